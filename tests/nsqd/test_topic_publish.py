"""A topic's publish path against real Topic and Channel objects, without sockets: the batch's messages
(IDs, one timestamp), the hand-over to every channel, deferred messages, paused topics, the memory bound
and the counters."""

from nsqd.actors import ActorSystem
from nsqd.guid import split_id
from nsqd.topic import Topic


def _topic(name: str = "t", mem_queue_size: int = 10_000) -> Topic:
    return Topic(name, node_id=7, mem_queue_size=mem_queue_size, max_msg_timeout=900.0, actors=ActorSystem())


async def test_a_batch_reaches_every_channel_as_the_topics_own_messages():
    topic = _topic()
    first, second = topic.get_channel("a"), topic.get_channel("b")
    bodies = [b"m%d" % n for n in range(300)]
    topic.publish(bodies)
    assert not topic.queue  # handed over at once
    ours, theirs = list(first.queue), list(second.queue)
    assert [m.body for m in ours] == [m.body for m in theirs] == bodies
    assert [m.id for m in ours] == [m.id for m in theirs]
    # one segment for both, each queue a window on it; the objects are made for each queue as it hands them out
    (window,), (other,) = first.queue._runs, second.queue._runs
    assert window is not other and window.packed is other.packed and (window.start, window.end) == (0, 300)
    assert not any(a is b for a, b in zip(ours, theirs, strict=True))
    ids = [m.id for m in ours]
    assert len(set(ids)) == len(ids) and ids == sorted(ids)
    assert all(len(i) == 16 and split_id(i).node_id == 7 for i in ids)
    assert len({m.timestamp for m in ours + theirs}) == 1  # one timestamp per publish
    assert {(m.attempts, m.defer, m.client, m.disk_token) for m in ours + theirs} == {(0, 0.0, None, -1)}
    assert (topic.message_count, topic.message_bytes) == (300, sum(map(len, bodies)))
    assert first.message_count == second.message_count == 300


async def test_deferred_publish_goes_to_the_deferred_heaps():
    topic = _topic()
    channel = topic.get_channel("c")
    topic.publish([b"later"], 5.0)
    topic.publish([b"now"])
    assert [m.body for m in channel.queue] == [b"now"]
    assert len(channel.deferred) == 1
    assert channel.message_count == 2


async def test_a_paused_topic_keeps_its_batches_and_their_delays_until_unpaused():
    topic = _topic()
    topic.pause()
    channel = topic.get_channel("c")
    topic.publish([b"a", b"b"])
    topic.publish([b"later"], 5.0)
    topic.publish([b"c"])
    assert [m.body for m in topic.queue] == [b"a", b"b", b"later", b"c"] and not channel.queue
    topic.unpause()
    assert not topic.queue
    assert [m.body for m in channel.queue] == [b"a", b"b", b"c"]
    assert len(channel.deferred) == 1
    # the queue has no deferred message left: the next batch goes straight to the queue again
    topic.publish([b"d"])
    assert [m.body for m in channel.queue][-1] == b"d" and len(channel.deferred) == 1


async def test_without_channels_a_batch_waits_in_the_topic():
    topic = _topic()
    topic.publish([b"x"] * 10)
    assert topic.depth() == 10
    channel = topic.get_channel("c")
    assert not topic.queue and len(channel.queue) == 10


async def test_an_ephemeral_topic_without_channels_drops_past_its_memory_bound():
    topic = _topic("t#ephemeral", mem_queue_size=5)
    topic.publish([b"x"] * 3)
    topic.publish([b"y"] * 4)  # all or nothing is about storage: what has no room is dropped, like nsqd
    assert [m.body for m in topic.queue] == [b"x"] * 3 + [b"y"] * 2
    assert topic.message_count == 7


async def test_a_batch_larger_than_a_tick_keeps_ids_increasing():
    topic = _topic(mem_queue_size=100_000)
    channel = topic.get_channel("c")
    for _ in range(3):
        topic.publish([b"."] * 5000)
    ids = [m.id for m in channel.queue]
    assert len(ids) == 15_000 and len(set(ids)) == len(ids) and ids == sorted(ids)
