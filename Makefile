# Every target creates the virtualenv when it is missing, so a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.installed-docs
RUN_STAMP := $(VENV)/.installed-daemons
LINT_STAMP := $(VENV)/.installed-lint
NODE_DIR := tests/compat/node
DATA ?= ./data

.PHONY: venv run test bench lint docs clean node spark-proto browser

venv: $(STAMP)

# `make run` needs only the daemons' own dependencies (seconds to install); the test clients, Playwright and
# PySpark come with `make test` and `make bench`.
$(RUN_STAMP): pyproject.toml setup.py nsqd/_speedups.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e .
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml $(RUN_STAMP)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

$(NODE_DIR)/node_modules/.installed: $(NODE_DIR)/package.json
	cd $(NODE_DIR) && npm install --no-audit --no-fund --silent
	touch $@

node: $(NODE_DIR)/node_modules/.installed

# Debian's chromium for the admin's browser tests (tests/ui); Playwright drives it, never downloads its own.
browser:
	command -v chromium >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)

# A local cluster: nsqlookupd (4160/4161), nsqd (4150/4151, data in $(DATA)) and nsqadmin (http://127.0.0.1:4171).
# Ctrl-C stops all three (each stops gracefully; nsqd writes its queues to disk).
run: $(RUN_STAMP)
	mkdir -p $(DATA)
	@$(VENV)/bin/nsqlookupd --tcp-address=127.0.0.1:4160 --http-address=127.0.0.1:4161 & lookupd=$$!; \
	$(VENV)/bin/nsqadmin --http-address=127.0.0.1:4171 --lookupd-http-address=127.0.0.1:4161 & admin=$$!; \
	trap 'kill $$lookupd $$admin 2>/dev/null; wait' EXIT INT TERM; \
	$(VENV)/bin/nsqd --data-path=$(DATA) --tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 \
		--lookupd-tcp-address=127.0.0.1:4160 --broadcast-address=127.0.0.1

# Run again with every nsqd on two workers (--workers=2; `pytest --nsqd-workers=2`): the client libraries' suites and
# the integration tests of the protocol, HTTP API, stats and persistence, the replication rings (every node on two
# workers; the compat rings with 8 kills instead of 20), the takeovers of an origin by a replica-only node (its
# topics spread over both workers, log channels among them: 30 s), and the replication nemesis on rings of three
# (20 s of faults each, about a minute for both; the ring of five with three copies, 38 s more, is left to N=1), a few
# minutes in all; tests/integration/test_workers*.py run N above 1 on their own.
WORKERS_TESTS := tests/compat/test_pynsq.py tests/compat/test_features_pynsq.py tests/compat/test_features_gnsq.py \
	tests/compat/test_nsqjs.py tests/compat/test_features_nsqjs.py tests/compat/test_lookupd_discovery.py \
	tests/integration/test_protocol.py tests/integration/test_errors.py tests/integration/test_frame_order.py \
	tests/integration/test_compression.py tests/integration/test_auth.py tests/integration/test_unix_sockets.py \
	tests/integration/test_fastpath.py tests/integration/test_http_api.py tests/integration/test_http_stats.py \
	tests/integration/test_persistence.py tests/integration/test_interop_files.py \
	tests/integration/test_replication_copies.py tests/compat/test_replication_ring.py $(REPLICA_TESTS) \
	tests/integration/test_replication_nemesis.py \
	'tests/integration/test_replication_nemesis_copies.py::test_three_copies_under_load_through_faults_of_one_and_two_nodes[ring3]'
REPLICATION := tests/integration/test_replication.py
REPLICA_TESTS := tests/integration/test_log_replication.py \
	$(REPLICATION)::test_takeover_by_http_adopts_unfinished_messages_with_their_channels \
	$(REPLICATION)::test_publishes_to_many_topics_in_the_same_millisecond_are_each_held_and_adopted \
	$(REPLICATION)::test_replica_keeps_its_copies_across_its_restart \
	$(REPLICATION)::test_an_origin_whose_messages_were_adopted_does_not_deliver_them_again \
	$(REPLICATION)::test_a_takeover_registers_the_adopted_topic_and_channel_with_lookupd \
	$(REPLICATION)::test_a_deferred_message_stays_deferred_after_a_takeover \
	$(REPLICATION)::test_a_message_put_back_keeps_its_attempts_and_its_delay_through_a_takeover

test: venv node browser
	$(PY) -m pytest -q
	RING_CYCLES=8 NEMESIS_SECONDS=20 $(PY) -m pytest -q --nsqd-workers=2 $(WORKERS_TESTS)

bench: venv
	$(PY) -m bench

$(LINT_STAMP): pyproject.toml setup.py nsqd/_speedups.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[lint]'
	touch $(LINT_STAMP)

# Stops at the first failure: ruff's rules and its formatting (settings in pyproject.toml), the C accelerator compiled
# with every warning an error (to a throwaway object; Python's headers from sysconfig), then byte-compilation.
lint: $(LINT_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
# mypy reads its file list and its two bars (strict, and the rest of the package) from pyproject.toml.
	$(PY) -m mypy
	obj=$$(mktemp --suffix=.o) && trap 'rm -f "$$obj"' EXIT && \
	$(CC) -Wall -Wextra -Werror -O2 \
		$$($(PY) -c 'import sysconfig; p = sysconfig.get_paths(); print("-I" + p["include"], "-I" + p["platinclude"])') \
		-c nsqd/_speedups.c -o "$$obj"
	$(PY) -m compileall -q protocol runtime nsqd lookupd admin spark_connector trionsq nsq_tools tests bench

# The docs site (mkdocs.yml, docs/*.md) into site/; --strict makes every warning an error, and mkdocs.yml's
# `validation:` makes a broken link or anchor a warning. Material's banner about its own future is not one.
$(DOCS_STAMP): pyproject.toml $(RUN_STAMP)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(NODE_DIR)/node_modules site

# Regenerate spark_connector/wal_pb2.py after editing wal.proto (the generated module is committed).
spark-proto: venv
	$(PY) -m pip install --quiet 'grpcio-tools>=1.71,<1.73'
	cd spark_connector && ../$(PY) -m grpc_tools.protoc -I. --python_out=. wal.proto
