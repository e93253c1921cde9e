"""Scenario: a node grown to thousands of topics, channels and idle consumers; what each one costs.

One nsqd is grown in steps, and each step is measured as it goes:

1. ``--topics`` topics (default 10,000) created one at a time with ``POST /topic/create`` on one keep-alive
   connection. Row ``create topic @N``: the mean round trip of the creates just before the N-th (at 100, 1,000 and
   10,000 by default: the last 500, or half of those made so far), beside the mean round trip of ``GET /ping`` on
   the same connection at the same moment (every tenth create is followed by one, so both follow a create): a
   create should cost no more than a plain request, whatever N. The medians beside them are the typical round
   trips: a stall of a millisecond among the 5 to 50 pings of a window moves their mean by 2-20%.
   Meanwhile another process publishes to a topic of its own on another TCP connection, one ``PUB`` at a time
   every millisecond; row ``PUB while creating``: the p50/p99/max of those round trips (a create that holds the
   event loop shows here). Row ``PUB, nothing else``: the same for ``--quiet-probe`` seconds before any create,
   the machine's noise floor.
2. ``--channels-per-topic`` channels per topic (default 2: 20,000) with ``POST /channel/create``.
3. ``--consumers`` idle consumers (default 5,000): a connection each, ``SUB`` to the first channel of as many
   topics, ``RDY 1``; nothing is published to them. They answer heartbeats.
4. ``/stats`` (JSON and text, with ``topic=``, ``channel=``, ``include_clients=false``) and ``/metrics``: wall
   time per request (median of ``--stats-repeats``) and nsqd CPU per request; the ``admin poll`` column is the share
   of a core that one poll of that request every 5 s costs (nsqadmin polls every node). The ``topics changed`` rows
   publish one message to each of ``--changed-topics`` topics (1,000, spread over all) before each request: what a
   request costs on a node in use, where those topics and their channels have changed since the last one.
5. Idle: nsqd's CPU over ``--idle`` seconds (30: one heartbeat interval, so each idle connection is sent one
   heartbeat, and answers it, within the window) with nothing else to do but keep the topics, channels and
   connections.
6. Full collection: ``POST /debug/freememory`` (a full collection of the interpreter's heap; the collector makes
   one by itself each time the long-lived objects have grown by a quarter, and one falling in the idle window is
   most of that window's CPU): its time follows the number of objects each topic, channel and connection keeps.
   Row ``first``: the one the growth left owed; row ``again``: the median of ``--stats-repeats`` more.

Memory: nsqd's resident set before and after each step gives the bytes per topic, per channel (no consumer) and
per idle connection (its consumer included), in the ``memory`` rows.

The PUB probe and the idle consumers speak V2 with raw sockets, as ``bench.load``'s generators do, not through the
``trionsq`` client: they measure nsqd's round trips and the cost of 5,000 connections to nsqd, with no client code in
between (5,000 client connections would also cost this process more than the consumers' one selector thread).

As every generator, the scenario's own clients (the HTTP connection, the PUB probe, the idle consumers' thread) run
on the CPUs nsqd is not pinned to (unless ``--no-pin``): on the server's core, each of their wake-ups took it from
nsqd, and the round trips measured were theirs as much as nsqd's.

The whole run takes about two minutes on our 2-core machine. A variant that grows nsqlookupd's registry instead is
the ``many_lookupd`` scenario.
"""

from __future__ import annotations

import multiprocessing
import os
import selectors
import socket
import statistics
import struct
import threading
import time

from bench.common import Report, Target, generator_cpus, main, percentile, unique_topic
from protocol.commands import MAGIC_V2, encode_pub, encode_rdy, encode_sub

NAME = "many"
TITLE = "a node grown to 10,000 topics, 20,000 channels and 5,000 idle consumers: cost per object"

#: one admin poll of a node every this many seconds (nsqadmin's refresh)
ADMIN_POLL_INTERVAL = 5.0

_header = struct.Struct(">ii")


def add_arguments(parser) -> None:
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument(
        "--checkpoints",
        default="100,1000,10000",
        help="topic counts at which the create time is reported (comma-separated)",
    )
    parser.add_argument("--channels-per-topic", type=int, default=2)
    parser.add_argument("--consumers", type=int, default=5_000)
    parser.add_argument(
        "--idle",
        type=float,
        default=30.0,
        help="seconds of idle CPU measured (default: nsqd's heartbeat interval, so that every "
        "connection's heartbeat falls in the window once)",
    )
    parser.add_argument("--stats-repeats", type=int, default=5)
    parser.add_argument(
        "--changed-topics",
        type=int,
        default=1000,
        help="topics published to before each request of the 'topics changed' rows",
    )
    parser.add_argument("--settle", type=float, default=1.0, help="seconds waited before each memory reading")
    parser.add_argument(
        "--quiet-probe",
        type=float,
        default=3.0,
        help="seconds of PUB round trips measured before any topic is created (the noise floor)",
    )


# -- a keep-alive HTTP client ------------------------------------------------------------------------


class HttpClient:
    """One keep-alive HTTP/1.1 connection with blocking round trips (the server must answer with Content-Length)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.sock = socket.create_connection(address, timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        self.sock.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        )
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            self.buffer = rest
            self._fill()
            rest = self.buffer
        self.buffer = rest[length:]
        return status, rest[:length]

    def timed(self, method: str, path: str, body: bytes = b"") -> float:
        """The round trip of one request, in seconds; raises on a status other than 200."""
        started = time.perf_counter()
        status, data = self.request(method, path, body)
        elapsed = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"{method} {path}: {status} {data[:200]!r}")
        return elapsed

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("the server closed the HTTP connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


# -- the PUB probe (its own process, so that the client side's GIL never shows in the round trips) -----------


def _probe(address: tuple[str, int], topic: str, stop, pipe) -> None:
    sock = socket.create_connection(address, timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(MAGIC_V2)
    frame = encode_pub(topic, b"p" * 100)
    latencies = []
    buffer = b""
    pipe.send("ready")
    while not stop.is_set():
        started = time.perf_counter()
        sock.sendall(frame)
        while len(buffer) < 4 or len(buffer) < 4 + _header.unpack_from(buffer)[0]:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("nsqd closed the probe connection")
            buffer += chunk
        size = _header.unpack_from(buffer)[0]
        buffer = buffer[4 + size :]
        latencies.append(time.perf_counter() - started)
        time.sleep(0.001)
    sock.close()
    pipe.send(latencies)


class PubProbe:
    """``PUB`` round trips on a connection of their own, from another process, while the scenario runs."""

    def __init__(self, address: tuple[str, int], topic: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=_probe, args=(address, topic, self.stop, child), daemon=True)
        self.process.start()
        if not self.pipe.poll(60):
            raise RuntimeError("the PUB probe did not start")
        self.pipe.recv()

    def finish(self) -> list[float]:
        self.stop.set()
        if not self.pipe.poll(60):
            raise RuntimeError("the PUB probe did not report")
        latencies = self.pipe.recv()
        self.process.join(10)
        return sorted(latencies)


# -- growing ----------------------------------------------------------------------------------------

#: creates measured before each checkpoint (fewer at the first ones: half the topics made so far)
WINDOW = 500


def grow_topics(http: HttpClient, names: list[str], checkpoints: list[int]) -> list[dict]:
    """Create ``names`` one by one with ``POST /topic/create``; at each checkpoint, the mean create round trip
    over the last creates before it and the mean ``/ping`` round trip measured among them (milliseconds)."""
    creates: list[float] = []
    pings: list[float] = []  # (index of the create it followed, round trip)
    rows = []
    pending = sorted(checkpoints)
    for index, name in enumerate(names, 1):
        creates.append(http.timed("POST", f"/topic/create?topic={name}"))
        if index % 10 == 0:
            pings.append((index, http.timed("GET", "/ping")))
        if pending and index == pending[0]:
            pending.pop(0)
            window = max(10, min(WINDOW, index // 2))
            recent = creates[index - window : index]
            recent_pings = [rt for at, rt in pings if at > index - window] or [pings[-1][1]]
            rows.append(
                {
                    "step": f"create topic @{index:,}",
                    "count": index,
                    "ms": statistics.fmean(recent) * 1e3,
                    "ping ms": statistics.fmean(recent_pings) * 1e3,
                    "median ms": statistics.median(recent) * 1e3,
                    "ping median ms": statistics.median(recent_pings) * 1e3,
                }
            )
            print(f"  {rows[-1]['step']}: {rows[-1]['ms']:.3f} ms (ping {rows[-1]['ping ms']:.3f} ms)", flush=True)
    return rows


def grow_channels(http: HttpClient, topics: list[str], per_topic: int) -> float:
    """Create ``per_topic`` channels on each topic; the mean round trip in milliseconds."""
    times = [
        http.timed("POST", f"/channel/create?topic={topic}&channel=c{index}")
        for topic in topics
        for index in range(per_topic)
    ]
    return statistics.fmean(times) * 1e3 if times else 0.0


class IdleConsumers:
    """``count`` consumer connections, each subscribed with ``RDY 1`` to a channel no one publishes to; a thread
    answers their heartbeats until ``close``."""

    def __init__(self, address: tuple[str, int], subscriptions: list[tuple[str, str]], batch: int = 250) -> None:
        self.sockets: list[socket.socket] = []
        self.heartbeats = 0
        for start in range(0, len(subscriptions), batch):
            group = []
            for topic, channel in subscriptions[start : start + batch]:
                sock = socket.create_connection(address, timeout=60)
                sock.sendall(MAGIC_V2 + encode_sub(topic, channel) + encode_rdy(1))
                group.append(sock)
            for sock in group:
                frame_type, data = _read_frame(sock)
                if frame_type != 0 or data != b"OK":
                    raise RuntimeError(f"SUB failed: {data[:200]!r}")
                sock.setblocking(False)
            self.sockets.extend(group)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._answer, daemon=True)
        self._thread.start()

    def _answer(self) -> None:
        selector = selectors.DefaultSelector()
        for sock in self.sockets:
            selector.register(sock, selectors.EVENT_READ)
        while not self._stop.is_set():
            for key, _ in selector.select(0.2):
                try:
                    data = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                count = data.count(b"_heartbeat_")
                if count:
                    self.heartbeats += count
                    key.fileobj.send(b"NOP\n" * count)
        selector.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in self.sockets:
            sock.close()


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while len(data) < 8:
        chunk = sock.recv(8 - len(data))
        if not chunk:
            raise RuntimeError("nsqd closed a consumer connection")
        data += chunk
    size, frame_type = _header.unpack(data)
    body = b""
    while len(body) < size - 4:
        chunk = sock.recv(size - 4 - len(body))
        if not chunk:
            raise RuntimeError("nsqd closed a consumer connection")
        body += chunk
    return frame_type, body


def measure_stats(http: HttpClient, sampler, paths: list[str], repeats: int) -> list[dict]:
    """Per path: median wall time of ``repeats`` requests, nsqd CPU per request, and the share of a core that one
    request every ``ADMIN_POLL_INTERVAL`` seconds costs."""
    rows = []
    for path in paths:
        http.timed("GET", path)  # warm
        cpu_before = sampler.cpu_seconds()
        times = [http.timed("GET", path) for _ in range(repeats)]
        cpu = (sampler.cpu_seconds() - cpu_before) / repeats
        size = len(http.request("GET", path)[1])
        rows.append(
            {
                "step": f"GET {path}",
                "ms": statistics.median(times) * 1e3,
                "cpu ms": cpu * 1e3 if sampler.pid else None,
                "KB": size / 1e3,
                "admin poll": cpu / ADMIN_POLL_INTERVAL if sampler.pid else None,
            }
        )
    return rows


def measure_stats_changing(http: HttpClient, sampler, paths: list[str], topics: list[str], repeats: int) -> list[dict]:
    """Per path: the same figures while the node is not idle: before each request one message is published to each
    of ``topics`` (so that they and their channels have changed since the last request, as on a node in use); only
    the requests' CPU is counted, not the publishes'."""
    rows = []
    for path in paths:
        times, cpu = [], 0.0
        for _ in range(repeats):
            for topic in topics:
                status, body = http.request("POST", f"/pub?topic={topic}", b"m")
                if status != 200:
                    raise RuntimeError(f"/pub answered {status}: {body[:200]!r}")
            time.sleep(0.05)  # the topics' pumps hand the messages to the channels
            cpu_before = sampler.cpu_seconds()
            times.append(http.timed("GET", path))
            cpu += sampler.cpu_seconds() - cpu_before
        rows.append(
            {
                "step": f"GET {path}, {len(topics):,} topics changed",
                "ms": statistics.median(times) * 1e3,
                "cpu ms": cpu / repeats * 1e3 if sampler.pid else None,
                "admin poll": cpu / repeats / ADMIN_POLL_INTERVAL if sampler.pid else None,
            }
        )
    return rows


def idle_cpu(sampler, seconds: float) -> float:
    """nsqd's CPU over ``seconds`` of waiting, as a share of one core."""
    before = sampler.cpu_seconds()
    time.sleep(seconds)
    return (sampler.cpu_seconds() - before) / seconds


def full_collection(http: HttpClient, sampler, repeats: int) -> list[dict]:
    """``POST /debug/freememory`` (a full collection of the interpreter's heap): wall time and nsqd CPU of the first
    request, then the median wall time and CPU per request of ``repeats`` more. The collector makes one by itself
    each time the long-lived objects have grown by a quarter; the first request makes the one the growth left
    owed, the others show what one costs once nothing has changed."""
    rows = []
    for step, count in (("first", 1), ("again", repeats)):
        times = []
        cpu_before = sampler.cpu_seconds()
        for _ in range(count):
            times.append(http.timed("POST", "/debug/freememory"))
        cpu = (sampler.cpu_seconds() - cpu_before) / count
        rows.append(
            {
                "step": f"full collection (POST /debug/freememory), {step}",
                "count": count,
                "ms": statistics.median(times) * 1e3,
                "cpu ms": cpu * 1e3 if sampler.pid else None,
            }
        )
    return rows


def _rss(sampler, settle: float) -> int:
    time.sleep(settle)
    return sampler.rss_bytes()


def run(args) -> Report:
    checkpoints = sorted({int(value) for value in args.checkpoints.split(",") if int(value) <= args.topics})
    report = Report(
        NAME,
        TITLE,
        params={
            "topics": args.topics,
            "channels_per_topic": args.channels_per_topic,
            "consumers": args.consumers,
            "idle_s": args.idle,
        },
    )
    with Target(args, [], want_http=True) as target:
        if target.http is None:
            report.skipped = "the server has no HTTP listener"
            return report
        report.target = target.describe()
        if args.pin and target.proc is not None:
            os.sched_setaffinity(0, set(generator_cpus()))  # this process and the probe it starts (see above)
        sampler = target.sampler()
        prefix = unique_topic(NAME)
        topics = [f"{prefix}_{index}" for index in range(args.topics)]
        http = HttpClient(target.http)
        try:
            http.timed("GET", "/ping")
            rss_start = _rss(sampler, args.settle)
            probe = PubProbe(target.tcp, f"{prefix}_probe")
            time.sleep(args.quiet_probe)
            quiet = probe.finish()
            report.rows.append(
                {
                    "step": "PUB, nothing else",
                    "count": len(quiet),
                    "ms": percentile(quiet, 0.5) * 1e3 if quiet else None,
                    "p99 ms": percentile(quiet, 0.99) * 1e3 if quiet else None,
                    "max ms": quiet[-1] * 1e3 if quiet else None,
                }
            )
            probe = PubProbe(target.tcp, f"{prefix}_probe")
            started = time.monotonic()
            cpu_before = sampler.cpu_seconds()
            rows = grow_topics(http, topics, checkpoints)
            create_cpu = (sampler.cpu_seconds() - cpu_before) / max(len(topics), 1)
            elapsed = time.monotonic() - started
            latencies = probe.finish()
            for row in rows:
                row["create/ping"] = row["ms"] / row["ping ms"]
                row["median create/ping"] = row["median ms"] / row["ping median ms"]
            if rows:
                rows[-1]["cpu ms"] = create_cpu * 1e3 if sampler.pid else None
            report.rows += rows
            report.rows.append(
                {
                    "step": "PUB while creating",
                    "count": len(latencies),
                    "ms": percentile(latencies, 0.5) * 1e3 if latencies else None,
                    "p99 ms": percentile(latencies, 0.99) * 1e3 if latencies else None,
                    "max ms": latencies[-1] * 1e3 if latencies else None,
                }
            )
            report.notes.append(f"{len(topics):,} topics created in {elapsed:.1f} s")
            rss_topics = _rss(sampler, args.settle)

            channel_ms = grow_channels(http, topics, args.channels_per_topic)
            channels = len(topics) * args.channels_per_topic
            report.rows.append({"step": f"create channel @{channels:,}", "count": channels, "ms": channel_ms})
            print(f"  {channels:,} channels: {channel_ms:.3f} ms each", flush=True)
            rss_channels = _rss(sampler, args.settle)

            consumers = IdleConsumers(
                target.tcp, [(topics[index % len(topics)], "c0") for index in range(min(args.consumers, len(topics)))]
            )
            print(f"  {len(consumers.sockets):,} idle consumers connected", flush=True)
            try:
                rss_consumers = _rss(sampler, args.settle)
                topic = topics[0]
                report.rows += measure_stats(
                    http,
                    sampler,
                    [
                        "/stats?format=json",
                        "/stats",
                        "/stats?format=json&include_clients=false",
                        f"/stats?format=json&topic={topic}",
                        f"/stats?format=json&topic={topic}&channel=c0",
                        f"/stats?topic={topic}",
                        "/metrics",
                    ],
                    args.stats_repeats,
                )
                report.rows += measure_stats_changing(
                    http,
                    sampler,
                    ["/stats?format=json", "/stats?format=json&include_clients=false", "/metrics"],
                    topics[:: max(len(topics) // max(args.changed_topics, 1), 1)][: args.changed_topics],
                    args.stats_repeats,
                )
                if args.idle > 0:  # --idle 0: no idle window
                    time.sleep(args.settle)
                    share = idle_cpu(sampler, args.idle)
                    report.rows.append(
                        {
                            "step": "idle",
                            "count": len(consumers.sockets),
                            "cpu share": share if sampler.pid else None,
                            "heartbeats": consumers.heartbeats,
                        }
                    )
                report.rows += full_collection(http, sampler, args.stats_repeats)
            finally:
                consumers.close()
        finally:
            http.close()
    if sampler.pid:
        report.rows.append(
            {
                "step": "memory",
                "count": len(topics),
                "topic KB": (rss_topics - rss_start) / len(topics) / 1e3,
                "channel KB": (rss_channels - rss_topics) / max(channels, 1) / 1e3,
                "connection KB": (rss_consumers - rss_channels) / max(len(consumers.sockets), 1) / 1e3,
                "rss MB": rss_consumers / 1e6,
            }
        )
    report.targets = {
        "create topic": "flat: within 1.2x from @100 to @10,000, and no more than a /ping round trip",
        "PUB while creating": "p99 under 2 ms",
        "GET /stats?format=json": "at least as fast as nsqd 1.3.0 (29 ms for 4,000 topics on this kind of machine); "
        "under 70 ms (nsqd's time scaled to 10,000 topics) at the least",
        "GET /stats (text), /metrics": "in the range of /stats?format=json",
        "idle": "cpu share under 0.02 (2% of a core)",
    }
    report.notes.append(
        "ms = mean round trip (median for GETs); 'cpu ms' = nsqd CPU per request; 'admin poll' = "
        f"share of a core for one such request every {ADMIN_POLL_INTERVAL:.0f} s"
    )
    return report


__all__ = [
    "HttpClient",
    "IdleConsumers",
    "PubProbe",
    "full_collection",
    "grow_channels",
    "grow_topics",
    "idle_cpu",
    "measure_stats",
    "measure_stats_changing",
    "run",
]

if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
