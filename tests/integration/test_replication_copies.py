"""Three copies: a ring of three where each node keeps copies on the two others (``--replicate-to`` twice, the
default ``--replication-min-insync=2``). Real daemons as subprocesses, real sockets.

One node killed: exactly one of its two replicas adopts its messages (the first in its ``--replicate-to`` order;
the other, asking it, leaves them), and the survivors refuse no publish. Two nodes killed at once: the third takes
both over, refuses publishes while it has no peer and takes them again by itself once one is back; the node that
returns with its store leaves to the third what that one adopted."""

from __future__ import annotations

import pytest

from tests.integration.copies_ring import CopiesRing as Ring
from tests.integration.harness import NsqdProcess, RawClient, stop_all
from tests.integration.http_helpers import wait_for

pytestmark = pytest.mark.timeout(120)


def _refused(node: NsqdProcess) -> bool:
    with RawClient(node.tcp) as producer:
        try:
            producer.publish("p", b"probe")
        except Exception:  # E_PUB_FAILED, or the connection closed without an answer
            return True
    return False


def test_one_node_killed_is_adopted_by_exactly_one_replica_and_the_survivors_refuse_nothing(daemons, tmp_path):
    ring = Ring(tmp_path, daemons)
    ring.publish(0, 200, "a")
    wait_for(lambda: ring.healthy() and ring.held(1, 0) == ring.held(2, 0) == 200, message="both copies held")
    ring.nodes[0].kill()
    for survivor in (1, 2):  # no wait for the dead peer: the other one acknowledges
        assert not _refused(ring.nodes[survivor])
    wait_for(lambda: ring.held(1, 0) == 0 and ring.held(2, 0) == 0, timeout=30, message="a taken over")
    depths = [ring.depth(1), ring.depth(2)]
    assert sorted(depths) == [0, 200], depths  # one owner for each message, none delivered twice
    first = ring.doc(1)["replication"]
    second = ring.doc(2)["replication"]
    assert first["adopted_messages"] == 200  # b is first in a's order
    assert second["adopted_messages"] == 0 and second["left_to_peers"] == 200
    for survivor in (1, 2):
        assert not _refused(ring.nodes[survivor])
    stop_all([node for node in daemons if node.is_running()])


def test_an_origin_killed_again_soon_after_a_takeover_is_adopted_by_the_first_replica_alone(daemons, tmp_path):
    # b (first in a's order) takes a over 4 s after a dies, c after 1 s: c asks b, and waits while b holds copies of
    # a. After a's second death b also lists the ids of its first takeover (for 30 s after a heard them); those say
    # nothing of the copies held now, and must not let c adopt them too (in a ring where both wait the same time,
    # both adopted them, and every channel that had not finished them got each twice)
    ring = Ring(tmp_path, daemons, node_args={1: ("--replica-takeover-timeout=4s",)})
    ring.publish(0, 50, "a")
    wait_for(lambda: ring.healthy() and ring.held(1, 0) == ring.held(2, 0) == 50, message="both copies held")
    ring.nodes[0].kill()
    wait_for(lambda: ring.held(1, 0) == 0 and ring.held(2, 0) == 0, timeout=30, message="a taken over")
    assert (ring.depth(1), ring.depth(2)) == (50, 0)
    ring.start(0)  # back: it hears which of its messages b adopted
    wait_for(ring.healthy, timeout=30, message="a back and replicating")
    ring.publish(0, 30, "b")
    wait_for(lambda: ring.healthy() and ring.held(1, 0) == ring.held(2, 0) == 30, message="both copies held again")
    ring.nodes[0].kill()
    wait_for(lambda: ring.held(1, 0) == 0 and ring.held(2, 0) == 0, timeout=30, message="a taken over again")
    assert (ring.depth(1), ring.depth(2)) == (80, 0), "c adopted what b adopts"
    second = ring.doc(2)["replication"]
    assert second["adopted_messages"] == 0 and second["left_to_peers"] == 80
    stop_all([node for node in daemons if node.is_running()])


def test_two_nodes_killed_at_once_lose_nothing_and_publishing_resumes_by_itself(daemons, tmp_path):
    ring = Ring(tmp_path, daemons)
    ring.publish(0, 100, "a")
    ring.publish(1, 50, "b")
    wait_for(lambda: ring.healthy() and ring.held(2, 0) == 100 and ring.held(2, 1) == 50, message="copies on c")
    ring.nodes[0].kill()
    ring.nodes[1].kill()
    wait_for(lambda: ring.held(2, 0) == 0 and ring.held(2, 1) == 0, timeout=30, message="c takes over a and b")
    assert ring.depth(2) == 150
    assert ring.doc(2)["replication"]["state"] == "degraded"  # no peer left: fewer copies than the minimum
    assert _refused(ring.nodes[2])
    ring.start(1)  # b comes back on its data: its store of a, unsynced, still holds what c adopted
    wait_for(
        lambda: ring.doc(2)["replication"]["state"] == "replicating", timeout=30, message="c replicating with b back"
    )
    assert not _refused(ring.nodes[2])
    wait_for(lambda: ring.doc(1)["replication"]["left_to_peers"] == 100, timeout=30, message="b leaves a to c")
    assert ring.held(1, 0) == 0
    assert ring.depth(1) == 0, "b delivers again what c adopted"
    assert ring.depth(2) == 150
    stop_all([node for node in daemons if node.is_running()])
