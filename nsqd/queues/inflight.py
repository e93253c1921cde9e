"""The in-flight queue: messages sent to a consumer and not yet finished, keyed by ID, ordered by deadline.

FIN and REQ remove a message by its ID, TOUCH moves its deadline, and the queue scanner pops the messages whose
deadline has passed. The structure is a dict ``msg_id -> (seq, deadline, item)`` plus a min-heap of
``(deadline, seq, msg_id)`` with lazy deletion:

- ``push`` adds the dict entry and one heap entry: O(log n).
- ``pop`` (FIN/REQ) deletes the dict entry only: O(1). Its heap entry becomes stale.
- ``touch`` gives the entry a new ``seq`` and pushes a new heap entry: O(log n). The old heap entry becomes stale.
- ``pop_expired(now)`` pops heap entries while their deadline is ``<= now``; an entry is live only when the dict
  still holds its ID with the same ``seq``, otherwise it is stale and dropped. O(k log n) for k popped entries.
- Stale entries would otherwise stay in the heap until their old deadline passes (a minute by default), so when they
  outnumber the live ones by ``REBUILD_FACTOR`` (2x) and there are more than ``REBUILD_MIN`` (64) of them after an
  operation that removes live entries or adds stale ones, the heap is rebuilt from the dict in O(n). Each rebuild removes over two thirds of the heap, so the cost is amortised
  O(1) per operation and the heap never holds more than about three times the live entries.

``seq`` is unique per entry, so heap tuples never compare IDs and messages with equal deadlines leave in push order.
The queue does no I/O and reads no clock: deadlines are plain floats on the caller's clock (``trio.current_time()``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["InFlightQueue"]

T = TypeVar("T")

#: Rebuild the heap when stale entries exceed this many times the live entries...
REBUILD_FACTOR = 2
#: ...and there are more than this many stale entries (small queues are never worth rebuilding).
REBUILD_MIN = 64


class InFlightQueue(Generic[T]):
    """Items keyed by message ID, each with a deadline; O(1) removal by ID, expiry in deadline order."""

    __slots__ = ("_entries", "_heap", "_next_seq")

    def __init__(self) -> None:
        self._entries: dict[bytes, tuple[int, float, T]] = {}
        self._heap: list[tuple[float, int, bytes]] = []
        self._next_seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._entries

    def __iter__(self) -> Iterator[bytes]:
        """The IDs in flight, in no particular order."""
        return iter(self._entries)

    def push(self, msg_id: bytes, item: T, deadline: float) -> None:
        """Record ``item`` as in flight until ``deadline``. Raises KeyError if ``msg_id`` is already in flight."""
        if msg_id in self._entries:
            raise KeyError(msg_id)
        seq = self._next_seq
        self._next_seq = seq + 1
        self._entries[msg_id] = (seq, deadline, item)
        heapq.heappush(self._heap, (deadline, seq, msg_id))

    def get(self, msg_id: bytes) -> T | None:
        """The item in flight under ``msg_id``, or None."""
        entry = self._entries.get(msg_id)
        return None if entry is None else entry[2]

    def deadline(self, msg_id: bytes) -> float | None:
        """The current deadline of ``msg_id``, or None if it is not in flight."""
        entry = self._entries.get(msg_id)
        return None if entry is None else entry[1]

    def pop(self, msg_id: bytes) -> T | None:
        """Remove and return the item in flight under ``msg_id`` (FIN, REQ), or None if there is none."""
        entries = self._entries
        entry = entries.pop(msg_id, None)
        if entry is None:
            return None
        stale = len(self._heap) - len(entries)  # _maybe_rebuild's test, inlined: FIN is the hot path
        if stale > REBUILD_MIN and stale > REBUILD_FACTOR * len(entries):
            self._maybe_rebuild()
        return entry[2]

    def touch(self, msg_id: bytes, deadline: float) -> bool:
        """Move the deadline of ``msg_id`` (TOUCH). Returns False if it is not in flight."""
        entry = self._entries.get(msg_id)
        if entry is None:
            return False
        seq = self._next_seq
        self._next_seq = seq + 1
        self._entries[msg_id] = (seq, deadline, entry[2])
        heapq.heappush(self._heap, (deadline, seq, msg_id))
        self._maybe_rebuild()
        return True

    def pop_expired(self, now: float) -> list[T]:
        """Remove and return the items whose deadline is ``<= now``, earliest deadline first."""
        heap = self._heap
        entries = self._entries
        expired: list[T] = []
        while heap and heap[0][0] <= now:
            _, seq, msg_id = heapq.heappop(heap)
            entry = entries.get(msg_id)
            if entry is not None and entry[0] == seq:
                del entries[msg_id]
                expired.append(entry[2])
        if expired:
            self._maybe_rebuild()
        return expired

    def peek_deadline(self) -> float | None:
        """The earliest deadline in flight, or None when empty. Drops the stale heap entries it meets."""
        heap = self._heap
        entries = self._entries
        while heap:
            deadline, seq, msg_id = heap[0]
            entry = entries.get(msg_id)
            if entry is not None and entry[0] == seq:
                return deadline
            heapq.heappop(heap)
        return None

    def drain(self) -> list[T]:
        """Remove and return every item in flight, earliest deadline first (for shutdown and channel deletion)."""
        ordered = sorted(self._entries.values(), key=lambda entry: (entry[1], entry[0]))
        self._entries.clear()
        self._heap.clear()
        return [entry[2] for entry in ordered]

    def _maybe_rebuild(self) -> None:
        live = len(self._entries)
        stale = len(self._heap) - live
        assert stale >= 0, "every live entry has exactly one heap entry"
        if stale > REBUILD_MIN and stale > REBUILD_FACTOR * live:
            self._heap = [(deadline, seq, msg_id) for msg_id, (seq, deadline, _) in self._entries.items()]
            heapq.heapify(self._heap)
