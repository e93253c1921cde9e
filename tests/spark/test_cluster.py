"""The connector on a Spark standalone cluster (a master and two workers on 127.0.0.1, started
by the ``cluster`` fixture): the driver, the executors and their Python workers are different
processes, so nothing may rely on sharing one. The source and the sink run the scenarios of the
local tests here, a task that fails once and is retried shows the sink's at-least-once count, and
a Trigger.AvailableNow query on the driver path reads a backlog larger than its consumers'
bound to the end and stops."""

from __future__ import annotations

import json

import pytest

from tests.spark import test_sink, test_streaming
from tests.spark.conftest import bodies, publish, read_output
from tests.spark.test_available_now import nsqd_with_http_next

pytestmark = pytest.mark.timeout(400)


def test_executors_are_processes_of_their_own(cluster, cluster_spark):
    import os

    pids = cluster_spark.sparkContext.parallelize(range(4), 2).map(lambda _: os.getpid()).distinct().collect()
    assert os.getpid() not in pids
    assert len(cluster.executor_pids()) == 2


def test_source_query_restarted_from_its_checkpoint(cluster_spark, nsqd_at, tmp_path, topic):
    test_streaming.test_query_stopped_and_restarted_mid_stream(cluster_spark, nsqd_at, tmp_path, topic)


def test_available_now_on_the_driver_path_reads_past_the_backlog_bound(cluster_spark, nsqd_at, tmp_path, topic):
    """Two nsqd with 10,000 messages each; the consumers stop at 2,000 logged and not yet done
    by Spark (maxBacklogMessages): the query reads all of them, in several batches, and ends."""
    daemons = [nsqd_with_http_next(nsqd_at) for _ in range(2)]
    expected = set()
    for n, nsqd in enumerate(daemons):
        published = bodies(f"n{n}", 0, 10_000)
        publish(nsqd, topic, published)
        expected.update(published)
    addresses = ",".join(d.tcp_address for d in daemons)
    options = {"nsqd.tcp.addresses": addresses, "topic": topic, "maxBacklogMessages": 2000}
    query = test_streaming.start_query(cluster_spark, tmp_path, options, trigger=None)
    try:
        assert query.awaitTermination(300), "the query did not end by itself"
        assert query.exception() is None, query.exception()
        batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    read = {bytes(row.body) for row in read_output(cluster_spark, tmp_path / "out")}
    assert expected <= read, f"{len(expected - read)} of {len(expected)} messages not read"
    # RDY 0 comes once a connection's log holds 2,000 messages Spark is not done with; what nsqd already sent
    # still arrives: up to the connection's RDY share (maxInFlight 2,500 over two connections) in the read that
    # crossed the bound and as much again refilled by its FINs before RDY 0 lands. So a batch holds at most
    # 2 x (2,000 + 2 x 1,250) = 9,000 messages, and 20,000 take at least three; without the bound, one.
    assert len(batches) >= 3, batches


def test_sink_million_rows_across_two_nsqd(cluster_spark, nsqd_at, tmp_path, topic):
    test_sink.test_million_rows_land_exactly_once_across_two_nsqd(cluster_spark, nsqd_at, tmp_path, topic)


def test_sink_routing_by_topic_column(cluster_spark, nsqd_at, tmp_path, topic):
    test_sink.test_rows_routed_by_their_topic_column(cluster_spark, nsqd_at, tmp_path, topic)


def test_sink_deferred_rows(cluster_spark, nsqd_at, topic):
    test_sink.test_deferred_rows_arrive_after_their_delay(cluster_spark, nsqd_at, topic)


def test_sink_refused_batch_retried_elsewhere(cluster_spark, nsqd_at, tmp_path, topic):
    test_sink.test_refused_batch_is_retried_on_another_nsqd(cluster_spark, nsqd_at, tmp_path, topic)


def test_sink_fails_with_nsqd_error(cluster_spark, nsqd_at, topic):
    test_sink.test_task_fails_with_nsqd_error_when_no_nsqd_takes_a_batch(cluster_spark, nsqd_at, topic)


def test_sink_bad_row(cluster_spark, nsqd_at, topic):
    test_sink.test_bad_body_fails_with_position_and_reason(
        cluster_spark, nsqd_at, topic, "CASE WHEN id = 7 THEN NULL ELSE 'b' END", "its body is null"
    )


def test_sink_streaming_pipeline_restarted(cluster_spark, nsqd_at, tmp_path, topic):
    test_sink.test_streaming_pipeline_restarted_mid_stream(cluster_spark, nsqd_at, tmp_path, topic)


def test_retried_task_counts_what_it_published_again(cluster_spark, nsqd_at, tmp_path, topic):
    """The first attempt of the task fails after publishing part of its rows; the second
    publishes them all: at-least-once, and the commit counts the attempt's rows as republished."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def fail_first_attempt(i: int) -> str:
        from pyspark import TaskContext

        if i == 3000 and TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("the first attempt fails here")
        return f"t-{i:05d}"

    body = F.udf(fail_first_attempt, StringType())
    nsqd = nsqd_at()
    frame = cluster_spark.range(0, 5000, numPartitions=1).select(body("id").alias("body"))
    metrics = tmp_path / "metrics.jsonl"
    cluster_spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
    try:
        test_sink.write(frame, topic=topic, batchMessages=100, metricsPath=metrics, nsqd_tcp_addresses=nsqd.tcp_address)
    finally:
        cluster_spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    [summary] = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert summary["rows"] == 5000 and summary["republished_rows"] == 5000
    assert [m["attempt"] for m in summary["task_messages"]] == [1]
    published = test_sink.topic_message_count(nsqd, topic)
    # what the first attempt published before it failed (up to row 3000), then every row
    assert 5000 <= published <= 8000
