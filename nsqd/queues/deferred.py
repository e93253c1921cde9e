"""The deferred queue: messages that must wait until a due time (``DPUB``, ``REQ`` with a delay).

A min-heap of entries ordered by ``(due, seq)``. ``seq`` grows with every push (one counter for every queue), so
items with the same due time leave in push order (FIFO) and items themselves are never compared. An entry is
``(due, seq, item)``, or, for nsqd's C ``Message`` (``nsqd/_speedups.c``), the message itself: it keeps the due
time in its ``delivered_at`` and the number in its ``in_flight`` while it waits (it is neither delivered nor in
flight then) and orders by them, so a deferred message costs a heap slot instead of a tuple, a ``float`` and an
``int`` (128 bytes). Such an entry never changes while it waits, so several queues can hold the same one
(``entry`` makes it, ``push_entry`` takes it): a topic's channels share the entry of each deferred message they all
get, as they share the message (nsqd/topic.py), and a further channel costs a heap slot. ``push`` is O(log n),
``pop_due(now)`` is O(k log n) for the k items whose due time is ``<= now``; the queue scanner calls it and puts
those items back on the channel queue.

The queue does no I/O and reads no clock: due times are plain floats on the caller's clock (``trio.current_time()``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import count
from typing import Any, Generic, TypeVar

from ..message import Message, PythonMessage

__all__ = ["EMPTY_DEFERRED", "DeferredQueue", "entry", "item_of", "numbers"]

T = TypeVar("T")

#: the ``seq`` of every entry, in every queue; the in-flight queue numbers its buckets from it too, so a number in
#: a message's ``in_flight`` names one thing only (queues/inflight.py)
numbers = count()

#: the type whose objects are their own heap entries (the C ``Message``; none without the accelerator)
_SELF_ENTRY: Any = Message if Message is not PythonMessage else None


def entry(item: T, due: float) -> Any:
    """A heap entry holding ``item`` until ``due``, for ``push_entry`` (of one queue or several)."""
    if type(item) is _SELF_ENTRY:
        message: Any = item
        message.delivered_at = due
        message.in_flight = next(numbers)
        return message
    return (due, next(numbers), item)


def _due(held: Any) -> float:
    return held.delivered_at if type(held) is _SELF_ENTRY else held[0]


def item_of(held: Any) -> Any:
    """The item an entry holds."""
    return held if type(held) is _SELF_ENTRY else held[2]


class DeferredQueue(Generic[T]):
    """Items held until their due time; popped earliest first, FIFO among equal due times."""

    __slots__ = ("_heap", "on_active")

    def __init__(self) -> None:
        #: called when the queue goes from empty to holding something (nsqd's queue scanner: QueueScanner.activate)
        self.on_active: Callable[[], None] | None = None
        self._heap: list[Any] = []  # entries: see the module notes

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: T, due: float) -> None:
        """Hold ``item`` until ``due``."""
        self.push_entry(entry(item, due))

    def push_entry(self, entry: Any) -> None:
        """Hold ``entry``'s item until its due time (``entry(item, due)`` made it; other queues may hold it too)."""
        if not self._heap and self.on_active is not None:
            self.on_active()
        heapq.heappush(self._heap, entry)

    def pop_due(self, now: float) -> list[T]:
        """Remove and return the items whose due time is ``<= now``, earliest first."""
        heap = self._heap
        due: list[T] = []
        while heap and _due(heap[0]) <= now:
            due.append(item_of(heapq.heappop(heap)))
        return due

    def peek_due(self) -> float | None:
        """The earliest due time, or None when empty."""
        return _due(self._heap[0]) if self._heap else None

    def entries(self) -> list[tuple[float, T]]:
        """Every ``(due, item)``, in no particular order, left in place (a replication backfill reads them)."""
        return [(_due(held), item_of(held)) for held in self._heap]

    def drain(self) -> list[tuple[float, T]]:
        """Remove and return every ``(due, item)``, earliest first (for shutdown and channel deletion)."""
        ordered = sorted(self._heap)  # by due time, then number (unique: items are never compared)
        self._heap.clear()
        return [(_due(held), item_of(held)) for held in ordered]


class _Unopened(DeferredQueue):
    """``EMPTY_DEFERRED``'s class: reads as an empty queue, refuses what would fill it."""

    __slots__ = ()

    def push_entry(self, entry: Any) -> None:
        raise TypeError("the shared empty deferred queue holds nothing: its owner opens a queue of its own")


#: An empty queue for those that have not pushed yet (nsqd's channels before their first deferred message): every
#: read, ``pop_due`` and ``drain`` work on it (it stays empty); ``push`` raises: the owner replaces it with a
#: ``DeferredQueue`` first.
EMPTY_DEFERRED: DeferredQueue = _Unopened()
