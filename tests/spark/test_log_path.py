"""The source's log path (``spark_connector.log_source``): the driver plans offset ranges of nsqd's
log channels and commits them, the executors read their ranges straight from nsqd.

The planner and the executor's reader first, against a real nsqd and without Spark; then, on the
standalone cluster the other tests share (``cluster``: a master and two 1-core workers, executors
in JVMs of their own), Spark's file sink with a checkpoint: every message exactly once (no
``dropDuplicates``) across an executor killed mid-batch, nsqd killed (durable mode) and stopped,
and the whole driver killed with SIGKILL and restarted on its checkpoint; and the driver path when
an nsqd has no log channels (a proxy that answers ``LOG`` as NSQ's nsqd 1.3.0 does).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from protocol.log import Columns, decode_range, encode_range
from spark_connector.log_client import LogNode, NoLogChannels
from spark_connector.log_source import LogPartition, LogPlanner, probe, range_batch, read_partition
from spark_connector.options import SourceOptions
from tests.integration.harness import free_port
from tests.spark import drivers
from tests.spark.conftest import bodies, publish, read_output, session_on, stop_cluster_session, wait_until

pytestmark = pytest.mark.timeout(300)

DURABLE = ("--mem-queue-size=0", "--sync-every=1")


def source_options(addresses, topic: str, **extra) -> SourceOptions:
    return SourceOptions.parse(
        {
            "nsqd.tcp.addresses": ",".join(addresses),
            "topic": topic,
            "channel": "spark",
            **{k: str(v) for k, v in extra.items()},
        }
    )


def log_offsets(nsqd, topic: str, channel: str = "spark") -> dict:
    with urllib.request.urlopen(f"http://%s:%d/stats?format=json&topic={topic}" % nsqd.http(), timeout=10) as r:
        stats = json.loads(r.read())
    for t in stats["topics"] or []:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c.get("log") or {}
    return {}


def read_bodies(options: SourceOptions, partition: LogPartition) -> list[bytes]:
    return [b for batch in read_partition(options, partition) for b in batch.column("body").to_pylist()]


# -- without Spark --------------------------------------------------------------------------------


def test_range_batch_matches_the_protocol_decoder_and_refuses_bad_frames():
    ids = [b"%016x" % i for i in range(6)]
    columns = Columns.from_messages(
        ids,
        [1_700_000_000_000_000_000 + 1000 * i for i in range(6)],
        [0, 1, 2, 3, 4, 65535],
        [b"a", b"", b"ccc", b"d" * 300, b"e", b"\x00\xff"],
    )
    data = encode_range(40, 50, [columns])
    first, count, batch = range_batch(data, "h:1", "t", "c")
    expected = list(decode_range(data).messages())
    assert (first, count) == (40, 6)
    assert batch.column("id").to_pylist() == [m[1].decode() for m in expected]
    assert batch.column("body").to_pylist() == [m[4] for m in expected]
    assert batch.column("attempts").to_pylist() == [m[3] for m in expected]
    assert [t.value for t in batch.column("timestamp")] == [m[2] // 1000 for m in expected]
    assert set(batch.column("nsqd").to_pylist()) == {"h:1"}
    assert range_batch(encode_range(7, 7, []), "h:1", "t", "c")[2].num_rows == 0
    bad_id = data.replace(b"0000000000000002", b"\xff" * 16)
    for broken, why in [
        (data[:-1], "adding up"),
        (data + b"x", "adding up"),
        (b"NLR2" + data[4:], "malformed"),
        (data[:20], "20 bytes"),
        (bad_id, "not text"),
    ]:
        with pytest.raises(Exception, match=why):
            range_batch(broken, "h:1", "t", "c")


def test_planner_offsets_partitions_and_commits(nsqd_factory, topic):
    """startingOffsets and startingTimestamp, maxOffsetsPerTrigger shared by two nsqd, minPartitions,
    Trigger.AvailableNow, LCOMMIT; the reader rides over nsqd answering in several frames."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    a, b = nsqd_factory(), nsqd_factory()
    publish(a, topic, bodies("a", 0, 300))
    publish(b, topic, bodies("b", 0, 100))
    opts = source_options([a.tcp_address, b.tcp_address], topic, minPartitions=4, fetchMaxBytes=1024)
    found, without = probe(opts, [a.tcp_address, b.tcp_address])
    assert without == [] and found[a.tcp_address]["end"] == 300 and found[b.tcp_address]["end"] == 100
    planner = LogPlanner(opts, found)
    try:
        start = planner.initial_offset()
        assert start == {"version": 2, "nsqd": {a.tcp_address: 0, b.tcp_address: 0}}
        end = planner.latest_offset(start, ReadMaxRows(200))
        assert end["nsqd"] == {a.tcp_address: 100, b.tcp_address: 100}  # shared evenly
        end = planner.latest_offset(start, ReadMaxRows(350))
        assert end["nsqd"] == {a.tcp_address: 250, b.tcp_address: 100}  # what b cannot use goes to a
        parts = planner.partitions(start, end)
        assert len(parts) >= 4 and sum(p.hi - p.lo for p in parts) == 350
        got = [body for p in parts for body in read_bodies(opts, p)]
        assert Counter(got) == Counter(bodies("a", 0, 250) + bodies("b", 0, 100))
        planner.commit(end)
        assert log_offsets(a, topic)["committed"] == 250 and log_offsets(b, topic)["committed"] == 100

        publish(a, topic, bodies("a", 300, 400))
        planner.prepare_available_now()  # the end is now fixed at a's 400
        publish(a, topic, bodies("a", 400, 450))
        assert planner.latest_offset(end, ReadAllAvailable())["nsqd"][a.tcp_address] == 400
    finally:
        planner.stop()

    def initial(**extra) -> dict:
        p = LogPlanner(
            source_options([a.tcp_address, b.tcp_address], topic, **extra),
            probe(opts, [a.tcp_address, b.tcp_address])[0],
        )
        try:
            return p.initial_offset()["nsqd"]
        finally:
            p.stop()

    assert initial() == {a.tcp_address: 250, b.tcp_address: 100}  # committed
    assert initial(startingOffsets="latest") == {a.tcp_address: 450, b.tcp_address: 100}
    assert initial(startingOffsets=json.dumps({a.tcp_address: 260, b.tcp_address: -1})) == {
        a.tcp_address: 260,
        b.tcp_address: 100,
    }
    assert initial(startingTimestamp=int(time.time() * 1000) + 60_000) == {a.tcp_address: 450, b.tcp_address: 100}
    with pytest.raises(Exception, match=r"asks offset 9999 of nsqd .* whose log holds \[250, 450\)"):
        initial(startingOffsets=json.dumps({a.tcp_address: 9999}))
    with pytest.raises(Exception, match="before the oldest retained|BEFORE_START"):
        read_bodies(opts, LogPartition(a.tcp_address, 10, 20))


def test_a_start_resolved_again_before_the_first_commit(nsqd_factory, topic):
    """Spark asks a restarted query's source for its start again until the first batch is committed (docs/spark.md, "A
    start that is resolved again"): ``committed``, fixed offsets and ``startingTimestamp`` give the same start,
    ``latest`` the end nsqd holds then."""
    a = nsqd_factory()
    publish(a, topic, bodies("a", 0, 100))
    addresses = [a.tcp_address]
    time.sleep(0.01)
    stamp = int(time.time() * 1000) + 1  # after the first 100 were published, before the next ones
    time.sleep(0.01)

    def start(**extra) -> int:
        opts = source_options(addresses, topic, **extra)
        planner = LogPlanner(opts, probe(opts, addresses)[0])
        try:
            return planner.initial_offset()["nsqd"][a.tcp_address]
        finally:
            planner.stop()

    first = {
        how: start(**extra)
        for how, extra in [
            ("committed", {}),
            ("latest", {"startingOffsets": "latest"}),
            ("fixed", {"startingOffsets": json.dumps({a.tcp_address: 40})}),
            ("timestamp", {"startingTimestamp": stamp}),
        ]
    }
    publish(a, topic, bodies("a", 100, 150))  # while the query is down, before its first commit
    again = {
        how: start(**extra)
        for how, extra in [
            ("committed", {}),
            ("latest", {"startingOffsets": "latest"}),
            ("fixed", {"startingOffsets": json.dumps({a.tcp_address: 40})}),
            ("timestamp", {"startingTimestamp": stamp}),
        ]
    }
    assert first == {"committed": 0, "latest": 100, "fixed": 40, "timestamp": 100}
    assert again == {"committed": 0, "latest": 150, "fixed": 40, "timestamp": 100}


def test_reader_rides_over_an_nsqd_restart(nsqd_at, tmp_path_factory, topic):
    port, data = free_port(), tmp_path_factory.mktemp("nsqd-restart")
    nsqd = nsqd_at(port, data, *DURABLE)
    publish(nsqd, topic, bodies("r", 0, 400))
    opts = source_options([nsqd.tcp_address], topic, fetchMaxBytes=2048, readRetryMs=30_000)
    LogNode(nsqd.tcp_address, opts).offsets()
    batches = read_partition(opts, LogPartition(nsqd.tcp_address, 0, 400))
    got = next(batches).column("body").to_pylist()
    nsqd.kill()
    threading.Timer(1.0, lambda: nsqd_at(port, data, *DURABLE)).start()
    for batch in batches:
        got += batch.column("body").to_pylist()
    assert got == bodies("r", 0, 400)


# -- an nsqd without log channels ----------------------------------------------------------------------


class NoLogProxy:
    """A TCP proxy in front of nsqd that answers ``LOG`` as NSQ's nsqd 1.3.0 answers an unknown
    command (``E_INVALID invalid command LOG``, then closes), and passes everything else on. It
    follows the client's commands only as far as it must to find their ends (plain V2, no
    upgrades): a command line, and after IDENTIFY, AUTH, PUB, MPUB and DPUB a sized body."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        server = socket.create_connection(self.target)

        def downstream() -> None:
            try:
                while data := server.recv(1 << 16):
                    client.sendall(data)
            except OSError:
                pass
            client.close()

        threading.Thread(target=downstream, daemon=True).start()
        reader = client.makefile("rb")
        try:
            server.sendall(reader.read(4))  # the magic
            while line := reader.readline():
                name = line.split(b" ", 1)[0].strip()
                if name == b"LOG":
                    self.refused += 1
                    error = b"E_INVALID invalid command LOG"
                    client.sendall(struct.pack(">ii", len(error) + 4, 1) + error)
                    break
                if name in (b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"):
                    size = reader.read(4)
                    line += size + reader.read(struct.unpack(">i", size)[0])
                server.sendall(line)
        except OSError:
            pass
        server.close()
        client.close()


def test_an_nsqd_without_log_channels_gets_the_driver_path(nsqd_factory, topic):
    nsqd = nsqd_factory()
    proxy = NoLogProxy(nsqd.tcp)
    try:
        opts = source_options([proxy.address], topic)
        with pytest.raises(NoLogChannels, match="invalid command LOG"):
            LogNode(proxy.address, opts).offsets()
        found, without = probe(
            source_options([nsqd.tcp_address, proxy.address], topic), [nsqd.tcp_address, proxy.address]
        )
        assert list(found) == [nsqd.tcp_address] and without == [proxy.address]
    finally:
        proxy.close()


# -- on the standalone cluster ----------------------------------------------------------------------


def start_query(spark, base: Path, options: dict, trigger: str = "100 milliseconds"):
    reader = spark.readStream.format("nsq")
    for key, value in {"channel": "spark", **options}.items():
        reader = reader.option(key, str(value))
    return (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(base / "out"))
        .option("checkpointLocation", str(base / "checkpoint"))
        .trigger(processingTime=trigger)
        .start()
    )


def wait_exactly_once(path: Path, expected: list[bytes], timeout: float, query=None) -> None:
    """Wait until the sink holds every expected body; then each must be there exactly once."""
    want = set(expected)

    def done():
        if query is not None and query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        rows = read_output(None, path)
        return rows if want <= {bytes(r.body) for r in rows} else None

    try:
        rows = wait_until(done, timeout, f"{len(want)} messages in the sink", interval=0.5)
    except AssertionError:
        have = {bytes(r.body) for r in read_output(None, path)}
        raise AssertionError(f"{len(want - have)} of {len(want)} missing, e.g. {sorted(want - have)[:5]}") from None
    counts = Counter(bytes(r.body) for r in rows)
    doubled = {b: n for b, n in counts.items() if n > 1}
    assert not doubled, f"{len(doubled)} messages more than once, e.g. {list(doubled.items())[:5]}"
    assert set(counts) == want


def test_cluster_backlog_and_live_messages_exactly_once_across_an_executor_kill(
    cluster, cluster_spark, nsqd_factory, tmp_path, topic
):
    """Two nsqd; one holds a backlog in an ordinary channel before the query starts (LOG converts
    it). Batches of at most 600 messages in at least 4 tasks; an executor JVM is killed with
    SIGKILL while a batch runs, the worker starts another, Spark runs the lost tasks again."""
    a, b = nsqd_factory(), nsqd_factory()
    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=spark"):
        urllib.request.urlopen(
            urllib.request.Request("http://{}:{}{}".format(*a.http(), path), method="POST"), timeout=10
        ).read()
    backlog = bodies("a", 0, 1500)
    publish(a, topic, backlog)
    query = start_query(
        cluster_spark,
        tmp_path,
        {
            "nsqd.tcp.addresses": f"{a.tcp_address},{b.tcp_address}",
            "topic": topic,
            "maxOffsetsPerTrigger": 600,
            "minPartitions": 4,
        },
    )
    live = bodies("b", 0, 1500)
    try:
        wait_until(lambda: drivers.planned_not_committed(tmp_path, 1), 120, "a second batch under way", interval=0.01)
        victim = cluster.executor_pids()[0]
        os.kill(victim, signal.SIGKILL)
        publish(b, topic, live)
        wait_exactly_once(tmp_path / "out", backlog + live, 180, query)
        progress = query.lastProgress or {}
        assert json.loads(progress["sources"][0]["endOffset"])["version"] == 2  # the log path
    finally:
        query.stop()
    assert victim not in cluster.executor_pids()
    assert log_offsets(a, topic)["committed"] > 0


def test_cluster_nsqd_killed_in_durable_mode_and_stopped_exactly_once(
    cluster_spark, nsqd_at, tmp_path, tmp_path_factory, topic
):
    """nsqd a (durable mode) dies with SIGKILL mid-stream and comes back on its data; then nsqd b is
    stopped (SIGTERM) and restarted. Tasks reading them dial again; the planner plans without the one
    that is away."""
    pa_, pb = free_port(), free_port()
    da, db = tmp_path_factory.mktemp("nsqd-a"), tmp_path_factory.mktemp("nsqd-b")
    a, b = nsqd_at(pa_, da, *DURABLE), nsqd_at(pb, db)
    first = bodies("a", 0, 1000) + bodies("b", 0, 1000)
    publish(a, topic, first[:1000])
    publish(b, topic, first[1000:])
    query = start_query(
        cluster_spark,
        tmp_path,
        {"nsqd.tcp.addresses": f"{a.tcp_address},{b.tcp_address}", "topic": topic, "maxOffsetsPerTrigger": 300},
    )
    try:
        wait_until(lambda: drivers.planned_not_committed(tmp_path, 1), 120, "a second batch under way", interval=0.01)
        a.kill()
        a = nsqd_at(pa_, da, *DURABLE)
        more = bodies("a", 1000, 1300)
        publish(a, topic, more)
        wait_until(lambda: drivers.planned_not_committed(tmp_path, 4), 120, "a fifth batch under way", interval=0.01)
        assert b.stop() == 0
        b = nsqd_at(pb, db)
        late = bodies("b", 1000, 1300)
        publish(b, topic, late)
        wait_exactly_once(tmp_path / "out", first + more + late, 180, query)
    finally:
        query.stop()


def test_an_nsqd_without_log_channels_makes_the_query_take_the_driver_path(
    cluster_spark, nsqd_factory, tmp_path, topic
):
    nsqd = nsqd_factory()
    proxy = NoLogProxy(nsqd.tcp)
    expected = bodies("d", 0, 600)
    publish(nsqd, topic, expected)
    try:
        with pytest.raises(Exception, match="readMode=log, but nsqd .* has no log channels"):
            query = start_query(
                cluster_spark,
                tmp_path / "refused",
                {"nsqd.tcp.addresses": proxy.address, "topic": topic, "readMode": "log"},
            )
            query.awaitTermination(120)
        query = start_query(
            cluster_spark, tmp_path, {"nsqd.tcp.addresses": proxy.address, "topic": topic, "walPath": tmp_path / "wal"}
        )
        try:
            wait_exactly_once(tmp_path / "out", expected, 120, query)
            assert json.loads(query.lastProgress["sources"][0]["endOffset"])["version"] == 1  # the driver path
        finally:
            query.stop()
        assert proxy.refused >= 2
    finally:
        proxy.close()


def test_cluster_driver_killed_and_restarted_on_its_checkpoint(cluster, nsqd_factory, tmp_path, topic):
    """The whole driver (a subprocess: Python, its JVM, the source runner) dies with SIGKILL while a
    batch is planned but not committed, its executors with it; a new driver (this process's session
    on the cluster) starts the query again on the same checkpoint: the batch that was under way is
    run again over the same ranges, and every message is in the sink once."""
    stop_cluster_session(cluster)  # the driver subprocess needs the cluster's cores
    a, b = nsqd_factory(), nsqd_factory()
    expected = bodies("a", 0, 400) + bodies("b", 0, 400)
    publish(a, topic, expected[:400])
    publish(b, topic, expected[400:])
    options = {
        "nsqd.tcp.addresses": f"{a.tcp_address},{b.tcp_address}",
        "topic": topic,
        "maxOffsetsPerTrigger": 100,
        "walPath": "/nonexistent",
    }  # a walPath given anyway is unused
    config = json.dumps(
        {
            "master": cluster.master_url,
            "conf": cluster.session_conf(),
            "base": str(tmp_path),
            "options": {"channel": "spark", **options},
            "trigger": "100 milliseconds",
        }
    )
    log_path = tmp_path / "driver.log"
    driver = drivers.launch("tests.spark.log_driver_app", [config], log_path)
    try:
        drivers.kill_mid_batch(driver, tmp_path, log_path, 1, 180)
    finally:
        drivers.reap(driver)
    assert "the log path" in log_path.read_text()
    assert len(read_output(None, tmp_path / "out")) < len(expected)
    query = start_query(session_on(cluster.master_url, cluster.session_conf()), tmp_path, options)
    try:
        wait_exactly_once(tmp_path / "out", expected, 180, query)
    finally:
        query.stop()
