"""The connector through Spark Connect: a Connect server (started with pyspark's ``spark-class``
as an application of the test standalone cluster) and a remote session in this process that
registers the ``nsq`` data source and runs the sink and the source over gRPC. The data source's
code runs in the server's Python workers and the executors, never in this process.

Needs the Connect client's packages (``pyspark[connect]``: grpcio, grpcio-status,
googleapis-common-protos, zstandard, pandas); skipped with the missing one's name otherwise."""

from __future__ import annotations

import os

import pytest

from tests.spark import test_sink
from tests.spark.conftest import bodies, consume_bodies, publish, stop_cluster_session, topic_message_count, wait_until

pytestmark = pytest.mark.timeout(400)

#: what pyspark sets in the environment for a remote session
CONNECT_ENVIRONMENT = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


def _connect_missing() -> str | None:
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as exc:
        return f"the Spark Connect client's packages are not installed: {exc}"
    return None


@pytest.fixture(scope="module")
def remote(request):
    reason = _connect_missing()
    if reason:
        pytest.skip(reason)
    cluster = request.getfixturevalue("cluster")
    stop_cluster_session(cluster)  # the Connect server is an application of its own: it needs the cores
    url = cluster.start_connect_server()
    from pyspark.sql import SparkSession

    # a remote session marks the process as Spark Connect (SPARK_CONNECT_MODE_ENABLED) and its stop() leaves the
    # mark: every later SparkSession of the run would try to be a Connect session without a URL
    saved = {name: os.environ.get(name) for name in CONNECT_ENVIRONMENT}
    try:
        session = SparkSession.builder.remote(url).getOrCreate()
        from spark_connector.datasource import NsqDataSource

        session.dataSource.register(NsqDataSource)
        yield session
        session.stop()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        cluster.stop_connect_server()


def test_batch_write_through_connect(remote, nsqd_at, tmp_path, topic):
    daemons = [nsqd_at(), nsqd_at()]
    test_sink.write(
        test_sink.numbered(remote, 20_000, 2), topic=topic, nsqd_tcp_addresses=",".join(d.tcp_address for d in daemons)
    )
    assert sum(topic_message_count(d, topic) for d in daemons) == 20_000
    found = consume_bodies([d.tcp_address for d in daemons], topic, tmp_path / "check", 20_000, 60)
    assert set(found) == {f"row-{i:07d}".encode() for i in range(20_000)}


def test_streaming_pipeline_through_connect(remote, nsqd_at, tmp_path, topic):
    """nsq -> upper-case -> nsq, from a remote session, stopped and restarted from its checkpoint."""
    nsqd = nsqd_at()
    out_topic = f"{topic}_out"
    first, second = bodies("c", 0, 1000), bodies("c", 1000, 2000)
    publish(nsqd, topic, first)
    source = {"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, "maxMessagesPerTrigger": 500, "ackMode": "commit"}
    sink = {"nsqd.tcp.addresses": nsqd.tcp_address, "topic": out_topic}
    query = test_sink.start_pipeline(remote, tmp_path, source, sink)
    try:
        wait_until(lambda: topic_message_count(nsqd, out_topic) >= 500, 150, "a batch published", interval=0.2)
    finally:
        query.stop()
    publish(nsqd, topic, second)
    query = test_sink.start_pipeline(remote, tmp_path, source, sink)
    try:
        expected = {b.upper() for b in first + second}
        found = consume_bodies([nsqd.tcp_address], out_topic, tmp_path / "check", len(expected), 150, expected)
    finally:
        query.stop()
    assert expected <= set(found)
