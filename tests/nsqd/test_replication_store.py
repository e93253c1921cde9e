"""ReplicaStore: which messages it holds after MESSAGES, FINISHED and CHANNEL frames, and after a reopen."""

from __future__ import annotations

from nsqd.replication.store import ReplicaStore, store_nodes
from protocol.replication import (
    OP_CREATED,
    OP_DELETED,
    OP_EMPTIED,
    OP_LOG,
    OP_PAUSED,
    ChannelOp,
    Finished,
    Messages,
    ReplicatedMessage,
    Requeued,
    Synced,
)

NODE = "127.0.0.1:4150"


def _id(n: int) -> bytes:
    return b"%016x" % n


def _messages(seq: int, topic: str, *numbers: int, channel: str = "") -> Messages:
    return Messages(seq, topic, tuple(ReplicatedMessage(_id(n), n, 0, 0, b"body%d" % n) for n in numbers), channel)


def _open(tmp_path, durable: bool = False) -> ReplicaStore:
    return ReplicaStore(NODE, str(tmp_path), durable=durable, max_record_size=1 << 20)


def test_a_message_is_released_once_every_channel_that_existed_finished_it(tmp_path):
    store = _open(tmp_path)
    store.store(
        [
            ChannelOp(1, "t", "a", OP_CREATED),
            ChannelOp(2, "t", "b", OP_CREATED),
            _messages(3, "t", 1, 2),
            ChannelOp(4, "t", "late", OP_CREATED),
        ]
    )
    assert set(store.held) == {_id(1), _id(2)} and store.held_bytes == 10
    store.store([Finished(5, "t", "a", (_id(1), _id(2)))])
    assert len(store.held) == 2
    store.store([Finished(6, "t", "b", (_id(1),))])
    assert set(store.held) == {_id(2)}  # "late" came after the messages: not waited for
    store.store([ChannelOp(7, "t", "b", OP_DELETED)])
    assert not store.held and store.held_bytes == 0


def test_a_topic_without_channels_waits_for_the_first_ones(tmp_path):
    store = _open(tmp_path)
    store.store([_messages(1, "t", 1), ChannelOp(2, "t", "a", OP_CREATED)])
    store.store([Finished(3, "t", "a", (_id(1),))])
    assert not store.held


def test_emptied_channel_and_deleted_topic_release(tmp_path):
    store = _open(tmp_path)
    store.store([ChannelOp(1, "t", "a", OP_CREATED), _messages(2, "t", 1, 2), _messages(3, "u", 3)])
    store.store([ChannelOp(4, "t", "a", OP_EMPTIED)])
    assert set(store.held) == {_id(3)}
    store.store([ChannelOp(5, "u", "", OP_DELETED)])
    assert not store.held


def test_a_message_sent_again_is_counted_once(tmp_path):
    store = _open(tmp_path)
    store.store([_messages(1, "t", 1)])
    store.store([_messages(2, "t", 1, 2)])
    assert len(store.held) == 2 and store.duplicates == 1


def test_reopen_replays_messages_fins_and_channels(tmp_path):
    store = _open(tmp_path, durable=True)
    store.store(
        [
            ChannelOp(1, "t", "a", OP_CREATED),
            ChannelOp(2, "t", "b", OP_CREATED),
            ChannelOp(3, "t", "b", OP_PAUSED),
            _messages(4, "t", *range(10)),
        ]
    )
    store.store(
        [
            Finished(5, "t", "a", tuple(_id(n) for n in range(10))),
            Finished(6, "t", "b", tuple(_id(n) for n in range(4))),
        ]
    )
    store.queue.close()  # as a kill leaves it: no JSON rewrite, the queue's meta from its last sync
    assert store_nodes(str(tmp_path)) == [NODE]
    again = _open(tmp_path, durable=True)
    assert set(again.held) == {_id(n) for n in range(4, 10)}
    assert again.topics["t"].channels["b"][1] is True
    adopted = [(topic, [(m.id, finished) for m, finished, _requeued in batch]) for topic, batch in again.adopt()]
    assert adopted == [("t", [(_id(n), {"a"}) for n in range(4, 10)])]
    again.epoch += 1
    again.remove()
    again.close()
    last = _open(tmp_path)
    assert not last.held and last.epoch == 1
    # the origin's channels stay known: an origin back without its directory learns them (WELCOME's topics)
    assert last.topology() == {"t": {"paused": False, "channels": {"a": False, "b": True}}}


def test_a_backfill_replaces_the_topology_and_releases_what_it_left_out(tmp_path):
    store = _open(tmp_path)
    store.store([ChannelOp(1, "t", "a", OP_CREATED), _messages(2, "t", 1, 2, 3)])
    store.begin_backfill()
    store.store([ChannelOp(0, "t", "b", OP_CREATED), _messages(0, "t", 2, 4), Synced(0)])
    assert store.backfill_released == 2
    assert set(store.held) == {_id(2), _id(4)} and list(store.topics["t"].channels) == ["b"]
    store.store([Finished(1, "t", "b", (_id(2), _id(4)))])
    assert not store.held


def _backfill_of_two_channels(store: ReplicaStore) -> None:
    """A backfill of topic t with channels a and b: 1 and 2 held by both (sent once per channel), 3 only by a,
    4 only by b, 5 still in the topic (every channel gets it), 6 by a and 7 by b in their own frames."""
    store.begin_backfill()
    store.store(
        [
            ChannelOp(0, "t", "", OP_CREATED),
            ChannelOp(0, "t", "a", OP_CREATED),
            ChannelOp(0, "t", "b", OP_CREATED),
            _messages(0, "t", 5),
            _messages(0, "t", 1, 2, 3, channel="a"),
            _messages(0, "t", 1, 2, 4, channel="b"),
            _messages(0, "t", 6, channel="a"),
            _messages(0, "t", 7, channel="b"),
            Synced(9),
        ]
    )


def test_a_backfill_names_the_channel_holding_each_message_and_the_others_count_as_finished(tmp_path):
    store = _open(tmp_path)
    store.store([ChannelOp(1, "t", "a", OP_CREATED), _messages(2, "t", 1, 3, 8)])  # from before: 8 is finished
    _backfill_of_two_channels(store)
    assert store.backfill_released == 1 and set(store.held) == {_id(n) for n in range(1, 8)}
    assert store.duplicates == 2 + 2  # 1 and 3 held from before, 1 and 2 named by both channels
    store.store([Finished(10, "t", "a", (_id(1), _id(2), _id(3), _id(5), _id(6)))])
    assert set(store.held) == {_id(1), _id(2), _id(4), _id(5), _id(7)}  # b never held 3 and 6
    store.store([Finished(11, "t", "b", (_id(1), _id(2), _id(4), _id(5), _id(7)))])
    assert not store.held and store.held_bytes == 0


def test_a_backfill_is_settled_again_when_the_store_is_replayed(tmp_path):
    store = _open(tmp_path, durable=True)
    _backfill_of_two_channels(store)
    store.store([Finished(10, "t", "a", (_id(1), _id(5)))])
    store.queue.close()  # as a kill leaves it
    again = _open(tmp_path, durable=True)
    assert set(again.held) == {_id(n) for n in range(1, 8)}
    again.store([Finished(11, "t", "b", (_id(1), _id(2), _id(4), _id(5), _id(7)))])
    assert set(again.held) == {_id(2), _id(3), _id(6)}  # waiting for a only
    adopted = {m.id: finished for _, batch in again.adopt() for m, finished, _requeued in batch}
    assert adopted == {_id(2): {"b"}, _id(3): {"b"}, _id(6): {"b"}}


def test_a_backfill_cut_short_leaves_its_messages_held_for_every_channel(tmp_path):
    store = _open(tmp_path)
    store.begin_backfill()
    store.store(
        [ChannelOp(0, "t", "a", OP_CREATED), ChannelOp(0, "t", "b", OP_CREATED), _messages(0, "t", 1, channel="a")]
    )
    store.begin_backfill()  # the connection broke; the next one backfills again
    store.store(
        [
            ChannelOp(0, "t", "a", OP_CREATED),
            ChannelOp(0, "t", "b", OP_CREATED),
            _messages(0, "t", 1, channel="b"),
            Synced(3),
        ]
    )
    store.store([Finished(4, "t", "b", (_id(1),))])
    assert not store.held


def test_fins_of_many_records_and_channels_release_each_message_once(tmp_path):
    store = _open(tmp_path)
    store.store(
        [ChannelOp(1, "t", "a", OP_CREATED), ChannelOp(2, "t", "b", OP_CREATED)]
        + [_messages(3 + n, "t", *range(n * 100, n * 100 + 100)) for n in range(5)]
    )
    assert len(store.held) == 500 and store.held_bytes == sum(len(b"body%d" % n) for n in range(500))
    every = tuple(_id(n) for n in range(500))
    store.store([Finished(8, "t", "a", every[::2] + every[::2])])  # repeated IDs are harmless
    assert len(store.held) == 500
    store.store([Finished(9, "t", "b", every[:250])])
    assert len(store.held) == 375
    store.store([Finished(10, "t", "a", every[1::2]), Finished(11, "t", "b", every[250:])])
    assert not store.held and store.held_bytes == 0 and not store._records


def test_a_batch_written_but_not_yet_indexed_is_indexed_before_anything_reads_the_index(tmp_path):
    store = _open(tmp_path)
    store.write([ChannelOp(1, "t", "a", OP_CREATED), _messages(2, "t", 1, 2)])  # acknowledged; indexed later
    store.write([Finished(3, "t", "a", (_id(1),))])  # the batches that came meanwhile wait with it
    assert store.unapplied == 2 and not store.held
    adopted = [(topic, [m.id for m, _, _ in batch]) for topic, batch in store.adopt()]
    assert adopted == [("t", [_id(2)])]


def test_batches_written_in_a_row_are_indexed_in_order_with_the_tokens_they_were_written_under(tmp_path):
    store = _open(tmp_path)
    store.write([ChannelOp(1, "t", "a", OP_CREATED), _messages(2, "t", 1, 2)])
    store.write([_messages(3, "t", 3)])
    store.write([Finished(4, "t", "a", (_id(1), _id(2)))])
    store.apply()
    assert set(store.held) == {_id(3)}
    store.close()
    store = _open(tmp_path)  # the committed position was at the record that still holds a message
    assert set(store.held) == {_id(3)}


def test_the_index_of_held_messages_is_not_walked_by_the_garbage_collector(tmp_path):
    import gc

    store = _open(tmp_path)
    store.store([ChannelOp(1, "t", "a", OP_CREATED), _messages(2, "t", *range(1000))])
    gc.collect()
    # one span for the frame, its IDs a tuple of bytes (untracked): millions held cost no collector pass
    assert len(store.held) == 1000 and store.held.spans == 1 and store.held.loose == 0
    (record,) = store._records.values()
    assert not gc.is_tracked(record.ids)


def test_requeues_are_kept_per_channel_the_latest_counting_and_replayed(tmp_path):
    store = _open(tmp_path, durable=True)
    store.store([ChannelOp(1, "t", "a", OP_CREATED), ChannelOp(2, "t", "b", OP_CREATED), _messages(3, "t", 1, 2, 3)])
    store.store(
        [
            Requeued(4, "t", "a", ((_id(1), 1, 0), (_id(2), 1, 5_000))),
            Requeued(5, "t", "a", ((_id(1), 2, 9_000),)),  # delivered again and put back again
            Requeued(6, "t", "b", ((_id(1), 1, 0), (_id(99), 7, 0))),  # 99: not held, nothing to keep
            Finished(7, "t", "a", (_id(2),)),
        ]
    )
    store.queue.close()  # as a kill leaves it
    again = _open(tmp_path, durable=True)
    adopted = {m.id: (finished, requeued) for _, batch in again.adopt() for m, finished, requeued in batch}
    assert adopted == {
        _id(1): (set(), {"a": (2, 9_000), "b": (1, 0)}),
        _id(2): ({"a"}, {"a": (1, 5_000)}),
        _id(3): (set(), None),
    }


def test_a_backfill_naming_damaged_queues_keeps_and_sends_back_what_they_lost(tmp_path):
    store = _open(tmp_path)
    store.store(
        [
            ChannelOp(1, "t", "a", OP_CREATED),
            ChannelOp(2, "t", "b", OP_CREATED),
            _messages(3, "t", 1, 2, 3, 4),
            _messages(4, "u", 9),
            ChannelOp(5, "u", "a", OP_CREATED),
            Finished(6, "t", "b", (_id(1), _id(2))),
            Requeued(7, "t", "a", ((_id(4), 3, 0),)),
        ]
    )
    # channel a lost 2, 3 and 4 to damage (it names 1 only); b finished 1 and 2 and names 3 and 4; topic u is whole
    store.begin_backfill()
    store.store(
        [
            ChannelOp(0, "t", "a", OP_CREATED),
            ChannelOp(0, "t", "b", OP_CREATED),
            ChannelOp(0, "u", "a", OP_CREATED),
            _messages(0, "t", 1, channel="a"),
            _messages(0, "t", 3, 4, channel="b"),
            Synced(8, (("t", "a"),)),
        ]
    )
    assert store.backfill_released == 1  # 9: topic u is not damaged, its backfill left it out: finished
    assert set(store.held) == {_id(n) for n in (1, 2, 3, 4)}
    restore = store.take_restore()
    assert {key: sorted(ids) for key, ids in restore.items()} == {("t", "a"): [_id(2), _id(3), _id(4)]}
    sent = {
        (topic, channel): {m.id: m.attempts for m in messages}
        for topic, channel, messages in store.read_restore(restore)
    }
    assert sent == {("t", "a"): {_id(2): 0, _id(3): 0, _id(4): 3}}  # 4 as a put it back
    assert not store.take_restore()
    store.store([Finished(9, "t", "a", (_id(1), _id(2), _id(3), _id(4)))])
    assert set(store.held) == {_id(3), _id(4)}  # waiting for b
    store.store([Finished(10, "t", "b", (_id(3), _id(4)))])
    assert not store.held


def test_a_log_channel_is_known_across_a_reopen_and_a_backfill_that_leaves_it_out_makes_it_ordinary(tmp_path):
    store = _open(tmp_path)
    store.store(
        [
            ChannelOp(1, "t", "spark", OP_CREATED),
            ChannelOp(2, "t", "spark", OP_LOG),
            ChannelOp(3, "t", "plain", OP_CREATED),
        ]
    )
    store.apply()
    store.save_json()
    store.close()
    again = _open(tmp_path)
    assert {name: state[1:] for name, state in again.topics["t"].channels.items()} == {
        "spark": [False, True],
        "plain": [False, False],
    }
    again.begin_backfill()
    again.store([ChannelOp(0, "t", "spark", OP_CREATED), Synced(4)])
    again.apply()
    assert again.topics["t"].channels["spark"][2] is False
    again.close()
