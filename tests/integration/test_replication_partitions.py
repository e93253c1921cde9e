"""Network partitions between an origin A and its replica B, while clients still reach both.

The partition is a pair of proxies the test controls (``partition.Link``): every byte between the two nodes
crosses them, each direction can be held, and new connections between them are refused during a cut. Each case
cuts both directions, or one, for less or more than B's ``--replica-takeover-timeout``, under a producer
publishing in turn with PUB, MPUB and HTTP, then heals it:

- no publish waits longer than the peer timeout (``sender.PEER_TIMEOUT``, documented in PROTOCOL.md, "Silence")
  plus a margin for a loaded machine: each ends in OK or an error;
- once A is degraded, publishes are refused (``refuse``) or acknowledged unreplicated (``accept``), as
  ``--replication-degraded`` says;
- everything acknowledged is delivered; a cut shorter than the takeover wait delivers nothing twice;
- a longer one lets B take A over while A lives: when the link heals A drops what B adopted, so each message has
  one owner; what comes twice is exactly what A finished during the partition (A counts it).
"""

from __future__ import annotations

import time

import pytest

from nsqd.replication.sender import PEER_TIMEOUT
from protocol.frames import FRAME_TYPE_MESSAGE
from protocol.message import decode_message
from tests.integration.harness import NsqdProcess, RawClient, command, consumer, free_port
from tests.integration.http_helpers import post, stats, wait_for
from tests.integration.partition import Link
from tests.integration.replication_load import Publisher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: what a loaded machine may add to the peer timeout before a waiting publish is answered
MARGIN = 4.0


class Pair:
    def __init__(self, tmp_path, mode: str, takeover: str) -> None:
        self.a_port, self.b_port = free_port(), free_port()
        self.link = Link(self.a_port, self.b_port)
        self.b = NsqdProcess(
            tmp_path / "b",
            [
                "--broadcast-address=127.0.0.1",
                f"--tcp-address=127.0.0.1:{self.b_port}",
                f"--replica-takeover-timeout={takeover}",
                "--node-id=2",
            ],
        ).start()
        self.a = NsqdProcess(
            tmp_path / "a",
            [
                "--broadcast-address=127.0.0.1",
                f"--tcp-address=127.0.0.1:{self.a_port}",
                "--node-id=1",
                f"--broadcast-tcp-port={self.link.to_a.port}",
                f"--replicate-to={self.link.to_b.address}",
                f"--replication-degraded={mode}",
            ],
        ).start()
        self.node = f"127.0.0.1:{self.link.to_a.port}"  # A as B knows it: its node address crosses the link

    def state(self) -> str:
        return stats(self.a.http())["replication"]["state"]

    def takeovers(self) -> int:
        return stats(self.b.http())["replication"]["takeovers"]

    def close(self) -> None:
        for node in (self.a, self.b):
            if node.is_running():
                node.kill()
        self.link.close()


def _consume(address, count: int) -> list[str]:
    with consumer(address, "t", "c", ready=count) as client:
        messages = [client.read_message(timeout=10) for _ in range(count)]
        client.send(command("RDY", 0))  # nothing more in flight to this consumer once it finished these
        for message in messages:
            client.send(command("FIN", message.id))
        return [message.body.decode() for message in messages]


def _drain(addresses, acked: set[str], received: list[str]) -> None:
    """Read channel ``c`` on every address until each acknowledged body came (30 s at most)."""
    clients = [consumer(address, "t", "c", ready=50) for address in addresses]
    try:
        deadline = time.monotonic() + 30
        while not acked <= set(received) and time.monotonic() < deadline:
            for client in clients:
                while (frame := client.poll_frame(0.01)) is not None:
                    if frame.frame_type == FRAME_TYPE_MESSAGE:
                        message = decode_message(frame.data)
                        received.append(message.body.decode())
                        client.send(command("FIN", message.id))
    finally:
        for client in clients:
            client.close()


CASES = [
    pytest.param("both", "refuse", False, id="both-ways-shorter-refuse"),
    pytest.param("a_to_b", "accept", False, id="origin-to-replica-shorter-accept"),
    pytest.param("b_to_a", "refuse", False, id="replica-to-origin-shorter-refuse"),
    pytest.param("both", "refuse", True, id="both-ways-longer-refuse"),
    pytest.param("a_to_b", "refuse", True, id="origin-to-replica-longer-refuse"),
    pytest.param("b_to_a", "accept", True, id="replica-to-origin-longer-accept"),
]


@pytest.mark.parametrize("direction, mode, longer", CASES)
def test_a_partition_loses_nothing_acknowledged_and_bounds_how_long_publishes_wait(tmp_path, direction, mode, longer):
    pair = Pair(tmp_path, mode, "1s" if longer else "60s")
    publisher = None
    try:
        wait_for(lambda: pair.state() == "replicating", timeout=20, message="replicating")
        assert post(pair.a.http(), "/topic/create?topic=t").status == 200
        assert post(pair.a.http(), "/channel/create?topic=t&channel=c").status == 200
        before = [f"before-{n}" for n in range(20)]
        with RawClient(pair.a.tcp) as producer:
            producer.publish_many("t", [body.encode() for body in before])
        acked_seq = stats(pair.a.http())["replication"]["peers"][0]["acked"]
        received = _consume(pair.a.tcp, 5)
        wait_for(
            lambda: (lambda p: p["acked"] > acked_seq and p["pending_frames"] == 0)(
                stats(pair.a.http())["replication"]["peers"][0]
            ),
            message="the FINs reached B",
        )

        publisher = Publisher("p", "t", lambda _index: (pair.a.tcp, pair.a.http()), lambda: 0).start()
        wait_for(lambda: len(publisher.acked) >= 20, timeout=20, message="publishing")
        cut_at = time.monotonic()
        pair.link.cut(a_to_b=direction != "b_to_a", b_to_a=direction != "a_to_b")
        wait_for(lambda: pair.state() == "degraded", timeout=PEER_TIMEOUT + MARGIN + 5, message="A degraded")
        degraded_at = time.monotonic()
        wait_for(
            lambda: len(publisher.outcomes_after(degraded_at)) >= 6,
            timeout=20,
            message="publishes answered while degraded",
        )
        during = []
        if longer:
            wait_for(lambda: pair.takeovers() == 1, timeout=30, message="B took A over during the partition")
            during = _consume(pair.a.tcp, 3)  # finished on A, unknown to B: these come twice
        pair.link.heal()
        healed_at = time.monotonic()
        wait_for(lambda: pair.state() == "replicating", timeout=20, message="replicating again")
        if longer:
            pair.a.wait_for_log(r"while it was connected elsewhere .*: dropped the \d+ held here", timeout=10)
        wait_for(lambda: len(publisher.outcomes_after(healed_at)) >= 3, timeout=20, message="publishing again")
        publisher.stop()

        outcomes = publisher.outcomes
        slowest = max(outcomes, key=lambda o: o.duration)
        assert slowest.duration <= PEER_TIMEOUT + MARGIN, f"a publish waited {slowest.duration:.1f} s: {slowest}"
        assert all(o.ok for o in outcomes if o.ended < cut_at), [o for o in outcomes if not o.ok][:3]
        while_degraded = [o for o in outcomes if degraded_at <= o.started and o.ended <= healed_at]
        assert while_degraded
        if mode == "refuse":
            assert not any(o.ok for o in while_degraded), [o for o in while_degraded if o.ok][:3]
        else:
            assert all(o.ok for o in while_degraded), [o for o in while_degraded if not o.ok][:3]

        acked = set(before) | set(publisher.acked)
        received += during
        _drain([pair.a.tcp] + ([pair.b.tcp] if longer else []), acked, received)
        missing = acked - set(received)
        assert not missing, f"{len(missing)} acknowledged message(s) lost, e.g. {sorted(missing)[:5]}"
        twice = sorted(body for body in set(received) if received.count(body) > 1 and body in acked)
        if longer:
            # one owner after the heal: only what A finished while cut off comes again (from B)
            assert twice == sorted(during)
            assert stats(pair.a.http())["replication"]["duplicates_after_takeover"] == len(during)
        else:
            assert twice == [] and pair.takeovers() == 0
        print(
            f"\npartition {direction} {'longer' if longer else 'shorter'} ({mode}): {len(acked)} acknowledged, "
            f"{len(twice)} twice, slowest publish {slowest.duration:.2f} s, "
            f"{sum(not o.ok for o in outcomes)} refused or failed"
        )
    finally:
        if publisher is not None:
            publisher.stopping.set()
        pair.close()
