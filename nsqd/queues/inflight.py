"""The in-flight queue: messages sent to a consumer and not yet finished, keyed by ID, ordered by deadline.

FIN and REQ remove a message by its ID, TOUCH moves its deadline, and the queue scanner pops the messages whose
deadline has passed. Expiry is rare next to delivery and FIN (a healthy consumer finishes everything long before
its timeout), so the structure makes push and pop cheap and leaves the work to expiry:

- A *bucket* is a run of consecutive pushes with the same deadline: the dispatcher hands a consumer a batch of
  messages at one instant with one timeout, so a batch shares one bucket. A bucket holds its deadline, the IDs
  appended to it (in push order) and ``live``, how many of them are still in flight in it.
- ``_entries`` maps ``msg_id -> (item, bucket)``; ``_heap`` is a min-heap of ``(deadline, seq, bucket)``, one entry
  per bucket (``seq`` is unique, so buckets are never compared and equal deadlines leave in push order).
- ``push`` adds the dict entry and appends the ID to the newest bucket when it has the same deadline and is still
  live, else opens a bucket (one heap push): O(1) for all but the first message of a batch. ``push_many`` does
  the same for a whole batch in one call.
- ``pop`` (FIN/REQ) deletes the dict entry and decrements its bucket's ``live``: O(1). The ID stays in the
  bucket's list, stale (an entry is live in a bucket only while the dict maps its ID to that very bucket).
  ``pop_owned`` does the same for a run of FINs, checking each item's owner. These two batch methods know the
  items are messages (``id``, ``client``); the rest of the queue takes any item.
- ``touch`` moves the entry to the newest bucket (or a new one) with the new deadline, like a pop and a push.
- ``pop_expired(now)`` pops the buckets whose deadline is ``<= now`` and returns their live items in push order:
  O(k + b log n) for k IDs in b buckets.

Garbage stays bounded, both kinds amortised O(1) per operation and each cleaned only when it outnumbers what is
live by ``REBUILD_FACTOR`` (2x) and there is more than ``REBUILD_MIN`` (64) of it:

- *dead buckets* (``live == 0``, every message finished) stay in the heap until their deadline; when they are
  that many, the heap is rebuilt without them. A dead bucket drops its ID list at once.
- *stale IDs* in live buckets (finished messages whose batch-mates are still out); when they are that many, every
  live bucket's list is rewritten with its live IDs only.

So the heap holds at most about three times the live buckets, and the lists at most about three times the live
IDs. (One heap entry per message would cost a heap push per delivery and, as FINs leave stale heap entries
behind, a rebuild of the whole heap every few thousand FINs.) The queue does no I/O and reads no clock: deadlines are
plain floats on the caller's clock (``trio.current_time()``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["EMPTY_IN_FLIGHT", "InFlightQueue"]

T = TypeVar("T")

#: Clean up dead buckets / stale IDs when they exceed this many times the live ones...
REBUILD_FACTOR = 2
#: ...and there are more than this many of them (small queues are never worth cleaning).
REBUILD_MIN = 64


class _Bucket:
    """Consecutive pushes with one deadline: one heap entry for all of them."""

    __slots__ = ("deadline", "ids", "live")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.ids: list[bytes] = []
        self.live = 0


#: the newest bucket before the first push: never live, so never appended to
_NO_BUCKET = _Bucket(float("nan"))


class InFlightQueue(Generic[T]):
    """Items keyed by message ID, each with a deadline; O(1) push and removal by ID, expiry in deadline order."""

    __slots__ = ("_entries", "_heap", "_next_seq", "_newest", "_dead", "_slots", "on_active")

    def __init__(self) -> None:
        #: called when the queue goes from empty to holding something (nsqd's queue scanner: QueueScanner.activate)
        self.on_active: Callable[[], None] | None = None
        self._entries: dict[bytes, tuple[T, _Bucket]] = {}
        self._heap: list[tuple[float, int, _Bucket]] = []
        self._next_seq = 0
        self._newest = _NO_BUCKET  # the bucket pushes with its deadline append to
        self._dead = 0  # buckets in the heap with live == 0
        self._slots = 0  # IDs in the lists of live buckets, stale ones included

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._entries

    def __iter__(self) -> Iterator[bytes]:
        """The IDs in flight, in no particular order."""
        return iter(self._entries)

    def push(self, msg_id: bytes, item: T, deadline: float) -> None:
        """Record ``item`` as in flight until ``deadline``. Raises KeyError if ``msg_id`` is already in flight."""
        entries = self._entries
        if msg_id in entries:
            raise KeyError(msg_id)
        if not entries and self.on_active is not None:
            self.on_active()
        bucket = self._bucket_for(deadline)
        bucket.ids.append(msg_id)
        bucket.live += 1
        self._slots += 1
        entries[msg_id] = (item, bucket)

    def push_many(self, items: list[T], deadline: float) -> list[T]:
        """``push`` of each item under its ``id`` attribute (a message's ID), all until ``deadline``: the
        dispatcher's batch to one consumer. Returns the items refused because their ID is already in flight
        (the others are pushed)."""
        entries = self._entries
        if not entries and self.on_active is not None:
            self.on_active()
        bucket = self._bucket_for(deadline)
        ids = bucket.ids
        append = ids.append
        before = len(ids)
        refused: list[T] = []
        for item in items:
            msg_id = item.id  # type: ignore[attr-defined]
            if msg_id in entries:
                refused.append(item)
                continue
            entries[msg_id] = (item, bucket)
            append(msg_id)
        added = len(ids) - before
        bucket.live += added
        self._slots += added
        if not bucket.live:
            self._bucket_died(bucket)  # opened for nothing (every item refused): a dead bucket like any other
        return refused

    def get(self, msg_id: bytes) -> T | None:
        """The item in flight under ``msg_id``, or None."""
        entry = self._entries.get(msg_id)
        return None if entry is None else entry[0]

    def deadline(self, msg_id: bytes) -> float | None:
        """The current deadline of ``msg_id``, or None if it is not in flight."""
        entry = self._entries.get(msg_id)
        return None if entry is None else entry[1].deadline

    def pop(self, msg_id: bytes) -> T | None:
        """Remove and return the item in flight under ``msg_id`` (FIN, REQ), or None if there is none."""
        entry = self._entries.pop(msg_id, None)
        if entry is None:
            return None
        bucket = entry[1]
        live = bucket.live - 1
        bucket.live = live
        if live:
            stale = self._slots - len(self._entries)
            if stale > REBUILD_MIN and stale > REBUILD_FACTOR * len(self._entries):
                self._compact()
        else:
            self._bucket_died(bucket)
        return entry[0]

    def pop_owned(self, msg_ids: list[bytes], owner: object) -> tuple[list[T], list[tuple[bytes, T | None]]]:
        """``pop`` of each ID in turn whose item's ``client`` attribute is ``owner`` (FIN of a run of IDs from
        one consumer). Returns the items popped, in order, and the refused IDs with the item in flight under
        each (None if there is none), in order."""
        entries = self._entries
        take = entries.pop
        popped: list[T] = []
        refused: list[tuple[bytes, T | None]] = []
        for msg_id in msg_ids:
            entry = take(msg_id, None)
            if entry is None:
                refused.append((msg_id, None))
                continue
            if entry[0].client is not owner:  # type: ignore[attr-defined]
                entries[msg_id] = entry  # put back (the dict's order means nothing here)
                refused.append((msg_id, entry[0]))
                continue
            bucket = entry[1]
            live = bucket.live - 1
            bucket.live = live
            if not live:
                self._bucket_died(bucket)
            popped.append(entry[0])
        stale = self._slots - len(entries)
        if stale > REBUILD_MIN and stale > REBUILD_FACTOR * len(entries):
            self._compact()
        return popped, refused

    def touch(self, msg_id: bytes, deadline: float) -> bool:
        """Move the deadline of ``msg_id`` (TOUCH). Returns False if it is not in flight."""
        entries = self._entries
        entry = entries.get(msg_id)
        if entry is None:
            return False
        old = entry[1]
        old.live -= 1
        bucket = self._bucket_for(deadline)
        bucket.ids.append(msg_id)
        bucket.live += 1
        self._slots += 1
        entries[msg_id] = (entry[0], bucket)
        if not old.live:
            self._bucket_died(old)
        stale = self._slots - len(entries)
        if stale > REBUILD_MIN and stale > REBUILD_FACTOR * len(entries):
            self._compact()
        return True

    def pop_expired(self, now: float) -> list[T]:
        """Remove and return the items whose deadline is ``<= now``, earliest deadline first (push order among
        equal deadlines)."""
        heap = self._heap
        entries = self._entries
        expired: list[T] = []
        while heap and heap[0][0] <= now:
            bucket = heapq.heappop(heap)[2]
            if not bucket.live:
                self._dead -= 1
                continue
            expired.extend(_take_live(entries, bucket))
            self._slots -= len(bucket.ids)
            bucket.live = 0
            bucket.ids = []
        return expired

    def peek_deadline(self) -> float | None:
        """The earliest deadline in flight, or None when empty. Drops the dead buckets it meets."""
        heap = self._heap
        while heap:
            top = heap[0]
            if top[2].live:
                return top[0]
            heapq.heappop(heap)
            self._dead -= 1
        return None

    def drain(self) -> list[T]:
        """Remove and return every item in flight, earliest deadline first (for shutdown and channel deletion)."""
        entries = self._entries
        ordered: list[T] = []
        for _, _, bucket in sorted(self._heap):
            ordered.extend(_take_live(entries, bucket))
        assert not entries, "every live entry is in a bucket of the heap"
        self._heap.clear()
        self._newest = _NO_BUCKET
        self._dead = 0
        self._slots = 0
        return ordered

    # -- internals -------------------------------------------------------------------------------
    def _bucket_for(self, deadline: float) -> _Bucket:
        """The bucket a push with ``deadline`` appends to: the newest one if it has that deadline and is live."""
        bucket = self._newest
        if bucket.deadline != deadline or not bucket.live:
            bucket = self._open(deadline)
        return bucket

    def _open(self, deadline: float) -> _Bucket:
        bucket = _Bucket(deadline)
        seq = self._next_seq
        self._next_seq = seq + 1
        heapq.heappush(self._heap, (deadline, seq, bucket))
        self._newest = bucket
        return bucket

    def _bucket_died(self, bucket: _Bucket) -> None:
        """Its last live entry left: drop its IDs; rebuild the heap once dead buckets are too many."""
        self._slots -= len(bucket.ids)
        bucket.ids = []
        dead = self._dead + 1
        self._dead = dead
        if dead > REBUILD_MIN and dead > REBUILD_FACTOR * (len(self._heap) - dead):
            self._heap = [top for top in self._heap if top[2].live]
            heapq.heapify(self._heap)
            self._dead = 0

    def _compact(self) -> None:
        """Rewrite every live bucket's list with its live IDs only (each once, in push order)."""
        entries = self._entries
        slots = 0
        for _, _, bucket in self._heap:
            if bucket.live:
                seen: set[bytes] = set()
                ids = []
                for msg_id in reversed(bucket.ids):
                    entry = entries.get(msg_id)
                    if entry is not None and entry[1] is bucket and msg_id not in seen:
                        seen.add(msg_id)
                        ids.append(msg_id)
                ids.reverse()
                bucket.ids = ids
                slots += len(ids)
        self._slots = slots


class _Unopened(InFlightQueue):
    """``EMPTY_IN_FLIGHT``'s class: reads as an empty queue, refuses what would fill it."""

    __slots__ = ()

    def push(self, msg_id: bytes, item: T, deadline: float) -> None:
        raise TypeError("the shared empty in-flight queue holds nothing: its owner opens a queue of its own")

    def push_many(self, items: list[T], deadline: float) -> list[T]:
        raise TypeError("the shared empty in-flight queue holds nothing: its owner opens a queue of its own")


#: An empty queue for those that have not pushed yet (nsqd's channels before their first delivery: one object
#: instead of three per idle channel, each visited by the cyclic collector). Every read and removal works on it
#: (it stays empty); ``push`` and ``push_many`` raise: the owner replaces it with an ``InFlightQueue`` first.
EMPTY_IN_FLIGHT: InFlightQueue = _Unopened()


def _take_live(entries: dict, bucket: _Bucket) -> list:
    """Remove the live entries of ``bucket`` from ``entries`` and return their items in push order. An ID can sit
    in one list twice (finished, then pushed again into the same bucket): its last place is the live one."""
    items = []
    for msg_id in reversed(bucket.ids):
        entry = entries.get(msg_id)
        if entry is not None and entry[1] is bucket:
            del entries[msg_id]
            items.append(entry[0])
    items.reverse()
    return items
