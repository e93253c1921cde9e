"""Memory queues of messages kept as their parts: no object per message until one is delivered.

A topic's published messages are kept in *segments* (``_Packed``): the IDs joined in one ``bytearray`` (8 bytes
each: ``pack_ids``), the bodies in a list, and each publish's one timestamp and delay (DPUB) with the count of
messages up to its end. Per message that is the body's bytes object, 8 bytes of list slot and 8 of ID, where a
``Message`` object, its ID's bytes object and a deque slot cost about 170 (bench/README.md, "Where a queued
message's bytes go"). A segment only grows: what was appended stays as it is, so many readers can hold the same
segment.

Those readers are the queues (``PackedQueue``): the topic's (while nothing takes its messages: no channel yet,
paused, or held while nsqd asks lookupd for its channels) and every channel's. A queue is a FIFO of *runs*: a
window on a segment (``_Window``: a range of its messages, one object for as many consecutive messages as the
queue got of it) or a deque of messages kept as objects (a REQ, a timeout, a disk backlog's messages, a
replica's takeover, anything with attempts). So a topic with four channels keeps a published message once, and
each channel's queue a share of one window object per segment. The ``Message`` objects are made when a queue
hands its messages out (``take``: the channel's dispatcher, about to deliver; ``take_all``: the topic's pump),
by the same call a publish made them with before (``message.new_messages``), fresh for each channel: a channel's
attempts, client and time of delivery are its own.

A topic appends to one open segment (``Segments``) while some queue still holds a window on it, up to
``SEGMENT_MESSAGES`` messages or ``SEGMENT_BYTES`` of bodies; when none does any more (every channel took what
it had of it, as when the consumers keep up) the segment starts again empty. A segment that follows a full one
(a backlog is forming) has room for as many messages made at once: its containers are each one allocation of
the size of the last, which the allocator reuses as segments come and go, where containers grown step by step
leave the heap scattered with the smaller blocks they outgrew (with 1,000,000 messages delivered from one
channel and held in flight, 352 bytes of resident set each instead of 375). A segment lives as long as a
window on it, so what every channel has taken of a segment stays with it until the slowest is past it: at most
one segment's worth per queue, by those bounds.

A publish with no delay into the topic's own queue, which already ends with a window on the open segment's end
(the commonest publish while nothing takes the topic's messages), grows the segment and that window in one call:
``extend_open``, in C (``nsqd/_speedups.c``) with a Python twin, what ``Segments.add`` and
``PackedQueue.extend_window`` would do, without their Python frames.

Iteration (a graceful stop writes a queue to disk; replication reads it) makes the packed ones as it goes,
each time anew.
"""

from __future__ import annotations

from array import array
from binascii import Error as HexError
from binascii import hexlify, unhexlify
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from itertools import chain, islice, repeat
from operator import sub
from sys import getrefcount
from typing import final

from ..message import Message, new_messages
from ..speedups import twin

__all__ = ["PackedQueue", "Segments", "SEGMENT_MESSAGES", "SEGMENT_BYTES", "extend_open"]

#: an ID as a segment keeps it: nsqd's IDs are 16 lowercase hex digits of 8 bytes (``nsqd/guid.py``), kept as those
#: 8 bytes and written in hex again when the message is made (``pack_ids``)
ID_SIZE = 8
#: a topic's open segment takes no more messages than this...
SEGMENT_MESSAGES = 4096
#: ...nor more bytes of bodies (so what a segment keeps of messages every channel has taken stays bounded)
SEGMENT_BYTES = 1 << 20


#: an ID as the wire has it (``protocol.message.MESSAGE_ID_LENGTH``)
HEX_ID_SIZE = 16


def pack_ids(ids: list[bytes]) -> bytes | None:
    """The IDs as a segment keeps them, joined (8 bytes each); None unless each is 16 lowercase hex digits, as
    the topic's GUID factory makes them (anything else would not come back as it was)."""
    joined = b"".join(ids)
    if len(joined) != HEX_ID_SIZE * len(ids):
        return None
    try:
        packed = unhexlify(joined)
    except HexError:
        return None
    return packed if hexlify(packed) == joined else None


@final  # no subclass: ``type(run) is _Window`` tells the two kinds of run apart (mypy follows it both ways)
class _Packed:
    """Published messages as their parts: IDs joined, bodies, and per publish (one entry for consecutive
    publishes with the same timestamp and delay) its timestamp, delay and the count of messages up to its end."""

    __slots__ = ("ids", "bodies", "count", "capacity", "stamps", "delays", "ends", "size", "deferred")

    def __init__(self, capacity: int = 0) -> None:
        # ``capacity``: room made at once for that many messages (the containers are not grown step by step)
        self.ids = bytearray(capacity * ID_SIZE)
        self.bodies: list[bytes] = [b""] * capacity
        self.count = 0  # the messages in it (the containers may have room beyond)
        self.capacity = capacity
        self.stamps = array("q")
        self.delays = array("d")
        self.ends = array("q")
        self.size = 0  # bytes of bodies
        self.deferred = False  # some message has a delay

    def __len__(self) -> int:
        return self.count

    def append(self, joined_ids: bytes, bodies: list[bytes], timestamp: int, defer: float, size: int) -> None:
        start = self.count
        end = start + len(bodies)
        self.ids[start * ID_SIZE : end * ID_SIZE] = joined_ids  # beyond the room made, these grow the containers
        self.bodies[start:end] = bodies
        self.count = end
        self.size += size
        stamps = self.stamps
        if stamps and stamps[-1] == timestamp and self.delays[-1] == defer:
            self.ends[-1] = end
        else:
            stamps.append(timestamp)
            self.delays.append(defer)
            self.ends.append(end)
            if defer:
                self.deferred = True

    def clear(self) -> None:
        """Empty again (only while no window holds it)."""
        del self.ids[:], self.bodies[:], self.stamps[:], self.delays[:], self.ends[:]
        self.count = self.capacity = self.size = 0
        self.deferred = False

    def messages(self, start: int, stop: int) -> list[Message]:
        """The messages ``start`` to ``stop`` (excluded) as new objects, as the publishes would have made them."""
        ids = hexlify(self.ids[start * ID_SIZE : stop * ID_SIZE])  # the IDs joined, split by ``new_messages``
        bodies = self.bodies[start:stop]
        ends = self.ends
        run = bisect_right(ends, start)
        if ends[run] >= stop:  # one publish's timestamp and delay for all (MPUB, or a run of them)
            return new_messages(ids, bodies, self.stamps[run], self.delays[run])
        if not self.deferred:  # one call with a timestamp per message, the list made by loops in C
            last = bisect_right(ends, stop - 1)
            if last - run + 1 == stop - start:  # a publish per message (PUB): the timestamps are the runs'
                return new_messages(ids, bodies, self.stamps[run : last + 1].tolist())
            bounds = [start, *ends[run:last], stop]
            counts = map(sub, islice(bounds, 1, None), bounds)
            return new_messages(
                ids, bodies, list(chain.from_iterable(map(repeat, self.stamps[run : last + 1], counts)))
            )
        made: list[Message] = []
        position = start
        while position < stop:
            end = min(ends[run], stop)
            part = slice(position - start, end - start)
            joined = ids[part.start * HEX_ID_SIZE : part.stop * HEX_ID_SIZE]
            made += new_messages(joined, bodies[part], self.stamps[run], self.delays[run])
            position = end
            run += 1
        return made


@final
class _Window:
    """A queue's run of consecutive messages of a segment: ``start`` to ``end`` (excluded)."""

    __slots__ = ("packed", "start", "end")

    def __init__(self, packed: _Packed, start: int, end: int) -> None:
        self.packed = packed
        self.start = start
        self.end = end


class Segments:
    """A topic's open segment: ``add`` appends a publish to it, or to a new one (see the module notes)."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open = _Packed()

    def add(self, joined_ids: bytes, bodies: list[bytes], timestamp: int, defer: float, size: int):
        """Append a publish (``joined_ids``: its IDs as ``pack_ids`` joins them; ``size``: its bytes of bodies);
        returns ``(segment, start, end)``, its place, for the queues' ``extend_window``."""
        packed = self.open
        if getrefcount(packed) <= 3:  # this attribute, the local name and the call's argument: no window on it
            if packed.capacity:
                packed = self.open = _Packed()  # its room goes too
            else:
                packed.clear()
        elif packed.count >= SEGMENT_MESSAGES or packed.size >= SEGMENT_BYTES:
            # a backlog: the next segment with room for as many as this one took, made at once
            packed = self.open = _Packed(packed.count)
        # ``_Packed.append``, inlined: a PUB's own path
        start = packed.count
        end = start + len(bodies)
        packed.ids[start * ID_SIZE : end * ID_SIZE] = joined_ids
        packed.bodies[start:end] = bodies
        packed.count = end
        packed.size += size
        stamps = packed.stamps
        if stamps and stamps[-1] == timestamp and packed.delays[-1] == defer:
            packed.ends[-1] = end
        else:
            stamps.append(timestamp)
            packed.delays.append(defer)
            packed.ends.append(end)
            if defer:
                packed.deferred = True
        return packed, start, end


class PackedQueue:
    """A FIFO of messages: ``extend_window`` with a segment's range, ``extend``/``append`` with messages kept as
    objects; ``take(count)`` (a channel's dispatcher), ``take_runs`` and ``take_all`` (the topic's pump) and
    ``clear``; ``len`` and iteration as a deque's."""

    __slots__ = ("_runs", "count")

    def __init__(self) -> None:
        self._runs = _NO_RUNS  # a deque of its own from the first message on
        #: how many messages it holds (``len``, without a call of a Python method: the publish path reads it)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[Message]:
        for run in list(self._runs):
            if type(run) is _Window:
                yield from run.packed.messages(run.start, run.end)
            else:
                yield from list(run)

    def append(self, message: Message) -> None:
        """One message as it is (an object, kept)."""
        runs = self._runs
        if runs and type(runs[-1]) is deque:
            runs[-1].append(message)
        else:
            self._own_runs().append(deque((message,)))
        self.count += 1

    def extend(self, messages) -> None:
        """Messages as they are (objects, kept)."""
        runs = self._runs
        if runs and type(runs[-1]) is deque:
            run = runs[-1]
            before = len(run)
            run.extend(messages)
            self.count += len(run) - before
            return
        run = deque(messages)
        if run:
            self._own_runs().append(run)
            self.count += len(run)

    def extend_window(self, packed: _Packed, start: int, end: int) -> None:
        """The messages ``start`` to ``end`` of the segment ``packed`` (``Segments.add``'s answer), packed."""
        runs = self._runs
        if runs:
            last = runs[-1]
            if type(last) is _Window and last.packed is packed and last.end == start:
                last.end = end
                self.count += end - start
                return
        self._own_runs().append(_Window(packed, start, end))
        self.count += end - start

    def extend_published(self, ids: list[bytes], bodies: list[bytes], timestamp: int, defer: float = 0.0) -> None:
        """A publish's messages, packed in a segment of this queue's own (tests and tools; a topic shares its
        segments with its channels: ``Segments``)."""
        if not bodies:
            return
        joined = pack_ids(ids)
        if joined is None:  # not nsqd's IDs: kept as objects
            self.extend(new_messages(ids, bodies, timestamp, defer))
            return
        runs = self._runs
        last = runs[-1] if runs else None
        packed = last.packed if type(last) is _Window and last.end == len(last.packed) else _Packed()
        start = len(packed)
        packed.append(joined, bodies, timestamp, defer, sum(map(len, bodies)))
        self.extend_window(packed, start, len(packed))

    def take(self, count: int) -> list[Message]:
        """Up to ``count`` messages from the front, as objects (the packed ones made now)."""
        runs = self._runs
        taken: list[Message] = []
        while count > 0 and runs:
            run = runs[0]
            if type(run) is _Window:
                start = run.start
                stop = min(start + count, run.end)
                part = run.packed.messages(start, stop)
                if stop == run.end:
                    runs.popleft()
                else:
                    run.start = stop
            elif len(run) <= count:
                part = list(run)
                runs.popleft()
            else:
                popleft = run.popleft
                part = [popleft() for _ in range(count)]
            taken += part
            count -= len(part)
        self.count -= len(taken)
        return taken

    def take_runs(self) -> list[tuple[_Packed, int, int] | list[Message]]:
        """Every message, in order: each window as ``(segment, start, end)``, each run of objects as a list; the
        queue is then empty (the topic's pump hands the windows on as they are)."""
        taken: list[tuple[_Packed, int, int] | list[Message]] = [
            (run.packed, run.start, run.end) if type(run) is _Window else list(run) for run in self._runs
        ]
        self.clear()
        return taken

    def take_all(self) -> list[Message]:
        """Every message, in order, as objects; the queue is then empty."""
        return self.take(self.count)

    def clear(self) -> None:
        self._runs = _NO_RUNS
        self.count = 0

    def _own_runs(self) -> deque[_Window | deque[Message]]:
        runs = self._runs
        if runs is _NO_RUNS:
            runs = self._runs = deque()
        return runs


def _extend_open(
    queue: PackedQueue, packed: _Packed, joined_ids: bytes, bodies: list[bytes], timestamp: int, size: int
) -> bool:
    """A publish with no delay into the topic's own queue (while nothing takes its messages), in its common case:
    when the queue's last run is a window ending where the open segment ``packed`` ends and the segment has room,
    the publish is appended to the segment and the window extended over it (``Segments.add`` and
    ``PackedQueue.extend_window`` in one call); False, with nothing changed, otherwise. The Python twin of the C
    ``extend_open`` (``nsqd/_speedups.c``)."""
    runs = queue._runs
    if not runs or not bodies or len(joined_ids) != ID_SIZE * len(bodies):
        return False
    last = runs[-1]
    start = packed.count
    if (
        type(last) is not _Window
        or last.packed is not packed
        or last.end != start
        or start >= SEGMENT_MESSAGES
        or packed.size >= SEGMENT_BYTES
    ):
        return False
    packed.append(joined_ids, bodies, timestamp, 0.0, size)
    end = packed.count
    last.end = end
    queue.count += end - start
    return True


extend_open = twin(
    "extend_open", _extend_open, "packed_layout", PackedQueue, _Window, _Packed, SEGMENT_MESSAGES, SEGMENT_BYTES
)


#: the runs of every queue that has held nothing yet (or was cleared): never added to (``_own_runs`` replaces it
#: first), so an idle topic or channel keeps no deque of its own for the cyclic collector to visit
_NO_RUNS: deque[_Window | deque[Message]] = deque()
