"""The node's collector policy (runtime/collector.py): what survives a full collection is frozen, so the next one
walks only what came since; deleted topics, channels and closed connections are still freed, once they outnumber a
quarter of what the node keeps."""

from __future__ import annotations

import contextlib
import gc
import weakref

from .test_topic_setup import started_nsqd


@contextlib.contextmanager
def grown(tmp_path, topics: int):
    """A node with ``topics`` topics of one channel each, its collector installed, after a full collection."""
    nsqd = started_nsqd(tmp_path)
    gc.collect()
    nsqd.collector.install()
    try:
        for n in range(topics):
            nsqd.get_topic(f"t{n}").get_channel("c")
        gc.collect()
        yield nsqd, nsqd.collector
    finally:
        nsqd.collector.uninstall()
        gc.unfreeze()


def test_a_full_collection_freezes_its_survivors_and_the_next_walks_only_what_came_since(tmp_path):
    with grown(tmp_path, 300) as (nsqd, collector):
        assert collector.freezes == 1 and gc.get_freeze_count() > 300 * 8
        assert len(gc.get_objects()) < 300  # the next full collection walks none of the topics and channels
        frozen = gc.get_freeze_count()
        nsqd.get_topic("new").get_channel("c")
        gc.collect()
        assert collector.freezes == 2 and gc.get_freeze_count() > frozen


def test_deleted_topics_and_channels_are_freed_once_they_outnumber_a_quarter_of_those_kept(tmp_path):
    # frozen: the topics and channels (in cycles with each other) are not walked any more
    with grown(tmp_path, 1000) as (nsqd, collector):
        deleted = [weakref.ref(nsqd.topics[f"t{n}"]) for n in range(190)]
        channels = [weakref.ref(nsqd.topics[f"t{n}"].channels["c"]) for n in range(190, 210)]
        for n in range(190):
            nsqd.delete_topic(f"t{n}")
        for n in range(190, 210):
            nsqd.topics[f"t{n}"].delete_channel("c")
        # 400 let go of (190 topics, their 190 channels, 20 channels), 1,600 kept: still frozen, their cycles kept
        assert collector.unfreezes == 0 and collector.released == 400
        gc.collect()
        assert all(ref() is not None for ref in deleted + channels)
        nsqd.topics["t210"].delete_channel("c")  # 401 let go of, 1,599 kept: more than a quarter
        assert collector.unfreezes == 1 and collector.released == 0
        gc.collect()
        assert all(ref() is None for ref in deleted + channels)
        assert collector.freezes == 3 and gc.get_freeze_count() > 0


def test_a_small_node_hands_back_nothing_for_a_few_objects(tmp_path):
    with grown(tmp_path, 10) as (nsqd, collector):
        for n in range(10):
            nsqd.delete_topic(f"t{n}")
        assert collector.released == 20 and collector.unfreezes == 0  # more than a quarter, fewer than RELEASED_MIN


def test_release_without_a_freeze_does_nothing(tmp_path):
    nsqd = started_nsqd(tmp_path)
    nsqd.get_topic("t")
    nsqd.delete_topic("t")
    assert nsqd.collector.released == 1 and nsqd.collector.unfreezes == 0
