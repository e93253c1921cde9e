"""Nemesis: a replication ring of three under continuous load, faults one at a time chosen at random.

Node i keeps copies on node i + 1; every byte between two neighbours crosses a ``partition.Link`` the test
controls, while producers and consumers reach each node directly. Three producers (one per node: TCP PUB, TCP MPUB,
HTTP /pub in turn, a refused or failed publish tried on the next node) and one consumer per node and channel, on
two channels. Faults, one at a time (each kind once, in a random order, then random ones until the time is up;
the seed is printed and ``NEMESIS_SEED`` replays it):

- ``kill``: SIGKILL a node; its successor takes it over; it comes back on its data;
- ``wipe``: the same with its data directory deleted;
- ``stop``: SIGSTOP a node for longer than the takeover wait, then SIGCONT (its successor does not take it over:
  its address still takes connections; its predecessor refuses publishes meanwhile, 5 s at most each);
- ``partition``: cut the link between two neighbours, both ways or one way, for 2-9 s (past the takeover wait
  or not), then heal it;
- ``damage``: stop a node (SIGTERM), flip one byte of a message body in one of its channel queue files, start
  it again: the damaged record is never delivered (the flipped body was never published), its copy comes back
  from the replica and is delivered on the channel that had not finished it.

Then heal and drain: every acknowledged message is delivered on both channels, the damaged ones included, nothing
that was never published is delivered (so no damaged body), and duplicates are counted and printed.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.integration.harness import NsqdProcess, free_port
from tests.integration.http_helpers import post, stats, wait_for
from tests.integration.partition import Link
from tests.integration.replication_load import Publisher, Readers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOPIC = "nemesis"
CHANNELS = ("one", "two")
KINDS = ("kill", "wipe", "stop", "partition", "damage")
#: faults are started until this many seconds have passed (each kind once at least)
FAULT_TIME = float(os.environ.get("NEMESIS_SECONDS", "60"))


class Ring:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.tcp = [free_port() for _ in range(3)]
        self.http = [free_port() for _ in range(3)]
        # link i: node i (A) and node i + 1 (B)
        self.links = [Link(self.tcp[i], self.tcp[(i + 1) % 3]) for i in range(3)]
        self.nodes: list[NsqdProcess | None] = [None, None, None]
        self.started: list[tuple[int, NsqdProcess]] = []
        self.available = [False, False, False]
        self.damaged: dict[int, int] = {}  # id of a node process -> damaged records it counted

    def node_name(self, index: int) -> str:
        return self.links[index].to_a.address

    def data_path(self, index: int) -> Path:
        return self.tmp_path / f"node{index}"

    def addresses(self, index: int):
        if not self.available[index]:
            return None
        return ("127.0.0.1", self.tcp[index]), ("127.0.0.1", self.http[index])

    def start(self, index: int) -> None:
        link = self.links[index]
        node = NsqdProcess(
            self.data_path(index),
            [
                "--broadcast-address=127.0.0.1",
                f"--tcp-address=127.0.0.1:{self.tcp[index]}",
                f"--http-address=127.0.0.1:{self.http[index]}",
                f"--broadcast-tcp-port={link.to_a.port}",
                f"--replicate-to={link.to_b.address}",
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
        for index in range(3):
            doc = self.stats(index).get("replication", {})
            if doc.get("state") != "replicating" or doc.get("unreplicated_messages"):
                return False
            if any(peer["pending_messages"] for peer in doc["peers"]):
                return False
        return True

    def note_damage(self) -> int:
        """The damaged records every node process counted so far (a restart starts its count again)."""
        for index in range(3):
            count = 0
            for topic in self.stats(index)["topics"] or ():
                count += topic.get("damaged_count", 0)
                count += sum(channel.get("damaged_count", 0) for channel in topic["channels"])
            self.damaged[id(self.nodes[index])] = count
        return sum(self.damaged.values())

    def close(self) -> None:
        for node in self.nodes:
            if node is not None and node.is_running():
                node.signal_all(signal.SIGCONT)
                node.kill()
        for link in self.links:
            link.close()


def _flip_a_body_byte(directory: Path, rng: random.Random) -> str:
    """One byte of one message body in a channel queue file of ``directory``; returns what was hit."""
    files = sorted(p for p in directory.glob(f"{TOPIC}:*.diskqueue.*.dat") if p.stat().st_size >= 64)
    if not files:
        return "nothing on disk"
    path = rng.choice(files)
    data = path.read_bytes()
    offsets, pos = [], 0
    while pos + 4 <= len(data):
        offsets.append(pos)
        pos += 4 + int.from_bytes(data[pos : pos + 4], "big")
    at = rng.choice(offsets) + 4 + 26  # size, timestamp, attempts, id: the body's first byte
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0x20]))
    return f"{path.name} at byte {at}"


def _fault(ring: Ring, kind: str, rng: random.Random) -> str:
    victim = rng.randrange(3)
    node = ring.nodes[victim]
    successor = (victim + 1) % 3
    if kind in ("kill", "wipe"):
        ring.available[victim] = False
        node.kill()
        if kind == "wipe":
            shutil.rmtree(ring.data_path(victim))
        wait_for(lambda: ring.held(successor, victim) == 0, timeout=30, message="takeover by the successor")
        ring.start(victim)
        return f"{kind} node{victim}"
    if kind == "stop":
        seconds = rng.uniform(7, 9)  # past the successor's silence (5 s) and takeover wait (1 s)
        node.signal_all(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            node.signal_all(signal.SIGCONT)
        return f"stop node{victim} {seconds:.1f} s"
    if kind == "partition":
        a_to_b, b_to_a = rng.choice([(True, True), (True, False), (False, True)])
        seconds = rng.uniform(2, 9)
        ring.links[victim].cut(a_to_b=a_to_b, b_to_a=b_to_a)
        time.sleep(seconds)
        ring.links[victim].heal()
        way = "both ways" if a_to_b and b_to_a else ("origin to replica" if a_to_b else "replica to origin")
        return f"partition node{victim}-node{successor} {way} {seconds:.1f} s"
    assert kind == "damage"
    # the consumers keep the channels empty: paused a moment, they keep a backlog, which a clean stop writes out
    address = ("127.0.0.1", ring.http[victim])
    for channel in CHANNELS:
        post(address, f"/channel/pause?topic={TOPIC}&channel={channel}")
    wait_for(
        lambda: all(c["depth"] >= 20 for t in ring.stats(victim)["topics"] for c in t["channels"]),
        timeout=20,
        message="a backlog to damage",
    )
    ring.available[victim] = False
    assert node.stop() == 0
    hit = _flip_a_body_byte(ring.data_path(victim), rng)
    ring.start(victim)
    for channel in CHANNELS:
        post(address, f"/channel/unpause?topic={TOPIC}&channel={channel}")
    return f"damage node{victim}: {hit}"


def test_a_ring_under_load_through_random_faults_delivers_every_acknowledged_message(tmp_path):
    seed = int(os.environ.get("NEMESIS_SEED", random.randrange(1 << 32)))
    print(f"\nnemesis seed {seed} (NEMESIS_SEED={seed} replays the faults)")
    rng = random.Random(seed)
    ring = Ring(tmp_path)
    publishers: list[Publisher] = []
    readers = None
    try:
        for index in range(3):
            ring.start(index)
        wait_for(ring.healthy, timeout=60, message="ring replicating")
        readers = Readers(TOPIC, CHANNELS, ring.addresses, 3).start()
        publishers = [
            Publisher(
                f"n{home}", TOPIC, ring.addresses, lambda home=home: home, nodes=3, retry=True, timeout=10, pause=0.01
            ).start()
            for home in range(3)
        ]
        kinds = list(KINDS)
        rng.shuffle(kinds)
        done = []
        began = time.monotonic()
        while kinds or time.monotonic() - began < FAULT_TIME:
            wait_for(ring.healthy, timeout=90, message=f"ring replicating after {done[-1:]}")
            time.sleep(rng.uniform(0.2, 1.0))
            kind = kinds.pop() if kinds else rng.choice(KINDS)
            ring.note_damage()
            done.append(_fault(ring, kind, rng))
        wait_for(ring.healthy, timeout=90, message="ring replicating at the end")
        for publisher in publishers:
            publisher.stop()
        acked = set()
        for publisher in publishers:
            acked.update(publisher.acked)
        damaged = ring.note_damage()
        try:
            wait_for(
                lambda: not any(readers.missing(acked).values()),
                timeout=60,
                interval=0.2,
                message="every acknowledged message delivered",
            )
        except AssertionError:
            missing = readers.missing(acked)
            _write_logs(tmp_path, ring)
            raise AssertionError(
                f"seed {seed}, faults {done}: missing per channel "
                f"{ {c: (len(m), sorted(m)[:10]) for c, m in missing.items()} } of {len(acked)}, "
                f"{damaged} damaged record(s) counted; logs in {tmp_path}"
            ) from None
        published = {body for publisher in publishers for outcome in publisher.outcomes for body in outcome.bodies}
        with readers.lock:
            garbage = {body for counts in readers.received.values() for body in counts if body not in published}
        assert not garbage, f"seed {seed}: delivered but never published: {sorted(garbage)[:10]}"
        report = {
            "faults": done,
            "acknowledged": len(acked),
            "damaged_records": damaged,
            "publish_failures_retried": sum(not o.ok for p in publishers for o in p.outcomes),
            "slowest_publish_s": round(max(o.duration for p in publishers for o in p.outcomes), 2),
            "duplicates": readers.duplicates(acked),
        }
        print(f"nemesis (seed {seed}): {report}")
    finally:
        for publisher in publishers:
            publisher.stopping.set()
        if readers is not None:
            readers.stop()
        ring.close()


def _write_logs(tmp_path: Path, ring: Ring) -> None:
    for number, (index, node) in enumerate(ring.started):
        (tmp_path / f"node{index}-{number}.log").write_text(node.log_text())
