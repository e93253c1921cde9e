"""Fixtures of the Spark connector tests: one local[2] SparkSession shared by every test that
asks for it, nsqd and lookupd subprocesses, and helpers to publish and to wait for output.

Only a missing Java skips these tests; pyspark and pyarrow are installed by ``make test``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.harness import NsqdProcess, RawClient


def java_missing_reason() -> str | None:
    java = shutil.which("java")
    if java is None and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        java = str(candidate) if candidate.exists() else None
    if java is None:
        return "Java is not installed (Spark needs a JDK 17+ `java` on PATH or JAVA_HOME)"
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`java -version` failed: {exc}"
    return None


SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.minBatchesToRetain": "10",
    "spark.sql.adaptive.enabled": "false",
    "spark.python.worker.reuse": "true",
    "spark.ui.showConsoleProgress": "false",
}


def spark_env() -> dict[str, str]:
    """Environment for a Spark driver: its Python workers must be this interpreter (the one
    with spark_connector and pyarrow), and nothing may reach beyond loopback."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_HOSTNAME": "localhost",
    }


def build_session(master: str = "local[2]", conf: dict[str, str] | None = None):
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("trionsq-spark-tests")
    for key, value in {**SPARK_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def session_on(master: str, conf: dict[str, str] | None = None):
    """The SparkSession of this process on ``master``: one Spark context per process, so the
    session of another master (local mode, the test cluster) is stopped first."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkContext._active_spark_context
    if active is not None and active.master == master:
        return SparkSession.builder.getOrCreate()
    if active is not None:
        SparkSession.builder.getOrCreate().stop()
    session = build_session(master, conf)
    import spark_connector

    spark_connector.register(session)
    return session


@pytest.fixture(scope="session")
def _spark_process():
    """Stops whichever Spark context the tests left running, at the end of the run."""
    reason = java_missing_reason()
    if reason:
        pytest.skip(reason)
    yield
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        from pyspark.sql import SparkSession

        SparkSession.builder.getOrCreate().stop()


@pytest.fixture
def spark(_spark_process):
    """The local[2] session (shared by the tests; rebuilt if a cluster test replaced it)."""
    return session_on("local[2]")


@pytest.fixture(scope="session")
def cluster(_spark_process, tmp_path_factory):
    """A standalone master and two workers on 127.0.0.1, shared by the tests that ask for it."""
    from tests.spark.standalone import StandaloneCluster

    started = StandaloneCluster(tmp_path_factory.mktemp("standalone")).start()
    yield started
    stop_cluster_session(started)
    started.stop()


def stop_cluster_session(cluster) -> None:
    """Stop this process's session on ``cluster``, if any (it holds the cluster's cores)."""
    from pyspark import SparkContext

    active = SparkContext._active_spark_context
    if active is not None and active.master == cluster.master_url:
        from pyspark.sql import SparkSession

        SparkSession.builder.getOrCreate().stop()


@pytest.fixture
def cluster_spark(cluster):
    """A session whose executors are the cluster's (their own JVMs and Python workers)."""
    return session_on(cluster.master_url, cluster.session_conf())


@pytest.fixture
def nsqd_at(tmp_path_factory):
    """Start nsqd on a fixed TCP port (so a restart keeps its address): ``nsqd_at(port, data)``."""
    yield from nsqd_starter(tmp_path_factory, NsqdProcess)


def nsqd_starter(tmp_path_factory, kind: type[NsqdProcess]):
    """``nsqd_at``'s generator, for nsqd processes of ``kind``: yields ``start(port, data, *flags)``; stops those
    still running when resumed."""
    daemons: list[NsqdProcess] = []

    def start(port: int | None = None, data: Path | None = None, *args: str) -> NsqdProcess:
        data = data or tmp_path_factory.mktemp("nsqd")
        extra = [f"--tcp-address=127.0.0.1:{port}"] if port else []
        daemon = kind(data, [*extra, *args])
        daemons.append(daemon)
        return daemon.start()

    yield start
    for daemon in daemons:
        if daemon.is_running():
            daemon.stop()


def publish(nsqd: NsqdProcess, topic: str, bodies: list[bytes], chunk: int = 500) -> None:
    with RawClient(nsqd.tcp) as client:
        for i in range(0, len(bodies), chunk):
            client.publish_many(topic, bodies[i : i + chunk])


def bodies(prefix: str, start: int, stop: int) -> list[bytes]:
    return [f"{prefix}-{i:06d}".encode() for i in range(start, stop)]


@dataclass(frozen=True)
class OutputRow:
    id: str
    body: bytes
    nsqd: str


def committed_files(path: Path) -> list[str]:
    """Files a Parquet sink has committed, from its own log (``_spark_metadata``): files that a
    killed batch left behind are not in it, exactly as Spark's own reader sees the sink."""
    log_dir = path / "_spark_metadata"
    if not log_dir.exists():
        return []
    entries = [p for p in log_dir.iterdir() if p.name.split(".")[0].isdigit()]
    latest_compact = max((int(p.name.split(".")[0]) for p in entries if p.name.endswith(".compact")), default=-1)
    files: dict[str, bool] = {}
    for entry in sorted(entries, key=lambda p: int(p.name.split(".")[0])):
        if int(entry.name.split(".")[0]) < latest_compact:
            continue
        for line in entry.read_text().splitlines()[1:]:
            record = json.loads(line)
            files[record["path"]] = record.get("action", "add") == "add"
    return [urllib.parse.urlparse(p).path for p, added in files.items() if added]


def read_output(spark, path: Path) -> list[OutputRow]:
    """Rows of a Parquet sink committed so far (read with pyarrow, without a Spark job)."""
    import pyarrow.parquet as pq

    rows = []
    for file in committed_files(path):
        table = pq.read_table(file, columns=["id", "body", "nsqd"])
        for i, b, n in zip(*(table.column(c).to_pylist() for c in ("id", "body", "nsqd")), strict=True):
            rows.append(OutputRow(i, b, n))
    return rows


def wait_for_bodies(spark, path: Path, expected: set[bytes], timeout: float, query=None) -> list:
    """Wait until every expected body is in the sink; return all rows. Fails with what is missing
    (and the query's error, if it died)."""
    deadline = time.monotonic() + timeout
    rows: list = []
    while True:
        rows = read_output(spark, path)
        have = {bytes(r.body) for r in rows}
        if expected <= have:
            return rows
        if query is not None and query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        if time.monotonic() >= deadline:
            missing = sorted(expected - have)
            raise AssertionError(
                f"{len(missing)} of {len(expected)} messages missing after {timeout}s, e.g. {missing[:5]}"
            )
        time.sleep(0.5)


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def assert_exactly_once_after_dedup(rows: list, expected: set[bytes]) -> None:
    """Every message at least once; one row per (nsqd, id) once duplicates are dropped, and the
    bodies of those rows are exactly the published ones."""
    by_key: dict[tuple[str, str], bytes] = {}
    for row in rows:
        key = (row.nsqd, row.id)
        body = bytes(row.body)
        assert by_key.setdefault(key, body) == body, f"two bodies for message {key}"
    deduped = sorted(by_key.values())
    assert len(deduped) == len(expected), (len(deduped), len(expected))
    assert set(deduped) == expected


def topic_message_count(nsqd: NsqdProcess, topic: str) -> int:
    """nsqd's own count of the messages published to ``topic`` (/stats)."""
    from tests.integration.harness import http_get

    status, body = http_get(nsqd.http(), f"/stats?format=json&topic={topic}")
    assert status == 200, body
    return sum(t["message_count"] for t in json.loads(body)["topics"] or [] if t["topic_name"] == topic)


def consume_bodies(
    addresses: list[str], topic: str, wal: Path, count: int, timeout: float, expected: set[bytes] | None = None
) -> list[bytes]:
    """Consume ``topic`` from every nsqd (channel ``check``) with the connector's own consumer
    until ``count`` distinct messages (by nsqd and id) are in its log, and every body of
    ``expected`` if given; return their bodies."""
    from spark_connector.consumer import ConsumerGroup
    from spark_connector.options import SourceOptions

    options = SourceOptions.parse(
        {
            "nsqd.tcp.addresses": ",".join(addresses),
            "topic": topic,
            "channel": "check",
            "walPath": str(wal),
            "maxInFlight": "5000",
            "dedupWindow": str(2 * count),
        }
    )
    group = ConsumerGroup(options)
    group.start()
    try:

        def logged() -> list[bytes] | None:
            if sum(m.synced_end for m in group.wal.snapshot().values()) < count:
                return None
            found = []
            for mlog in group.wal.snapshot().values():
                columns = mlog.read(0, mlog.synced_end)
                pos = 0
                for size in columns.body_sizes:
                    found.append(columns.bodies[pos : pos + size])
                    pos += size
            return found if expected is None or expected <= set(found) else None

        return wait_until(logged, timeout, f"{count} messages of {topic} consumed", interval=0.2)
    finally:
        group.stop()
