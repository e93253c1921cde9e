"""The source's log path against nsqd with ``--workers=2``: the planner and the executors' reads (LOG, LREAD,
LCOMMIT) on connections either worker accepted, whichever owns the topic; a local query, exactly once, over a
topic owned by each worker; and on the standalone cluster, exactly once across a kill -9 of a durable node (every
process of it) and a graceful stop of another."""

from __future__ import annotations

import pytest

from tests.integration.test_workers import owned_topics
from tests.integration.workers_harness import TwoWorkers, two_workers_starter
from tests.spark.conftest import bodies, nsqd_starter, publish
from tests.spark.test_log_path import (  # noqa: F401 (collected here, against two workers)
    start_query,
    test_a_start_resolved_again_before_the_first_commit,
    test_cluster_nsqd_killed_in_durable_mode_and_stopped_exactly_once,
    test_planner_offsets_partitions_and_commits,
    wait_exactly_once,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def nsqd_factory(tmp_path_factory):
    yield from two_workers_starter(lambda: tmp_path_factory.mktemp("nsqd-workers"))


@pytest.fixture
def nsqd_at(tmp_path_factory):
    yield from nsqd_starter(tmp_path_factory, TwoWorkers)


def test_a_query_reads_topics_owned_by_each_worker_exactly_once(spark, nsqd_factory, tmp_path):
    node = nsqd_factory()
    for number, topic in enumerate(owned_topics("sparked")):
        expected = bodies(f"w{number}", 0, 600)
        publish(node, topic, expected)
        base = tmp_path / topic
        query = start_query(spark, base, {"nsqd.tcp.addresses": node.tcp_address, "topic": topic, "readMode": "log"})
        try:
            publish(node, topic, bodies(f"w{number}", 600, 900))  # live, after the first batch was planned
            wait_exactly_once(base / "out", bodies(f"w{number}", 0, 900), 120, query)
        finally:
            query.stop()
