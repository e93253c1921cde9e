import random

import pytest

from nsqd.message import Message, PythonMessage
from nsqd.queues.deferred import DeferredQueue, entry, item_of


def test_empty():
    q = DeferredQueue()
    assert len(q) == 0
    assert q.peek_due() is None
    assert q.pop_due(1e9) == []
    assert q.drain() == []


def test_pop_due_in_due_order_inclusive():
    q = DeferredQueue()
    for item, due in [("c", 3.0), ("a", 1.0), ("b", 2.0), ("e", 5.0)]:
        q.push(item, due)
    assert len(q) == 4 and q.peek_due() == 1.0
    assert q.pop_due(0.999) == []
    assert q.pop_due(2.0) == ["a", "b"]
    assert q.peek_due() == 3.0 and len(q) == 2
    assert q.pop_due(4.0) == ["c"]
    assert q.pop_due(5.0) == ["e"]
    assert len(q) == 0 and q.peek_due() is None


def test_fifo_among_equal_due_times():
    q = DeferredQueue()
    for n in range(50):
        q.push(n, 7.0 if n % 2 else 3.0)
    assert q.pop_due(3.0) == list(range(0, 50, 2))
    assert q.pop_due(7.0) == list(range(1, 50, 2))


def test_items_need_not_be_comparable():
    q = DeferredQueue()
    a, b = object(), object()
    q.push(a, 1.0)
    q.push(b, 1.0)
    q.push({"x": 1}, 1.0)
    assert q.pop_due(1.0)[:2] == [a, b]


def test_drain_returns_due_and_item_in_order():
    q = DeferredQueue()
    q.push("late", 9.0)
    q.push("early", 1.0)
    q.push("early2", 1.0)
    assert q.drain() == [(1.0, "early"), (1.0, "early2"), (9.0, "late")]
    assert len(q) == 0 and q.pop_due(100.0) == []


def test_random_operations_match_a_sorted_model():
    rng = random.Random(99)
    q = DeferredQueue()
    model: list[tuple[float, int]] = []  # (due, order); item == order
    order = 0
    now = 0.0
    for _ in range(10_000):
        if rng.random() < 0.6:
            due = now + rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 5)])
            q.push(order, due)
            model.append((due, order))
            order += 1
        else:
            now += rng.uniform(0, 0.7)
            model.sort()
            due_now = [item for due, item in model if due <= now]
            model = [(due, item) for due, item in model if due > now]
            assert q.pop_due(now) == due_now
        assert len(q) == len(model)
        assert q.peek_due() == min((due for due, _ in model), default=None)


def test_queues_share_entries_and_keep_fifo_with_their_own_pushes():
    first, second = DeferredQueue(), DeferredQueue()
    first.push("own", 5.0)
    shared = [entry("a", 5.0), entry("b", 1.0)]
    for queue in (first, second):
        for made in shared:
            queue.push_entry(made)
    second.push("later own", 5.0)
    assert first._heap[0] is second._heap[0] is shared[1]
    assert first.pop_due(5.0) == ["b", "own", "a"]
    assert second.pop_due(5.0) == ["b", "a", "later own"]


@pytest.mark.parametrize("cls", sorted({Message, PythonMessage}, key=lambda cls: cls.__module__))
def test_messages_wait_in_order_and_are_shared(cls):
    """nsqd's messages: the C ``Message`` is its own entry (its due time and number held in it), the Python class
    rides in a tuple; either way the order is by due time, then push order, and channels share an entry."""
    made = [cls(b"%016d" % n, b"m%d" % n, 1000) for n in range(6)]
    first, second = DeferredQueue(), DeferredQueue()
    for n, message in enumerate(made[:4]):
        first.push(message, 2.0 if n % 2 else 1.0)
    shared = [entry(made[4], 1.0), entry(made[5], 0.5)]
    for queue in (first, second):
        for held in shared:
            queue.push_entry(held)
    if cls is not PythonMessage:
        assert first._heap[0] is made[5] and made[5].delivered_at == 0.5  # no tuple: the message itself
    assert first.peek_due() == second.peek_due() == 0.5
    assert [due for due, _ in first.entries()].count(1.0) == 3
    assert first.pop_due(1.0) == [made[5], made[0], made[2], made[4]]
    assert second.drain() == [(0.5, made[5]), (1.0, made[4])]
    assert first.drain() == [(2.0, made[1]), (2.0, made[3])]
    assert item_of(shared[0]) is made[4]
