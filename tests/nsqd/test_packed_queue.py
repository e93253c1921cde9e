"""The memory queues of nsqd/queues/packed.py: published messages kept as their parts come back as the messages
a publish makes, in order with those kept as objects, whole or taken a few at a time; a topic's segment grows
while a queue holds a window on it and starts again when none does; and the topic's paths through its queue
(held backlog handed to a new channel, /stats depth, a graceful stop's write to disk)."""

from __future__ import annotations

import gc

import pytest

from nsqd import message as message_module
from nsqd.actors import ActorSystem
from nsqd.message import Message, PythonMessage, new_messages
from nsqd.queues.packed import SEGMENT_MESSAGES, PackedQueue, Segments, pack_ids
from nsqd.topic import Topic

SLOTS = [slot for cls in Message.__mro__ for slot in getattr(cls, "__slots__", ())]


def _slots(messages) -> list[list]:
    return [[getattr(m, slot) for slot in SLOTS] for m in messages]


def _ids(start: int, count: int) -> list[bytes]:
    return [b"%016x" % n for n in range(start, start + count)]


def test_packed_runs_and_objects_come_back_in_order():
    queue = PackedQueue()
    assert not queue and len(queue) == 0 and queue.take_all() == []
    queue.extend_published(_ids(0, 3), [b"a", b"b", b""], 1000)
    queue.extend_published(_ids(3, 2), [b"c", b"d"], 1000)  # one timestamp: one entry of the run
    queue.extend_published(_ids(5, 1), [b"e"], 2000)
    queue.extend_published(_ids(9, 1), [b"h"], 2000, 2.5)  # a delay of its own: an entry of its own
    kept = Message(b"%016x" % 6, b"requeued", 500, 3, 1.5)
    queue.extend([kept])
    queue.extend_published(_ids(7, 2), [b"f", b"g"], 3000)
    queue.extend_published([], [], 4000)
    assert len(queue) == 10 and queue
    expected = (
        new_messages(_ids(0, 5), [b"a", b"b", b"", b"c", b"d"], 1000)
        + new_messages(_ids(5, 1), [b"e"], 2000)
        + new_messages(_ids(9, 1), [b"h"], 2000, 2.5)
        + [kept]
        + new_messages(_ids(7, 2), [b"f", b"g"], 3000)
    )
    assert _slots(queue) == _slots(expected)  # iteration leaves the queue as it is
    assert len(queue) == 10
    taken = queue.take_all()
    assert _slots(taken) == _slots(expected) and taken[7] is kept and taken[6].defer == 2.5
    assert all(type(m.id) is bytes and type(m.body) is bytes for m in taken)
    assert not queue and queue.take_all() == []
    if message_module._speedups is not None:  # made as a publish makes them: out of the collector's walks
        assert not any(gc.is_tracked(m) for m in taken[:7])


def test_ids_of_another_size_are_kept_as_objects():
    queue = PackedQueue()
    if Message is PythonMessage:
        queue.extend_published([b"short", b"x" * 20], [b"a", b"b"], 7)
        assert [(m.id, m.body, m.timestamp) for m in queue.take_all()] == [(b"short", b"a", 7), (b"x" * 20, b"b", 7)]
    else:  # the C type holds 16 bytes, as nsqd's IDs always are (the GUID factory's, a record's fixed field)
        with pytest.raises(ValueError):
            queue.extend_published([b"short", b"x" * 20], [b"a", b"b"], 7)
    upper = [b"%016X" % 0xABCDEF, b"g" * 16]  # 16 bytes, but not as nsqd writes them: they would not come back so
    queue.extend_published(upper, [b"c", b"d"], 9)
    assert [m.id for m in queue.take_all()] == upper and pack_ids(upper) is None and pack_ids(upper[:1]) is None
    assert pack_ids(_ids(10, 2)) == (10).to_bytes(8, "big") + (11).to_bytes(8, "big")
    queue.extend_published(_ids(0, 1), [b"z"], 8)
    queue.clear()
    assert not queue and list(queue) == []


def _topic(**kwargs) -> Topic:
    return Topic("t", node_id=5, mem_queue_size=10_000, max_msg_timeout=900.0, actors=ActorSystem(), **kwargs)


async def test_a_topic_without_channels_keeps_publishes_packed_and_hands_them_over():
    topic = _topic()
    topic.publish([b"m%d" % n for n in range(300)])
    topic.publish([b"later"], 5.0)  # a DPUB, packed with its delay
    topic.put_many([Message(b"%016x" % 99, b"kept", 1, 2)])  # an object (attempts 2), kept as it is
    topic.publish([b"last"])
    assert len(topic.queue) == topic.depth() == 303 and topic.message_count == 303
    assert [type(run).__name__ for run in topic.queue._runs] == ["_Window", "deque", "_Window"]
    channel = topic.get_channel("c")
    assert not topic.queue
    queued = list(channel.queue)
    assert [m.body for m in queued] == [b"m%d" % n for n in range(300)] + [b"kept", b"last"]
    assert [m.body for _due, m in channel.deferred.entries()] == [b"later"]
    ids = [m.id for m in queued]
    assert len(set(ids)) == 302 and all(len(i) == 16 for i in ids)
    assert queued.pop(300).attempts == 2
    assert {(m.attempts, m.defer, m.client, m.disk_token) for m in queued} == {(0, 0.0, None, -1)}


async def test_a_paused_topic_packs_and_unpause_pumps():
    topic = _topic()
    channel = topic.get_channel("c")
    topic.pause()
    topic.publish([b"a", b"b"])
    assert len(topic.queue) == 2 and not channel.queue
    topic.unpause()
    assert [m.body for m in channel.queue] == [b"a", b"b"] and not topic.queue


def test_take_crosses_runs_and_leaves_the_rest_in_order():
    queue = PackedQueue()
    queue.extend_published(_ids(0, 5), [b"p%d" % n for n in range(5)], 1000)
    queue.extend_published(_ids(5, 1), [b"p5"], 1001)  # the same segment, a timestamp of its own
    kept = [Message(b"%016x" % 50, b"k%d" % n, 9, 1) for n in range(3)]
    queue.extend(kept[:2])
    queue.append(kept[2])
    queue.extend_published(_ids(6, 2), [b"p6", b"p7"], 1002)
    assert [type(run).__name__ for run in queue._runs] == ["_Window", "deque", "_Window"] and len(queue) == 11
    first = queue.take(4)
    assert [(m.body, m.timestamp) for m in first] == [(b"p%d" % n, 1000) for n in range(4)] and len(queue) == 7
    second = queue.take(4)  # the rest of the window (two timestamps), then objects as they are
    assert [(m.body, m.timestamp) for m in second[:2]] == [(b"p4", 1000), (b"p5", 1001)]
    assert second[2] is kept[0] and second[3] is kept[1]
    assert [m.body for m in queue] == [b"k2", b"p6", b"p7"] and len(queue) == 3
    rest = queue.take(10)
    assert rest[0] is kept[2] and [m.timestamp for m in rest[1:]] == [1002, 1002]
    assert queue.take(1) == [] and not queue
    assert [m.id for m in first + second + rest] == _ids(0, 5) + [b"%016x" % 5] + [m.id for m in kept] + _ids(6, 2)


def test_a_segment_grows_while_a_window_holds_it_and_starts_again_when_none_does():
    segments = Segments()
    packed, start, end = segments.add(pack_ids(_ids(0, 2)), [b"a", b"b"], 1, 0.0, 2)
    assert (start, end) == (0, 2)
    queue = PackedQueue()
    queue.extend_window(packed, start, end)
    again, start, end = segments.add(pack_ids(_ids(2, 1)), [b"c"], 2, 0.0, 1)
    assert again is packed and (start, end) == (2, 3)  # a window holds it: appended to
    queue.extend_window(again, start, end)
    assert len(queue._runs) == 1 and queue._runs[0].end == 3  # consecutive: one window grows
    del again
    assert [m.body for m in queue.take(3)] == [b"a", b"b", b"c"]
    del packed
    reused, start, end = segments.add(pack_ids(_ids(3, 1)), [b"d"], 3, 0.0, 1)
    assert (start, end) == (0, 1) and reused.bodies == [b"d"]  # nobody held it: started again
    queue.extend_window(reused, start, end)
    full = len(reused)
    while full < SEGMENT_MESSAGES:
        _, _, full = segments.add(pack_ids(_ids(full, 1)), [b"x"], 4, 0.0, 1)
    newer, start, end = segments.add(pack_ids(_ids(full, 1)), [b"y"], 5, 0.0, 1)
    assert newer is not reused and (start, end) == (0, 1) and len(reused) == SEGMENT_MESSAGES
    # a backlog: the next segment has its room made at once, as much as the full one took
    assert newer.capacity == SEGMENT_MESSAGES and len(newer.bodies) == SEGMENT_MESSAGES and len(newer) == 1
    queue.extend_window(newer, start, end)
    segments.add(pack_ids(_ids(full + 1, 2)), [b"z1", b"z2"], 6, 0.0, 2)
    queue.extend_window(newer, 1, 3)
    taken = queue.take(SEGMENT_MESSAGES + 3)
    assert [m.body for m in taken[-3:]] == [b"y", b"z1", b"z2"] and [m.timestamp for m in taken[-3:]] == [5, 6, 6]
    assert [m.id for m in taken[-3:]] == _ids(full, 3) and not queue
    del newer, reused, taken
    fresh, start, end = segments.add(pack_ids(_ids(0, 1)), [b"w"], 7, 0.0, 1)
    assert fresh.capacity == 0 and fresh.bodies == [b"w"] and (start, end) == (0, 1)  # nobody held it: its room went
