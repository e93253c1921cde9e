"""End to end: nsqd subprocesses, a real local Spark, Parquet sinks with checkpoints.

Every test publishes known bodies and checks that each one reaches the sink at least once, and
exactly once after dropping duplicates by (nsqd, id), across the failure it provokes.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest

from spark_connector.wal import SEGMENT_SUFFIX, WalDirectory
from tests.integration.harness import free_port, http_get
from tests.spark import drivers
from tests.spark.conftest import (
    assert_exactly_once_after_dedup,
    bodies,
    publish,
    read_output,
    wait_for_bodies,
    wait_until,
)

pytestmark = pytest.mark.timeout(240)


def start_query(spark, base: Path, options: dict[str, object], trigger: str | None = "300 milliseconds"):
    """The driver path's query into BASE/out; ``trigger`` None: Trigger.AvailableNow."""
    reader = spark.readStream.format("nsq")
    # the driver path: these tests are about its consumer and write-ahead log (test_log_path: the log path)
    for key, value in {"channel": "spark", "walPath": str(base / "wal"), "readMode": "driver", **options}.items():
        reader = reader.option(key, str(value))
    writer = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(base / "out"))
        .option("checkpointLocation", str(base / "checkpoint"))
    )
    return (writer.trigger(availableNow=True) if trigger is None else writer.trigger(processingTime=trigger)).start()


def committed_batches(base: Path) -> int:
    commits = base / "checkpoint" / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def tear_torn_tail(wal: Path) -> Path:
    """Append half a record to the newest segment, as a crash in the middle of an append would."""
    segments = sorted(wal.rglob(f"*{SEGMENT_SUFFIX}"))
    assert segments, "the query wrote no write-ahead log"
    newest = segments[-1]
    with open(newest, "ab") as f:
        f.write(struct.pack(">II", 4000, 12345) + b"\x0a\x05partial")
    return newest


def test_query_stopped_and_restarted_mid_stream(spark, nsqd_at, tmp_path, topic):
    """ackMode=commit: FIN at Spark's commit, TOUCH meanwhile; the query stops mid-stream, the
    log gets a torn tail, the query restarts on the same checkpoint and log. Each batch of the
    one nsqd is split into three partitions (minPartitions)."""
    nsqd = nsqd_at()
    first, second = bodies("q", 0, 1000), bodies("q", 1000, 1500)
    publish(nsqd, topic, first)
    options = {
        "nsqd.tcp.addresses": nsqd.tcp_address,
        "topic": topic,
        "ackMode": "commit",
        "msgTimeoutMs": 2000,
        "maxMessagesPerTrigger": 250,
        "minPartitions": 3,
    }
    query = start_query(spark, tmp_path, options)
    try:
        wait_until(lambda: committed_batches(tmp_path) >= 2, 120, "two committed batches")
        assert query.exception() is None
    finally:
        query.stop()
    assert len({bytes(r.body) for r in read_output(spark, tmp_path / "out")}) < len(first) + len(second)
    torn = tear_torn_tail(tmp_path / "wal")
    size_with_tail = torn.stat().st_size

    publish(nsqd, topic, second)
    query = start_query(spark, tmp_path, options)
    try:
        rows = wait_for_bodies(spark, tmp_path / "out", set(first + second), 150, query)
    finally:
        query.stop()
    assert_exactly_once_after_dedup(rows, set(first + second))
    # The torn tail was cut and the log went on cleanly after it.
    reopened = WalDirectory(tmp_path / "wal", topic, "spark", segment_bytes=1 << 20, dedup_window=10).open()
    try:
        assert all(m.truncated_bytes == 0 for m in reopened.logs.values())
        assert sum(m.end for m in reopened.logs.values()) >= len(first) + len(second)
    finally:
        reopened.close()
    assert torn.stat().st_size != size_with_tail


def test_nsqd_restarted_mid_stream(spark, nsqd_at, tmp_path, tmp_path_factory, topic):
    port = free_port()
    data = tmp_path_factory.mktemp("nsqd-data")
    nsqd = nsqd_at(port, data)
    first, second = bodies("r", 0, 600), bodies("r", 600, 1200)
    publish(nsqd, topic, first)
    query = start_query(
        spark,
        tmp_path,
        {"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, "maxMessagesPerTrigger": 200, "msgTimeoutMs": 2000},
    )
    try:
        wait_until(lambda: committed_batches(tmp_path) >= 1, 120, "a committed batch")
        assert nsqd.stop() == 0
        nsqd = nsqd_at(port, data)
        publish(nsqd, topic, second)
        rows = wait_for_bodies(spark, tmp_path / "out", set(first + second), 150, query)
    finally:
        query.stop()
    assert_exactly_once_after_dedup(rows, set(first + second))


def test_topic_that_does_not_exist_yet(spark, nsqd_at, tmp_path, topic):
    nsqd = nsqd_at()
    query = start_query(spark, tmp_path, {"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic})
    try:
        # The consumer's SUB creates the topic and its channel; wait for it, then publish.
        def channel_exists():
            status, body = http_get(nsqd.http(), "/stats?format=json")
            return status == 200 and topic.encode() in body and b'"spark"' in body

        wait_until(channel_exists, 120, "the consumer to subscribe", interval=0.5)
        expected = bodies("late", 0, 500)
        publish(nsqd, topic, expected)
        rows = wait_for_bodies(spark, tmp_path / "out", set(expected), 120, query)
    finally:
        query.stop()
    assert_exactly_once_after_dedup(rows, set(expected))


def test_unreachable_nsqd_fails_the_query_clearly(spark, tmp_path, topic):
    from pyspark.errors import StreamingQueryException

    address = f"127.0.0.1:{free_port()}"
    query = start_query(spark, tmp_path, {"nsqd.tcp.addresses": address, "topic": topic, "connectTimeoutMs": 1000})
    try:
        with pytest.raises(StreamingQueryException) as caught:
            query.awaitTermination(120)
    finally:
        query.stop()
    message = str(caught.value)
    assert f"cannot consume from nsqd {address}" in message
    assert "connectTimeoutMs" in message


def test_bad_options_fail_at_load(spark, tmp_path):
    with pytest.raises(Exception) as caught:
        spark.readStream.format("nsq").option("topic", "t").option("readMode", "driver").load()
    assert "set nsqd.tcp.addresses or lookupd.http.addresses" in str(caught.value)
    assert "option walPath is required with readMode=driver" in str(caught.value)


@pytest.mark.skipif(
    importlib.util.find_spec("lookupd") is None,
    reason="nsqlookupd (python -m lookupd) is not importable in this checkout yet",
)
def test_two_nsqd_found_through_lookupd(spark, nsqd_at, tmp_path, topic):
    """Both nsqd register with lookupd themselves (--lookupd-tcp-address) when the topic is created."""
    from tests.spark.lookupd_helpers import LookupdProcess

    lookupd = LookupdProcess(tmp_path / "lookupd").start()
    try:
        host, port = lookupd.tcp
        flags = (f"--lookupd-tcp-address={host}:{port}", "--broadcast-address=127.0.0.1")
        daemons = [nsqd_at(None, None, *flags), nsqd_at(None, None, *flags)]
        expected: set[bytes] = set()
        for n, daemon in enumerate(daemons):
            part = bodies(f"n{n}", 0, 400)
            publish(daemon, topic, part)
            expected |= set(part)

        def both_registered():
            status, body = http_get(lookupd.http(), f"/lookup?topic={topic}")
            return status == 200 and len(json.loads(body)["producers"]) == 2

        wait_until(both_registered, 30, "both nsqd to register the topic with lookupd", interval=0.2)
        query = start_query(
            spark,
            tmp_path,
            {"lookupd.http.addresses": lookupd.http_address, "topic": topic, "lookupd.pollIntervalMs": 500},
        )
        try:
            rows = wait_for_bodies(spark, tmp_path / "out", expected, 150, query)
        finally:
            query.stop()
        assert {r.nsqd for r in rows} == {d.tcp_address for d in daemons}
        assert_exactly_once_after_dedup(rows, expected)
    finally:
        lookupd.stop()


def run_killed_driver(tmp_path, nsqd, topic, first_wal: list[str], second_wal: list[str]) -> list:
    """Publish 1,200 messages; a driver subprocess (``driver_app`` with ``first_wal``: walPath name
    and ackMode) dies with SIGKILL while its third batch or a later one is planned but not
    committed; a second driver (``second_wal``) on the same checkpoint finishes the job. Returns
    the sink's rows."""
    expected = bodies("k", 0, 1200)
    publish(nsqd, topic, expected)
    log_path = tmp_path / "driver.log"
    args = [nsqd.tcp_address, topic, str(tmp_path)]
    driver = drivers.launch("tests.spark.driver_app", [*args, *first_wal], log_path)
    try:
        drivers.kill_mid_batch(driver, tmp_path, log_path, 2, 150)
        assert len({bytes(r.body) for r in read_output(None, tmp_path / "out")}) < len(expected)
        driver = drivers.launch("tests.spark.driver_app", [*args, *second_wal], log_path)
        rows = wait_for_bodies(None, tmp_path / "out", set(expected), 180)
        drivers.stop(driver, tmp_path, log_path)
    finally:
        drivers.reap(driver)
    return rows


@pytest.mark.usefixtures("_spark_process")
def test_driver_killed_mid_batch(nsqd_at, tmp_path, topic):
    """The whole driver (Python, JVM, Python workers) dies with SIGKILL while a batch is planned
    but not committed; a new driver on the same checkpoint and log finishes the job."""
    rows = run_killed_driver(tmp_path, nsqd_at(), topic, ["wal", "durable"], ["wal", "durable"])
    assert_exactly_once_after_dedup(rows, set(bodies("k", 0, 1200)))


@pytest.mark.usefixtures("_spark_process")
def test_driver_restarted_with_an_empty_wal_path_in_commit_mode(nsqd_at, tmp_path, topic):
    """ackMode=commit: the new driver (another machine, say) has a different, empty walPath; the
    messages of the batch that was not committed come again from nsqd: nothing is lost."""
    rows = run_killed_driver(tmp_path, nsqd_at(), topic, ["wal-a", "commit"], ["wal-b", "commit"])
    assert {bytes(r.body) for r in rows} == set(bodies("k", 0, 1200))
    assert (tmp_path / "wal-b").exists()
