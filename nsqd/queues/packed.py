"""A topic's memory queue, with what nobody takes yet packed: no object per message.

A topic holds its messages only while nothing takes them: no channel yet, paused, or held while nsqd asks
lookupd for its channels (topic.py). Such a backlog can be large (``--mem-queue-size``) and, as nsqd's, it is
read only when the pump hands it over, all at once. So a publish that stays in the topic is kept as its parts,
in runs (``_Packed``): the IDs in one ``bytearray`` (16 bytes each), the bodies in a list, and each publish's
one timestamp and delay (DPUB) with its message count. Per message that is the body's bytes object, 8 bytes
of list slot and 16 of ID, where a ``Message`` object, its ID's bytes object and a deque slot cost about 170
(bench/README.md, "Where a queued message's bytes go"). The ``Message`` objects are made when the pump takes the queue
(``take_all``), by the same call a publish makes them with (``message.new_messages``).

Messages that come as objects (``put_many``: a replica's takeover, a disk backlog's messages, anything with
attempts) are kept as they are, in runs of their own, so the order of the queue is the order things came in.
Iteration (a graceful stop writes the queue to disk; replication reads it) makes the packed ones as it goes.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from typing import final

from ..message import Message, new_messages

__all__ = ["PackedQueue"]

#: nsqd's message IDs (the topic's GUID factory makes them; ``protocol.message.MESSAGE_ID_LENGTH``)
ID_SIZE = 16


@final  # no subclass: ``type(run) is _Packed`` tells the two kinds of run apart (mypy follows it both ways)
class _Packed:
    """Published messages as their parts: IDs joined, bodies, and (timestamp, delay, count) per publish (one
    entry for consecutive publishes with the same timestamp and delay)."""

    __slots__ = ("ids", "bodies", "stamps", "delays", "counts")

    def __init__(self) -> None:
        self.ids = bytearray()
        self.bodies: list[bytes] = []
        self.stamps = array("q")
        self.delays = array("d")
        self.counts = array("q")

    def messages(self) -> list[Message]:
        joined = bytes(self.ids)
        ids = [joined[start : start + ID_SIZE] for start in range(0, len(joined), ID_SIZE)]
        bodies = self.bodies
        if len(self.stamps) == 1:
            return new_messages(ids, bodies, self.stamps[0], self.delays[0])
        made: list[Message] = []
        start = 0
        for timestamp, defer, count in zip(self.stamps, self.delays, self.counts, strict=True):
            end = start + count
            made += new_messages(ids[start:end], bodies[start:end], timestamp, defer)
            start = end
        return made


class PackedQueue:
    """A FIFO of messages for a topic's memory queue: ``extend`` with messages, ``extend_published`` with a
    publish's parts, ``take_all`` (the pump) and ``clear``; ``len`` and iteration as a deque's."""

    __slots__ = ("_runs", "count")

    def __init__(self) -> None:
        self._runs: deque[_Packed | list[Message]] = deque()
        #: how many messages it holds (``len``, without a call of a Python method: the publish path reads it)
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __iter__(self) -> Iterator[Message]:
        for run in list(self._runs):
            yield from run.messages() if type(run) is _Packed else run

    def extend(self, messages) -> None:
        """Messages as they are (objects, kept)."""
        messages = list(messages)
        if not messages:
            return
        runs = self._runs
        if runs and type(runs[-1]) is list:
            runs[-1] += messages
        else:
            runs.append(messages)
        self.count += len(messages)

    def extend_published(self, ids: list[bytes], bodies: list[bytes], timestamp: int, defer: float = 0.0) -> None:
        """A publish's messages, packed: ``new_messages(ids, bodies, timestamp, defer)`` when taken."""
        if not bodies:
            return
        joined = b"".join(ids)
        if len(joined) != ID_SIZE * len(bodies):  # not nsqd's IDs: kept as objects
            self.extend(new_messages(ids, bodies, timestamp, defer))
            return
        runs = self._runs
        run = runs[-1] if runs else None
        if type(run) is not _Packed:
            run = _Packed()
            runs.append(run)
        run.ids += joined
        run.bodies += bodies
        count = len(bodies)
        stamps = run.stamps
        if stamps and stamps[-1] == timestamp and run.delays[-1] == defer:
            run.counts[-1] += count
        else:
            stamps.append(timestamp)
            run.delays.append(defer)
            run.counts.append(count)
        self.count += count

    def take_all(self) -> list[Message]:
        """Every message, in order, as objects; the queue is then empty."""
        runs = self._runs
        if len(runs) == 1 and type(runs[0]) is list:
            taken = runs[0]
        else:
            taken = []
            for run in runs:
                taken += run.messages() if type(run) is _Packed else run
        runs.clear()
        self.count = 0
        return taken

    def clear(self) -> None:
        self._runs.clear()
        self.count = 0
