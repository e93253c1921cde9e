"""A backlog larger than the heaps that read it, with the source's default options, on the
standalone cluster: a driver of 512 MiB (about the least Spark starts with) and the cluster's
executors of 512 MiB read a topic of 576 MiB, the driver path on one channel (every message passes
through the driver) and the log path on another (every message passes through an executor), side
by side, with Trigger.AvailableNow, to the end. Neither may run out of memory: the driver path cuts
its batches to ``maxBytesPerTrigger`` (default 32 MiB), the log path streams what a task reads
(``fetchMaxBytes`` per answer). The driver path delivers at least once, the log path exactly once.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter

import pytest

from spark_connector.options import DEFAULT_MAX_BYTES_PER_TRIGGER
from tests.spark import drivers
from tests.spark.conftest import committed_files, publish, stop_cluster_session, wait_until
from tests.spark.test_available_now import nsqd_with_http_next

pytestmark = pytest.mark.timeout(600)

DRIVER_MEMORY = "512m"
BODY_SIZE = 16384
MESSAGES = 36 * 1024  # 576 MiB of bodies
CHANNELS = ("driver", "log")


def body(i: int) -> bytes:
    return b"%08d" % i + b"." * (BODY_SIZE - 8)


def numbers_read(out) -> Counter:
    """How often each message (by the number its body starts with) is in a Parquet sink's committed files."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    seen: Counter = Counter()
    for file in committed_files(out):
        for batch in pq.ParquetFile(file).iter_batches(batch_size=8192, columns=["body"]):
            seen.update(int(b) for b in pc.binary_slice(batch.column(0), 0, 8).to_pylist())
    return seen


def test_backlog_larger_than_the_heaps_is_read_on_both_paths(cluster, nsqd_at, tmp_path, topic):
    stop_cluster_session(cluster)  # the driver subprocess needs the cluster's cores
    nsqd = nsqd_with_http_next(nsqd_at)  # Trigger.AvailableNow on the driver path asks its /stats
    address = nsqd.tcp_address
    # the two channels first, so that each gets every message: the driver path's is an ordinary
    # channel, the log path's becomes a log channel at its first LOG (its backlog with it)
    host, port = nsqd.http()
    for path in (f"/topic/create?topic={topic}", *(f"/channel/create?topic={topic}&channel={c}" for c in CHANNELS)):
        urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}{path}", method="POST"), timeout=10).read()
    for start in range(0, MESSAGES, 1024):
        publish(nsqd, topic, [body(i) for i in range(start, start + 1024)], chunk=128)
    common = {"nsqd.tcp.addresses": address, "topic": topic}
    config = {
        "master": cluster.master_url,
        "conf": {**cluster.session_conf(), "spark.driver.memory": DRIVER_MEMORY},
        "base": str(tmp_path),
        "queries": {
            "driver": {**common, "channel": "driver", "readMode": "driver", "walPath": str(tmp_path / "wal")},
            "log": {**common, "channel": "log", "readMode": "log"},
        },
    }
    log_path = tmp_path / "driver.log"
    driver = drivers.launch("tests.spark.backlog_app", [json.dumps(config)], log_path)
    try:
        # a JVM out of memory stalls the query rather than ending it: fail at the first sign of one
        wait_until(
            lambda: driver.poll() is not None or "OutOfMemoryError" in log_path.read_text(),
            540,
            "the driver to read both backlogs",
            interval=1,
        )
        status = driver.poll()
    finally:
        drivers.reap(driver)
    output = log_path.read_text()
    assert "OutOfMemoryError" not in output, output[-5000:]
    assert status == 0, output[-5000:]
    assert f"carries at most {DEFAULT_MAX_BYTES_PER_TRIGGER} bytes" in output  # the driver path's default bound applied
    expected = set(range(MESSAGES))
    on_driver_path = numbers_read(tmp_path / "driver" / "out")
    assert expected <= set(on_driver_path), f"{len(expected - set(on_driver_path))} messages missing"
    on_log_path = numbers_read(tmp_path / "log" / "out")
    assert set(on_log_path) == expected
    assert max(on_log_path.values()) == 1
    batches = [int(line.split()[2]) for line in output.splitlines() if line.startswith("BATCH driver ")]
    assert len([n for n in batches if n > 0]) >= 18, batches  # 576 MiB in batches of at most 32 MiB
