"""Message IDs, generated as nsqd generates them (nsqd/guid.go), plus a batch fast path.

One ``GUIDFactory`` serves every topic of a node (nsqd has one per topic): IDs are unique and strictly increasing
per node, so an ID names one message of the node whatever its topic (replication keys copies by ID alone).
The 64-bit value, written as 8 big-endian bytes in lowercase hex (16 ASCII bytes on the wire)::

     63                        22 21          12 11            0
    +----------------------------+--------------+--------------+
    |      tick - TWEPOCH        |   node id    |   sequence   |
    +----------------------------+--------------+--------------+

``tick`` is Unix nanoseconds >> 20 (units of 1.048576 ms). NSQ subtracts a Twitter-snowflake
epoch written in milliseconds (1288834974288) from that tick count; the mixed units are kept so
the IDs look like real nsqd's. The sequence restarts at 0 on every new tick; a tick holds 4096 IDs.

``next_id`` follows nsqd exactly: when the tick's 4096 sequence numbers are used up, or the clock
has moved back, it raises ``GUIDUnavailable`` and the caller decides when to retry (nsqd sleeps
1 ms). Nothing here sleeps.

``next_ids`` serves MPUB: when a batch needs more than what is left of the current tick, it
continues into the following ticks ahead of the clock ("borrowed" ticks), at most
``MAX_LEAD_TICKS`` (1024 ticks, about 1.07 s, 4M+ IDs) ahead. Monotonicity holds because the
factory keeps counting from the last borrowed tick until the real clock passes it: while the
factory is ahead, a clock reading behind it is not "time going backwards" but the lead being
worked off. A batch that would need a larger lead raises ``GUIDUnavailable`` without using any
ID; the caller retries later (the lead shrinks as time passes) or splits the batch.
Caveat of the lead: a restarted nsqd starts from the real clock, so a restart within the lead
(at most ~1 s after an enormous MPUB) could reissue IDs of messages kept on disk, the same
exposure nsqd has to a clock stepping back.

How the hex is made: the sequence is the low 12 bits, exactly the last 3 hex digits, so an ID is
the tick's 13-digit prefix (timestamp and node id) followed by one of 4096 precomputed suffixes.
A batch joins prefix and suffixes into one bytes object and splits it: one C call each instead of a
``%016x`` formatting per ID (about 4x cheaper per ID; MPUB pays it on every message). ``next_packed`` makes
the IDs' 8-byte values the same way (a 6-byte prefix, 2-byte suffixes), joined and not split: a publish kept in
memory needs no bytes object per ID (``queues/packed.py``), and its 200 IDs cost one join, not a list of 200.

A node of several worker processes (``--workers N``, ``workers.py``) stamps every ID with its ``--node-id``, as one
process does, and gives each worker one N-th of every tick's sequences (``GUIDFactory(node_id, part, parts)``:
worker k issues ``[k * 4096 // N, (k + 1) * 4096 // N)``), so the IDs of its workers never meet and are the IDs
of one node to whoever reads them. Stamping ``--node-id`` plus the worker's number instead made a worker's IDs
those of the node whose ``--node-id`` is that number: a replica adopting that node's messages into a topic of
that worker put two messages with one ID in a channel, which delivers one of two copies in flight. The cost: a
worker issues 4096 / N IDs per tick (about 1 ms), and borrows ticks ahead sooner.

Not thread-safe: a factory belongs to its node (or its worker) and is used from the event-loop thread.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from .speedups import twin

__all__ = [
    "MAX_LEAD_TICKS",
    "SEQUENCE_BITS",
    "NODE_ID_BITS",
    "TWEPOCH",
    "GUIDFactory",
    "GUIDParts",
    "GUIDUnavailable",
    "next_packed_one",
    "split_id",
]

TWEPOCH = 1288834974288
NODE_ID_BITS = 10
SEQUENCE_BITS = 12
TICK_SHIFT = 20  # nanoseconds >> 20
_NODE_SHIFT = SEQUENCE_BITS
_TIMESTAMP_SHIFT = SEQUENCE_BITS + NODE_ID_BITS
_SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1
_PER_TICK = 1 << SEQUENCE_BITS
MAX_LEAD_TICKS = 1024
#: the sequence's 3 hex digits, by sequence
_SUFFIXES = tuple(b"%03x" % sequence for sequence in range(_PER_TICK))


class GUIDUnavailable(Exception):
    """No ID can be issued right now (sequence used up, or the clock moved back); retry later."""


class GUIDParts(NamedTuple):
    tick: int  # Unix nanoseconds >> 20
    node_id: int
    sequence: int


def split_id(message_id: bytes) -> GUIDParts:
    """Decode a 16-byte hex ID back into its tick, node id and sequence."""
    value = int(message_id, 16)
    return GUIDParts(
        tick=(value >> _TIMESTAMP_SHIFT) + TWEPOCH,
        node_id=(value >> _NODE_SHIFT) & ((1 << NODE_ID_BITS) - 1),
        sequence=value & _SEQUENCE_MASK,
    )


class GUIDFactory:
    """Issues a node's message IDs (see the module notes for the layout and the batch rule)."""

    __slots__ = (
        "node_id",
        "_first",
        "_end",
        "_span",
        "_last_tick",
        "_sequence",
        "_ahead",
        "_prefix_tick",
        "_prefix",
        "_packed_tick",
        "_packed",
        "_packed_suffixes",
    )

    #: the largest batch ``next_ids`` can ever issue at once (a factory with every sequence of a tick)
    max_batch = MAX_LEAD_TICKS * _PER_TICK

    def __init__(self, node_id: int, part: int = 0, parts: int = 1) -> None:
        """``part`` of ``parts``: this factory issues that share of each tick's sequences (a node's workers)."""
        if not 0 <= node_id < (1 << NODE_ID_BITS):
            raise ValueError(f"node id {node_id} outside [0,1024)")
        if not 0 <= part < parts <= _PER_TICK:
            raise ValueError(f"part {part} of {parts}: a tick has {_PER_TICK} sequences")
        self.node_id = node_id
        self._first = part * _PER_TICK // parts  # this factory's sequences in every tick: [_first, _end)
        self._end = (part + 1) * _PER_TICK // parts
        self._span = self._end - self._first
        self._last_tick = -1  # tick of the last ID issued
        self._sequence = 0  # sequence of the last ID issued
        self._ahead = False  # _last_tick was borrowed ahead of the clock by next_ids
        self._prefix_tick = -1  # the tick whose 13 hex digits are in _prefix
        self._prefix = b""
        self._packed_tick = -1  # the tick whose 6 bytes are in _packed (``next_packed``)
        self._packed = b""
        self._packed_suffixes: tuple[bytes, ...] = ()  # the low 2 bytes by sequence, for this node id

    def _tick_prefix(self, tick: int) -> bytes:
        """The 13 hex digits every ID of ``tick`` starts with (timestamp and node id), cached per tick."""
        if tick != self._prefix_tick:
            self._prefix = b"%013x" % (((tick - TWEPOCH) << NODE_ID_BITS) | self.node_id)
            self._prefix_tick = tick
        return self._prefix

    def _start(self, now_tick: int) -> tuple[int, int]:
        """Where the next ID goes: (tick, sequence), the sequence possibly one past the tick's end."""
        last = self._last_tick
        if now_tick > last:
            if now_tick < TWEPOCH:
                raise ValueError("clock reads before NSQ's ID epoch")
            return now_tick, self._first
        if now_tick == last or (self._ahead and last - now_tick <= MAX_LEAD_TICKS):
            return last, self._sequence + 1
        raise GUIDUnavailable("time has gone backwards")

    def next_id(self, now_ns: int | None = None) -> bytes:
        """One ID as 16 lowercase hex bytes; ``GUIDUnavailable`` when the tick is used up or time went back."""
        now_tick = (time.time_ns() if now_ns is None else now_ns) >> TICK_SHIFT
        tick, sequence = self._start(now_tick)
        if sequence >= self._end:
            raise GUIDUnavailable("sequence expired")
        self._last_tick = tick
        self._sequence = sequence
        self._ahead = tick > now_tick
        return self._tick_prefix(tick) + _SUFFIXES[sequence]

    def _claim(self, count: int, now_ns: int | None) -> tuple[int, int]:
        """Use ``count`` (>= 1) consecutive IDs, borrowing ticks ahead of the clock when one tick is not enough:
        the (tick, sequence) of the first; the others follow it, into the next ticks from sequence 0. All or
        nothing: on ``GUIDUnavailable`` no ID has been used."""
        now_tick = (time.time_ns() if now_ns is None else now_ns) >> TICK_SHIFT
        tick, sequence = self._start(now_tick)
        first = self._first
        if sequence >= self._end:  # the tick is used up: the batch starts in the next one
            tick += 1
            sequence = first
        position = sequence - first + count - 1  # of the last ID, counted from the start of `tick`'s share
        span = self._span
        end_tick = tick + position // span
        if end_tick - now_tick > MAX_LEAD_TICKS:
            raise GUIDUnavailable("sequence expired")
        self._last_tick = end_tick
        self._sequence = first + position % span
        self._ahead = end_tick > now_tick
        return tick, sequence

    def next_ids(self, count: int, now_ns: int | None = None) -> list[bytes]:
        """``count`` consecutive IDs, borrowing ticks ahead of the clock when one tick is not enough.

        All or nothing: on ``GUIDUnavailable`` no ID has been used.
        """
        if count <= 0:
            if count == 0:
                return []
            raise ValueError("count must not be negative")
        tick, sequence = self._claim(count, now_ns)
        if count == 1:  # a PUB's one ID: without the join and split below (0.6 us instead of 2.2)
            return [self._tick_prefix(tick) + _SUFFIXES[sequence]]
        end = sequence + count
        if end <= self._end:  # in one tick (a poller step's PUBs, most MPUBs): one join and one split, no loop
            prefix = self._tick_prefix(tick)
            return (prefix + (b" " + prefix).join(_SUFFIXES[sequence:end])).split(b" ")
        # "P" + "000" + " P" + "001" + ... per tick, the ticks joined by " ", then one split
        pieces: list[bytes] = []
        for run_tick, first, end in self._runs(tick, sequence, count):
            prefix = self._tick_prefix(run_tick)
            pieces.append(prefix + (b" " + prefix).join(_SUFFIXES[first:end]))
        return (pieces[0] if len(pieces) == 1 else b" ".join(pieces)).split(b" ")

    def next_packed(self, count: int, now_ns: int | None = None) -> bytes:
        """``next_ids`` as a topic's segment keeps them (``queues/packed.py``): each ID's 8 big-endian bytes,
        joined, with no bytes object per ID. ``GUIDUnavailable`` as ``next_ids``."""
        if count == 1:  # a PUB's one ID, in the clock's tick (``_claim``'s two commonest cases, without its calls)
            made = next_packed_one(self, time.time_ns() if now_ns is None else now_ns)
            if made is not None:
                return made
        elif count <= 0:
            if count == 0:
                return b""
            raise ValueError("count must not be negative")
        tick, sequence = self._claim(count, now_ns)
        suffixes = self._packed_suffixes or self._make_packed_suffixes()
        end = sequence + count
        if end <= self._end:  # in one tick
            prefix = self._packed_prefix(tick)
            return prefix + suffixes[sequence] if count == 1 else prefix + prefix.join(suffixes[sequence:end])
        pieces: list[bytes] = []
        for run_tick, first, end in self._runs(tick, sequence, count):
            prefix = self._packed_prefix(run_tick)
            pieces.append(prefix + prefix.join(suffixes[first:end]))
        return b"".join(pieces)

    def _packed_prefix(self, tick: int) -> bytes:
        """The 6 bytes every packed ID of ``tick`` starts with: the high 48 bits of the value, the tick and the
        node id's high 6 bits (a sequence never carries into them), cached per tick."""
        if tick != self._packed_tick:
            self._packed = (((tick - TWEPOCH) << (NODE_ID_BITS - 4)) | (self.node_id >> 4)).to_bytes(6, "big")
            self._packed_tick = tick
        return self._packed

    def _make_packed_suffixes(self) -> tuple[bytes, ...]:
        self._packed_suffixes = _packed_suffixes(self.node_id & 0xF)
        return self._packed_suffixes

    def _runs(self, tick: int, sequence: int, count: int):
        """The ``(tick, first sequence, end sequence)`` of ``count`` IDs from ``(tick, sequence)`` on, tick by
        tick, each in this factory's share of the tick."""
        end = self._end
        while count:
            take = min(end - sequence, count)
            yield tick, sequence, sequence + take
            count -= take
            tick += 1
            sequence = self._first


def _next_packed_one(factory: GUIDFactory, now_ns: int) -> bytes | None:
    """``factory.next_packed(1, now_ns)`` in its two commonest cases, ``_claim``'s without its calls: the first ID
    of a new tick, the next of the clock's tick; None otherwise (a tick used up, ticks borrowed ahead, the clock
    gone back), with nothing used: ``next_packed`` then takes ``_claim``'s way. A PUB calls it first. The Python
    twin of the C ``next_packed_one`` (``nsqd/_speedups.c``), which writes the same slots."""
    now_tick = now_ns >> TICK_SHIFT
    last = factory._last_tick
    if now_tick > last and now_tick >= TWEPOCH:
        sequence = factory._first
    elif now_tick == last and factory._sequence + 1 < factory._end:
        sequence = factory._sequence + 1
    else:
        return None
    factory._last_tick = now_tick
    factory._sequence = sequence
    factory._ahead = False
    prefix = factory._packed if now_tick == factory._packed_tick else factory._packed_prefix(now_tick)
    return prefix + (factory._packed_suffixes or factory._make_packed_suffixes())[sequence]


next_packed_one = twin(
    "next_packed_one", _next_packed_one, "guid_layout", GUIDFactory, TWEPOCH, TICK_SHIFT, NODE_ID_BITS, SEQUENCE_BITS
)


#: by the node id's low 4 bits: the IDs' low 2 bytes (those bits and the sequence), by sequence; made when a node
#: first packs IDs (``next_packed``: one for a node, of 4096 small bytes objects)
_PACKED_SUFFIXES: dict[int, tuple[bytes, ...]] = {}


def _packed_suffixes(low_bits: int) -> tuple[bytes, ...]:
    table = _PACKED_SUFFIXES.get(low_bits)
    if table is None:
        base = low_bits << SEQUENCE_BITS
        table = _PACKED_SUFFIXES[low_bits] = tuple(
            (base | sequence).to_bytes(2, "big") for sequence in range(_PER_TICK)
        )
    return table
