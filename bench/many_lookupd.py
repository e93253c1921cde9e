"""Many topics in nsqlookupd: the registration storm after a lookupd restart, and ``/lookup`` while it happens.

A fresh nsqlookupd per row. ``--nodes`` simulated nsqd (raw V1 lookup protocol clients, ``protocol.lookup_v1``)
connect at once and each registers ``--topics`` topics (and ``--channels`` channels per topic) right after its
IDENTIFY, as nsqd does after (re)connecting: one command at a time, each waiting for its ``OK`` (nsqd gives each
command 1 s; ``over 1s`` counts the commands that took longer, after which a real nsqd would drop the connection
and start again). Node ``n`` registers the topics ``(n * 200 + k) mod 10,000`` for ``k < --topics``, so with 50
nodes of 1,000 topics every topic of the 10,000 has 5 producers.

Meanwhile a separate process asks ``/lookup`` for one of node 0's topics, one request at a time on a keep-alive
connection, for the whole storm and ``--after`` seconds past its end. Figures: the seconds from the first
connect to the last ``OK``, registrations per second and lookupd CPU microseconds per registration until then
(both should stay flat as the row grows), ``/lookup`` p50/p99 during the storm and after it, one ``/nodes``
(the admin's node list) and ``/topics`` after, and lookupd's resident set. Rows grow the node count
(``--sizes``, default 10,25,50) so that a cost growing faster than linearly shows as a falling rate. Run it
as ``python -m bench.many_lookupd``; the machine is shared by lookupd, the simulated nodes and the prober.
"""

from __future__ import annotations

import http.client
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time

import trio

from bench.common import REPO_ROOT, ProcessSampler, Report, main, parse_address, percentile
from protocol.lookup_v1 import MAGIC_V1, ResponseDecoder, encode_identify, encode_register

NAME = "many_lookupd"
TITLE = "nsqlookupd: registration storm of N nsqd x 1,000 topics, /lookup latency during and after"

POOL = 10_000
STRIDE = 200
COMMAND_TIMEOUT = 1.0  # nsqd's deadline per lookupd command
_LISTENING = re.compile(r"(TCP|HTTP): listening on (\S+)")


def add_arguments(parser) -> None:
    parser.add_argument("--sizes", default="10,25,50", help="comma-separated simulated nsqd counts, one row each")
    parser.add_argument("--topics", type=int, default=1000, help="topics each simulated nsqd registers")
    parser.add_argument("--channels", type=int, default=0, help="channels registered per topic")
    parser.add_argument("--after", type=float, default=3.0, help="seconds /lookup is measured after the storm")


class Lookupd:
    """A fresh ``python -m lookupd`` on 127.0.0.1 with ports picked by the kernel; its log is drained."""

    def __enter__(self) -> Lookupd:
        argv = [sys.executable, "-m", "lookupd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        self.addresses: dict[str, tuple[str, int]] = {}
        ready = threading.Event()

        def drain() -> None:
            for raw in self.proc.stdout:
                match = _LISTENING.search(raw.decode("utf-8", "replace"))
                if match:
                    self.addresses[match.group(1)] = parse_address(match.group(2))
                    if len(self.addresses) == 2:
                        ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(30) or len(self.addresses) < 2:
            self.__exit__()
            raise RuntimeError("nsqlookupd did not start")
        self.sampler = ProcessSampler(self.proc.pid)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


# -- the simulated nsqd ------------------------------------------------------------------------------------
def node_topics(node: int, count: int) -> list[str]:
    return [f"tenant_{(node * STRIDE + k) % POOL:05d}" for k in range(count)]


async def _node(
    address: tuple[str, int], node: int, commands: list[bytes], stats: dict, done: trio.Event, release: trio.Event
) -> None:
    stream = await trio.open_tcp_stream(*address)
    decoder = ResponseDecoder()
    async with stream:
        await stream.send_all(MAGIC_V1)
        identify = encode_identify(
            broadcast_address=f"sim-{node}.example",
            hostname=f"sim-{node}",
            http_port=20000 + node,
            tcp_port=30000 + node,
            version="1.3.0",
        )
        for command in [identify, *commands]:
            started = trio.current_time()
            await stream.send_all(command)
            while (response := decoder.next_response()) is None:
                data = await stream.receive_some(65536)
                if not data:
                    raise RuntimeError(f"lookupd closed node {node}'s connection")
                decoder.receive_data(data)
            if command is not identify and response != b"OK":
                raise RuntimeError(f"node {node}: {response!r}")
            if trio.current_time() - started > COMMAND_TIMEOUT:
                stats["slow"] += 1
        stats["last_ok"] = max(stats["last_ok"], time.monotonic())
        done.set()
        await release.wait()  # the peers stay connected (and registered) while /lookup is measured


async def _storm(lookupd: Lookupd, nodes: int, topics: int, channels: int, after: float, stats: dict) -> None:
    plans = []
    for node in range(nodes):
        commands = []
        for topic in node_topics(node, topics):
            commands.append(encode_register(topic))
            commands.extend(encode_register(topic, f"ch{c}") for c in range(channels))
        plans.append(commands)
    stats.update(slow=0, last_ok=0.0)
    release = trio.Event()
    async with trio.open_nursery() as nursery:
        events = []
        stats["start"] = time.monotonic()
        for node, commands in enumerate(plans):
            event = trio.Event()
            events.append(event)
            nursery.start_soon(_node, lookupd.addresses["TCP"], node, commands, stats, event, release)
        for event in events:
            await event.wait()
        stats["cpu"] = lookupd.sampler.cpu_seconds() - stats["cpu"]
        await trio.sleep(after)
        stats["after_end"] = time.monotonic()
        for path in ("/nodes", "/topics"):
            stats[path] = await trio.to_thread.run_sync(_timed_get, lookupd.addresses["HTTP"], path)
        release.set()


# -- the /lookup prober (its own process) ----------------------------------------------------------------------
def _probe(address: tuple[str, int], topic: str, stop, results) -> None:
    connection = http.client.HTTPConnection(*address, timeout=30)
    samples = []
    path = f"/lookup?topic={topic}"
    while not stop.is_set():
        started = time.monotonic()
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        samples.append((started, time.monotonic() - started, response.status))
    results.send(samples)


def _timed_get(address: tuple[str, int], path: str) -> tuple[float, bytes]:
    connection = http.client.HTTPConnection(*address, timeout=60)
    started = time.monotonic()
    connection.request("GET", path)
    body = connection.getresponse().read()
    elapsed = time.monotonic() - started
    connection.close()
    return elapsed, body


def _ms(values: list[float], fraction: float) -> float | None:
    value = percentile(values, fraction)
    return None if value is None else value * 1000


def measure(args, nodes: int) -> dict:
    registrations = nodes * args.topics * (1 + args.channels)
    with Lookupd() as lookupd:
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        receiver, sender = context.Pipe(duplex=False)
        prober = context.Process(target=_probe, args=(lookupd.addresses["HTTP"], node_topics(0, 1)[0], stop, sender))
        prober.start()
        time.sleep(0.5)
        stats: dict = {"cpu": lookupd.sampler.cpu_seconds()}
        trio.run(_storm, lookupd, nodes, args.topics, args.channels, args.after, stats)
        stop.set()
        samples = receiver.recv()
        prober.join(10)
        rss = lookupd.sampler.rss_bytes()
    start, end = stats["start"], stats["last_ok"]
    during = sorted(latency for at, latency, _ in samples if start <= at <= end)
    after = sorted(latency for at, latency, _ in samples if end < at <= stats["after_end"])
    seconds = end - start
    return {
        "nsqd": nodes,
        "topics each": args.topics,
        "registrations": registrations,
        "register s": seconds,
        "reg/s": registrations / seconds,
        "cpu us/reg": stats["cpu"] * 1e6 / registrations,
        "over 1s": stats["slow"],
        "lookup p50 ms": _ms(during, 0.5),
        "lookup p99 ms": _ms(during, 0.99),
        "lookups": len(during),
        "after p50 ms": _ms(after, 0.5),
        "after p99 ms": _ms(after, 0.99),
        "/nodes ms": stats["/nodes"][0] * 1000,
        "/nodes KB": len(stats["/nodes"][1]) / 1000,
        "/topics ms": stats["/topics"][0] * 1000,
        "rss MB": rss / 1e6,
    }


def run(args) -> Report:
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    report = Report(
        NAME,
        TITLE,
        params={
            "sizes": sizes,
            "topics_each": args.topics,
            "channels": args.channels,
            "after_s": args.after,
            "topic_pool": POOL,
        },
    )
    for nodes in sizes:
        report.rows.append(measure(args, nodes))
    report.notes.append(
        "reg/s and cpu us/reg should stay flat as the node count grows; 'over 1s' counts commands "
        "slower than nsqd's 1 s deadline"
    )
    report.notes.append("lookupd, the simulated nsqd and the /lookup prober share this machine")
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
