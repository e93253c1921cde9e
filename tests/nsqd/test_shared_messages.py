"""A topic's channels share its message objects until each delivers its own (nsqd/message.py): ``claim_shared``
in C and in Python, and what a channel's consumers, FINs, REQs and timeouts do to the other channels' copies."""

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


async def test_channels_share_queued_messages_and_deliver_their_own():
    topic = _topic(3)
    topic.publish([b"a", b"b", b"c"])
    first, second, third = topic.channels.values()
    queued = list(first.queue)
    assert all(
        list(c.queue) == queued and all(x is y for x, y in zip(c.queue, queued, strict=True)) for c in (second, third)
    )
    client = _consumer(first, 1, rdy=100)
    first.dispatcher.dispatch(math.inf)
    delivered = [first.in_flight.get(m.id) for m in queued]
    assert all(m is not q and m.client is client and m.attempts == 1 for m, q in zip(delivered, queued, strict=True))
    assert all(m.client is None and m.attempts == 0 and m.delivered_at == 0.0 for m in second.queue)
    assert [m.body for m in delivered] == [b"a", b"b", b"c"] and delivered[0].body is queued[0].body
    # a REQ puts the first channel's own copy back; the others still hold the topic's objects
    first.requeue(client, queued[0].id, 0.0)
    assert first.queue[0] is delivered[0] and first.queue[0].attempts == 1
    assert second.queue[0] is queued[0] and second.queue[0].attempts == 0
    first.finish(client, queued[1].id)
    # the second channel copies too (the third still holds them); the last one takes the objects themselves
    other = _consumer(second, 2, rdy=100)
    second.dispatcher.dispatch(math.inf)
    assert all(second.in_flight.get(q.id) is not q and second.in_flight.get(q.id).client is other for q in queued)
    ids = [q.id for q in queued]
    del queued, delivered
    last = _consumer(third, 3, rdy=100)
    held = [id(m) for m in third.queue]
    third.dispatcher.dispatch(math.inf)
    assert [id(third.in_flight.get(i)) for i in ids] == held
    assert all(third.in_flight.get(i).client is last for i in ids)


async def test_a_single_channel_delivers_the_topics_objects():
    topic = _topic(1)
    topic.publish([b"x", b"y"])
    (channel,) = topic.channels.values()
    queued = list(channel.queue)
    _consumer(channel, 1, rdy=10)
    channel.dispatcher.dispatch(math.inf)
    assert [channel.in_flight.get(m.id) for m in queued] == queued
    assert all(channel.in_flight.get(m.id) is m for m in queued)


async def test_deferred_messages_are_shared_until_due_and_timeouts_keep_the_channels_apart():
    topic = _topic(2)
    topic.publish([b"later"], 5.0)
    first, second = topic.channels.values()
    assert first.deferred._heap[0][2] is second.deferred._heap[0][2]
    now = trio.current_time()
    assert first.process_queues(now + 6.0) and second.process_queues(now + 6.0)
    assert first.queue[0] is second.queue[0]
    client = _consumer(first, 1, rdy=10, msg_timeout=1.0)
    first.dispatcher.dispatch(math.inf)
    (delivered,) = [first.in_flight.get(m.id) for m in second.queue]
    assert delivered is not second.queue[0] and delivered.client is client
    assert first.process_queues(trio.current_time() + 2.0)  # the delivery timed out: back to the first channel
    assert first.queue[0] is delivered and delivered.attempts == 1 and delivered.client is None
    assert second.queue[0].attempts == 0 and second.queue[0].client is None
