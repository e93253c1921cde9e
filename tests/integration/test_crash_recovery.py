"""Start-up after a kill -9 in default mode: what a killed nsqd (trionsq or nsqd 1.3.0) leaves in a channel's disk
queue while its reader catches up with the writer, and what the next start makes of it: no false ERROR, no file
left behind, nothing read twice that the meta file records as read."""

from __future__ import annotations

import re
import threading
import time
import uuid

import pytest

from tests.integration.harness import ConnectionClosed, RawClient, rdy, sub
from tests.integration.persistence_helpers import DataDir, consume_exactly, create_channel, receive

#: 100-byte records (4-byte length, 26-byte header, 70-byte body): 10 per 1000-byte file
FLAGS = ("--mem-queue-size=0", "--max-bytes-per-file=1000")
RECORD = 100


def body(n: int) -> bytes:
    return b"%06d" % n + b"x" * 64


def errors(daemon) -> list[str]:
    return [line for line in daemon.log_text().splitlines() if " ERROR: " in line]


def queue_files(d: DataDir, queue: str) -> list[str]:
    return [f for f in d.files() if re.fullmatch(rf"{re.escape(queue)}\.diskqueue\.\d{{6}}\.dat", f)]


def wait_for_removal(d: DataDir, queue: str, before: int) -> None:
    """Read files are removed by the queue's worker, just after the read: wait (bounded) until no file of
    ``queue`` numbered below ``before`` is left."""
    deadline = time.monotonic() + 10
    while left := [f for f in queue_files(d, queue) if int(f[-10:-4]) < before]:
        assert time.monotonic() < deadline, f"{queue}: left behind {left[:5]}"
        time.sleep(0.01)


@pytest.mark.timeout(60)
def test_a_restart_after_a_kill_during_a_catch_up_reads_on_without_false_errors(data_dir):
    """Three files of a channel were written by a cleanly stopped nsqd; then each channel is put in the state a
    kill leaves while its reader catches up: ``removed`` as nsqd 1.3.0 (and go-diskqueue) leave it (file 0
    removed, the meta file still inside it), ``behind`` as this nsqd leaves it (the meta file past file 0, file 0
    not removed yet)."""
    d = data_dir(*FLAGS)
    daemon = d.start()
    topics = {kind: f"{kind}_{uuid.uuid4().hex[:8]}" for kind in ("removed", "behind")}
    for topic in topics.values():
        create_channel(daemon, topic, "c")
        with RawClient(daemon.tcp) as producer:
            producer.publish_many(topic, [body(n) for n in range(30)])
    d.stop()
    removed, behind = (f"{topics[kind]}:c" for kind in ("removed", "behind"))
    (d.path / f"{removed}.diskqueue.000000.dat").unlink()
    (d.path / f"{removed}.diskqueue.meta.dat").write_text(f"27\n0,{3 * RECORD}\n2,{10 * RECORD}\n")
    (d.path / f"{behind}.diskqueue.meta.dat").write_text(f"17\n1,{3 * RECORD}\n2,{10 * RECORD}\n")

    daemon = d.start()
    # file 1 from its start (three records there come again: the meta had not recorded them), then file 2
    assert sorted(m.body for m in consume_exactly(daemon, topics["removed"], "c", 20)) == [
        body(n) for n in range(10, 30)
    ]
    assert sorted(m.body for m in consume_exactly(daemon, topics["behind"], "c", 17)) == [
        body(n) for n in range(13, 30)
    ]
    assert errors(daemon) == []
    log = daemon.log_text()
    assert f"{removed}.diskqueue.000000.dat is missing, before the read position {3 * RECORD}" in log
    assert "data loss" not in log
    assert f"removing {d.path / behind}.diskqueue.000000.dat, read before the last stop" in log
    for queue in (removed, behind):
        wait_for_removal(d, queue, 2)
        assert queue_files(d, queue) == [f"{queue}.diskqueue.000002.dat"]


def _consume_until(address, topic: str, stop: threading.Event) -> None:
    """Channel ``c`` of ``topic`` consumed at ``address`` until ``stop`` is set or the connection goes."""
    try:
        with RawClient(address) as consumer:
            consumer.send(sub(topic, "c"))
            consumer.expect_ok()
            consumer.send(rdy(50))
            while not stop.is_set():
                receive(consumer, 1, timeout=10)
    except (ConnectionClosed, OSError, AssertionError, TimeoutError):
        return


@pytest.mark.timeout(180)
def test_kill_9_while_a_consumer_catches_up_restarts_without_errors(data_dir):
    """Publish and consume through many small files, SIGKILL nsqd at varying moments, restart, repeat: no start-up
    logs an ERROR, and no file the meta file records as read is left behind."""
    d = data_dir(*FLAGS, "--sync-timeout=50ms")
    topic = f"catchup_{uuid.uuid4().hex[:8]}"
    queue = f"{topic}:c"
    counter = iter(range(10**9))
    for round_ in range(5):
        daemon = d.start()
        assert errors(daemon) == [], f"round {round_}:\n" + "\n".join(errors(daemon))
        meta = d.path / f"{queue}.diskqueue.meta.dat"
        read_num = int(meta.read_text().split("\n")[1].split(",")[0]) if meta.exists() else 0
        daemon.wait_for_log(r"HTTP: listening on ", 10)
        wait_for_removal(d, queue, read_num)
        stop = threading.Event()
        consumer = threading.Thread(target=_consume_until, args=(daemon.tcp, topic, stop), daemon=True)
        with RawClient(daemon.tcp) as producer:
            producer.publish_many(topic, [body(next(counter)) for _ in range(200)])
            consumer.start()
            for _ in range(10 + 7 * round_):
                producer.publish_many(topic, [body(next(counter)) for _ in range(20)])
        d.kill()
        stop.set()
        consumer.join(30)
        assert not consumer.is_alive()
    daemon = d.start()
    assert errors(daemon) == []
