"""What a topic costs before it is used: no file, no worker, a handful of objects; its files still load and appear
as nsqd's when they are needed."""

from __future__ import annotations

import gc
import time

from nsqd.message import Message, encode_record
from nsqd.options import parse_options
from nsqd.queues.diskqueue import DiskQueue
from nsqd.server import NSQD


def started_nsqd(tmp_path, *flags: str) -> NSQD:
    """An NSQD past the start-up steps that concern topics (the lock, nsqd.dat and the data directory read)."""
    nsqd = NSQD(parse_options([f"--data-path={tmp_path}", *flags]))
    nsqd.lock_data_path()
    nsqd.load_metadata()
    return nsqd


def message(topic, body: bytes = b"x" * 40) -> Message:
    return Message(topic.new_ids(1)[0], body, time.time_ns())


def tracked_objects_per_topic(nsqd: NSQD, count: int) -> float:
    gc.collect()
    before = len(gc.get_objects())
    for n in range(count):
        nsqd.get_topic(f"idle_{n}")
    gc.collect()
    return (len(gc.get_objects()) - before) / count


def test_an_unused_topic_opens_no_file_and_holds_few_objects(tmp_path):
    nsqd = started_nsqd(tmp_path)
    # a topic, its memory deque, its ID factory, its disk queue and deferred index: the garbage collector visits
    # each again and again while a node grows to thousands of topics
    assert tracked_objects_per_topic(nsqd, 500) < 8
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nsqd.dat comes from the writer task
    queue = nsqd.topics["idle_0"].backend
    assert queue.depth() == 0 and not queue.has_unread()
    # a graceful stop leaves every queue's meta file, as nsqd does
    for topic in nsqd.topics.values():
        topic.close(persist=True)
    assert (tmp_path / "idle_499.diskqueue.meta.dat").read_bytes() == b"0\n0,0\n0,0\n"


def test_a_topic_spills_to_disk_beyond_the_memory_queue(tmp_path):
    nsqd = started_nsqd(tmp_path, "--mem-queue-size=2")
    topic = nsqd.get_topic("spill")
    for _ in range(5):
        topic.put(message(topic))
    assert (len(topic.queue), topic.backend_depth(), topic.depth()) == (2, 3, 5)
    assert (tmp_path / "spill.diskqueue.000000.dat").stat().st_size == 3 * (4 + 26 + 40)
    topic.close(persist=True)
    assert (tmp_path / "spill.diskqueue.meta.dat").read_bytes() == f"5\n0,0\n0,{5 * 70}\n".encode()


def test_files_of_a_topic_missing_from_nsqd_dat_load_when_it_is_created(tmp_path):
    """nsqd was killed after messages reached a new topic's disk queue, before nsqd.dat named the topic: the files
    are taken up when the topic is created again, whenever that is."""
    topic_queue = DiskQueue("late", str(tmp_path), sync_every=1)
    channel_queue = DiskQueue("late:ch", str(tmp_path), sync_every=1)
    records = [encode_record(Message(b"%016d" % n, b"body %d" % n, time.time_ns())) for n in range(7)]
    topic_queue.put_many(records[:4])
    channel_queue.put_many(records[4:])
    topic_queue.close()
    channel_queue.close()

    nsqd = started_nsqd(tmp_path)
    assert nsqd.topics == {}
    for n in range(100):  # created after start-up, before it: no file of theirs
        nsqd.get_topic(f"other_{n}")
    topic = nsqd.get_topic("late")
    assert topic.backend_depth() == 4
    channel = topic.get_channel("ch")
    assert channel.backend_depth() == 3
    assert nsqd.get_topic("other_0").backend_depth() == 0


def test_the_queue_scanner_sees_every_channel_and_no_deleted_one(tmp_path):
    nsqd = started_nsqd(tmp_path)
    for n in range(3):
        topic = nsqd.get_topic(f"t{n}")
        for name in ("a", "b"):
            topic.get_channel(name)
    assert {(c.topic_name, c.name) for c in nsqd.all_channels()} == {(f"t{n}", c) for n in range(3) for c in "ab"}
    nsqd.get_topic("t0").delete_channel("a")
    nsqd.delete_topic("t1")
    assert {(c.topic_name, c.name) for c in nsqd.all_channels()} == {("t0", "b"), ("t2", "a"), ("t2", "b")}


def test_message_ids_are_unique_across_the_topics_of_a_node(tmp_path):
    # one ID names one message of the node: a replica indexes the copies of all its origin's topics by ID alone,
    # and topics with factories of their own give the same IDs to publishes in the same millisecond
    nsqd = started_nsqd(tmp_path)
    topics = [nsqd.get_topic(f"ids_{n}") for n in range(4)]
    ids = [msg_id for _ in range(50) for topic in topics for msg_id in topic.new_ids(2)]
    assert len(set(ids)) == len(ids)
    published = []
    for topic in topics:
        topic.publish([b"x", b"y"])
        published += [m.id for m in topic.queue]
    assert len(set(published)) == len(published) == 8
