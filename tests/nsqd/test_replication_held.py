"""HeldIndex: the replica's index of held messages by ID (spans of sorted frames, a dict for the others)."""

from __future__ import annotations

import random

from nsqd.replication.held import HeldIndex
from nsqd.replication.store import ReplicaStore
from protocol.replication import OP_CREATED, ChannelOp, Finished, Messages, ReplicatedMessage


def _id(n: int) -> bytes:
    return b"%016x" % n


def _ids(*numbers: int) -> tuple[bytes, ...]:
    return tuple(map(_id, numbers))


def test_a_sorted_frame_is_one_span_and_each_id_is_found_in_it():
    index = HeldIndex()
    assert index.add(1, _ids(10, 11, 12, 20, 21)) == _ids(10, 11, 12, 20, 21)
    assert index.add(2, _ids(30, 31)) == _ids(30, 31)
    assert index.spans == 2 and index.loose == 0 and len(index) == 7
    assert [index.get(_id(n)) for n in (10, 12, 20, 21, 30, 31)] == [1, 1, 1, 1, 2, 2]
    # inside a span's range but not among its IDs, between spans, before and after them all
    assert [index.get(_id(n)) for n in (13, 19, 25, 9, 32)] == [None] * 5


def test_a_fin_of_ids_in_the_middle_of_a_record_releases_those_only():
    index = HeldIndex()
    index.add(1, _ids(*range(100, 110)))
    assert index.runs(_ids(104, 105)) == [(1, list(_ids(104, 105)))]
    assert index.release(1, _ids(104, 105)) == 2
    assert _id(104) not in index and _id(103) in index and _id(106) in index and len(index) == 8
    assert index.held_ids(1) == list(_ids(100, 101, 102, 103, 106, 107, 108, 109))
    # a FIN batch with gaps and IDs of no record: only the held ones come back, and each once released
    assert index.runs(_ids(109, 104, 150, 101, 99, 105)) == [(1, list(_ids(101, 109)))]
    assert index.release(1, _ids(101, 109)) == 2 and index.release(1, _ids(101)) == 0
    assert index.release(1, _ids(100, 102, 103, 106, 107, 108)) == 6
    assert len(index) == 0 and index.spans == 0 and index.get(_id(100)) is None


def test_out_of_order_and_overlapping_frames_are_held_by_id():
    index = HeldIndex()
    index.add(1, _ids(10, 20, 30))
    index.add(2, _ids(5, 3, 7))  # not sorted (adopted messages come back with another node's IDs)
    index.add(3, _ids(15, 25))  # sorted, but within span 1's range
    index.add(4, _ids(1, 2))  # sorted, before everything: a span
    assert index.spans == 2 and index.loose == 5
    assert {n: index.get(_id(n)) for n in (1, 2, 3, 5, 7, 10, 15, 20, 25, 30)} == {
        1: 4,
        2: 4,
        3: 2,
        5: 2,
        7: 2,
        10: 1,
        15: 3,
        20: 1,
        25: 3,
        30: 1,
    }
    merged: dict[int, list[bytes]] = {}
    for token, ids in index.runs(_ids(30, 25, 3, 10, 15, 2)):  # a loose record comes once per run of its IDs
        merged.setdefault(token, []).extend(ids)
    assert sorted((token, sorted(ids)) for token, ids in merged.items()) == [
        (1, list(_ids(10, 30))),
        (2, [_id(3)]),
        (3, list(_ids(15, 25))),
        (4, [_id(2)]),
    ]


def test_an_id_held_already_is_not_taken_again():
    index = HeldIndex()
    index.add(1, _ids(1, 2, 3))
    assert index.add(2, _ids(3, 4)) == (_id(4),)  # a frame sent again, or a backfill naming it again
    assert index.add(3, _ids(4, 4)) == ()
    assert len(index) == 4 and index.get(_id(3)) == 1 and index.get(_id(4)) == 2
    index.release(1, _ids(3))
    assert index.add(5, _ids(3)) == (_id(3),) and index.get(_id(3)) == 5  # released, then held again elsewhere
    assert index.runs(_ids(3)) == [(5, [_id(3)])] and index.release(1, _ids(3)) == 0 and _id(3) in index


def test_the_index_agrees_with_a_dict_of_ids_in_random_streams():
    rng = random.Random(7)
    index, model = HeldIndex(), {}
    next_id = 1000
    for token in range(1, 400):
        kind = rng.random()
        if kind < 0.6:  # a published batch: increasing IDs, sometimes with gaps (a new tick)
            ids = []
            for _ in range(rng.randint(1, 20)):
                next_id += rng.choice((1, 1, 1, 50))
                ids.append(next_id)
        elif kind < 0.8:  # adopted messages: older IDs in any order, some held already
            ids = rng.sample(range(900, next_id + 1), rng.randint(1, 10))
        else:  # a backfill: a stretch of IDs named again
            start = rng.randint(900, next_id)
            ids = list(range(start, start + rng.randint(1, 15)))
        ids = _ids(*ids)
        fresh = index.add(token, ids)
        expected = tuple(dict.fromkeys(m for m in ids if m not in model))
        assert fresh == expected
        model.update(dict.fromkeys(fresh, token))
        if rng.random() < 0.5 and model:  # FINs of held IDs and of others, shuffled
            fins = rng.sample(sorted(model), min(len(model), rng.randint(1, 30)))
            fins += _ids(*rng.sample(range(900, next_id + 1), 5))
            rng.shuffle(fins)
            for held_by, run in index.runs(fins):  # an ID named twice may come in two runs: released once
                assert all(model.get(m) in (held_by, None) for m in run)
                still = {m for m in run if m in model}
                assert index.release(held_by, run) == len(still)
                for m in still:
                    del model[m]
            assert not any(m in model for m in fins)
        assert len(index) == len(model)
    assert set(index) == set(model)
    assert all(index.get(m) == t for m, t in model.items())


def _messages(seq: int, *numbers: int) -> Messages:
    return Messages(seq, "t", tuple(ReplicatedMessage(_id(n), n, 0, 0, b"body") for n in numbers))


def test_a_reopened_store_holds_what_it_held_across_spans_and_loose_records(tmp_path):
    store = ReplicaStore("127.0.0.1:4150", str(tmp_path), durable=False, max_record_size=1 << 20)
    store.store(
        [
            ChannelOp(1, "t", "a", OP_CREATED),
            _messages(2, *range(100, 110)),
            _messages(3, 105, 3, 200),
            _messages(4, *range(110, 120)),
            Finished(5, "t", "a", _ids(101, 115, 3, 105, 119)),
        ]
    )
    expected = {_id(n) for n in [*range(100, 120), 3, 200]} - set(_ids(101, 115, 3, 105, 119))
    assert set(store.held) == expected
    store.close()
    again = ReplicaStore("127.0.0.1:4150", str(tmp_path), durable=False, max_record_size=1 << 20)
    assert set(again.held) == expected and len(again.held) == len(expected) == 17
    again.store([Finished(6, "t", "a", tuple(sorted(expected)))])
    assert not again.held and not again._records and again.held_bytes == 0


def test_a_release_counts_only_the_ids_a_span_still_holds():
    index = HeldIndex()
    index.add(1, _ids(10, 12, 14, 16))
    # one it holds (named twice), one in its range it never had, one outside it
    assert index.release(1, _ids(12, 12, 13, 30)) == 1
    assert index.release(1, _ids(12, 14)) == 1  # 12 is gone already
    assert len(index) == 2 and index.held_ids(1) == list(_ids(10, 16))
    assert index.release(1, _ids(10, 11, 16)) == 2 and len(index) == 0 and index.spans == 0
