"""Restarts in a replication ring of three (node i keeps copies on node i + 1, and on i + 2 with two peers), real
daemons under load.

- A node back on an empty data directory knows its topics' channels before it takes a publish: its peers tell it
  (WELCOME's ``topics``), so a message published at once reaches every channel, not only the first one a consumer
  makes again (a topic without channels gives its backlog to its first channel).
- Rolling restarts: each node in turn stopped (SIGTERM) and started again while producers publish (trying the next
  node when one refuses) and consumers read every node: nothing acknowledged is lost, and the live nodes refuse
  publishes only while the restarted node is away, plus a bounded moment to reconnect to it. The windows are
  printed per node.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.integration.harness import NsqdProcess, RawClient, free_port
from tests.integration.http_helpers import post, stats, wait_for
from tests.integration.replication_load import Outcome, Publisher, Readers
from tests.integration.test_replication import held

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOPIC = "restarts"
CHANNELS = ("one", "two")
#: how long a restarted node stays stopped (a deploy replaces what it runs): past the first steps of a peer's
#: reconnection back-off (0.1, 0.3, 0.7, 1.5, 3.1, 6.3 s), which a stop that says so (E_EXITING) skips
AWAY = 3.5


class Ring:
    """Three nodes on fixed ports (a restart keeps them); ``peers``: copies each node keeps on its successors."""

    def __init__(self, tmp_path: Path, *, peers: int = 1, takeover_timeout: str = "1s") -> None:
        self.tmp_path = tmp_path
        self.peers = peers
        self.takeover_timeout = takeover_timeout
        self.tcp = [free_port() for _ in range(3)]
        self.http = [free_port() for _ in range(3)]
        self.nodes: list[NsqdProcess | None] = [None, None, None]
        self.started: list[NsqdProcess] = []

    def node_name(self, index: int) -> str:
        return f"127.0.0.1:{self.tcp[index]}"

    def data_path(self, index: int) -> Path:
        return self.tmp_path / f"node{index}"

    def addresses(self, index: int):
        return ("127.0.0.1", self.tcp[index]), ("127.0.0.1", self.http[index])

    def start(self, index: int) -> NsqdProcess:
        peers = [f"--replicate-to={self.node_name((index + step) % 3)}" for step in range(1, self.peers + 1)]
        node = NsqdProcess(
            self.data_path(index),
            [
                "--broadcast-address=127.0.0.1",
                f"--tcp-address=127.0.0.1:{self.tcp[index]}",
                f"--http-address=127.0.0.1:{self.http[index]}",
                *peers,
                "--replication-acks=1",
                f"--replica-takeover-timeout={self.takeover_timeout}",
                f"--node-id={index + 1}",
                "--msg-timeout=5s",
            ],
        )
        node.start()
        self.nodes[index] = node
        self.started.append(node)
        return node

    def create(self, index: int) -> None:
        address = self.addresses(index)[1]
        assert post(address, f"/topic/create?topic={TOPIC}").status == 200
        for channel in CHANNELS:
            assert post(address, f"/channel/create?topic={TOPIC}&channel={channel}").status == 200

    def stats(self, index: int) -> dict:
        return stats(self.addresses(index)[1])

    def held(self, holder: int, origin: int) -> int:
        node = self.nodes[holder]
        assert node is not None
        return held(node, self.node_name(origin))

    def healthy(self) -> bool:
        for index in range(3):
            doc = self.stats(index).get("replication", {})
            if doc.get("state") != "replicating" or any(peer["state"] != "connected" for peer in doc["peers"]):
                return False
        return True

    def logs(self) -> str:
        return "\n\n".join(node.log_text() for node in self.started)

    def close(self) -> None:
        for node in self.nodes:
            if node is not None:
                node.kill()


@pytest.fixture
def ring_factory(tmp_path):
    rings: list[Ring] = []

    def make(**kwargs) -> Ring:
        rings.append(Ring(tmp_path, **kwargs))
        return rings[-1]

    yield make
    for number, ring in enumerate(rings):
        ring.close()
        (tmp_path / f"ring{number}.log").write_text(ring.logs())  # read when a test failed


def _missing(readers: Readers, acked, ring: Ring, tmp_path: Path) -> None:
    """Wait (bounded) until every acknowledged body reached both channels; fail naming what is missing."""
    try:
        wait_for(lambda: not any(readers.missing(acked).values()), timeout=60, interval=0.2, message="delivered")
    except AssertionError:
        missing = {channel: sorted(bodies)[:10] for channel, bodies in readers.missing(acked).items() if bodies}
        raise AssertionError(f"missing of {len(acked)} acknowledged: {missing}; logs in {tmp_path}") from None


@pytest.mark.parametrize("when", ["after-takeover", "taken-over-at-return"])
def test_a_node_back_on_an_empty_directory_knows_its_channels_before_it_takes_a_publish(ring_factory, tmp_path, when):
    # after-takeover: the successor adopted the node's copies before it came back (it kept the node's channels);
    # taken-over-at-return: it still held them, and takes them over when the node says it lost its directory
    ring = ring_factory(takeover_timeout="1s" if when == "after-takeover" else "120s")
    for index in range(3):
        ring.start(index)
    ring.create(0)
    wait_for(ring.healthy, timeout=30, message="ring replicating")
    with RawClient(ring.addresses(0)[0]) as producer:
        producer.publish_many(TOPIC, [b"before-%d" % i for i in range(10)])
    wait_for(lambda: ring.held(1, 0) == 10, message="copies on the successor")
    ring.nodes[0].kill()
    shutil.rmtree(ring.data_path(0))
    if when == "after-takeover":
        wait_for(lambda: ring.held(1, 0) == 0, timeout=30, message="takeover by the successor")
    # a producer that publishes to the node from the moment it is back (refused while it starts), and no consumer
    # yet: the channels exist only if the node learned them
    publisher = Publisher("p", TOPIC, ring.addresses, lambda: 0, timeout=10, pause=0.002).start()
    try:
        wait_for(lambda: publisher.outcomes, message="the producer trying the node while it is down")
        node = ring.start(0)
        listening = time.monotonic()
        wait_for(lambda: len(publisher.acked) >= 100, timeout=30, message="publishes taken after the restart")
    finally:
        publisher.stop()
    first = min(outcome.ended for outcome in publisher.outcomes if outcome.ok)
    # (3 made: the topic and its channels; or 2 when a refused HTTP publish made the topic first)
    if "topic(s) and channel(s) of this node that it lacked: created" not in node.log_text():
        raise AssertionError(f"node0 did not learn its channels from its peer; logs in {tmp_path}")
    assert "no available nsqlookupd" not in node.log_text()
    readers = Readers(TOPIC, CHANNELS, ring.addresses, 1).start()
    try:
        _missing(readers, publisher.acked, ring, tmp_path)
    finally:
        readers.stop()
    print(f"\n{when}: first publish acknowledged {first - listening:.3f} s after the node listened")


def _refusals(outcomes: list[Outcome], nodes, began: float, ended: float) -> tuple[int, float]:
    """How many publishes ``nodes`` refused between ``began`` and ``ended``, and the longest window (s) in which one
    of them refused: from its first refusal to its first acknowledgement after its last refusal (or that refusal's
    end, if none came)."""
    count, window = 0, 0.0
    for node in nodes:
        mine = sorted((o for o in outcomes if o.node == node and began <= o.started <= ended), key=lambda o: o.started)
        refused = [o for o in mine if not o.ok]
        if not refused:
            continue
        count += len(refused)
        last = refused[-1]
        after = [o.ended for o in mine if o.ok and o.started >= last.started]
        window = max(window, (min(after) if after else last.ended) - refused[0].started)
    return count, window


@pytest.mark.parametrize("peers", [1, 2])
def test_rolling_restarts_under_load_lose_nothing_and_refuse_only_while_a_node_is_away(ring_factory, tmp_path, peers):
    ring = ring_factory(peers=peers)
    for index in range(3):
        ring.start(index)
        ring.create(index)
    wait_for(ring.healthy, timeout=60, message="ring replicating")
    readers = Readers(TOPIC, CHANNELS, ring.addresses, 3).start()
    publishers = [
        Publisher(f"n{home}", TOPIC, ring.addresses, lambda home=home: home, nodes=3, retry=True, timeout=10)
        for home in range(3)
    ]
    figures = []
    try:
        for publisher in publishers:
            publisher.start()
        wait_for(lambda: all(len(p.acked) >= 50 for p in publishers), timeout=30, message="load running")
        for victim in range(3):
            wait_for(ring.healthy, timeout=60, message=f"ring replicating before node{victim} restarts")
            stopping = time.monotonic()
            assert ring.nodes[victim].stop() == 0
            stopped = time.monotonic()
            time.sleep(AWAY)
            ring.start(victim)
            back = time.monotonic()
            wait_for(ring.healthy, timeout=60, message=f"ring replicating after node{victim} restarted")
            healthy = time.monotonic()
            time.sleep(0.5)  # publishes answered after the ring looked healthy again (it must not refuse them)
            outcomes = [o for p in publishers for o in list(p.outcomes)]
            live = [index for index in range(3) if index != victim]
            refused, window = _refusals(outcomes, live, stopping, healthy + 0.5)
            own, own_window = _refusals(outcomes, [victim], back, healthy + 0.5)
            figures.append(
                {
                    "node": victim,
                    "away_s": round(back - stopping, 2),
                    "stop_s": round(stopped - stopping, 2),
                    "live_refused": refused,
                    "live_window_s": round(window, 2),
                    "own_refused_after_start": own,
                    "own_window_s": round(own_window, 2),
                    "healthy_after_s": round(healthy - stopping, 2),
                }
            )
            if peers == 1:
                # its predecessor cannot replicate while it is away: refused from the stop until it is back, plus
                # the reconnection (told E_EXITING, the predecessor tries every 0.1 s, where its back-off would wait
                # until 6.3 s) and the stream's resumption
                assert window <= back - stopping + 1.0, figures[-1]
            else:
                # each node keeps a second copy elsewhere: one node's restart refuses nothing on the others
                assert refused == 0, figures[-1]
            # the restarted node itself refuses while it learns from its peers and sends them its backfill
            assert own_window <= 3.0, figures[-1]
    finally:
        for publisher in publishers:
            publisher.stopping.set()
        for publisher in publishers:
            publisher.stop()
        print(f"\nrolling restarts, {peers} peer(s) per node: {figures}")
    acked = {body for publisher in publishers for body in publisher.acked}
    try:
        _missing(readers, acked, ring, tmp_path)
    finally:
        readers.stop()
    print(f"acknowledged {len(acked)}, duplicates per channel {readers.duplicates(acked)}")
