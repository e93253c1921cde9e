"""The in-flight queue, with each twin of ``Message``: the C type (its own key in the queue's index) and the
Python class (keyed by its ID). Most tests label each message by its body and speak of the labels (``Q``)."""

import random
import sys
from functools import partial

import pytest

from nsqd import message as message_module
from nsqd.queues import inflight
from nsqd.queues.inflight import InFlightQueue

TWINS = [(message_module.PythonMessage, inflight.MessagesById)]
if inflight.DEFAULT_INDEX is not inflight.MessagesById:
    TWINS.insert(0, (message_module.Message, inflight.DEFAULT_INDEX))


@pytest.fixture(autouse=True, params=TWINS, ids=lambda twin: twin[1].__name__)
def twin(request, monkeypatch):
    """Each test with each twin: the C ``Message`` in the C ``MessageIndex``, the Python class in the dict."""
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "Message", request.param[0])
    monkeypatch.setattr(module, "InFlightQueue", partial(inflight.InFlightQueue, request.param[1]))
    return request.param


Message = TWINS[0][0]


def mid(n: int) -> bytes:
    return b"%016d" % n


class Q:
    """An ``InFlightQueue`` of messages labelled by their bodies, spoken to and answering in labels."""

    def __init__(self) -> None:
        self.queue = InFlightQueue()

    @property
    def _heap(self):
        return self.queue._heap

    def __len__(self) -> int:
        return len(self.queue)

    def __contains__(self, msg_id) -> bool:
        return msg_id in self.queue

    def __iter__(self):
        return iter(self.queue)

    def push(self, msg_id: bytes, label, deadline: float) -> None:
        self.queue.push(Message(msg_id, label, 0), deadline)

    def pop(self, msg_id: bytes):
        return _label(self.queue.pop(msg_id))

    def get(self, msg_id: bytes):
        return _label(self.queue.get(msg_id))

    def touch(self, msg_id: bytes, deadline: float) -> bool:
        return self.queue.touch(msg_id, deadline)

    def deadline(self, msg_id: bytes):
        return self.queue.deadline(msg_id)

    def peek_deadline(self):
        return self.queue.peek_deadline()

    def pop_expired(self, now: float) -> list:
        return [message.body for message in self.queue.pop_expired(now)]

    def drain(self) -> list:
        return [message.body for message in self.queue.drain()]


def _label(message):
    return None if message is None else message.body


def test_push_get_pop_len_contains():
    q = Q()
    assert len(q) == 0 and q.peek_deadline() is None
    q.push(mid(1), "a", 10.0)
    q.push(mid(2), "b", 5.0)
    assert len(q) == 2
    assert mid(1) in q and mid(3) not in q
    assert q.get(mid(1)) == "a" and q.get(mid(3)) is None
    assert q.deadline(mid(2)) == 5.0 and q.deadline(mid(3)) is None
    assert q.peek_deadline() == 5.0
    assert q.pop(mid(2)) == "b"
    assert q.pop(mid(2)) is None
    assert mid(2) not in q and len(q) == 1
    assert q.peek_deadline() == 10.0
    assert sorted(q) == [mid(1)]


def test_push_duplicate_id_raises_and_keeps_the_first():
    q = Q()
    q.push(mid(1), "a", 1.0)
    with pytest.raises(KeyError):
        q.push(mid(1), "b", 2.0)
    assert q.get(mid(1)) == "a" and q.deadline(mid(1)) == 1.0 and len(q) == 1
    # Once finished, the same ID may go in flight again (a requeued message redelivered).
    q.pop(mid(1))
    q.push(mid(1), "c", 3.0)
    assert q.pop_expired(10.0) == ["c"]


def test_pop_expired_in_deadline_order_and_inclusive():
    q = Q()
    for n, deadline in enumerate([3.0, 1.0, 2.0, 2.0, 5.0]):
        q.push(mid(n), n, deadline)
    assert q.pop_expired(0.5) == []
    # Equal deadlines leave in push order; deadline == now counts as expired.
    assert q.pop_expired(2.0) == [1, 2, 3]
    assert len(q) == 2
    assert q.pop_expired(4.0) == [0]
    assert q.pop_expired(100.0) == [4]
    assert len(q) == 0 and q.peek_deadline() is None


def test_finished_messages_never_expire():
    q = Q()
    for n in range(10):
        q.push(mid(n), n, float(n))
    for n in range(0, 10, 2):
        assert q.pop(mid(n)) == n
    assert q.pop_expired(100.0) == [1, 3, 5, 7, 9]


def test_touch_moves_the_deadline_both_ways():
    q = Q()
    q.push(mid(1), "a", 1.0)
    q.push(mid(2), "b", 2.0)
    assert q.touch(mid(1), 10.0) is True
    assert q.deadline(mid(1)) == 10.0
    assert q.peek_deadline() == 2.0  # the stale entry at 1.0 is skipped
    assert q.pop_expired(5.0) == ["b"]
    assert q.touch(mid(1), 3.0) is True  # earlier again
    assert q.pop_expired(3.0) == ["a"]
    assert q.touch(mid(1), 4.0) is False
    assert q.touch(mid(9), 4.0) is False
    assert len(q) == 0 and q.pop_expired(100.0) == []


def test_touch_repeatedly_expires_once():
    q = Q()
    q.push(mid(1), "a", 1.0)
    for deadline in (2.0, 3.0, 4.0):
        q.touch(mid(1), deadline)
    assert q.pop_expired(3.5) == []
    assert q.pop_expired(4.0) == ["a"]
    assert q.pop_expired(100.0) == []


def test_drain_returns_everything_in_deadline_order():
    q = Q()
    q.push(mid(1), "a", 3.0)
    q.push(mid(2), "b", 1.0)
    q.push(mid(3), "c", 2.0)
    q.touch(mid(2), 4.0)
    q.pop(mid(3))
    assert q.drain() == ["a", "b"]
    assert len(q) == 0 and q.peek_deadline() is None and q.pop_expired(100.0) == []


def test_stale_entries_stay_bounded_under_fin_and_touch():
    q = Q()
    live = 10
    for n in range(live):
        q.push(mid(n), n, 1000.0 + n)
    # Touch the same messages a great many times, far from their deadlines, and churn FIN + push.
    for round_ in range(5000):
        n = round_ % live
        q.touch(mid(n), 2000.0 + round_)
        assert len(q._heap) <= (inflight.REBUILD_FACTOR + 1) * live + inflight.REBUILD_MIN + 1
    for round_ in range(5000):
        q.push(mid(100 + round_), round_, 5000.0)
        q.pop(mid(100 + round_))
        assert len(q._heap) <= (inflight.REBUILD_FACTOR + 1) * live + inflight.REBUILD_MIN + 1
    assert len(q) == live
    assert q.pop_expired(10_000.0) == sorted(range(live), key=lambda n: 2000.0 + 4990 + n)


@pytest.mark.parametrize("deadlines", ["continuous", "few"])
def test_random_operations_match_a_model(deadlines):
    rng = random.Random(1234)
    q = Q()
    model: dict[bytes, tuple[float, int, int]] = {}  # id -> (deadline, order, item)
    order = 0
    now = 0.0
    for step in range(20_000):
        op = rng.random()
        key = mid(rng.randrange(300))
        # "few": deadlines repeat, so pushes and touches keep landing in shared buckets
        spread = (lambda: rng.uniform(0, 10)) if deadlines == "continuous" else (lambda: float(rng.randrange(3)))
        if op < 0.35:
            deadline = now + spread()
            if key in model:
                with pytest.raises(KeyError):
                    q.push(key, step, deadline)
            else:
                q.push(key, step, deadline)
                model[key] = (deadline, order, step)
                order += 1
        elif op < 0.55:
            expected = model.pop(key, None)
            assert q.pop(key) == (None if expected is None else expected[2])
        elif op < 0.75:
            deadline = now + spread()
            if key in model:
                assert q.touch(key, deadline)
                model[key] = (deadline, order, model[key][2])
                order += 1
            else:
                assert not q.touch(key, deadline)
        elif op < 0.95:
            now += rng.uniform(0, 0.5)
            expected = sorted((v for v in model.values() if v[0] <= now), key=lambda v: (v[0], v[1]))
            for v in expected:
                del model[next(k for k, mv in model.items() if mv is v)]
            assert q.pop_expired(now) == [v[2] for v in expected]
        else:
            assert q.get(key) == (model[key][2] if key in model else None)
        assert len(q) == len(model)
        expected_peek = min((v[0] for v in model.values()), default=None)
        assert q.peek_deadline() == expected_peek
        assert len(q._heap) <= 3 * len(model) + inflight.REBUILD_MIN + 1
        assert _listed(q) <= 3 * len(model) + inflight.REBUILD_MIN + 1


def _listed(q: Q) -> int:
    """Places in the lists of the heap's buckets, stale ones included."""
    return sum(len(bucket.items) for _, _, bucket in q._heap)


def test_a_batch_with_one_deadline_takes_one_heap_entry():
    q = Q()
    for n in range(64):
        q.push(mid(n), n, 60.0)
    q.push(mid(64), 64, 61.0)
    assert len(q._heap) == 2
    assert q.pop_expired(60.0) == list(range(64))


def test_equal_deadlines_leave_in_push_order_across_repush_and_touch():
    q = Q()
    q.push(mid(1), "a", 5.0)
    q.push(mid(2), "b", 5.0)
    q.push(mid(3), "c", 5.0)
    assert q.pop(mid(1)) == "a"
    q.push(mid(1), "a2", 5.0)  # the same ID again, into the same bucket: it now comes last
    assert q.touch(mid(2), 5.0)  # touched to the same deadline: after everything pushed before
    assert q.pop_expired(5.0) == ["c", "a2", "b"]
    assert len(q) == 0


def test_finished_batches_leave_no_heap_entries_behind():
    q = Q()
    q.push(mid(0), "kept", 10_000.0)
    for batch in range(2000):
        ids = [mid(1 + batch * 10 + n) for n in range(10)]
        for n, msg_id in enumerate(ids):
            q.push(msg_id, n, 100.0 + batch)
        for msg_id in ids:
            q.pop(msg_id)
        assert len(q._heap) <= (inflight.REBUILD_FACTOR + 1) * 1 + inflight.REBUILD_MIN + 1
    assert q.pop_expired(1e9) == ["kept"]


def test_stale_ids_of_partly_finished_batches_stay_bounded():
    q = Q()
    for batch in range(2000):
        ids = [mid(batch * 64 + n) for n in range(64)]
        for n, msg_id in enumerate(ids):
            q.push(msg_id, (batch, n), 100.0 + batch)
        for msg_id in ids[1:]:  # one message of each batch stays out until its timeout
            q.pop(msg_id)
        live = batch + 1
        assert _listed(q) <= (inflight.REBUILD_FACTOR + 1) * live + inflight.REBUILD_MIN + 1
    assert q.pop_expired(1e9) == [(batch, 0) for batch in range(2000)]
    assert len(q._heap) == 0


def test_heap_is_rebuilt_when_dead_buckets_outnumber_live_ones():
    q = Q()
    for n in range(10):
        q.push(mid(1000 + n), n, 10_000.0 + n)  # 10 live buckets
    for n in range(100):
        q.push(mid(n), n, float(n))  # 100 buckets of one
    for n in range(73):
        q.pop(mid(n))
    assert len(q._heap) == 110  # 73 dead > 64 but not > 2 x 37 live: kept
    q.pop(mid(73))
    assert len(q._heap) == 36  # 74 dead > 2 x 36 live: rebuilt
    for n in range(74, 95):
        q.pop(mid(n))
    assert q.peek_deadline() == 95.0
    assert q.pop_expired(1e9) == [95, 96, 97, 98, 99] + list(range(10))


def _Item(n: int, client: str):
    message = Message(mid(n), b"", 0)
    message.client = client
    return message


def test_push_many_shares_one_bucket_and_refuses_ids_in_flight():
    q = InFlightQueue()
    already = Message(mid(2), b"already", 0)
    q.push(already, 1.0)
    items = [_Item(n, "c") for n in range(5)]
    assert q.push_many(items, 30.0) == [items[2]]
    assert len(q) == 5 and len(q._heap) == 2
    assert q.get(mid(2)) is already and q.deadline(mid(4)) == 30.0
    assert q.push_many([_Item(2, "c")], 30.0) != []  # every item refused: nothing is left behind
    assert q.pop_expired(100.0) == [already, items[0], items[1], items[3], items[4]]
    assert len(q) == 0 and q.peek_deadline() is None and len(q._heap) == 0


def test_pop_owned_pops_in_order_and_reports_the_refused():
    q = InFlightQueue()
    mine = [_Item(n, "me") for n in range(4)]
    q.push_many(mine, 10.0)
    theirs = _Item(9, "them")
    q.push(theirs, 10.0)
    popped, refused = q.pop_owned([mid(1), mid(7), mid(9), mid(0), mid(1), mid(3)], "me")
    assert popped == [mine[1], mine[0], mine[3]]
    assert refused == [(mid(7), None), (mid(9), theirs), (mid(1), None)]
    assert sorted(q) == [mid(2), mid(9)]
    assert q.pop_expired(10.0) == [mine[2], theirs]


def test_the_index_matches_a_dict_through_growth_and_shrinking(twin):
    """The index alone (C: an open-addressing table that grows, shrinks and closes the gaps a removal leaves),
    against a dict of the same messages by ID."""
    message_class, index_class = twin
    rng = random.Random(41)
    index = index_class()
    model: dict[bytes, object] = {}
    for step in range(30_000):
        msg_id = mid(rng.randrange(3000 if step < 20_000 else 40))  # then few keys: the table shrinks
        op = rng.random()
        if op < 0.45:
            message = message_class(msg_id, b"", step)
            assert index.add(message) is (msg_id not in model)
            model.setdefault(msg_id, message)
        elif op < 0.8:
            assert index.pop(msg_id, None) is model.pop(msg_id, None)
        else:
            assert index.get(msg_id) is model.get(msg_id) and (msg_id in index) is (msg_id in model)
        assert len(index) == len(model)
    assert sorted(m.id for m in index.values()) == sorted(model)
    assert index.get(b"short") is None and b"short" not in index and index.pop(b"short", 7) == 7
    with pytest.raises(KeyError):
        index.pop(mid(99_999))
    if message_class is not message_module.PythonMessage:
        big = sys.getsizeof(index)
        with pytest.raises(TypeError):
            index.add(message_module.PythonMessage(mid(1), b"", 0))
        with pytest.raises(TypeError):
            index.get("a string")
        for msg_id in list(model):
            index.pop(msg_id)
        assert len(index) == 0 and sys.getsizeof(index) <= big
    index.clear()
    assert len(index) == 0 and list(index.values()) == []


def test_a_large_index_grows_past_its_mapped_tables_and_back(twin):
    """Tables of 64 KiB and more are mapped on their own in C (``_speedups.c``: ``index_table_new``): an index
    grown to 40,000 messages and emptied again, and one let go of while large, hold and free their messages."""
    message_class, index_class = twin
    messages = [message_class(mid(n), b"b", n) for n in range(40_000)]
    index = index_class()
    for message in messages:
        assert index.add(message)
    assert len(index) == len(messages)
    assert all(index.get(mid(n)) is messages[n] for n in range(0, 40_000, 7))
    for message in messages[::2]:
        assert index.pop(mid(int(message.timestamp))) is message
    assert all(index.get(mid(n)) is (None if n % 2 == 0 else messages[n]) for n in range(40_000))
    for message in messages[1::2]:
        assert index.pop(message.id) is message
    assert len(index) == 0 and list(index.values()) == []
    held = index_class()
    for message in messages:
        held.add(message)
    assert len(held) == len(messages)
    del held  # its mapped table unmapped, its messages let go of
