"""Log channels (LOG, LSEEK, LREAD, LCOMMIT; retention) with ``--workers=2``: a log command on a connection one
worker accepted for a topic the other owns crosses to the owner and comes back as its answer. The log channel
tests run here against a node of two workers (the fixtures below replace the one-process ones), and one test
reads and commits the logs of a topic owned by each worker on many connections. Retention by bytes is left out:
its file layout counts on one chunk per MPUB, and an owner joins the MPUBs another worker sent in one step."""

from __future__ import annotations

import pytest

from .harness import RawClient, mpub, stop_all
from .persistence_helpers import data_dirs
from .test_log_channels import (  # noqa: F401 (collected here, against two workers)
    bodies,
    commit,
    offsets,
    publish_to_log,
    read_all,
    test_a_channel_with_a_backlog_and_a_consumer_becomes_a_log,
    test_a_log_channel_missing_from_nsqd_dat_is_found_by_its_files,
    test_a_torn_log_file_at_start_up,
    test_errors,
    test_log_commands_after_sub_are_refused,
    test_log_over_tls_and_snappy,
    test_offsets_survive_kill_9_in_durable_mode,
    test_offsets_survive_sigterm_with_old_consumers_messages,
    test_read_commit_and_the_byte_cap,
    test_retention_by_time,
)
from .test_workers import owned_topics
from .workers_harness import TwoWorkers, TwoWorkersDataDir, two_workers_starter

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def module_nsqd(tmp_path_factory):
    node = TwoWorkers(tmp_path_factory.mktemp("nsqd-workers-logs")).start()
    yield node
    stop_all([node])


@pytest.fixture
def nsqd_factory(tmp_path_factory):
    yield from two_workers_starter(lambda: tmp_path_factory.mktemp("nsqd-workers"))


@pytest.fixture
def data_dir(tmp_path):
    yield from data_dirs(tmp_path, TwoWorkersDataDir)


def test_logs_of_topics_owned_by_each_worker_on_many_connections(module_nsqd):
    """Whichever worker accepts a connection, the log of a topic owned by either reads and commits the same;
    commands pipelined on one connection keep their order across the workers."""
    topics = owned_topics("logged")
    clients = [RawClient(module_nsqd.tcp) for _ in range(6)]
    try:
        for number, topic in enumerate(topics):
            publish_to_log(clients[number], topic, bodies("a", 50), bodies("a", 50, 50))
        for client in clients:
            for topic in topics:
                assert read_all(client, topic, 0, 100) == bodies("a", 100)
        for number, client in enumerate(clients):
            assert commit(client, topics[number % 2], number + 1)["committed"] >= number + 1
        client = clients[0]
        client.send(b"".join(mpub(topic, [b"late"]) for topic in topics))
        for _ in topics:
            client.expect_ok()
        for topic, committed in zip(topics, (5, 6), strict=True):  # the highest of the commits above
            assert offsets(client, topic) == {"start": committed, "committed": committed, "end": 101}
    finally:
        for client in clients:
            client.close()
