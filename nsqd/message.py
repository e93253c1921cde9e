"""The message as nsqd keeps it: the wire fields plus per-channel delivery state.

Made at delivery, shared until then. A published message usually has no object while it waits: the topic's
segment holds its parts and each channel's queue a window on them (``queues/packed.py``); a channel's queue
makes its own objects when its dispatcher takes them (``new_messages``, the IDs joined), so attempts, the client
and the time of delivery are each channel's from the start. Messages that come as objects (a disk backlog's, a
takeover's, deferred ones) are handed to every channel as the same objects instead: such a message is never
changed while it waits in a queue or a deferred heap, and a channel's dispatcher, about to deliver a batch it
took, makes its own copy of each message that anything else still references (``claim_shared``: another
channel's queue or heap; the last channel to deliver it takes the object itself), and only while the topic has
more than one channel (one alone has nothing to share with). A copy has the attempts the topic's message has (0
for a publish; nsqd's own pump gives the first channel the topic's message and the others fresh ones at 0).

The C type. With the accelerator built, ``Message`` is a type of ``nsqd/_speedups.c`` with the same fields and
constructor: one 96-byte object with the ID's 16 bytes inline, where the class below takes 96 and a bytes object of
64 for the ID (a message in flight, bench/README.md "Memory per message": 185 bytes over its body instead of 343).
Reading ``id`` makes a bytes object; the in-flight queue finds messages by their inline IDs (``MessageIndex``,
``queues/inflight.py``). Its IDs are 16 bytes, as nsqd's always are (``ValueError`` otherwise).

The cyclic collector. A message as published references only bytes and numbers, so it cannot be part of a
reference cycle, and reference counting frees it; but as an instance of a Python class it is tracked, and each
young and middle collection walks every message made since (about 0.4 us per message kept in memory, nearly
all of the collector's time in the PUB scenario: bench/HISTORY.md, item 29). The C type is not followed by the
collector at all: the one reference of a message that can close a cycle is the consumer's client a delivery
stores in it (a client holds its channel, whose in-flight queue holds the message), and a channel empties its
in-flight queue when it is closed (``Channel.close``), which breaks every such cycle. For the Python class,
``new_messages`` untracks the batch it makes (``untrack_atomic``: only objects whose referents are all atomic),
and a delivery tracks its messages again (``track_all``) before it stores the client in them; the copies a
delivery makes (``claim_shared``) are tracked from the start. These are C functions of ``nsqd/_speedups.c``;
Python cannot untrack an object, so without the accelerator the hints do nothing and every message stays
tracked, as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import repeat
from sys import getrefcount

from protocol.message import MESSAGE_ID_LENGTH
from protocol.message import Message as WireMessage

from .queues.segment_reader import SplitRecords
from .speedups import load as load_speedups

__all__ = ["Message", "new_messages", "claim_shared", "encode_record", "split_messages", "track_all"]


def _leave_to_the_collector(objects: list) -> None:
    """The Python twin of ``untrack_atomic`` and ``track_all``: Python cannot untrack an object, so each stays
    tracked (see the module notes)."""


_speedups = load_speedups()
if _speedups is not None:
    _new_messages = _speedups.new_messages  # the C twin of ``new_messages``
    untrack_atomic, track_all = _speedups.untrack_atomic, _speedups.track_all
else:  # not built, or TRIONSQ_NO_SPEEDUPS: nothing untracked, nothing to track again
    _new_messages = None
    untrack_atomic = track_all = _leave_to_the_collector
#: the C ``new_messages`` takes a list of timestamps and joined IDs (an accelerator built before it did, not rebuilt
#: since, is left the lists of IDs with one timestamp)
_packed_in_c = bool(getattr(_speedups, "NEW_MESSAGES_PACKED", 0))


class Message(WireMessage):
    """A message inside nsqd.

    ``defer`` is the delay in seconds a DPUB asked for (0.0 for an ordinary publish); ``client``
    is the connection that holds it in flight and ``delivered_at`` the trio time of that delivery
    (TOUCH caps the total in-flight time from there). ``disk_token`` is, in durable mode, the
    token of the disk queue record this message was read from (-1 otherwise): the record stays
    held until the message is finished or written to the queue again (see ``queues/diskqueue.py``).
    ``in_flight`` is the number of the in-flight queue's bucket that holds it (-1: none;
    ``queues/inflight.py``).

    This class is the Python twin: with the accelerator built, ``Message`` is its C type (``nsqd/_speedups.c``),
    96 bytes with the ID inline (see the module notes).
    """

    __slots__ = ("defer", "client", "delivered_at", "disk_token", "in_flight")

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int = 0, defer: float = 0.0) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.defer = defer
        self.client = None
        self.delivered_at = 0.0
        self.disk_token = -1
        self.in_flight = -1


#: the Python class, also where the accelerator is built (tests compare the two)
PythonMessage = Message
if _speedups is not None and hasattr(_speedups, "Message"):
    Message = _speedups.Message  # type: ignore[misc]


def new_messages(
    ids: list[bytes] | bytes, bodies: list[bytes], timestamp: int | list[int], defer: float = 0.0
) -> list[Message]:
    """A published batch's messages, one timestamp for all (or a list of them, one per message), left out of the
    cyclic collector's walks (see the module notes). ``ids``: a list, or the IDs joined (16 bytes each, as a packed
    queue keeps them). In C when the accelerator is built (``nsqd/_speedups.c``: the slots written directly, no
    ``__init__`` frame per message); here ``map`` calls the class from C: about 40% cheaper per message than a
    comprehension, and a delivery of packed messages pays it on every message."""
    if _new_messages is not None and (_packed_in_c or (type(timestamp) is not list and type(ids) is list)):
        return _new_messages(Message, ids, bodies, timestamp, defer)
    if isinstance(ids, bytes):
        if len(ids) != MESSAGE_ID_LENGTH * len(bodies):
            raise ValueError("ids and bodies differ in length")
        ids = [ids[start : start + MESSAGE_ID_LENGTH] for start in range(0, len(ids), MESSAGE_ID_LENGTH)]
    count = len(ids)
    if isinstance(timestamp, list):
        assert len(timestamp) == count
        messages = list(map(Message, ids, bodies, timestamp, repeat(0, count), repeat(defer, count)))
    elif defer:
        messages = list(map(Message, ids, bodies, repeat(timestamp, count), repeat(0, count), repeat(defer, count)))
    else:
        messages = list(map(Message, ids, bodies, repeat(timestamp, count)))
    untrack_atomic(messages)
    return messages


def _copy(message: Message) -> Message:
    """A new object with every slot of ``message`` (the ID and body bytes are shared, not copied)."""
    copy = Message(message.id, message.body, message.timestamp, message.attempts, message.defer)
    copy.client = message.client
    copy.delivered_at = message.delivered_at
    copy.disk_token = message.disk_token
    copy.in_flight = message.in_flight
    return copy


def _claim_shared(batch: list[Message]) -> None:
    """``claim_shared`` in Python: replace in ``batch`` each message that anything besides the list references
    by a copy of it, which the caller may then change (see the module notes: a channel's dispatcher, before a
    delivery)."""
    for index in range(len(batch)):
        if getrefcount(batch[index]) > 2:  # the list's reference and the call's argument
            batch[index] = _copy(batch[index])


#: the C twin when the accelerator is built (``nsqd/_speedups.c``), called with no Python frame between (an
#: accelerator built before it had the function, not rebuilt since, leaves the Python one)
claim_shared = getattr(_speedups, "claim_shared", _claim_shared)


_pack_header = SplitRecords.HEADER.pack  # the record layout's one definition, shared with the disk queue's reads


def encode_record(message: Message) -> bytes:
    """The disk queue record of a message: the same 26-byte header + body as on the wire."""
    return _pack_header(message.timestamp, message.attempts, message.id) + message.body


def split_messages(records: SplitRecords) -> Iterator[Message]:
    """The messages of records read split at their header (``DiskQueue.read_split``), built by ``map`` from the
    columns: no copy of a record, no call per record besides the class."""
    return map(Message, records.ids, records.bodies, records.timestamps, records.attempts)
