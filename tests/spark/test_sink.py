"""The ``nsq`` sink in a local Spark: batch and streaming writes to nsqd subprocesses, checked
through nsqd's /stats and by consuming what was published."""

from __future__ import annotations

import json
import time

import pytest

from tests.integration.harness import RawClient, free_port, http_get
from tests.spark.conftest import bodies, consume_bodies, publish, topic_message_count, wait_until

pytestmark = pytest.mark.timeout(300)


def write(frame, **options):
    writer = frame.write.format("nsq").mode("append")
    for key, value in options.items():
        writer = writer.option(key.replace("_", "."), str(value))
    writer.save()


def numbered(spark, count: int, partitions: int, prefix: str = "row"):
    from pyspark.sql import functions as F

    return spark.range(0, count, numPartitions=partitions).select(F.format_string(f"{prefix}-%07d", "id").alias("body"))


def metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_million_rows_land_exactly_once_across_two_nsqd(spark, nsqd_at, tmp_path, topic):
    daemons = [nsqd_at(), nsqd_at()]
    count = 1_000_000
    write(
        numbered(spark, count, 4),
        topic=topic,
        metricsPath=tmp_path / "metrics.jsonl",
        **{"nsqd_tcp_addresses": ",".join(d.tcp_address for d in daemons)},
    )
    per_nsqd = [topic_message_count(d, topic) for d in daemons]
    assert sum(per_nsqd) == count
    assert min(per_nsqd) >= count * 0.4, per_nsqd  # spread evenly
    [summary] = metrics(tmp_path / "metrics.jsonl")
    assert summary["outcome"] == "committed"
    assert (summary["rows"], summary["messages"], summary["republished_rows"]) == (count, count, 0)
    found = consume_bodies([d.tcp_address for d in daemons], topic, tmp_path / "check", count, 120)
    assert len(found) == count
    assert set(found) == {f"row-{i:07d}".encode() for i in range(count)}


def test_rows_routed_by_their_topic_column(spark, nsqd_at, tmp_path, topic):
    from pyspark.sql import functions as F

    nsqd = nsqd_at()
    names = [f"{topic}_a", f"{topic}_b", f"{topic}_c"]
    frame = spark.range(0, 3000, numPartitions=2).select(
        # every third row has no topic: the option's default (names[2]) applies
        F.when(F.col("id") % 3 == 0, F.lit(names[0])).when(F.col("id") % 3 == 1, F.lit(names[1])).alias("topic"),
        F.format_string("r-%05d", "id").cast("binary").alias("body"),
        F.col("id"),  # ignored
    )
    write(frame, topic=names[2], nsqd_tcp_addresses=nsqd.tcp_address)
    for k, name in enumerate(names):
        assert topic_message_count(nsqd, name) == 1000
        found = consume_bodies([nsqd.tcp_address], name, tmp_path / name, 1000, 60)
        assert sorted(found) == [f"r-{i:05d}".encode() for i in range(3000) if i % 3 == k]

    # Every row has a topic: the option is not needed.
    write(frame.where("topic is not null"), nsqd_tcp_addresses=nsqd.tcp_address)
    assert [topic_message_count(nsqd, name) for name in names] == [2000, 2000, 1000]


def test_deferred_rows_arrive_after_their_delay(spark, nsqd_at, topic):
    from pyspark.sql import functions as F

    nsqd = nsqd_at()
    delay_ms = 3000
    frame = spark.range(0, 20, numPartitions=2).select(
        F.format_string("d-%02d", "id").alias("body"),
        F.when(F.col("id") % 2 == 0, F.lit(delay_ms)).alias("deferMs"),  # odd rows: null, no delay
    )
    with RawClient(nsqd.tcp) as client:
        client.subscribe(topic, "check", 100)
        started = time.monotonic()
        write(frame, topic=topic, nsqd_tcp_addresses=nsqd.tcp_address)
        arrivals = {}
        while len(arrivals) < 20:
            message = client.read_message(timeout=30)
            arrivals[message.body] = time.monotonic() - started
            client.send(f"FIN {message.id.decode()}\n".encode())
    for i in range(20):
        body = f"d-{i:02d}".encode()
        if i % 2 == 0:
            assert arrivals[body] >= delay_ms / 1000, (body, arrivals[body])
    # The immediate rows came before any deferred one.
    assert max(arrivals[f"d-{i:02d}".encode()] for i in range(1, 20, 2)) < min(
        arrivals[f"d-{i:02d}".encode()] for i in range(0, 20, 2)
    )


def test_stopped_nsqd_is_skipped(spark, nsqd_at, tmp_path, topic):
    up, down = nsqd_at(), nsqd_at()
    down.stop()
    write(
        numbered(spark, 5000, 2),
        topic=topic,
        connectTimeoutMs=2000,
        nsqd_tcp_addresses=f"{down.tcp_address},{up.tcp_address}",
    )
    assert topic_message_count(up, topic) == 5000


def test_refused_batch_is_retried_on_another_nsqd(spark, nsqd_at, tmp_path, topic):
    """One nsqd takes no message over 100 bytes (its --max-msg-size): every batch it is given
    comes back with nsqd's error and goes to the other."""
    small = nsqd_at(None, None, "--max-msg-size=100")
    large = nsqd_at()
    frame = numbered(spark, 4000, 2, prefix="x" * 150)
    write(
        frame,
        topic=topic,
        batchMessages=100,
        metricsPath=tmp_path / "metrics.jsonl",
        nsqd_tcp_addresses=f"{small.tcp_address},{large.tcp_address}",
    )
    assert topic_message_count(large, topic) == 4000
    assert topic_message_count(small, topic) == 0
    [summary] = metrics(tmp_path / "metrics.jsonl")
    assert summary["messages"] == 4000 and summary["retried_commands"] >= 1


def test_task_fails_with_nsqd_error_when_no_nsqd_takes_a_batch(spark, nsqd_at, topic):
    daemons = [nsqd_at(None, None, "--max-msg-size=100"), nsqd_at(None, None, "--max-msg-size=100")]
    with pytest.raises(Exception) as caught:
        write(
            numbered(spark, 100, 1, prefix="x" * 150),
            topic=topic,
            nsqd_tcp_addresses=",".join(d.tcp_address for d in daemons),
        )
    message = str(caught.value)
    assert "no nsqd took 100 messages from row 0" in message
    for daemon in daemons:
        assert f"nsqd {daemon.tcp_address}: E_BAD_MESSAGE MPUB message too big 158 > 100" in message


def test_unreachable_nsqd_fails_the_task(spark, nsqd_at, topic):
    down = nsqd_at()
    down.stop()
    with pytest.raises(Exception) as caught:
        write(numbered(spark, 10, 1), topic=topic, connectTimeoutMs=1000, nsqd_tcp_addresses=down.tcp_address)
    assert f"no nsqd accepted a connection: nsqd {down.tcp_address}: cannot connect" in str(caught.value)


@pytest.mark.parametrize(
    "column, reason",
    [
        ("CASE WHEN id = 7 THEN NULL ELSE 'b' END", "its body is null"),
        ("CASE WHEN id = 7 THEN '' ELSE 'b' END", "its body is empty"),
        ("CASE WHEN id = 7 THEN repeat('z', 2000) ELSE 'b' END", "its body is 2000 bytes, over maxMessageBytes=1000"),
    ],
)
def test_bad_body_fails_with_position_and_reason(spark, nsqd_at, topic, column, reason):
    nsqd = nsqd_at()
    frame = spark.range(0, 10, numPartitions=1).selectExpr(f"{column} AS body")
    with pytest.raises(Exception) as caught:
        write(frame, topic=topic, maxMessageBytes=1000, nsqd_tcp_addresses=nsqd.tcp_address)
    assert f"row 7 of partition 0: {reason}" in str(caught.value)


def test_bad_topic_and_defer_fail_with_position_and_reason(spark, nsqd_at, topic):
    nsqd = nsqd_at()
    bad_topic = spark.range(0, 10, numPartitions=1).selectExpr(
        "'b' AS body", f"CASE WHEN id = 4 THEN 'no/slash' ELSE '{topic}' END AS topic"
    )
    with pytest.raises(Exception) as caught:
        write(bad_topic, nsqd_tcp_addresses=nsqd.tcp_address)
    assert "row 4 of partition 0: topic 'no/slash' is not a valid NSQ topic name" in str(caught.value)

    no_topic = spark.range(0, 10, numPartitions=1).selectExpr(
        "'b' AS body", f"CASE WHEN id = 5 THEN NULL ELSE '{topic}' END AS topic"
    )
    with pytest.raises(Exception) as caught:
        write(no_topic, nsqd_tcp_addresses=nsqd.tcp_address)
    assert "row 5 of partition 0: its topic is null and the topic option is not set" in str(caught.value)

    negative = spark.range(0, 10, numPartitions=1).selectExpr("'b' AS body", "CASE WHEN id = 6 THEN -5 END AS deferMs")
    with pytest.raises(Exception) as caught:
        write(negative, topic=topic, nsqd_tcp_addresses=nsqd.tcp_address)
    assert "row 6 of partition 0: deferMs -5 is negative" in str(caught.value)


def test_bad_schema_and_mode_fail_before_any_task(spark, nsqd_at, topic):
    frame = spark.range(0, 3).selectExpr("id AS value")
    with pytest.raises(Exception) as caught:
        write(frame, topic=topic, nsqd_tcp_addresses="127.0.0.1:1")
    assert "a body column (binary or string) is required" in str(caught.value)
    with pytest.raises(Exception) as caught:
        write(frame.selectExpr("'b' AS body"), nsqd_tcp_addresses="127.0.0.1:1")
    assert "set the topic option or give the rows a topic column" in str(caught.value)
    with pytest.raises(Exception) as caught:
        frame.selectExpr("'b' AS body").write.format("nsq").mode("overwrite").option("topic", topic).option(
            "nsqd.tcp.addresses", "127.0.0.1:1"
        ).save()
    assert 'use mode("append")' in str(caught.value)


def start_pipeline(spark, base, source: dict, sink: dict):
    """nsq -> upper-case the body -> nsq, with its checkpoint in ``base``."""
    from pyspark.sql import functions as F

    reader = spark.readStream.format("nsq")
    for key, value in {"channel": "spark", "walPath": str(base / "wal"), **source}.items():
        reader = reader.option(key, str(value))
    out = reader.load().select(F.upper(F.col("body").cast("string")).alias("body"))
    writer = out.writeStream.format("nsq").option("checkpointLocation", str(base / "checkpoint"))
    for key, value in sink.items():
        writer = writer.option(key, str(value))
    return writer.trigger(processingTime="300 milliseconds").start()


def test_streaming_pipeline_restarted_mid_stream(spark, nsqd_at, tmp_path, topic):
    """nsq -> transform -> nsq: the query stops in the middle and restarts from its checkpoint;
    every input's result arrives at least once."""
    nsqd = nsqd_at()
    out_topic = f"{topic}_out"
    first, second = bodies("p", 0, 1500), bodies("p", 1500, 3000)
    publish(nsqd, topic, first)
    source = {"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, "maxMessagesPerTrigger": 750}
    sink = {"nsqd.tcp.addresses": nsqd.tcp_address, "topic": out_topic}
    query = start_pipeline(spark, tmp_path, source, sink)
    try:
        wait_until(lambda: topic_message_count(nsqd, out_topic) >= 750, 120, "a batch published", interval=0.2)
        assert query.exception() is None
    finally:
        query.stop()
    assert topic_message_count(nsqd, out_topic) < len(first) + len(second)
    publish(nsqd, topic, second)
    query = start_pipeline(spark, tmp_path, source, sink)
    try:
        expected = {b.upper() for b in first + second}
        found = consume_bodies([nsqd.tcp_address], out_topic, tmp_path / "check", len(expected), 150, expected)
        assert query.exception() is None
    finally:
        query.stop()
    assert expected <= set(found)


def test_nsqd_stopped_in_the_middle_of_a_write(spark, nsqd_at, tmp_path, tmp_path_factory, topic):
    """One of two nsqd stops while the tasks publish to both: its batches go to the other, and
    every row is stored at least once (what it took before it stopped is on its disk)."""
    import threading

    port, data = free_port(), tmp_path_factory.mktemp("stopping")
    stopping, staying = nsqd_at(port, data), nsqd_at()
    count = 300_000
    stopped: list[int] = []

    def stop_after_first_batches():
        wait_until(
            lambda: topic_message_count(stopping, topic) > 0,
            120,
            "the first batches on the nsqd to stop",
            interval=0.01,
        )
        stopped.append(stopping.stop())

    # Spark jobs run from the test's thread (a data source registered with the session is found there)
    stopper = threading.Thread(target=stop_after_first_batches, daemon=True)
    stopper.start()
    write(
        numbered(spark, count, 2),
        topic=topic,
        metricsPath=tmp_path / "metrics.jsonl",
        nsqd_tcp_addresses=f"{stopping.tcp_address},{staying.tcp_address}",
    )
    stopper.join(130)
    assert stopped == [0]
    [summary] = metrics(tmp_path / "metrics.jsonl")
    assert summary["rows"] == count and summary["retried_commands"] >= 1
    restarted = nsqd_at(port, data)
    addresses = [restarted.tcp_address, staying.tcp_address]
    found = consume_bodies(
        addresses, topic, tmp_path / "check", count, 120, {f"row-{i:07d}".encode() for i in range(count)}
    )
    assert len(found) >= count


def test_every_nsqd_lookupd_knows(spark, nsqd_at, tmp_path, topic):
    from tests.spark.lookupd_helpers import LookupdProcess

    lookupd = LookupdProcess(tmp_path / "lookupd").start()
    try:
        host, port = lookupd.tcp
        flags = (f"--lookupd-tcp-address={host}:{port}", "--broadcast-address=127.0.0.1")
        daemons = [nsqd_at(None, None, *flags), nsqd_at(None, None, *flags)]

        def both_known():
            status, body = http_get(lookupd.http(), "/nodes")
            return status == 200 and len(json.loads(body)["producers"]) == 2

        wait_until(both_known, 30, "both nsqd to register with lookupd", interval=0.2)
        write(numbered(spark, 10_000, 2), topic=topic, **{"lookupd_http_addresses": lookupd.http_address})
        counts = [topic_message_count(d, topic) for d in daemons]
        assert sum(counts) == 10_000 and min(counts) > 0, counts
    finally:
        lookupd.stop()


@pytest.mark.parametrize(
    "options",
    [{"snappy": "true"}, {"deflate": "true", "deflate.level": "3"}, {"tls": "true", "snappy": "true"}],
    ids=["snappy", "deflate", "tls+snappy"],
)
def test_connection_upgrades_of_the_publisher(tmp_path, nsqd_at, topic, options):
    """The sink's tasks connect as the source does (here a task's code without Spark: Arrow batches
    straight into ``write_partition``)."""
    import pyarrow as pa

    from spark_connector.options import SinkOptions
    from spark_connector.sink import write_partition
    from tests.integration.features import make_certificates

    certs = make_certificates(tmp_path / "certs")
    nsqd = nsqd_at(None, None, *certs.daemon_args())
    if options.get("tls"):
        options = {**options, "tls.caFile": str(certs.ca_file)}
    sink = SinkOptions.parse(
        {"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, "batchMessages": "100", **options}
    )
    expected = bodies("u", 0, 3000)
    batches = [
        pa.record_batch([pa.array(expected[i : i + 1000], pa.binary())], names=["body"]) for i in range(0, 3000, 1000)
    ]
    message = write_partition(sink, {"body": "body"}, iter(batches))
    assert (message.rows, message.messages, message.commands) == (3000, 3000, 30)
    assert topic_message_count(nsqd, topic) == 3000
    found = consume_bodies([nsqd.tcp_address], topic, tmp_path / "check", 3000, 60)
    assert sorted(found) == expected
