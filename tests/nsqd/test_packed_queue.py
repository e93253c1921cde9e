"""The memory queues of nsqd/queues/packed.py: published messages kept as their parts come back as the messages
a publish makes, in order with those kept as objects, whole or taken a few at a time; a topic's segment grows
while a queue holds a window on it and starts again when none does; and the topic's paths through its queue
(held backlog handed to a new channel, /stats depth, a graceful stop's write to disk)."""

from __future__ import annotations

import gc
import sys

import pytest

from nsqd import message as message_module
from nsqd import topic as topic_module
from nsqd.actors import ActorSystem
from nsqd.message import Message, PythonMessage, new_messages, split_messages
from nsqd.options import parse_options
from nsqd.queues import packed as packed_module
from nsqd.queues.packed import SEGMENT_BYTES, SEGMENT_MESSAGES, PackedQueue, Segments, _Packed, _Window, pack_ids
from nsqd.server import NSQD
from nsqd.topic import Topic, TopicExiting

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


def _extend_twins() -> list:
    """``extend_open``'s Python twin, and its C twin when the accelerator is built (whatever TRIONSQ_NO_SPEEDUPS
    says: the two must change a segment and a queue alike)."""
    twins = [pytest.param(packed_module._extend_open, id="python")]
    try:
        import nsqd._speedups as speedups
    except ImportError:
        return twins
    speedups.packed_layout(PackedQueue, _Window, _Packed, SEGMENT_MESSAGES, SEGMENT_BYTES)
    return [*twins, pytest.param(speedups.extend_open, id="c")]


def _state(queue: PackedQueue, segments: Segments) -> list:
    """Everything ``extend_open`` may change, the containers' allocated sizes included (they must grow alike)."""
    seen: list[_Packed] = []
    runs = []
    for run in queue._runs:
        if type(run) is _Window:
            if run.packed not in seen:
                seen.append(run.packed)
            runs.append((seen.index(run.packed), run.start, run.end))
        else:
            runs.append([m.body for m in run])
    if segments.open not in seen:
        seen.append(segments.open)
    packed = [
        (
            bytes(p.ids),
            list(p.bodies),
            p.count,
            p.capacity,
            p.size,
            p.stamps.tolist(),
            p.delays.tolist(),
            p.ends.tolist(),
            p.deferred,
            [sys.getsizeof(c) for c in (p.ids, p.bodies, p.stamps, p.delays, p.ends)],
        )
        for p in seen
    ]
    return [queue.count, runs, seen.index(segments.open), packed]


def _publish_steps(extend) -> tuple[list, list]:
    """A topic's own queue through ``extend_open``'s cases, as ``Topic.publish`` drives it: what each call answered
    and the state after it, then the messages the queue hands out."""
    segments = Segments()
    queue = PackedQueue()
    steps: list = []
    ids = iter(range(1 << 20))

    def publish(bodies: list[bytes], stamp: int, joined: bytes | None = None) -> None:
        packed_ids = pack_ids([b"%016x" % next(ids) for _ in bodies])
        size = sum(map(len, bodies))
        done = extend(queue, segments.open, packed_ids if joined is None else joined, bodies, stamp, size)
        if not done:
            queue.extend_window(*segments.add(packed_ids, bodies, stamp, 0.0, size))
        steps.append([done, *_state(queue, segments)])

    publish([b"a"], 10)  # an empty queue: no window to extend
    publish([b"b"], 10)  # the same timestamp: the run's end moves
    publish([b"c"], 11)  # a run of its own
    publish([b"d", b"e", b"f"], 12)  # an MPUB
    queue.extend_window(*segments.add(pack_ids([b"%016x" % next(ids)]), [b"later"], 12, 2.5, 5))  # a DPUB
    publish([b"g"], 12)  # the timestamp of the DPUB before it, not its delay: a run of its own
    publish([b"h"], 12, joined=b"short")  # IDs that are not 8 bytes per body
    queue.extend([Message(b"%016x" % 99, b"kept", 1, 2)])
    publish([b"i"], 13)  # behind objects: a new window
    segments.add(pack_ids([b"%016x" % next(ids)]), [b"elsewhere"], 14, 0.0, 9)  # a channel's, not this queue's
    publish([b"j"], 14)  # the window no longer ends where the segment does
    while len(segments.open) < SEGMENT_MESSAGES:
        publish([b"k"], 15 + len(segments.open) // 500)
    publish([b"l"], 30)  # full: the next segment, its room made at once
    publish([b"m", b"n"], 31)  # into that room
    publish([b"o" * SEGMENT_BYTES], 32)
    publish([b"p"], 32)  # full of bytes
    return steps, _slots(queue.take_all())


@pytest.mark.parametrize("extend", _extend_twins())
def test_extend_open_appends_as_add_and_extend_window_do(extend):
    steps, messages = _publish_steps(extend)
    answers = [step[0] for step in steps]
    assert answers[:8] == [False, True, True, True, True, False, False, False]
    assert answers[-4:] == [False, True, True, False]
    assert steps[1][4][0][5:8] == ([10], [0.0], [2])  # one run entry for both publishes of timestamp 10
    # the twins change everything alike; the general way alone makes the same messages, in more windows
    assert (steps, messages) == _publish_steps(packed_module._extend_open)
    assert messages == _publish_steps(lambda *args: False)[1]


async def test_extend_open_keeps_a_topics_publishes_as_they_were_published():
    topic = _topic()
    for n in range(3):
        topic.publish([b"p%d" % n])
    topic.publish([b"q0", b"q1"])
    assert [type(run).__name__ for run in topic.queue._runs] == ["_Window"] and len(topic.queue) == 5
    messages = topic.queue.take_all()
    assert [m.body for m in messages] == [b"p0", b"p1", b"p2", b"q0", b"q1"]
    assert len({m.id for m in messages}) == 5 and messages[3].timestamp == messages[4].timestamp


@pytest.mark.parametrize("extend", _extend_twins())
async def test_a_publish_goes_where_the_topics_state_says_at_that_moment(extend, monkeypatch):
    monkeypatch.setattr(topic_module, "extend_open", extend)
    topic = _topic()

    def bodies(queue) -> list[bytes]:
        return [m.body for m in queue]

    topic.publish([b"a"])
    topic.publish([b"b"])  # no channel yet: the topic keeps them
    assert bodies(topic.queue) == [b"a", b"b"]
    channel = topic.get_channel("c")  # added after: it gets them
    topic.publish([b"c"])  # and the next ones directly
    assert not topic.queue and bodies(channel.queue) == [b"a", b"b", b"c"]
    topic.pause()
    topic.publish([b"d"])
    topic.publish([b"e"])
    assert bodies(topic.queue) == [b"d", b"e"] and len(channel.queue) == 3
    topic.unpause()
    assert not topic.queue and bodies(channel.queue)[3:] == [b"d", b"e"]
    topic.held = True  # while nsqd asks lookupd for the topic's channels
    topic.publish([b"f"])
    assert bodies(topic.queue) == [b"f"]
    topic.held = False
    topic.pump()
    second = topic.get_channel("second")
    topic.publish([b"g"])
    assert bodies(channel.queue)[5:] == [b"f", b"g"] and bodies(second.queue) == [b"g"]
    topic.delete_channel("c")
    topic.delete_channel("second")
    topic.publish([b"h"])  # no channel again
    assert bodies(topic.queue) == [b"h"] and topic.message_count == 8
    topic.close(persist=False)
    with pytest.raises(TopicExiting):
        topic.publish([b"i"])


@pytest.mark.parametrize("extend", _extend_twins())
async def test_a_publish_behind_a_disk_backlog_goes_to_disk(extend, monkeypatch, tmp_path):
    monkeypatch.setattr(topic_module, "extend_open", extend)
    nsqd = NSQD(parse_options([f"--data-path={tmp_path}", "--mem-queue-size=3"]))
    topic = nsqd.get_topic("spill")
    for n in range(4):
        topic.publish([b"m%d" % n])  # the fourth has no room in memory
    assert (len(topic.queue), topic.backend_depth()) == (3, 1)
    channel = topic.get_channel("c")  # takes the memory queue; the drain is not running here
    topic.publish([b"m4"])  # room in memory now, but behind what is on disk
    assert len(channel.queue) == 3 and topic.backend_depth() == 2
    assert [m.body for m in split_messages(topic.backend.read_split(10))] == [b"m3", b"m4"]
    assert [m.body for m in channel.queue.take(3)] == [b"m0", b"m1", b"m2"]  # as its consumers would
    topic.publish([b"m5"])  # the backlog read: to the channel again
    assert [m.body for m in channel.queue] == [b"m5"] and topic.backend_depth() == 0
    (tmp_path / "durable").mkdir()
    durable = NSQD(parse_options([f"--data-path={tmp_path / 'durable'}", "--mem-queue-size=0"])).get_topic("d")
    durable.publish([b"x"])  # no memory queue: every publish to disk
    assert (len(durable.queue), durable.backend_depth()) == (0, 1)
