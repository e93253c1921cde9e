"""A topic's channels share what it holds: its segment of published messages (each channel's queue a window on
it, nsqd/queues/packed.py), and the message objects it hands them (a disk backlog's, a takeover's, deferred ones)
until each delivers its own (nsqd/message.py): ``claim_shared`` in C and in Python, and what a channel's
consumers, FINs, REQs and timeouts do to the other channels' copies."""

from __future__ import annotations

import math

import pytest
import trio

from nsqd import message as message_module
from nsqd.actors import ActorSystem
from nsqd.message import Message
from nsqd.topic import Topic

from .test_dispatch import _consumer

SLOTS = [slot for cls in Message.__mro__ for slot in getattr(cls, "__slots__", ())]
TWINS = [pytest.param(message_module._claim_shared, id="python")]
if message_module._speedups is not None:
    TWINS.append(pytest.param(message_module._speedups.claim_shared, id="c"))


def _slots(message: Message) -> list:
    return [getattr(message, slot) for slot in SLOTS]


@pytest.mark.parametrize("claim", TWINS)
def test_claim_copies_only_what_something_else_references(claim):
    made = [Message(b"%016d" % n, b"body %d" % n, 1000 + n, n, 0.5 * n) for n in range(4)]
    made[3].disk_token = 7
    elsewhere = [made[1], made[3]]  # another channel's queue, say
    batch = list(made)
    del made
    claim(batch)
    assert batch[1] is not elsewhere[0] and batch[3] is not elsewhere[1]
    assert _slots(batch[1]) == _slots(elsewhere[0]) and _slots(batch[3]) == _slots(elsewhere[1])
    assert type(batch[1]) is Message and batch[3].disk_token == 7
    kept = [batch[0], batch[2]]
    claim(batch)  # now every message has another reference (``kept``, ``elsewhere``): each is copied
    assert batch[0] is not kept[0] and batch[2] is not kept[1]
    del kept, elsewhere
    again = list(batch)
    del again
    alone = [batch[0]]
    batch.clear()
    first = alone[0]
    del first
    address = id(alone[0])
    claim(alone)  # referenced by the list alone: left as it is
    assert id(alone[0]) == address


def _topic(channels: int) -> Topic:
    topic = Topic("t", node_id=3, mem_queue_size=10_000, max_msg_timeout=900.0, actors=ActorSystem())
    for index in range(channels):
        topic.get_channel(f"c{index}")
    return topic


async def test_channels_share_the_topics_segment_and_deliver_their_own():
    topic = _topic(3)
    topic.publish([b"a", b"b", b"c"])
    first, second, third = topic.channels.values()
    windows = [c.queue._runs[0] for c in (first, second, third)]
    assert len({id(w.packed) for w in windows}) == 1 and {(w.start, w.end) for w in windows} == {(0, 3)}
    queued = list(first.queue)
    client = _consumer(first, 1, rdy=100)
    first.dispatcher.dispatch(math.inf)
    delivered = [first.in_flight.get(m.id) for m in queued]
    assert all(m.client is client and m.attempts == 1 for m in delivered)
    assert all(m.client is None and m.attempts == 0 and m.delivered_at == 0.0 for m in second.queue)
    assert [m.body for m in delivered] == [b"a", b"b", b"c"] and delivered[0].body is queued[0].body
    # a REQ puts the first channel's own object back; the others still hold their windows
    first.requeue(client, queued[0].id, 0.0)
    (requeued,) = first.queue
    assert requeued is delivered[0] and requeued.attempts == 1
    assert [m.attempts for m in second.queue] == [0, 0, 0] and type(second.queue._runs[0]) is type(windows[0])
    first.finish(client, queued[1].id)
    other = _consumer(second, 2, rdy=100)
    second.dispatcher.dispatch(math.inf)
    theirs = [second.in_flight.get(q.id) for q in queued]
    assert all(m.client is other and m.attempts == 1 for m in theirs)
    assert not any(a is b for a, b in zip(theirs, delivered, strict=True))
    assert [m.body for m in third.queue] == [b"a", b"b", b"c"]


async def test_objects_handed_to_every_channel_are_shared_until_delivered():
    topic = _topic(2)
    first, second = topic.channels.values()
    given = [Message(b"%016d" % n, b"kept %d" % n, 1000, 2) for n in range(2)]  # a takeover's, say: attempts 2
    topic.put_many(given)
    assert all(x is y for x, y in zip(first.queue, second.queue, strict=True))
    client = _consumer(first, 1, rdy=10)
    first.dispatcher.dispatch(math.inf)
    mine = [first.in_flight.get(m.id) for m in given]
    assert all(m is not g and m.attempts == 3 and m.client is client for m, g in zip(mine, given, strict=True))
    assert [(m.attempts, m.client) for m in second.queue] == [(2, None), (2, None)]
    held = [id(m) for m in second.queue]
    del given, mine
    _consumer(second, 2, rdy=10)
    second.dispatcher.dispatch(math.inf)  # the last holder takes the objects themselves
    assert sorted(id(message) for message in second.in_flight._entries.values()) == sorted(held)


async def test_deferred_messages_are_shared_until_due_and_timeouts_keep_the_channels_apart():
    topic = _topic(2)
    topic.publish([b"later"], 5.0)
    first, second = topic.channels.values()
    assert first.deferred._heap[0] is second.deferred._heap[0]  # one heap entry for both (queues/deferred.py)
    now = trio.current_time()
    assert first.process_queues(now + 6.0) and second.process_queues(now + 6.0)
    (shared,) = first.queue
    assert shared is next(iter(second.queue))
    client = _consumer(first, 1, rdy=10, msg_timeout=1.0)
    first.dispatcher.dispatch(math.inf)
    delivered = first.in_flight.get(shared.id)
    assert delivered is not shared and delivered.client is client
    assert first.process_queues(trio.current_time() + 2.0)  # the delivery timed out: back to the first channel
    assert next(iter(first.queue)) is delivered and delivered.attempts == 1 and delivered.client is None
    assert shared.attempts == 0 and shared.client is None and next(iter(second.queue)) is shared
