"""Restarts in a replication ring of three (node i keeps copies on node i + 1, and on i + 2 with two peers), real
daemons under load.

- A node back on an empty data directory knows its topics' channels before it takes a publish: its peers tell it
  (WELCOME's ``topics``), so a message published at once reaches every channel, not only the first one a consumer
  makes again (a topic without channels gives its backlog to its first channel).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.integration.harness import NsqdProcess, RawClient, free_port
from tests.integration.http_helpers import post, stats, wait_for
from tests.integration.replication_load import Publisher, Readers
from tests.integration.test_replication import held

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOPIC = "restarts"
CHANNELS = ("one", "two")


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
