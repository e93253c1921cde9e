"""A rolling upgrade: a ring of three where one node speaks only the first version of the replication protocol.

The older node is a current nsqd whose protocol version is capped (``NSQD_TEST_REPLICATION_VERSION=1``): it
announces version 1 and its decoders refuse every frame type that came later, as a node of that version would.
Its peers must speak version 1 to it and version 2 to each other: the stream from the ring's newer node to its
newer successor carries PING/PONG (version 2: the round trip in ``/stats``), the others only version 1's frames.
Then the older node is upgraded (restarted without the cap, on its data) and every link speaks version 2."""

from __future__ import annotations

import pytest

from nsqd.server import REPLICATION_VERSION_ENV
from protocol.replication import PROTOCOL_VERSION
from tests.integration.harness import NsqdProcess, RawClient, free_port
from tests.integration.http_helpers import stats, wait_for

pytestmark = pytest.mark.timeout(120)


class _Ring:
    """Three nodes, node i keeping copies on node i + 1; ``older``: the node capped at version 1."""

    def __init__(self, tmp_path, older: int) -> None:
        self.tmp_path = tmp_path
        self.older = older
        self.ports = [free_port() for _ in range(3)]
        self.nodes: list[NsqdProcess] = []

    def address(self, index: int) -> str:
        return f"127.0.0.1:{self.ports[index]}"

    def start(self, index: int, *, capped: bool) -> NsqdProcess:
        node = NsqdProcess(
            self.tmp_path / f"n{index}",
            [
                "--broadcast-address=127.0.0.1",
                f"--tcp-address={self.address(index)}",
                f"--node-id={index + 1}",
                f"--replicate-to={self.address((index + 1) % 3)}",
            ],
        )
        if capped:
            node.env[REPLICATION_VERSION_ENV] = "1"
        node.start()
        if index < len(self.nodes):
            self.nodes[index] = node
        else:
            self.nodes.append(node)
        return node

    def peer(self, index: int) -> dict:
        return stats(self.nodes[index].http())["replication"]["peers"][0]

    def replicating(self) -> bool:
        return all(stats(node.http())["replication"]["state"] == "replicating" for node in self.nodes)

    def held(self, holder: int, origin: int) -> int:
        for entry in stats(self.nodes[holder].http())["replication"]["replicas"]:
            if entry["node"] == self.address(origin):
                return entry["held_messages"]
        return 0


@pytest.fixture
def ring(tmp_path):
    ring = _Ring(tmp_path, older=1)
    yield ring
    for node in ring.nodes:
        if node.is_running():
            node.kill()


def _publish(ring: _Ring, label: str) -> None:
    for index in range(3):
        with RawClient(("127.0.0.1", ring.ports[index])) as producer:
            producer.publish("t", f"{label}-{index}-pub".encode())
            producer.publish_many("t", [f"{label}-{index}-mpub-{n}".encode() for n in range(4)])


def test_a_ring_upgrades_one_node_at_a_time(ring):
    assert PROTOCOL_VERSION >= 2  # else there is nothing newer to speak
    for index in range(3):
        ring.start(index, capped=index == ring.older)
    wait_for(ring.replicating, timeout=30, message="ring replicating")
    newer_link = (ring.older + 1) % 3  # its successor is newer too: the one link that speaks version 2
    assert [ring.peer(index)["version"] for index in range(3)] == [2 if i == newer_link else 1 for i in range(3)]

    _publish(ring, "before")
    # every OK came once the successor stored the message
    assert [ring.held((index + 1) % 3, index) for index in range(3)] == [5, 5, 5]

    # idle now: each origin heartbeats; the newer link with PING (its PONG gives the round trip), the links of the
    # older node with version 1's HEARTBEAT, which its decoder takes (it would refuse a PING and close the stream)
    wait_for(
        lambda: ring.peer(newer_link)["round_trip_ms"] is not None,
        timeout=20,
        message="a PING answered on the version 2 link",
    )
    for index in range(3):
        if index != newer_link:
            assert ring.peer(index)["round_trip_ms"] is None
    _publish(ring, "idle")
    assert [ring.held((index + 1) % 3, index) for index in range(3)] == [10, 10, 10]
    for node in ring.nodes:
        log = node.log_text()
        assert "unknown replication frame type" not in log and " lost - " not in log, log

    # the upgrade: the older node restarts on its data, without the cap
    assert ring.nodes[ring.older].stop() == 0
    ring.start(ring.older, capped=False)
    wait_for(
        lambda: ring.replicating() and all(ring.peer(i)["version"] == 2 for i in range(3)),
        timeout=30,
        message="every link on version 2 after the upgrade",
    )
    _publish(ring, "after")
    assert [ring.held((index + 1) % 3, index) for index in range(3)] == [15, 15, 15]
    wait_for(
        lambda: all(ring.peer(i)["round_trip_ms"] is not None for i in range(3)), timeout=20, message="every link pings"
    )
