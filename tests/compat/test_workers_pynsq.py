"""pynsq (Writer and Reader on tornado) against one node of two workers (``--workers=2``): its scenarios pass as
against one process, whichever worker each of its connections lands on."""

from __future__ import annotations

import pytest

from nsqd.workers import owner_of
from tests.compat.client_runs import python_client, run_client, unique_topic
from tests.integration.harness import REPO_ROOT, stop_all
from tests.integration.test_workers import start_node

pytestmark = [pytest.mark.compat, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    daemon = start_node(tmp_path_factory.mktemp("workers-pynsq"))
    yield daemon
    stop_all([daemon])


@pytest.mark.parametrize("scenario", ["publish_consume_finish", "requeue_with_delay", "max_in_flight", "mpub_and_dpub"])
def test_pynsq_scenarios_against_two_workers(node, scenario):
    topics: dict[int, str] = {}
    while len(topics) < 2:  # one topic owned by each worker
        name = unique_topic("pynsq")
        topics.setdefault(owner_of(name, 2), name)
    for topic in topics.values():
        result = run_client(
            python_client("pynsq_scenarios", scenario, node.tcp_address, topic),
            cwd=REPO_ROOT,
            what=f"pynsq scenario {scenario}",
            logs=node.log_text,
            timeout=75,
        )
        assert not [w for w in result["warnings"] if "E_" in w], result["warnings"]
        if scenario == "publish_consume_finish":
            assert result["pub"] == "OK" and result["redelivered"] == []
        elif scenario == "requeue_with_delay":
            assert result["second"]["attempts"] == 2
        elif scenario == "max_in_flight":
            assert result["bodies"] == sorted(f"m{i:02d}" for i in range(50))
            assert result["peak_in_flight"] == 10
        else:
            assert sorted(result["bodies"]) == sorted(["deferred"] + [f"batch-{i}" for i in range(100)])
