"""Three nodes in a replication ring with three copies (A keeps copies on B and C, B on C and A, C on A and B: the ring
of docs/replication.md) under SIGKILL.

nsqlookupd; three producer threads (one per node: TCP PUB, TCP MPUB and HTTP /pub in turn, each retrying a refused
or failed publish on the next node, as real producers do); a pynsq Reader and an nsqjs Reader on two channels,
finding the nodes through lookupd only. In each of CYCLES cycles a random node is killed with SIGKILL at a random
moment, its data directory deleted (or kept, in the second test); its replicas take it over after
``--replica-takeover-timeout`` (each message adopted by one of them); the node comes back on the same ports. At the
end every message a producer had acknowledged has reached each channel at least once; duplicates are counted and
printed.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.compat.client_runs import NODE, NODE_DIR, nsqjs_missing, python_client
from tests.integration.harness import REPO_ROOT, NsqdProcess, RawClient, free_port
from tests.integration.http_helpers import post, stats, wait_for
from tests.integration.lookupd_harness import LookupdProcess

pytestmark = [pytest.mark.compat, pytest.mark.slow, pytest.mark.timeout(900)]

CYCLES = int(os.environ.get("RING_CYCLES", "20"))
TOPIC = "ring"
CHANNELS = ("py", "js")


class Ring:
    def __init__(self, tmp_path: Path, lookupd: LookupdProcess, extra: tuple[str, ...]) -> None:
        self.tmp_path = tmp_path
        self.lookupd = lookupd
        self.extra = extra
        self.ports = [(free_port(), free_port()) for _ in range(3)]
        self.nodes: list[NsqdProcess | None] = [None, None, None]
        self.started: list[tuple[int, NsqdProcess]] = []  # every process, for the logs of a failure
        # producers use a node once it has the topic and both channels: a topic without channels gives its backlog
        # to the first channel created (NSQ's rule), which the test must not mistake for a loss
        self.available = [False, False, False]
        self.lock = threading.Lock()

    def address(self, index: int) -> str:
        return f"127.0.0.1:{self.ports[index][0]}"

    def data_path(self, index: int) -> Path:
        return self.tmp_path / f"node{index}"

    def start(self, index: int) -> NsqdProcess:
        tcp, http = self.ports[index]
        node = NsqdProcess(
            self.data_path(index),
            [
                "--broadcast-address=127.0.0.1",
                f"--tcp-address=127.0.0.1:{tcp}",
                f"--http-address=127.0.0.1:{http}",
                f"--replicate-to={self.address((index + 1) % 3)}",
                f"--replicate-to={self.address((index + 2) % 3)}",
                f"--lookupd-tcp-address={self.lookupd.tcp_address}",
                "--replica-takeover-timeout=1s",
                f"--node-id={index + 1}",
                *self.extra,
            ],
        )
        node.start()
        with self.lock:
            self.nodes[index] = node
            self.started.append((index, node))
        return node

    def prepare(self, index: int) -> None:
        assert post(self.http(index), f"/topic/create?topic={TOPIC}").status == 200
        for channel in CHANNELS:
            assert post(self.http(index), f"/channel/create?topic={TOPIC}&channel={channel}").status == 200
        self.available[index] = True

    def kill(self, index: int) -> None:
        self.available[index] = False
        self.nodes[index].kill()

    def http(self, index: int) -> tuple[str, int]:
        return "127.0.0.1", self.ports[index][1]

    def healthy(self) -> bool:
        """Every node up and replicating with nothing pending, and no origin left untaken."""
        for index in range(3):
            doc = stats(self.http(index)).get("replication", {})
            if doc.get("state") != "replicating" or doc.get("unreplicated_messages"):
                return False
            if any(peer["pending_messages"] for peer in doc["peers"]):
                return False
        return True

    def stop(self) -> None:
        for node in self.nodes:
            if node is not None:
                node.kill()


class Producers:
    """One thread per node; each acknowledged body is recorded once its OK (or 200) came."""

    def __init__(self, ring: Ring) -> None:
        self.ring = ring
        self.acked: list[str] = []
        self.failures = 0
        self.where: dict[str, tuple] = {}  # first body of a publish -> (node, kind, time acknowledged)
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(index,), daemon=True) for index in range(3)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def _publish(self, kind: str, index: int, bodies: list[str], clients: dict) -> None:
        if not self.ring.available[index]:
            raise ConnectionRefusedError("node down")
        if kind == "http":
            reply = post(self.ring.http(index), f"/pub?topic={TOPIC}", bodies[0].encode(), timeout=10)
            assert reply.status == 200, reply
            return
        client = clients.get(index)
        if client is None:
            client = clients[index] = RawClient(("127.0.0.1", self.ring.ports[index][0]), timeout=10)
        try:
            if kind == "pub":
                client.publish(TOPIC, bodies[0].encode())
            else:
                client.publish_many(TOPIC, [body.encode() for body in bodies])
        except BaseException:
            clients.pop(index).close()
            raise

    def _run(self, home: int) -> None:
        kinds = itertools.cycle(("pub", "mpub", "http"))
        clients: dict[int, RawClient] = {}
        number = 0
        while not self.stopping.is_set():
            kind = next(kinds)
            bodies = [f"p{home}-{number + i}" for i in range(10 if kind == "mpub" else 1)]
            number += len(bodies)
            for attempt in range(60):
                index = (home + attempt) % 3
                try:
                    self._publish(kind, index, bodies, clients)
                except Exception:
                    self.failures += 1
                    time.sleep(0.05)
                    continue
                self.acked.extend(bodies)
                self.where[bodies[0]] = (index, kind, time.time())
                break
            time.sleep(0.002)
        for client in clients.values():
            client.close()


class Consumer:
    """A reader subprocess printing each body it receives; its lines are counted by a thread."""

    def __init__(self, argv: list[str], cwd: Path, log_path: Path) -> None:
        self.received: Counter[str] = Counter()
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=log, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.received[line.rstrip("\n")] += 1

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def _replica_held(ring: Ring, holder: int, origin: int) -> int:
    for entry in stats(ring.http(holder)).get("replication", {}).get("replicas", []):
        if entry["node"] == ring.address(origin):
            return entry["held_messages"]
    return 0


def _channel_states(ring: Ring) -> list:
    states = []
    for index in range(3):
        for topic in stats(ring.http(index))["topics"] or ():
            for channel in topic["channels"]:
                states.append(
                    (
                        index,
                        topic["topic_name"],
                        channel["channel_name"],
                        channel["depth"],
                        channel["in_flight_count"],
                        channel["deferred_count"],
                        len(channel["clients"]),
                        channel["paused"],
                    )
                )
    return states


def _write_logs(tmp_path: Path, ring: Ring) -> list[str]:
    """Every node's log into ``tmp_path``; returns their replication warnings."""
    warnings = []
    for number, (index, node) in enumerate(ring.started):
        text = node.log_text()
        (tmp_path / f"node{index}-{number}.log").write_text(text)
        warnings += [
            f"node{index}-{number}: {line}"
            for line in text.splitlines()
            if "WARNING: REPLICATION" in line or "ERROR: REPLICATION" in line
        ]
    return warnings


ADOPTED_FROM_LIVING = re.compile(
    r"peer \S+ adopted (\d+) message\(s\) of this node .* while it was connected "
    r"elsewhere"
)
GAVE_UP_AT_START = "at start-up: delivering the messages this node holds"


def _adopted_from_living(ring: Ring) -> tuple[int, list[str]]:
    """Messages a peer adopted from a node that lived, which both deliver: ``(allowed, unexplained lines)``. Allowed
    are those of a node restarted on its data that logged it went on without a peer's answer at start-up
    (at-least-once: it delivers what it holds); any other is a takeover of a living node. (The ring's first three
    starts find their successors down, hold nothing, and excuse nothing.)"""
    allowed, unexplained = 0, []
    for number, (index, node) in enumerate(ring.started):
        text = node.log_text()
        gave_up = number >= 3 and GAVE_UP_AT_START in text
        for line in text.splitlines():
            match = ADOPTED_FROM_LIVING.search(line)
            if match and gave_up:
                allowed += int(match.group(1))
            elif match:
                unexplained.append(f"node{index}-{number}: {line}")
    return allowed, unexplained


def _run_ring(
    tmp_path: Path, *, keep_data: bool, extra: tuple[str, ...] = (), max_duplicates: int | None = None
) -> dict:
    reason = nsqjs_missing()
    if reason:
        pytest.skip(reason)
    rng = random.Random()
    lookupd = LookupdProcess(tmp_path / "lookupd").start()
    ring = Ring(tmp_path, lookupd, extra)
    consumers: list[Consumer] = []
    producers = Producers(ring)
    try:
        for index in range(3):
            ring.start(index)
        for index in range(3):
            ring.prepare(index)
        wait_for(ring.healthy, timeout=60, message="ring replicating")
        lookupd_http = "{}:{}".format(*lookupd.http_address)
        consumers = [
            Consumer(python_client("pynsq_stream", lookupd_http, TOPIC, "py"), REPO_ROOT, tmp_path / "py.log"),
            Consumer([NODE, "stream_reader.js", lookupd_http, TOPIC, "js"], NODE_DIR, tmp_path / "js.log"),
        ]
        producers.start()
        for _cycle in range(CYCLES):
            wait_for(ring.healthy, timeout=90, message="ring replicating before a kill")
            time.sleep(rng.uniform(0.1, 1.0))
            victim = rng.randrange(3)
            ring.kill(victim)
            if not keep_data:
                shutil.rmtree(ring.data_path(victim))
            replicas = [(victim + 1) % 3, (victim + 2) % 3]
            wait_for(
                lambda v=victim, rs=replicas: all(_replica_held(ring, r, v) == 0 for r in rs),
                timeout=30,
                message="takeover",
            )
            ring.start(victim)
            ring.prepare(victim)
        wait_for(ring.healthy, timeout=90, message="ring replicating at the end")
        producers.stop()
        acked = set(producers.acked)
        assert len(acked) == len(producers.acked)

        def delivered() -> bool:
            return all(acked <= consumer.received.keys() for consumer in consumers)

        try:
            wait_for(delivered, timeout=120, interval=0.2, message="every acknowledged message delivered")
        except AssertionError:
            missing = {
                channel: sorted(acked - consumer.received.keys())[:10]
                for channel, consumer in zip(CHANNELS, consumers, strict=True)
            }
            _write_logs(tmp_path, ring)
            for channel, consumer in zip(CHANNELS, consumers, strict=True):
                (tmp_path / f"missing-{channel}.txt").write_text("\n".join(sorted(acked - consumer.received.keys())))
            (tmp_path / "acked.txt").write_text("\n".join(f"{k} {v}" for k, v in producers.where.items()))
            giving_up = [line for line in consumers[0].log_path.read_text().splitlines() if "giving up" in line]
            raise AssertionError(
                f"missing per channel (first ten) {missing} of {len(acked)}; "
                f"channels: {_channel_states(ring)}; pynsq gave up: {giving_up[:5]}"
            ) from None
        report = {"acknowledged": len(acked), "publish_failures_retried": producers.failures}
        for channel, consumer in zip(CHANNELS, consumers, strict=True):
            report[f"duplicates_{channel}"] = sum(n - 1 for body, n in consumer.received.items() if body in acked)
        print(f"\nreplication ring, {CYCLES} kills, data {'kept' if keep_data else 'deleted'}: {report}")
        if max_duplicates is not None:
            allowed, unexplained = _adopted_from_living(ring)
            report["adopted_after_a_start_without_a_peer"] = allowed
            if unexplained or any(report[f"duplicates_{channel}"] > max_duplicates + allowed for channel in CHANNELS):
                warnings = _write_logs(tmp_path, ring)  # what the nodes said of their peers and takeovers
                raise AssertionError(
                    f"more than {max_duplicates} duplicates on a channel, or a living node's messages "
                    f"adopted: {report}; {unexplained[:5]}; logs in {tmp_path}; replication warnings "
                    f"(last 20): {warnings[-20:]}"
                )
        return report
    finally:
        producers.stopping.set()
        for consumer in consumers:
            consumer.stop()
        ring.stop()
        lookupd.kill()


def test_ring_survives_kills_that_destroy_the_data(tmp_path):
    _run_ring(tmp_path, keep_data=False)


def test_ring_with_nodes_restarted_on_their_data_does_not_deliver_adopted_messages_again(tmp_path):
    # what may come twice: what was in flight at a kill (max-in-flight 20 per reader) and FINs not yet replicated; a
    # publish whose answer the kill cut off (held by a replica, and retried on the next node: up to 10 bodies per
    # producer); and what a peer adopted from a node that logged it started without that peer's answer
    # (at-least-once). No node's messages may be adopted while it lives (a restarted node waits for its living
    # predecessor's stream), nor by both of its replicas: pynsq connects to an address once per 10 s at most, so a
    # node killed again soon after its return often holds a backlog of one channel, which such a double takeover
    # delivered twice (1,044 at once).
    _run_ring(tmp_path, keep_data=True, extra=("--mem-queue-size=0", "--sync-every=1"), max_duplicates=CYCLES * 100)
