"""Nemesis with three copies: rings of three and of five where node i keeps copies on nodes i + 1 and i + 2
(``--replicate-to`` twice, the default ``--replication-min-insync=2``), under continuous load, faults one at a
time chosen at random, some of them hitting two nodes at once.

Each replication stream (node i to each of its peers) crosses its own ``partition.Proxy``, which the test holds to
cut the network between two nodes; clients, and a replica's connections back to its origin's address (CONFIRM,
probes), reach the nodes directly. Three producers (TCP PUB, TCP MPUB, HTTP /pub in turn, a refused publish tried
on the next node) and one consumer per node and channel, on two channels. Faults (each kind once, in a random
order, then random ones until the time is up; the seed is printed and ``NEMESIS_SEED`` replays it):

- ``kill``: SIGKILL a node; exactly one of its replicas adopts each of its messages; it comes back on its data;
- ``wipe``: the same with its data directory deleted;
- ``stop``: SIGSTOP a node past the takeover wait, then SIGCONT;
- ``partition``: cut the streams between two nodes, both ways or one way, for 2-9 s;
- ``kill2``: SIGKILL two nodes at the same moment, their data kept; ``kill2wipe``: the same, one of them wiped.
  The replicas left take both over; a node with no peer left refuses publishes until one is back.

Then heal and drain: every acknowledged message is delivered on both channels. The share of publishes refused is
measured per fault; where the guarantee says none (a one-node fault: every node it did not hit), a node that is up
refuses under 1% of the publishes it gets and no publish is refused by every live node. A producer's connection
that a node closed by dying is replaced before the next publish (``replication_load``), so a restarted node is not
charged with the closed socket of the process it replaced. When an assertion fails, the nodes' logs and every
failed publish (``refusals.txt``) are kept in the test's directory."""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.integration.harness import NsqdProcess, free_port
from tests.integration.http_helpers import post, stats, wait_for
from tests.integration.partition import Proxy
from tests.integration.replication_load import Publisher, Readers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]

TOPIC = "nemesis"
CHANNELS = ("one", "two")
KINDS = ("kill", "wipe", "stop", "partition", "kill2", "kill2wipe")
#: faults are started until this many seconds have passed (each kind once at least)
FAULT_TIME = float(os.environ.get("NEMESIS_SECONDS", "20"))
#: the highest share of refused publishes a node that is up may answer during one-node faults
REFUSED_LIMIT = 0.01


class Ring:
    def __init__(self, tmp_path: Path, size: int) -> None:
        self.tmp_path = tmp_path
        self.size = size
        self.tcp = [free_port() for _ in range(size)]
        self.http = [free_port() for _ in range(size)]
        # streams[i][j]: node i's stream to its peer j
        self.streams = {i: {j: Proxy(("127.0.0.1", self.tcp[j])) for j in self.peers(i)} for i in range(size)}
        self.nodes: list[NsqdProcess | None] = [None] * size
        self.started: list[tuple[int, NsqdProcess]] = []
        self.available = [False] * size

    def peers(self, index: int) -> list[int]:
        return [(index + 1) % self.size, (index + 2) % self.size]

    def origins(self, index: int) -> list[int]:
        return [i for i in range(self.size) if index in self.peers(i)]

    def node_name(self, index: int) -> str:
        return f"127.0.0.1:{self.tcp[index]}"

    def data_path(self, index: int) -> Path:
        return self.tmp_path / f"node{index}"

    def addresses(self, index: int):
        if not self.available[index]:
            return None
        return ("127.0.0.1", self.tcp[index]), ("127.0.0.1", self.http[index])

    def start(self, index: int) -> None:
        node = NsqdProcess(
            self.data_path(index),
            [
                "--broadcast-address=127.0.0.1",
                f"--tcp-address=127.0.0.1:{self.tcp[index]}",
                f"--http-address=127.0.0.1:{self.http[index]}",
                *(f"--replicate-to={proxy.address}" for proxy in self.streams[index].values()),
                "--replica-takeover-timeout=1s",
                f"--node-id={index + 1}",
                "--msg-timeout=5s",
            ],
        )
        node.start()
        self.nodes[index] = node
        self.started.append((index, node))
        address = ("127.0.0.1", self.http[index])
        assert post(address, f"/topic/create?topic={TOPIC}").status == 200
        for channel in CHANNELS:
            assert post(address, f"/channel/create?topic={TOPIC}&channel={channel}").status == 200
        self.available[index] = True

    def stats(self, index: int) -> dict:
        return stats(("127.0.0.1", self.http[index]))

    def held(self, holder: int, origin: int) -> int:
        for entry in self.stats(holder).get("replication", {}).get("replicas", []):
            if entry["node"] == self.node_name(origin):
                return entry["held_messages"]
        return 0

    def healthy(self) -> bool:
        for index in range(self.size):
            doc = self.stats(index).get("replication", {})
            if doc.get("state") != "replicating" or doc.get("unreplicated_messages"):
                return False
            if any(peer["pending_messages"] or peer["state"] != "connected" for peer in doc["peers"]):
                return False
        return True

    def cut(self, a: int, b: int, *, a_to_b: bool, b_to_a: bool) -> None:
        """Hold the bytes between nodes ``a`` and ``b`` (each one's stream to the other, when it has one)."""
        if b in self.streams[a]:
            self.streams[a][b].set(outbound=a_to_b, inbound=b_to_a)
        if a in self.streams[b]:
            self.streams[b][a].set(outbound=b_to_a, inbound=a_to_b)

    def kill(self, index: int, *, wipe: bool = False) -> None:
        self.available[index] = False
        node = self.nodes[index]
        assert node is not None
        node.kill()
        if wipe:
            shutil.rmtree(self.data_path(index))

    def taken_over(self, victims: list[int]) -> bool:
        """No live replica of a victim holds its copies any more (they were adopted)."""
        live = [i for i in range(self.size) if i not in victims]
        return all(self.held(holder, victim) == 0 for victim in victims for holder in live)

    def close(self) -> None:
        for node in self.nodes:
            if node is not None and node.is_running():
                node.signal_all(signal.SIGCONT)
                node.kill()
        for proxies in self.streams.values():
            for proxy in proxies.values():
                proxy.close()


def _fault(ring: Ring, kind: str, rng: random.Random) -> tuple[str, list[int]]:
    """Run one fault; returns its description and the nodes it hit."""
    victim = rng.randrange(ring.size)
    if kind in ("kill", "wipe"):
        ring.kill(victim, wipe=kind == "wipe")
        wait_for(lambda: ring.taken_over([victim]), timeout=30, message="takeover by one replica")
        ring.start(victim)
        return f"{kind} node{victim}", [victim]
    if kind in ("kill2", "kill2wipe"):
        other = rng.choice([i for i in range(ring.size) if i != victim])
        ring.kill(victim)
        ring.kill(other, wipe=kind == "kill2wipe")
        wait_for(lambda: ring.taken_over([victim, other]), timeout=40, message="takeover of both")
        for index in rng.sample([victim, other], 2):
            ring.start(index)
        return f"{kind} node{victim} node{other}" + (f" (node{other} wiped)" if kind == "kill2wipe" else ""), [
            victim,
            other,
        ]
    node = ring.nodes[victim]
    assert node is not None
    if kind == "stop":
        seconds = rng.uniform(7, 9)  # past a replica's silence (5 s) and takeover wait (1 s)
        node.signal_all(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            node.signal_all(signal.SIGCONT)
        return f"stop node{victim} {seconds:.1f} s", [victim]
    assert kind == "partition"
    other = rng.choice(ring.peers(victim))
    a_to_b, b_to_a = rng.choice([(True, True), (True, False), (False, True)])
    seconds = rng.uniform(2, 9)
    ring.cut(victim, other, a_to_b=a_to_b, b_to_a=b_to_a)
    time.sleep(seconds)
    ring.cut(victim, other, a_to_b=False, b_to_a=False)
    way = "both ways" if a_to_b and b_to_a else "one way"
    return f"partition node{victim}-node{other} {way} {seconds:.1f} s", []


def _refusals(publishers: list[Publisher], windows: list[tuple[float, float, list[int]]], size: int) -> dict:
    """Per fault window: publishes each node got and refused (a node the fault hit is left out: it was down,
    stopped, or starting), and the publishes refused by every live node they were tried on."""
    got = [0] * size
    refused = [0] * size
    everywhere = 0
    for publisher in publishers:
        outcomes = list(publisher.outcomes)
        for outcome in outcomes:
            window = next((w for w in windows if w[0] <= outcome.started <= w[1]), None)
            if window is None or len(window[2]) > 1 or outcome.node in window[2]:
                continue
            if outcome.error.startswith("ConnectionRefusedError: node down"):
                continue
            got[outcome.node] += 1
            refused[outcome.node] += not outcome.ok
    one_node = [w for w in windows if len(w[2]) <= 1]
    for publisher in publishers:
        acked = set(publisher.acked)
        for outcome in publisher.outcomes:
            if outcome.ok or not any(w[0] <= outcome.started <= w[1] for w in one_node):
                continue
            if not any(body in acked for body in outcome.bodies):
                everywhere += 1  # every attempt at these bodies failed
    return {"got": got, "refused": refused, "refused_everywhere": everywhere}


def _longest_gap(publishers: list[Publisher], windows: list[tuple[float, float, list[int]]], nodes_hit: int) -> float:
    """The longest time within the fault windows that hit ``nodes_hit`` nodes (or none, for 1: partitions count
    with one-node faults) in which no publish was acknowledged anywhere."""
    oks = sorted(o.ended for p in publishers for o in list(p.outcomes) if o.ok)
    longest = 0.0
    for start, end, hit in windows:
        if max(len(hit), 1) != nodes_hit:
            continue
        moments = [start, *(t for t in oks if start < t < end), end]
        longest = max(longest, *(b - a for a, b in itertools.pairwise(moments)))
    return round(longest, 2)


def _keep_logs(ring: Ring, directory: Path) -> None:
    for number, (index, node) in enumerate(ring.started):
        (directory / f"node{index}-{number}.log").write_text(node.log_text())


def _keep_refusals(publishers: list[Publisher], windows: list, faults: list[str], path: Path) -> None:
    """Every fault window and every failed publish, in seconds from the first fault's start, for reading with the
    nodes' logs."""
    began = windows[0][0]
    lines = [
        f"window {start - began:8.3f} {end - began:8.3f} hit {hit} {what}"
        for (start, end, hit), what in zip(windows, faults, strict=True)
    ]
    failed = sorted(((p.name, o) for p in publishers for o in list(p.outcomes) if not o.ok), key=lambda f: f[1].started)
    lines += [
        f"failed {o.started - began:8.3f} +{o.duration:.3f} s {name} node{o.node} {o.kind} {o.error}"
        for name, o in failed
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("size", [3, 5], ids=["ring3", "ring5"])
def test_three_copies_under_load_through_faults_of_one_and_two_nodes(tmp_path, size):
    seed = int(os.environ.get("NEMESIS_SEED", random.randrange(1 << 32)))
    print(f"\nnemesis seed {seed} (NEMESIS_SEED={seed} replays the faults)")
    rng = random.Random(seed)
    ring = Ring(tmp_path, size)
    publishers: list[Publisher] = []
    readers = None
    try:
        for index in range(size):
            ring.start(index)
        wait_for(ring.healthy, timeout=60, message="ring replicating")
        readers = Readers(TOPIC, CHANNELS, ring.addresses, size).start()
        publishers = [
            Publisher(
                f"n{home}",
                TOPIC,
                ring.addresses,
                lambda home=home: home,
                nodes=size,
                retry=True,
                timeout=10,
                pause=0.01,
            ).start()
            for home in range(3)
        ]
        kinds = list(KINDS)
        rng.shuffle(kinds)
        done: list[str] = []
        windows: list[tuple[float, float, list[int]]] = []
        began = time.monotonic()
        while kinds or time.monotonic() - began < FAULT_TIME:
            time.sleep(rng.uniform(0.2, 1.0))
            kind = kinds.pop() if kinds else rng.choice(KINDS)
            started = time.monotonic()
            what, hit = _fault(ring, kind, rng)
            done.append(what)
            wait_for(ring.healthy, timeout=90, message=f"ring replicating after {what}")
            windows.append((started, time.monotonic(), hit))
        for publisher in publishers:
            publisher.stop()
        acked = set()
        for publisher in publishers:
            acked.update(publisher.acked)
        try:
            wait_for(
                lambda: not any(readers.missing(acked).values()),
                timeout=60,
                interval=0.2,
                message="every acknowledged message delivered",
            )
        except AssertionError:
            missing = readers.missing(acked)
            _keep_logs(ring, tmp_path)
            raise AssertionError(
                f"seed {seed}, faults {done}: missing per channel "
                f"{ {c: (len(m), sorted(m)[:10]) for c, m in missing.items()} } of {len(acked)}; logs in {tmp_path}"
            ) from None
        measured = _refusals(publishers, windows, size)
        shares = [r / g if g else 0.0 for r, g in zip(measured["refused"], measured["got"], strict=True)]
        takeovers = [ring.stats(i)["replication"] for i in range(size)]
        report = {
            "faults": done,
            "acknowledged": len(acked),
            "refused_share_per_live_node_in_one_node_faults": [round(s, 4) for s in shares],
            "publishes_per_live_node_in_one_node_faults": measured["got"],
            "refused_by_every_live_node": measured["refused_everywhere"],
            "longest_without_an_ok_s": {
                "one-node faults": _longest_gap(publishers, windows, 1),
                "two-node faults": _longest_gap(publishers, windows, 2),
            },
            "publish_failures_retried": sum(not o.ok for p in publishers for o in p.outcomes),
            "connections_found_closed": sum(p.found_closed for p in publishers),
            "adopted": sum(doc["adopted_messages"] for doc in takeovers),
            "left_to_peers": sum(doc["left_to_peers"] for doc in takeovers),
            "duplicates": readers.duplicates(acked),
        }
        print(f"nemesis with three copies, ring of {size} (seed {seed}): {report}")
        if max(shares) >= REFUSED_LIMIT or measured["refused_everywhere"]:
            _keep_logs(ring, tmp_path)
            _keep_refusals(publishers, windows, done, tmp_path / "refusals.txt")
        assert max(shares) < REFUSED_LIMIT, (
            f"seed {seed}: a live node refused {max(shares):.2%}: {report}; in {tmp_path}"
        )
        assert measured["refused_everywhere"] == 0, (
            f"seed {seed}: publishes refused by every live node: {report}; in {tmp_path}"
        )
    finally:
        for publisher in publishers:
            publisher.stopping.set()
        if readers is not None:
            readers.stop()
        ring.close()
