"""Real clients discovering nsqd through nsqlookupd: two nsqlookupd, two nsqd, a pynsq Reader and an nsqjs Reader
given only ``lookupd_http_addresses`` consume every message published on both nsqd."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compat.client_runs import NODE, NODE_DIR, nsqjs_missing, python_client, run_client, unique_topic
from tests.integration.harness import REPO_ROOT, RawClient
from tests.integration.lookupd_harness import Cluster, wait_for_producers

pytestmark = [pytest.mark.compat, pytest.mark.timeout(120)]

PER_NSQD = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    built = Cluster(tmp_path_factory.mktemp)
    yield built
    built.stop()


def published_topic(cluster: Cluster) -> tuple[str, list[str]]:
    """A fresh topic with PER_NSQD messages on each nsqd, registered with both lookupds."""
    topic = unique_topic("disc")
    bodies = []
    for index, nsqd in enumerate(cluster.nsqds):
        batch = [f"nsqd{index}-{n}" for n in range(PER_NSQD)]
        with RawClient(nsqd.tcp) as client:
            client.publish_many(topic, [body.encode() for body in batch])
        bodies += batch
    for lookupd in cluster.lookupds:
        wait_for_producers(lookupd, topic, {nsqd.tcp[1] for nsqd in cluster.nsqds})
    return topic, bodies


def lookupd_list(cluster: Cluster) -> str:
    return ",".join(f"{host}:{port}" for host, port in (lookupd.http_address for lookupd in cluster.lookupds))


def run(cluster: Cluster, argv: list[str], cwd: Path) -> dict:
    return run_client(argv, cwd=cwd, what=argv[1], logs=cluster.logs, logs_name="logs")


def expected_nsqd(cluster: Cluster) -> list[str]:
    return sorted(nsqd.tcp_address for nsqd in cluster.nsqds)


def test_pynsq_reader_consumes_from_every_nsqd(cluster):
    topic, bodies = published_topic(cluster)
    result = run(cluster, python_client("pynsq_lookupd", lookupd_list(cluster), topic, str(len(bodies))), REPO_ROOT)
    assert sorted(result["bodies"]) == sorted(bodies)
    assert result["nsqd"] == expected_nsqd(cluster)
    problems = [w for w in result["warnings"] if "E_" in w or "query error" in w or "failed to parse JSON" in w]
    assert not problems, problems


def test_nsqjs_reader_consumes_from_every_nsqd(cluster):
    if nsqjs_missing() is not None:
        pytest.skip("node and nsqjs are needed: run `make node`")
    topic, bodies = published_topic(cluster)
    result = run(cluster, [NODE, "lookupd_scenarios.js", lookupd_list(cluster), topic, str(len(bodies))], NODE_DIR)
    assert sorted(result["bodies"]) == sorted(bodies)
    assert result["nsqd"] == expected_nsqd(cluster)
    assert result["errors"] == []
