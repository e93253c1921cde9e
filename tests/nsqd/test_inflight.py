import random

import pytest

from nsqd.queues import inflight
from nsqd.queues.inflight import InFlightQueue


def mid(n: int) -> bytes:
    return b"%016d" % n


def test_push_get_pop_len_contains():
    q = InFlightQueue()
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
    q = InFlightQueue()
    q.push(mid(1), "a", 1.0)
    with pytest.raises(KeyError):
        q.push(mid(1), "b", 2.0)
    assert q.get(mid(1)) == "a" and q.deadline(mid(1)) == 1.0 and len(q) == 1
    # Once finished, the same ID may go in flight again (a requeued message redelivered).
    q.pop(mid(1))
    q.push(mid(1), "c", 3.0)
    assert q.pop_expired(10.0) == ["c"]


def test_pop_expired_in_deadline_order_and_inclusive():
    q = InFlightQueue()
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
    q = InFlightQueue()
    for n in range(10):
        q.push(mid(n), n, float(n))
    for n in range(0, 10, 2):
        assert q.pop(mid(n)) == n
    assert q.pop_expired(100.0) == [1, 3, 5, 7, 9]


def test_touch_moves_the_deadline_both_ways():
    q = InFlightQueue()
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
    q = InFlightQueue()
    q.push(mid(1), "a", 1.0)
    for deadline in (2.0, 3.0, 4.0):
        q.touch(mid(1), deadline)
    assert q.pop_expired(3.5) == []
    assert q.pop_expired(4.0) == ["a"]
    assert q.pop_expired(100.0) == []


def test_drain_returns_everything_in_deadline_order():
    q = InFlightQueue()
    q.push(mid(1), "a", 3.0)
    q.push(mid(2), "b", 1.0)
    q.push(mid(3), "c", 2.0)
    q.touch(mid(2), 4.0)
    q.pop(mid(3))
    assert q.drain() == ["a", "b"]
    assert len(q) == 0 and q.peek_deadline() is None and q.pop_expired(100.0) == []


def test_stale_entries_stay_bounded_under_fin_and_touch():
    q = InFlightQueue()
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


def test_random_operations_match_a_model():
    rng = random.Random(1234)
    q = InFlightQueue()
    model: dict[bytes, tuple[float, int, int]] = {}  # id -> (deadline, order, item)
    order = 0
    now = 0.0
    for step in range(20_000):
        op = rng.random()
        key = mid(rng.randrange(300))
        if op < 0.35:
            deadline = now + rng.uniform(0, 10)
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
            deadline = now + rng.uniform(0, 10)
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


def test_heap_is_rebuilt_when_expiry_leaves_mostly_stale_entries():
    q = InFlightQueue()
    for n in range(300):
        q.push(mid(1000 + n), n, 1.0 + n)
    for n in range(100):
        q.push(mid(n), n, 1000.0)
    for touch_round in range(3):  # 300 stale entries, far in the future
        for n in range(100):
            q.touch(mid(n), 900.0 - touch_round)
    assert len(q._heap) == 700  # 300 stale < 2 x 400 live: no rebuild yet
    assert len(q.pop_expired(300.0)) == 300
    assert len(q._heap) == len(q) == 100  # 300 stale > 2 x 100 live: rebuilt
    assert q.pop_expired(1e9) == list(range(100))
