"""Helpers for the persistence tests: one data directory served by successive nsqd processes, bulk consumption,
and readers of the on-disk files written from the file formats alone (NSQ's diskqueue and nsqd.dat)."""

from __future__ import annotations

import json
import re
import struct
import sys
import time
from pathlib import Path

from tests.integration.harness import (
    FRAME_TYPE_MESSAGE,
    ConnectionClosed,
    NsqdProcess,
    RawClient,
    fin,
    mpub,
    pub,
    rdy,
    sub,
)
from tests.integration.http_helpers import stats, wait_for

#: every file name nsqd 1.3.0 itself creates in a data directory
NSQ_FILE = re.compile(r"^(nsqd\.dat|.+\.diskqueue\.(meta|\d{6})\.dat)$")
#: trionsq's additions, which nsqd never opens: the deferred index (nsqd/queues/deferred_index.py) and the record
#: checksums of each segment (nsqd/queues/checksums.py)
SIDE_FILE = re.compile(r"^(.+\.deferred\.dat|.+\.diskqueue\.\d{6}\.dat\.crc)$")


class DataDir:
    """nsqd processes started one after another on the same data directory with the same flags."""

    def __init__(self, path: Path, args: list[str] | tuple[str, ...] = ()):
        self.path = Path(path)
        self.args = list(args)
        self.current: NsqdProcess | None = None
        self.all: list[NsqdProcess] = []

    def start(self, process_class=NsqdProcess, **kwargs) -> NsqdProcess:
        assert self.current is None or not self.current.is_running()
        daemon = process_class(self.path, self.args, **kwargs)
        self.all.append(daemon)
        self.current = daemon.start()
        return daemon

    def stop(self) -> None:
        """SIGTERM; the daemon must exit 0 (its shutdown is what writes the files)."""
        code = self.current.stop(timeout=30)
        assert code == 0, f"nsqd exited with {code}; log:\n{self.current.log_text()}"

    def kill(self) -> None:
        self.current.kill()

    def restart(self) -> NsqdProcess:
        self.stop()
        return self.start()

    def cleanup(self) -> None:
        for daemon in self.all:
            daemon.kill()

    def files(self) -> list[str]:
        return sorted(p.name for p in self.path.iterdir())


def data_dirs(tmp_path: Path, kind: type[DataDir]):
    """The ``data_dir`` fixture's generator: yields ``make(*flags)``, which makes a ``kind`` in a new directory
    under ``tmp_path``; cleans each up when resumed."""
    dirs: list[DataDir] = []

    def make(*args: str) -> DataDir:
        d = kind(tmp_path / f"data{len(dirs)}", args)
        d.path.mkdir()
        dirs.append(d)
        return d

    yield make
    for d in dirs:
        d.cleanup()


def http(daemon: NsqdProcess) -> tuple[str, int]:
    address = daemon.http(timeout=10)
    assert address is not None, daemon.log_text()
    return address


def channel_stats(daemon: NsqdProcess, topic: str, channel: str) -> dict:
    for t in stats(http(daemon), f"topic={topic}")["topics"] or []:
        for c in t["channels"] or []:
            if t["topic_name"] == topic and c["channel_name"] == channel:
                return c
    raise AssertionError(f"no channel {topic}:{channel} in /stats")


def create_channel(daemon: NsqdProcess, topic: str, channel: str) -> None:
    """SUB once and leave, so the (non-ephemeral) channel exists without a consumer."""
    with RawClient(daemon.tcp) as client:
        client.subscribe(topic, channel)


def receive(client: RawClient, count: int, timeout: float = 30.0, *, finish: bool = True) -> list:
    """Read ``count`` messages (FIN each, joined per read, unless ``finish`` is False)."""
    deadline = time.monotonic() + timeout
    got = []
    while len(got) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"received {len(got)} of {count} messages within {timeout}s")
        frame = client.read_frame(remaining)
        if frame.frame_type != FRAME_TYPE_MESSAGE:
            raise AssertionError(f"unexpected frame {frame}")
        message = decode(frame.data)
        got.append(message)
        if finish:
            client.send(fin(message.id))
    return got


def publish_until_stopped(address, topics: list[str], stop, counter, acknowledged) -> None:
    """PUBs and MPUBs of 5 at ``address``, to ``topics`` in turn, each waiting for its OK, until ``stop`` (a
    ``threading.Event``) is set or the connection goes; ``acknowledged(topic, bodies)`` after each OK. Bodies are
    numbered from ``counter`` (shared by the threads publishing)."""
    try:
        with RawClient(address) as producer:
            while not stop.is_set():
                topic = topics[next(counter) % len(topics)]
                batch = [b"p%07d" % next(counter) for _ in range(5)]
                if batch[0][-1] % 2:
                    batch = batch[:1]
                    producer.send(pub(topic, batch[0]))
                else:
                    producer.send(mpub(topic, batch))
                producer.expect_ok()
                acknowledged(topic, batch)
    except (ConnectionClosed, OSError, AssertionError):
        return


def consume_holding_some(address, topic: str, stop, received, key=lambda body: body) -> None:
    """Channel ``c`` of ``topic`` consumed at ``address`` (RDY 25) until ``stop`` (a ``threading.Event``) is set or
    the connection goes, each message counted in ``received`` (a ``Counter``) under ``key(body)``; every ninth
    stays in flight, for a crash to meet."""
    try:
        with RawClient(address) as consumer:
            consumer.send(sub(topic, "c"))
            consumer.expect_ok()
            consumer.send(rdy(25))
            n = 0
            while not stop.is_set():
                (m,) = receive(consumer, 1, timeout=30, finish=False)
                received[key(m.body)] += 1
                n += 1
                if n % 9:
                    consumer.send(fin(m.id))
    except (ConnectionClosed, OSError, AssertionError, TimeoutError):
        return


def consume_exactly(daemon: NsqdProcess, topic: str, channel: str, count: int, timeout: float = 30.0) -> list:
    """Subscribe, take ``count`` messages without finishing them, then check that the channel holds nothing else:
    with every one of them in flight, depth 0 proves there was no extra message."""
    with RawClient(daemon.tcp) as client:
        client.send(sub(topic, channel))
        client.expect_ok()
        client.send(rdy(min(max(count, 1) + 1, 2500)))
        got = receive(client, count, timeout, finish=False)
        c = channel_stats(daemon, topic, channel)
        assert (c["depth"], c["deferred_count"], c["in_flight_count"]) == (0, 0, count), c
        for message in got:
            client.send(fin(message.id))
        client.send(b"NOP\n")
    return got


def decode(data: bytes):
    from protocol.message import decode_message

    return decode_message(data)


# -- the files, read from the formats alone -------------------------------------------------------------------
def read_queue(path: Path, name: str) -> list[bytes]:
    """The unread records of diskqueue ``name``: meta positions, then ``[int32 length][payload]`` records."""
    depth, read, write = (path / f"{name}.diskqueue.meta.dat").read_text("ascii").split("\n")[:3]
    read_num, read_pos = map(int, read.split(","))
    write_num, write_pos = map(int, write.split(","))
    records = []
    for num in range(read_num, write_num + 1):
        file = path / f"{name}.diskqueue.{num:06d}.dat"
        blob = file.read_bytes() if file.exists() else b""
        pos = read_pos if num == read_num else 0
        end = write_pos if num == write_num else len(blob)
        while pos < end:
            (size,) = struct.unpack_from(">i", blob, pos)
            records.append(blob[pos + 4 : pos + 4 + size])
            pos += 4 + size
        assert pos == end, f"{file}: records end at {pos}, expected {end}"
    assert len(records) == int(depth), f"{name}: meta depth {depth}, {len(records)} records"
    return records


def parse_record(record: bytes) -> tuple[int, int, bytes, bytes]:
    """``(timestamp ns, attempts, id, body)`` of one diskqueue record."""
    timestamp, attempts = struct.unpack_from(">qH", record)
    return timestamp, attempts, record[10:26], record[26:]


def make_record(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    assert len(msg_id) == 16
    return struct.pack(">qH", timestamp, attempts) + msg_id + body


def framed(records: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(r)) + r for r in records)


def metadata(path: Path) -> dict:
    return json.loads((path / "nsqd.dat").read_bytes())


def wait_for_metadata(path: Path, condition, timeout: float = 10.0) -> dict:
    """nsqd.dat once ``condition(document)`` holds: creates and deletes are written shortly after they are
    answered, as in nsqd (its goroutine), not before."""

    def ready() -> dict | None:
        document = metadata(path)
        return document if condition(document) else None

    return wait_for(ready, timeout, message="nsqd.dat to follow")


def limited_process_class(max_file_size: int):
    """An NsqdProcess whose files may not grow past ``max_file_size`` bytes (RLIMIT_FSIZE): writes beyond fail with
    EFBIG, as on a full disk. ``resource.prlimit(pid, ...)`` lifts the limit later."""

    class LimitedNsqd(NsqdProcess):
        @property
        def argv(self) -> list[str]:
            flags = super().argv[3:]  # after [python, -m, nsqd]
            boot = (
                "import resource, runpy, sys; "
                f"resource.setrlimit(resource.RLIMIT_FSIZE, ({max_file_size}, "
                "resource.getrlimit(resource.RLIMIT_FSIZE)[1])); "
                "runpy.run_module('nsqd', run_name='__main__', alter_sys=True)"
            )
            return [sys.executable, "-c", boot, *flags]

    return LimitedNsqd


__all__ = [
    "ConnectionClosed",
    "DataDir",
    "NSQ_FILE",
    "SIDE_FILE",
    "channel_stats",
    "consume_exactly",
    "consume_holding_some",
    "publish_until_stopped",
    "create_channel",
    "data_dirs",
    "framed",
    "http",
    "limited_process_class",
    "make_record",
    "metadata",
    "parse_record",
    "read_queue",
    "receive",
]
