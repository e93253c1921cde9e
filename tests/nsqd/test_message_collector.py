"""nsqd/message.py's C twins: ``new_messages`` made in C holds what the Python one does, slot for slot; and the
cyclic collector: published messages are left out of its walks (with the C accelerator),
a delivery puts them back before it stores its client in them, and a cycle closed through a message is then
collected; without the accelerator every message stays tracked, as before."""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import weakref

import pytest

from nsqd import message as message_module
from nsqd.message import Message, claim_shared, new_messages, track_all

from .test_dispatch import _channel, _consumer

ACCELERATED = message_module.untrack_atomic is not message_module._leave_to_the_collector
accelerated = pytest.mark.skipif(not ACCELERATED, reason="nsqd._speedups not built or TRIONSQ_NO_SPEEDUPS set")


def _batch(count: int = 3, body=b"body") -> list[Message]:
    return new_messages([b"%016d" % n for n in range(count)], [body] * count, 1000)


class _Holder:
    """A stand-in for what a delivered message's client leads back to (its channel's in-flight queue)."""


@accelerated
async def test_published_messages_leave_the_collector_and_a_delivery_tracks_them_again():
    messages = _batch()
    assert not any(gc.is_tracked(m) for m in messages)
    channel = _channel()
    client = _consumer(channel, 1, rdy=100)
    channel.put_many(messages)
    channel.dispatcher.dispatch(math.inf)
    assert all(m.client is client for m in messages)
    assert all(gc.is_tracked(m) for m in messages)


@accelerated
def test_a_message_that_references_a_container_stays_tracked():
    plain, viewed = new_messages([b"%016d" % 1, b"%016d" % 2], [b"plain", memoryview(b"viewed")], 1000)
    assert not gc.is_tracked(plain)
    assert gc.is_tracked(viewed)
    deferred = new_messages([b"%016d" % 3], [b"later"], 1000, 2.5)[0]
    assert not gc.is_tracked(deferred) and deferred.defer == 2.5
    shared = [plain, deferred]
    batch = list(shared)
    claim_shared(batch)  # the copies a delivery makes are tracked at once: their client is stored next
    assert batch[0] is not plain and batch[1].defer == 2.5


SLOTS = [slot for cls in Message.__mro__ for slot in getattr(cls, "__slots__", ())]


@accelerated
@pytest.mark.parametrize("defer", [0.0, 0, 2.5])
def test_messages_made_in_c_hold_what_the_python_twin_makes(defer):
    ids = [b"%016d" % n for n in range(4)]
    bodies = [b"one", b"two" * 100, memoryview(b"three"), b""]
    made = new_messages(ids, bodies, 1234, defer)
    count = len(ids)
    expected = (
        [Message(i, b, 1234, 0, defer) for i, b in zip(ids, bodies, strict=True)]
        if defer
        else [Message(i, b, 1234) for i, b in zip(ids, bodies, strict=True)]
    )
    assert len(made) == count and all(type(m) is Message for m in made)
    for got, want in zip(made, expected, strict=True):
        assert [getattr(got, slot) for slot in SLOTS] == [getattr(want, slot) for slot in SLOTS]
        assert type(got.defer) is type(want.defer)
    assert [gc.is_tracked(m) for m in made] == [False, False, True, False]
    with pytest.raises(ValueError):
        new_messages(ids, bodies[:2], 1234)


@pytest.mark.parametrize("twin", ["c", "python"])
def test_messages_with_a_timestamp_each(twin, monkeypatch):
    """A packed queue's delivery across publishes (nsqd/queues/packed.py): one call, a timestamp per message, the
    IDs joined."""
    if twin == "python":
        monkeypatch.setattr(message_module, "_new_messages", None)
    elif not message_module._packed_in_c:
        pytest.skip("nsqd._speedups not built (or built before it took a list), or TRIONSQ_NO_SPEEDUPS set")
    ids = [b"%016d" % n for n in range(3)]
    made = new_messages(ids, [b"a", b"b", b"c"], [10, 10, 11])
    expected = [Message(i, b, t) for i, b, t in zip(ids, [b"a", b"b", b"c"], [10, 10, 11], strict=True)]
    for got, want in zip(made, expected, strict=True):
        assert [getattr(got, slot) for slot in SLOTS] == [getattr(want, slot) for slot in SLOTS]
    joined = new_messages(b"".join(ids), [b"a", b"b", b"c"], [10, 10, 11])  # the IDs as a packed queue keeps them
    assert [[getattr(m, slot) for slot in SLOTS] for m in joined] == [
        [getattr(m, slot) for slot in SLOTS] for m in made
    ]
    with pytest.raises(ValueError):
        new_messages(b"".join(ids)[:-1], [b"a", b"b", b"c"], 10)
    if twin == "c":
        assert not any(gc.is_tracked(m) for m in made + joined)
        with pytest.raises(ValueError):
            new_messages(ids, [b"a", b"b", b"c"], [10, 11])


def _cycle_through(message: Message, retrack: bool) -> weakref.ref:
    holder = _Holder()
    holder.messages = [message]
    if retrack:
        track_all(holder.messages)
    message.client = holder  # what a delivery stores: the holder leads back to the message
    return weakref.ref(holder)


@accelerated
def test_a_cycle_closed_through_a_tracked_again_message_is_collected():
    gone = _cycle_through(_batch(1)[0], retrack=True)
    gc.collect()
    assert gone() is None
    # and the reason for track_all: an untracked message hides its reference from the collector, which then
    # takes the cycle for reachable from outside
    kept = _cycle_through(_batch(1)[0], retrack=False)
    gc.collect()
    assert kept() is not None
    kept().messages[0].client = None  # break it by hand, so no test leaves it behind


def test_without_the_accelerator_every_message_stays_tracked():
    messages = [Message(b"%016d" % n, b"body", 1000) for n in range(3)]
    message_module._leave_to_the_collector(messages)
    assert all(gc.is_tracked(m) for m in messages)
    script = (
        "import gc; from nsqd import message as m; "
        "b = m.new_messages([b'0' * 16], [b'x'], 1); m.track_all(b); "
        "print(m.untrack_atomic is m._leave_to_the_collector, gc.is_tracked(b[0]))"
    )
    env = dict(os.environ, TRIONSQ_NO_SPEEDUPS="1")
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["True", "True"]
