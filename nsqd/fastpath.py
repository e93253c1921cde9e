"""The PUB producer's round trip in one pass: the read, the publish and the write of a poller step, batched.

Why: with the read poller (bench/HISTORY.md, change 14) a PUB round trip still cost nsqd about 17 us of CPU, half
of it in the kernel (one ``read``, one ``write``, a share of an ``epoll_wait``) and half in the interpreter: the
read's bytes through the general parser, the command table, the publish path and the output buffer, for each
PUB. A producer that sends one PUB at a time sends the same line each time (``PUB <topic>\\n``), which the
parser has already checked once. Here:

- ``poll_producers`` starts a poller step (the poller's ``step_poll``): one call polls the poller's epoll set
  and reads every ready light producer whose PUBs may skip the parser (``fast_line_of``), and for each read that
  holds nothing but whole PUB commands of that connection's last checked PUB line, with a body size in range,
  adds the bodies, the connection and its count to its topic's group of the step, and sets ``last_read``; the
  other ready members go back to the poller, and anything else read (another command, a partial command, a new
  topic, end of input, an error) goes to its connection as read, for the general parser, which stays the one
  authority on the protocol. ``read_producers`` is the same for a list of descriptors (an interlude, or a step
  without ``step_poll``), ``read_pubs`` for one socket (a producer served later in the step, by a fresh look).
  The per-connection part of a step thus runs without the interpreter: the checks, the read, the grouping
  (bench/HISTORY.md, item 30);
- such connections do not run the command: at the end of the poller step the batch publishes each topic's bodies
  with one ``Topic.publish`` (one ID run, one timestamp, one hand-off to the channels, as an MPUB) and writes every
  connection's OKs of that topic with one call (``write_oks``), and adds the counts to the producers' figures
  with one (``count_published``);
- all exist in C (``nsqd/_speedups.c``, built by ``pip install -e .`` where a compiler is present) and here in
  Python; the C ones are used when they were built, unless ``TRIONSQ_NO_SPEEDUPS=1``. Same answers for the same
  bytes (``tests/nsqd/test_fastpath.py`` runs both).

What the client sees does not change: the same OK frames, one per PUB, in order, on its connection; a failed
publish is the same fatal ``E_PUB_FAILED`` (the general path's error, raised for each connection of the
batch). Only connections for which a PUB has nothing else to check take this path: plain TCP, no auth, no TLS
requirement, not subscribed (a consumer's publish may be delivered back to it and must be answered first),
no replication (its answers wait for the peers), nothing unread or unsent; in durable mode the OKs of a publish
that made a sync due go through the writers, which commit first.
"""

from __future__ import annotations

import os
import struct
from functools import partial
from typing import Any

from protocol.errors import ProtocolError
from protocol.frames import OK_FRAME

from .speedups import load as load_speedups
from .topic import TopicExiting, TopicFull

__all__ = [
    "ACCELERATED",
    "PublishBatch",
    "count_published",
    "fast_line_of",
    "poll_producers",
    "read_producers",
    "read_pubs",
    "write_oks",
]

RECEIVE_SIZE = 65536
_unpack_size = struct.Struct(">i").unpack_from


def _pub_bodies(data: bytes, line: bytes, max_size: int) -> list[bytes] | None:
    """The bodies of ``data`` when it is nothing but whole PUBs of ``line`` with sizes in range; None otherwise."""
    end = len(data)
    step = len(line) + 4
    pos = 0
    bodies = []
    while pos < end:
        if end - pos < step or not data.startswith(line, pos):
            return None
        size = _unpack_size(data, pos + step - 4)[0]
        start = pos + step
        if size <= 0 or size > max_size or size > end - start:
            return None
        pos = start + size
        bodies.append(data[start:pos])
    return bodies or None


def _read_pubs(fd: int, line: bytes, max_size: int):
    """``read_pubs`` in Python (see the module notes and nsqd/_speedups.c)."""
    try:
        data = os.read(fd, RECEIVE_SIZE)
    except BlockingIOError:
        return None
    bodies = _pub_bodies(data, line, max_size)
    if bodies is None:
        return data
    return len(data), bodies


def fast_line_of(member) -> tuple[bytes, bytes] | None:
    """The line and topic of the PUBs that ``member`` (a poller member) may read past the parser now
    (``Connection.fast_pub`` says why each check): its cached ``fast_line`` (None or missing for a member
    that is no producer connection, such as a replication peer's ACKs), nothing in its client's output and no
    write of its writer under way; None otherwise. ``fast_line_of`` in nsqd/_speedups.c is the twin."""
    line = getattr(member, "fast_line", None)
    if line is not None and not member.client.out and not member._send_lock.locked():
        return line
    return None


def _read_producer(member, fd: int, groups: dict, max_size: int, step_time: float, others: list, late: list) -> bool:
    """``read_producer`` of nsqd/_speedups.c in Python: False when ``member`` may not take the fast path (nothing
    read), True when it was read (see ``PublishBatch.read_producers``)."""
    last = fast_line_of(member)
    if last is None:
        return False
    line, topic = last
    try:
        data = os.read(fd, RECEIVE_SIZE)
    except BlockingIOError:
        return True
    except OSError as exc:
        others.append((member, exc))
        return True
    bodies = _pub_bodies(data, line, max_size)
    if bodies is None:
        others.append((member, data))
        return True
    group = groups.get(topic)
    if group is None:
        groups[topic] = group = [[], [], [], []]
    group[0].extend(bodies)
    group[1].append(member)
    group[2].append(fd)
    group[3].append(len(bodies))
    member.last_read = len(data)
    if step_time > member._read_moves_at:
        late.append(member)
    return True


def _read_producers(fds: list[int], members: dict, max_size: int, groups: dict, step_time: float):
    """``read_producers`` in Python (see ``PublishBatch.read_producers`` and nsqd/_speedups.c):
    ``(rest, others, late)``."""
    rest = []
    others: list[Any] = []
    late: list[Any] = []
    for fd in fds:
        member = members.get(fd)
        if member is None or not _read_producer(member, fd, groups, max_size, step_time, others, late):
            rest.append(fd)
    return rest, others, late


def _poll_producers(epoll, members: dict, light_read: int, max_size: int, groups: dict, step_time: float):
    """``poll_producers`` in Python (see ``PublishBatch.poll_producers`` and nsqd/_speedups.c):
    ``(events, taken, others, late)``."""
    events = []
    taken = []
    others: list[Any] = []
    late: list[Any] = []
    for event in epoll.poll(0):
        fd = event[0]
        member = members.get(fd)
        if (
            member is not None
            and member.last_read <= light_read
            and member.poll_actor is None
            and _read_producer(member, fd, groups, max_size, step_time, others, late)
        ):
            taken.append(fd)
        else:
            events.append(event)
    return events, taken, others, late


def _count_published(connections: list, counts: list[int], topic: str) -> None:
    """``count_published`` in Python: ``Client.published`` for each connection's client."""
    if len(connections) != len(counts):
        raise ValueError("connections and counts differ in length")
    for connection, count in zip(connections, counts, strict=True):
        connection.client.published(topic, count)


def _write_oks(fds: list[int], counts: list[int]) -> list[tuple[int, int]]:
    """``write_oks`` in Python: the writes that did not take all their OKs, as (index, bytes written or -errno)."""
    if len(fds) != len(counts):
        raise ValueError("fds and counts differ in length")
    short = []
    write = os.write
    for index, (fd, count) in enumerate(zip(fds, counts, strict=True)):
        if count <= 0:
            continue
        data = OK_FRAME * count
        try:
            sent = write(fd, data)
        except OSError as exc:
            sent = -(exc.errno or 1)
        if sent != len(data):
            short.append((index, sent))
    return short


_speedups = load_speedups()
ACCELERATED = _speedups is not None
if _speedups is not None:
    read_pubs, write_oks = _speedups.read_pubs, _speedups.write_oks
    read_producers, count_published = _speedups.read_producers, _speedups.count_published
    poll_producers = _speedups.poll_producers
else:  # not built, or TRIONSQ_NO_SPEEDUPS: the Python twins above
    read_pubs, write_oks = _read_pubs, _write_oks
    read_producers, count_published = _read_producers, _count_published
    poll_producers = _poll_producers


class PublishBatch:
    """The PUB bodies that connections read in one poller step, published and answered at its end.

    Bodies come in three ways. At the start of a step the poller polls through ``poll_producers`` and the
    ready light producers that may take this path (``fast_line_of``) are read in that call, their bodies grouped
    by topic; what was not whole PUBs of the connection's line goes back to the connection (``poll_data``), with
    the bytes as read. Light producers handed over by an interlude (the poller's
    ``bulk_read``) are read the same way by ``read_producers``, and a connection served on its own reads itself
    with ``read_pubs`` and calls ``add``. Either way the batch registers with the poller for the end of the
    step's light part (``ReadPoller.defer_reply``), which calls ``send_deferred``: per topic, one
    ``Topic.publish`` of every body in the order they were read, then one ``write_oks`` of every connection's
    OKs. A connection whose OKs the socket does not take whole gets the rest through its own output buffer and
    writer, as any answer; so do all of a topic's OKs when a disk sync must come first (durable mode).

    A connection may take this path only with nothing in its output and no write of its writer under way
    (``fast_pub``): nothing else runs for it until the step's end, so its OKs may then be written at once."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        #: topic name (bytes) -> [bodies, connections, their descriptors, OKs owed to each], in the order read
        self._topics: dict[bytes, list] = {}
        self._max_size = nsqd.opts.max_msg_size

    def add(self, connection, topic: bytes, bodies: list[bytes]) -> None:
        topics = self._topics
        if not topics:
            self.nsqd.read_poller.defer_reply(self)
        group = topics.get(topic)
        if group is None:
            topics[topic] = [bodies, [connection], [connection.poll_fd], [len(bodies)]]
        else:
            group[0].extend(bodies)
            group[1].append(connection)
            group[2].append(connection.poll_fd)
            group[3].append(len(bodies))

    def poll_producers(self, epoll, members: dict, light_read: int) -> tuple[list, list[int]]:
        """The start of a poller step (the poller's ``step_poll``): one ``poll_producers`` call polls the poller's
        epoll set and reads every ready light producer that may take the fast path, as ``read_producers`` does;
        returns the other ready events, for the poller to sort and serve, and the descriptors read."""
        groups = self._topics
        had_groups = bool(groups)
        poller = self.nsqd.read_poller
        events, taken, others, late = poll_producers(
            epoll, members, light_read, self._max_size, groups, poller.step_time
        )
        self._after_reads(had_groups, others, late)
        return events, taken

    def read_producers(self, fds: list[int], members: dict) -> list[int]:
        """Read the connections of ``fds`` that may take the fast path with one ``read_producers`` call (the
        poller's ``bulk_read``, for an interlude); returns the descriptors it did not read (other
        members, connections with something to check), in their order.

        Either call does each connection's part of the step: the check of ``Connection.fast_pub`` (its cached
        ``fast_line``, an empty output, no write under way), the read, the bodies into this step's group of the
        topic and the connection into the group's lists, ``last_read``. What comes back is what only Python
        does: what a read gave that is not whole PUBs (for ``poll_data``), and the connections whose read
        deadline is to move (``_set_read_deadline``, once in a while)."""
        groups = self._topics
        had_groups = bool(groups)
        rest, others, late = read_producers(fds, members, self._max_size, groups, self.nsqd.read_poller.step_time)
        self._after_reads(had_groups, others, late)
        return rest

    def _after_reads(self, had_groups: bool, others: list, late: list) -> None:
        """What the reads leave to Python: the step's end for the batch, the read deadlines that move, the reads
        for the parser."""
        if self._topics and not had_groups:
            self.nsqd.read_poller.defer_reply(self)
        if late or others:
            for connection in late:
                connection._set_read_deadline()
            for connection, result in others:
                connection.poll_data(result)

    def send_deferred(self) -> None:
        groups, self._topics = self._topics, {}
        mesh = self.nsqd.mesh
        for raw_topic, (bodies, connections, fds, counts) in groups.items():
            topic_name = raw_topic.decode("utf-8", "surrogateescape")
            if mesh is not None and not mesh.owns(topic_name):
                # another worker owns the topic (nsqd/workers.py): the step's bodies go there in one record,
                # acknowledged now; or, while the node stops or the owner's disk refuses this topic, each
                # connection's OKs wait in its output for the owner's answer
                if self.nsqd.exiting or not mesh.publish_acknowledged(topic_name, bodies, 0.0):
                    owner = mesh.owner(topic_name)
                    pairs = zip(connections, counts, strict=True)
                    held = [connection.hold_oks(count, owner) for connection, count in pairs]
                    mesh.publish_soon(topic_name, bodies, 0.0, partial(_answer_held, held))
                    count_published(connections, counts, topic_name)
                    continue
                error = None
            else:
                error = self._publish(topic_name, bodies)
            if error is not None:
                for connection in connections:
                    connection.fast_publish_failed(error)
                continue
            count_published(connections, counts, topic_name)
            if self.nsqd.sync_barrier:
                # durable mode: the sync this publish made due is committed by the writers before these OKs leave,
                # and a failed one turns each of them into E_PUB_FAILED (Connection._writer, commit_verbs)
                for connection, count in zip(connections, counts, strict=True):
                    connection.client.commit_verbs.extend(("PUB",) * count)
                    connection.answer_later(OK_FRAME * count)
                continue
            unsent = write_oks(fds, counts)
            for index, sent in unsent:
                data = OK_FRAME * counts[index]
                connections[index].answer_later(data[sent:] if sent > 0 else data)
            if mesh is not None and not mesh.owns(topic_name):
                # each producer whose OKs all left goes to the topic's owner (Connection.hand_over)
                owner = mesh.owner(topic_name)
                for connection in connections:
                    connection.hand_over(owner)

    def _publish(self, topic_name: str, bodies: list[bytes]) -> ProtocolError | None:
        """``Connection._publish_stored``'s publish for a batch: the error each of its connections gets, or None."""
        nsqd = self.nsqd
        if nsqd.exiting:
            return ProtocolError("E_PUB_FAILED", "PUB failed exiting")
        try:
            nsqd.get_topic(topic_name).publish(bodies, 0.0, defer_sync=True)
        except TopicExiting:
            return ProtocolError("E_PUB_FAILED", "PUB failed exiting")
        except TopicFull as exc:
            return ProtocolError("E_PUB_FAILED", f"PUB failed {exc}")
        return None


def _answer_held(held: list, reason: str | None) -> None:
    """The owner's answer to a step's publishes of one topic: to each connection whose OKs it held."""
    for answered in held:
        answered(reason)
