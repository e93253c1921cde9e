"""The in-flight queue: messages sent to a consumer and not yet finished, keyed by ID, ordered by deadline.

FIN and REQ remove a message by its ID, TOUCH moves its deadline, and the queue scanner pops the messages whose
deadline has passed. Expiry is rare next to delivery and FIN (a healthy consumer finishes everything long before
its timeout), so the structure makes push and pop cheap and leaves the work to expiry:

- A *bucket* is a run of consecutive pushes with the same deadline: the dispatcher hands a consumer a batch of
  messages at one instant with one timeout, so a batch shares one bucket. A bucket holds its deadline, a number
  (``seq``, unique among every queue's buckets), the messages appended to it (in push order) and ``live``, how
  many of them are still in flight in it.
- ``_entries`` finds each message by its ID, and the message's ``in_flight`` names the bucket it is live in (the
  bucket's ``seq``, -1 once it is not in flight); ``_buckets`` maps the live buckets' numbers to them. With the
  accelerator, ``Message`` is a C type with its ID inline (nsqd/message.py) and ``_entries`` a ``MessageIndex``
  (``nsqd/_speedups.c``): a table of pointers to the messages, about 16 bytes per message where a dict keyed by
  the IDs (``MessagesById``, its Python twin) costs a bytes object for the ID and about 40 for its entry. So a
  message in flight costs its object, a pointer in the index and a place in its bucket's list; no tuple.
  ``_heap`` is a min-heap of ``(deadline, seq, bucket)``, one entry per bucket (equal deadlines leave in push
  order).
- ``push`` adds the dict entry and appends the message to the newest bucket when it has the same deadline and is
  still live, else opens a bucket (one heap push): O(1) for all but the first message of a batch. ``push_many``
  does the same for a whole batch in one call.
- ``pop`` (FIN/REQ) deletes the dict entry and decrements its bucket's ``live``: O(1). The message stays in the
  bucket's list, stale (a message is live in a bucket only while its ``in_flight`` is that bucket's number).
  ``pop_owned`` does the same for a run of FINs, checking each message's ``client``.
- ``touch`` moves the entry to the newest bucket (or a new one) with the new deadline, like a pop and a push.
- ``pop_expired(now)`` pops the buckets whose deadline is ``<= now`` and returns their live messages in push
  order: O(k + b log n) for k messages in b buckets.

Garbage stays bounded, both kinds amortised O(1) per operation and each cleaned only when it outnumbers what is
live by ``REBUILD_FACTOR`` (2x) and there is more than ``REBUILD_MIN`` (64) of it:

- *dead buckets* (``live == 0``, every message finished) stay in the heap until their deadline; when they are
  that many, the heap is rebuilt without them. A dead bucket drops its list at once.
- *stale places* in live buckets (finished messages whose batch-mates are still out); when they are that many,
  every live bucket's list is rewritten with its live messages only.

So the heap holds at most about three times the live buckets, and the lists at most about three times the live
messages. (One heap entry per message would cost a heap push per delivery and, as FINs leave stale heap entries
behind, a rebuild of the whole heap every few thousand FINs.) The queue does no I/O and reads no clock: deadlines
are plain floats on the caller's clock (``trio.current_time()``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from ..message import Message, PythonMessage
from ..speedups import load as load_speedups
from .deferred import numbers

__all__ = ["EMPTY_IN_FLIGHT", "InFlightQueue", "MessagesById"]

#: Clean up dead buckets / stale places when they exceed this many times the live ones...
REBUILD_FACTOR = 2
#: ...and there are more than this many of them (small queues are never worth cleaning).
REBUILD_MIN = 64


class _Bucket:
    """Consecutive pushes with one deadline: one heap entry for all of them."""

    __slots__ = ("deadline", "seq", "items", "live")

    def __init__(self, deadline: float, seq: int) -> None:
        self.deadline = deadline
        self.seq = seq
        self.items: list[Message] = []
        self.live = 0


#: the newest bucket before the first push: never live, so never appended to
_NO_BUCKET = _Bucket(float("nan"), -1)


class MessagesById(dict):
    """Messages by their IDs: the Python twin of the C ``MessageIndex`` (``nsqd/_speedups.c``), which holds C
    ``Message`` objects only and finds them by the IDs inline in them."""

    __slots__ = ()

    def add(self, message: Message) -> bool:
        """Add ``message``; False (nothing changed) when a message with its ID is in already."""
        key = message.id
        if key in self:
            return False
        self[key] = message
        return True


#: the index an in-flight queue keeps its messages in: the C one when the accelerator is built (it takes the C
#: ``Message``, which ``nsqd.message`` then uses), else the dict
_speedups = load_speedups()
DEFAULT_INDEX: type = getattr(_speedups, "MessageIndex", MessagesById) if Message is not PythonMessage else MessagesById


class InFlightQueue:
    """Messages keyed by ID, each with a deadline; O(1) push and removal by ID, expiry in deadline order."""

    __slots__ = ("_entries", "_buckets", "_heap", "_newest", "_dead", "_slots", "on_active")

    def __init__(self, index: type | None = None) -> None:
        #: called when the queue goes from empty to holding something (nsqd's queue scanner: QueueScanner.activate)
        self.on_active: Callable[[], None] | None = None
        #: message ID -> message (``index``: the C ``MessageIndex`` or the dict ``MessagesById``; by default the
        #: one that takes ``nsqd.message.Message``)
        self._entries = (DEFAULT_INDEX if index is None else index)()
        self._buckets: dict[int, _Bucket] = {}  # the live buckets by number
        self._heap: list[tuple[float, int, _Bucket]] = []
        self._newest = _NO_BUCKET  # the bucket pushes with its deadline append to
        self._dead = 0  # buckets in the heap with live == 0
        self._slots = 0  # places in the lists of live buckets, stale ones included

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._entries

    def __iter__(self) -> Iterator[bytes]:
        """The IDs in flight, in no particular order."""
        return iter([message.id for message in self._entries.values()])

    def push(self, message: Message, deadline: float) -> None:
        """Record ``message`` as in flight until ``deadline``. Raises KeyError if its ID is already in flight."""
        if self.push_many([message], deadline):
            raise KeyError(message.id)

    def push_many(self, messages: list[Message], deadline: float) -> list[Message]:
        """``push`` of each message, all until ``deadline``: the dispatcher's batch to one consumer. Returns the
        messages refused because their ID is already in flight (the others are pushed)."""
        entries = self._entries
        if not entries and self.on_active is not None:
            self.on_active()
        bucket = self._bucket_for(deadline)
        items = bucket.items
        append = items.append
        seq = bucket.seq
        add = entries.add
        before = len(items)
        refused: list[Message] = []
        for message in messages:
            if not add(message):
                refused.append(message)
                continue
            message.in_flight = seq
            append(message)
        added = len(items) - before
        bucket.live += added
        self._slots += added
        if not bucket.live:
            self._bucket_died(bucket)  # opened for nothing (every message refused): a dead bucket like any other
        return refused

    def get(self, msg_id: bytes) -> Message | None:
        """The message in flight under ``msg_id``, or None."""
        return self._entries.get(msg_id)

    def deadline(self, msg_id: bytes) -> float | None:
        """The current deadline of ``msg_id``, or None if it is not in flight."""
        message = self._entries.get(msg_id)
        return None if message is None else self._buckets[message.in_flight].deadline

    def pop(self, msg_id: bytes) -> Message | None:
        """Remove and return the message in flight under ``msg_id`` (FIN, REQ), or None if there is none."""
        message = self._entries.pop(msg_id, None)
        if message is None:
            return None
        bucket = self._buckets[message.in_flight]
        message.in_flight = -1
        live = bucket.live - 1
        bucket.live = live
        if live:
            stale = self._slots - len(self._entries)
            if stale > REBUILD_MIN and stale > REBUILD_FACTOR * len(self._entries):
                self._compact()
        else:
            self._bucket_died(bucket)
        return message

    def pop_owned(
        self, msg_ids: list[bytes], owner: object
    ) -> tuple[list[Message], list[tuple[bytes, Message | None]]]:
        """``pop`` of each ID in turn whose message's ``client`` is ``owner`` (FIN of a run of IDs from one
        consumer). Returns the messages popped, in order, and the refused IDs with the message in flight under
        each (None if there is none), in order."""
        entries = self._entries
        buckets = self._buckets
        take = entries.pop
        popped: list[Message] = []
        refused: list[tuple[bytes, Message | None]] = []
        for msg_id in msg_ids:
            message = take(msg_id, None)
            if message is None:
                refused.append((msg_id, None))
                continue
            if message.client is not owner:
                entries.add(message)  # put back (the index's order means nothing here)
                refused.append((msg_id, message))
                continue
            bucket = buckets[message.in_flight]
            message.in_flight = -1
            live = bucket.live - 1
            bucket.live = live
            if not live:
                self._bucket_died(bucket)
            popped.append(message)
        stale = self._slots - len(entries)
        if stale > REBUILD_MIN and stale > REBUILD_FACTOR * len(entries):
            self._compact()
        return popped, refused

    def touch(self, msg_id: bytes, deadline: float) -> bool:
        """Move the deadline of ``msg_id`` (TOUCH). Returns False if it is not in flight."""
        entries = self._entries
        message = entries.get(msg_id)
        if message is None:
            return False
        old = self._buckets[message.in_flight]
        old.live -= 1
        bucket = self._bucket_for(deadline)
        bucket.items.append(message)
        bucket.live += 1
        self._slots += 1
        message.in_flight = bucket.seq
        if not old.live:
            self._bucket_died(old)
        stale = self._slots - len(entries)
        if stale > REBUILD_MIN and stale > REBUILD_FACTOR * len(entries):
            self._compact()
        return True

    def pop_expired(self, now: float) -> list[Message]:
        """Remove and return the messages whose deadline is ``<= now``, earliest deadline first (push order among
        equal deadlines)."""
        heap = self._heap
        expired: list[Message] = []
        while heap and heap[0][0] <= now:
            bucket = heapq.heappop(heap)[2]
            if not bucket.live:
                self._dead -= 1
                continue
            expired.extend(self._take_live(bucket))
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

    def drain(self) -> list[Message]:
        """Remove and return every message in flight, earliest deadline first (for shutdown and channel
        deletion)."""
        ordered: list[Message] = []
        for _, _, bucket in sorted(self._heap):
            if bucket.live:
                ordered.extend(self._take_live(bucket))
        assert not self._entries and not self._buckets, "every live entry is in a bucket of the heap"
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
        seq = next(numbers)  # one counter with the deferred queues: an ``in_flight`` names one thing
        bucket = _Bucket(deadline, seq)
        heapq.heappush(self._heap, (deadline, seq, bucket))
        self._buckets[seq] = bucket
        self._newest = bucket
        return bucket

    def _bucket_died(self, bucket: _Bucket) -> None:
        """Its last live entry left: drop its list; rebuild the heap once dead buckets are too many."""
        self._slots -= len(bucket.items)
        bucket.items = []
        del self._buckets[bucket.seq]
        dead = self._dead + 1
        self._dead = dead
        if dead > REBUILD_MIN and dead > REBUILD_FACTOR * (len(self._heap) - dead):
            self._heap = [top for top in self._heap if top[2].live]
            heapq.heapify(self._heap)
            self._dead = 0

    def _take_live(self, bucket: _Bucket) -> list[Message]:
        """Remove the live messages of ``bucket`` (its number their ``in_flight``) and return them in push order;
        the bucket is then empty and forgotten. A message can sit in one list twice (finished, then pushed again
        into the same bucket): its last place is the live one."""
        entries = self._entries
        seq = bucket.seq
        taken = []
        for message in reversed(bucket.items):
            if message.in_flight == seq:
                message.in_flight = -1
                entries.pop(message.id)
                taken.append(message)
        taken.reverse()
        self._slots -= len(bucket.items)
        bucket.live = 0
        bucket.items = []
        del self._buckets[seq]
        return taken

    def _compact(self) -> None:
        """Rewrite every live bucket's list with its live messages only (each once, in push order)."""
        slots = 0
        for bucket in self._buckets.values():
            seq = bucket.seq
            seen: set[int] = set()
            items = []
            for message in reversed(bucket.items):
                if message.in_flight == seq and id(message) not in seen:
                    seen.add(id(message))
                    items.append(message)
            items.reverse()
            bucket.items = items
            slots += len(items)
        self._slots = slots


class _Unopened(InFlightQueue):
    """``EMPTY_IN_FLIGHT``'s class: reads as an empty queue, refuses what would fill it."""

    __slots__ = ()

    def push_many(self, messages: list[Message], deadline: float) -> list[Message]:
        raise TypeError("the shared empty in-flight queue holds nothing: its owner opens a queue of its own")


#: An empty queue for those that have not pushed yet (nsqd's channels before their first delivery: one object
#: instead of three per idle channel, each visited by the cyclic collector). Every read and removal works on it
#: (it stays empty); ``push`` and ``push_many`` raise: the owner replaces it with an ``InFlightQueue`` first.
EMPTY_IN_FLIGHT: InFlightQueue = _Unopened()
