"""nsqd/message.py's C twins: ``new_messages`` made in C holds what the Python one does, slot for slot; and the
cyclic collector: the C ``Message`` is never in its walks, and a channel that is closed forgets its in-flight
messages, so no cycle through their clients stays; messages of a Python class made in C are left out of its walks,
a delivery puts them back before it stores its client in them, and a cycle closed through such a message is then
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
from nsqd.message import Message, PythonMessage, claim_shared, new_messages, track_all
from nsqd.queues import inflight

from .test_dispatch import _channel, _consumer

ACCELERATED = message_module.untrack_atomic is not message_module._leave_to_the_collector
accelerated = pytest.mark.skipif(not ACCELERATED, reason="nsqd._speedups not built or TRIONSQ_NO_SPEEDUPS set")


def _batch(count: int = 3, body=b"body") -> list[Message]:
    return new_messages([b"%016d" % n for n in range(count)], [body] * count, 1000)


def _python_batch(count: int = 3, body=b"body") -> list[PythonMessage]:
    """Messages of the Python class made by the C ``new_messages`` (untracked as it leaves them)."""
    return message_module._new_messages(PythonMessage, [b"%016d" % n for n in range(count)], [body] * count, 1000, 0.0)


class _Holder:
    """A stand-in for what a delivered message's client leads back to (its channel's in-flight queue)."""


@accelerated
async def test_the_c_message_is_never_tracked_and_a_closed_channel_forgets_its_clients():
    messages = _batch()
    assert type(messages[0]) is Message and Message is not PythonMessage
    channel = _channel()
    client = _consumer(channel, 1, rdy=100)
    channel.put_many(messages)
    channel.dispatcher.dispatch(math.inf)
    assert all(m.client is client for m in messages)
    assert not any(gc.is_tracked(m) for m in messages)
    channel.close(persist=False)  # deleted: what is in flight is forgotten, the cycle through each client broken
    assert all(m.client is None for m in messages) and len(channel.in_flight) == 0


@accelerated
async def test_published_messages_of_a_python_class_leave_the_collector_and_a_delivery_tracks_them_again(monkeypatch):
    monkeypatch.setattr(inflight, "DEFAULT_INDEX", inflight.MessagesById)  # the C index takes the C type only
    messages = _python_batch()
    assert not any(gc.is_tracked(m) for m in messages)
    channel = _channel()
    client = _consumer(channel, 1, rdy=100)
    channel.put_many(messages)
    channel.dispatcher.dispatch(math.inf)
    assert all(m.client is client for m in messages)
    assert all(gc.is_tracked(m) for m in messages)


@accelerated
def test_a_message_that_references_a_container_stays_tracked():
    make = message_module._new_messages
    plain, viewed = make(PythonMessage, [b"%016d" % 1, b"%016d" % 2], [b"plain", memoryview(b"viewed")], 1000, 0)
    assert not gc.is_tracked(plain)
    assert gc.is_tracked(viewed)
    deferred = make(PythonMessage, [b"%016d" % 3], [b"later"], 1000, 2.5)[0]
    assert not gc.is_tracked(deferred) and deferred.defer == 2.5
    shared = [plain, deferred, _batch(1)[0]]
    batch = list(shared)
    claim_shared(batch)  # the copies a delivery makes are tracked at once: their client is stored next
    assert batch[0] is not plain and batch[1].defer == 2.5
    assert batch[2] is not shared[2] and batch[2].id == shared[2].id and type(batch[2]) is Message


SLOTS = [slot for cls in PythonMessage.__mro__ for slot in getattr(cls, "__slots__", ())]


@accelerated
@pytest.mark.parametrize("defer", [0.0, 0, 2.5])
def test_messages_made_in_c_hold_what_the_python_twin_makes(defer):
    ids = [b"%016d" % n for n in range(4)]
    bodies = [b"one", b"two" * 100, memoryview(b"three"), b""]
    made = new_messages(ids, bodies, 1234, defer)
    count = len(ids)
    expected = (
        [PythonMessage(i, b, 1234, 0, defer) for i, b in zip(ids, bodies, strict=True)]
        if defer
        else [PythonMessage(i, b, 1234) for i, b in zip(ids, bodies, strict=True)]
    )
    assert len(made) == count and all(type(m) is Message for m in made)
    python_made = message_module._new_messages(PythonMessage, ids, bodies, 1234, defer)
    for got, python_got, want in zip(made, python_made, expected, strict=True):
        assert [getattr(got, slot) for slot in SLOTS] == [getattr(want, slot) for slot in SLOTS]
        assert [getattr(python_got, slot) for slot in SLOTS] == [getattr(want, slot) for slot in SLOTS]
        assert type(got.defer) is type(want.defer) is type(python_got.defer)
    assert not any(gc.is_tracked(m) for m in made)
    assert [gc.is_tracked(m) for m in python_made] == [False, False, True, False]
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


def _cycle_through(message: PythonMessage, retrack: bool) -> weakref.ref:
    holder = _Holder()
    holder.messages = [message]
    if retrack:
        track_all(holder.messages)
    message.client = holder  # what a delivery stores: the holder leads back to the message
    return weakref.ref(holder)


@accelerated
def test_a_cycle_closed_through_a_tracked_again_message_is_collected():
    gone = _cycle_through(_python_batch(1)[0], retrack=True)
    gc.collect()
    assert gone() is None
    # and the reason for track_all: an untracked message hides its reference from the collector, which then
    # takes the cycle for reachable from outside
    kept = _cycle_through(_python_batch(1)[0], retrack=False)
    gc.collect()
    assert kept() is not None
    kept().messages[0].client = None  # break it by hand, so no test leaves it behind


def test_without_the_accelerator_every_message_stays_tracked():
    messages = [PythonMessage(b"%016d" % n, b"body", 1000) for n in range(3)]
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
