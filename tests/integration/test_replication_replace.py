"""A peer gone for good: a ring of five, three copies (each node keeps copies on the next two), one node killed and
never brought back. After ``--replication-replace-after`` each node that had it as a peer keeps its copies on another
candidate instead and backfills it: every unfinished message is on three nodes again, nothing acknowledged is lost,
no flag is edited. The killed node, started again on its data later, is told it was replaced and drops its copies:
nothing is delivered twice. Real daemons as subprocesses, real sockets."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.integration.copies_ring import CopiesRing
from tests.integration.harness import NsqdProcess, RawClient, free_port, stop_all
from tests.integration.http_helpers import post, stats, wait_for

pytestmark = pytest.mark.timeout(240)

NAMES = ("a", "b", "c", "d", "e")
GONE = 2  # c: a and b keep copies on it
BACKLOG = 2000  # messages per node before the kill


class Ring(CopiesRing):
    """The ring of five of these tests: each node may replace a peer gone for 2 s by one of its two others."""

    ready_timeout = 60.0

    def __init__(self, tmp_path, daemons) -> None:
        super().__init__(tmp_path, daemons, len(NAMES), "--replication-replace-after=2s", candidates=True)

    def node_dir(self, index: int) -> Path:
        return self.tmp_path / NAMES[index]

    def peers(self, index: int) -> list[str]:
        return [peer["address"] for peer in self.doc(index)["replication"]["peers"]]

    def healthy(self) -> bool:
        """Every live node replicates to two connected peers, none of them gone, with nothing pending."""
        for index in self.live:
            doc = self.doc(index)["replication"]
            if doc["state"] != "replicating" or len(doc["peers"]) != 2:
                return False
            for peer in doc["peers"]:
                if peer["state"] != "connected" or peer["lagging"] or peer["pending_messages"]:
                    return False
                if peer["address"] not in {self.address(other) for other in self.live}:
                    return False
        return True

    def three_copies(self) -> bool:
        """Every live node's unfinished messages are held by both of its peers."""
        if not self.healthy():
            return False
        for origin in self.live:
            depth = self.depth(origin)
            for peer in self.peers(origin):
                if self.held(self.ports.index(int(peer.rpartition(":")[2])), origin) != depth:
                    return False
        return True

    def publish(self, index: int, count: int, tag: str) -> None:
        post(self.nodes[index].http(), "/topic/create?topic=t")
        post(self.nodes[index].http(), "/channel/create?topic=t&channel=c")
        with RawClient(self.nodes[index].tcp) as producer:
            for start in range(0, count, 100):
                producer.publish_many("t", [f"{tag}-{number}".encode() for number in range(start, start + 100)])


class Load:
    """Publishes to the given nodes in turn from a thread until stopped; counts what was acknowledged and refused."""

    def __init__(self, ring: Ring, nodes: list[int]) -> None:
        self.ring = ring
        self.nodes = nodes
        self.acknowledged = 0
        self.refused = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        clients = {index: RawClient(self.ring.nodes[index].tcp) for index in self.nodes}
        number = 0
        while not self.stopping.is_set():
            index = self.nodes[number % len(self.nodes)]
            number += 1
            try:
                clients[index].publish("t", f"load-{number}".encode())
                self.acknowledged += 1
            except Exception:  # refused, or closed without an answer: a producer tries elsewhere
                self.refused += 1
                clients[index].close()
                clients[index] = RawClient(self.ring.nodes[index].tcp)
            time.sleep(0.002)
        for client in clients.values():
            client.close()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def test_a_peer_gone_for_good_is_replaced_and_three_copies_come_back(daemons, tmp_path):
    ring = Ring(tmp_path, daemons)
    for index in range(len(NAMES)):
        ring.publish(index, BACKLOG, NAMES[index])
    wait_for(ring.three_copies, timeout=30, message="three copies of everything")
    before = {index: ring.peers(index) for index in range(len(NAMES))}
    survivors = [index for index in range(len(NAMES)) if index != GONE]
    load = Load(ring, survivors)
    wait_for(lambda: load.acknowledged > 100, timeout=30, message="load running")
    killed_at = time.monotonic()
    ring.nodes[GONE].kill()  # gone for good: no flag of any node changes
    ring.live = survivors
    wait_for(ring.healthy, timeout=60, message="c replaced by live peers, backfilled")
    replaced_at = time.monotonic()
    load.stop()
    wait_for(ring.three_copies, timeout=30, message="three copies again")
    settled_at = time.monotonic()
    print(
        f"\nreplace: ring of 5, --replication-replace-after=2s: peers replaced and backfilled under load "
        f"{replaced_at - killed_at:.2f} s after the kill, three copies of every message checked after "
        f"{settled_at - killed_at:.2f} s ({load.acknowledged} acknowledged under load, {load.refused} refused); "
        f"a -> {ring.peers(0)}, b -> {ring.peers(1)}"
    )
    for index in survivors:  # only the nodes that had c as a peer changed one, never to themselves or a peer
        peers = ring.peers(index)
        if ring.address(GONE) in before[index]:
            kept = [peer for peer in before[index] if peer != ring.address(GONE)]
            assert kept[0] in peers and ring.address(index) not in peers and len(set(peers)) == 2, peers
            [new] = set(peers) - set(kept)
            # the peer it kept reconnects once the new one holds the backlog: it learns the new order of takeover
            ring.nodes[index].wait_for_log(rf"reconnecting peer {kept[0]}: it learns that {new} is a peer", 10)
        else:
            assert peers == before[index]
    replaced = {index: ring.doc(index)["replication"]["replaced_peers"] for index in survivors}
    assert replaced == {index: int(ring.address(GONE) in before[index]) for index in survivors}, replaced
    # nothing acknowledged lost, nothing twice: c's backlog was adopted by exactly one of its replicas
    total = BACKLOG * len(NAMES) + load.acknowledged
    assert sum(ring.depth(index) for index in survivors) == total

    # c comes back on its data: a and b tell it it was replaced; it drops its copies of them, and its own messages,
    # adopted by d, are d's alone
    ring.start(GONE)
    for origin in (0, 1):
        dropped = ring.nodes[GONE].wait_for_log(
            rf"origin {ring.address(origin)} replaced this node as its replica: (\d+) held", timeout=30
        )
        assert int(dropped.group(1)) > 0
    assert ring.held(GONE, 0) == ring.held(GONE, 1) == 0
    ring.live = list(range(len(NAMES)))
    wait_for(ring.healthy, timeout=30, message="c replicating again")
    assert ring.depth(GONE) == 0
    assert sum(ring.depth(index) for index in range(len(NAMES))) == total
    for index in (0, 1):  # a and b keep the peers that replaced c
        assert ring.address(GONE) not in ring.peers(index)
    stop_all([node for node in daemons if node.is_running()])


def test_with_nsqlookupd_a_lone_peer_gone_for_good_is_replaced_by_a_node_it_knows(daemons, tmp_path):
    """Two copies (one peer each: a -> b -> c -> a) and no candidate list: b's peer c dies, b refuses publishes as
    with any missing peer, then takes a, which nsqlookupd knows, in c's place and publishes again by itself."""
    from tests.integration.lookupd_harness import LookupdProcess

    lookupd = LookupdProcess(tmp_path / "lookupd")
    daemons.append(lookupd)
    lookupd.start()
    ports = [free_port() for _ in range(3)]

    def start(index: int) -> NsqdProcess:
        node = NsqdProcess(
            tmp_path / NAMES[index],
            [
                "--broadcast-address=127.0.0.1",
                f"--tcp-address=127.0.0.1:{ports[index]}",
                f"--replicate-to=127.0.0.1:{ports[(index + 1) % 3]}",
                f"--lookupd-tcp-address={lookupd.tcp_address}",
                "--replica-takeover-timeout=1s",
                "--replication-replace-after=2s",
                f"--node-id={index + 1}",
            ],
        )
        daemons.append(node)
        return node.start()

    nodes = [start(index) for index in range(3)]

    def peers(index: int) -> list[dict]:
        return stats(nodes[index].http())["replication"]["peers"]

    def held(holder: int, origin: int) -> int:
        for entry in stats(nodes[holder].http())["replication"]["replicas"]:
            if entry["node"] == f"127.0.0.1:{ports[origin]}":
                return entry["held_messages"]
        return 0

    wait_for(lambda: all(peers(i)[0]["state"] == "connected" for i in range(3)), timeout=30, message="ring up")
    post(nodes[1].http(), "/topic/create?topic=t")
    post(nodes[1].http(), "/channel/create?topic=t&channel=c")
    with RawClient(nodes[1].tcp) as producer:
        producer.publish_many("t", [b"m%d" % number for number in range(100)])
    nodes[2].kill()
    wait_for(lambda: peers(1)[0]["state"] != "connected", timeout=10, message="b lost c")
    with RawClient(nodes[1].tcp) as producer, pytest.raises(Exception):  # noqa: B017 - refused either way
        producer.publish("t", b"refused")  # one copy only: refused, as today with a peer missing
    replaced = f"127.0.0.1:{ports[0]}"
    wait_for(
        lambda: peers(1)[0]["address"] == replaced and peers(1)[0]["state"] == "connected",
        timeout=30,
        message="b keeps its copies on a",
    )
    with RawClient(nodes[1].tcp) as producer:
        producer.publish("t", b"accepted")
    wait_for(lambda: held(0, 1) == 101, timeout=10, message="a holds all of b's messages")
    # c comes back with its stale copies of b: b tells it it was replaced, and c drops them (it has no other replica
    # of b to ask, and would otherwise adopt them once b stayed silent to it for 60 s, while b delivers them)
    nodes[2] = start(2)
    dropped = nodes[2].wait_for_log(rf"origin 127.0.0.1:{ports[1]} replaced this node as its replica: (\d+) held", 30)
    assert int(dropped.group(1)) == 100
    assert held(2, 1) == 0
    stop_all([node for node in daemons if node.is_running()])
