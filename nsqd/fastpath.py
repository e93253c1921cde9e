"""The PUB producer's round trip in one pass: the read, the publish and the write of a poller step, batched.

Why: with the read poller (bench/HISTORY.md, change 14) a PUB round trip still cost nsqd about 17 us of CPU, half
of it in the kernel (one ``read``, one ``write``, a share of an ``epoll_wait``) and half in the interpreter: the
read's bytes through the general parser, the command table, the publish path and the output buffer, for each
PUB. A producer that sends one PUB at a time sends the same line each time (``PUB <topic>\\n``), which the
parser has already checked once. Here:

- ``read_pubs(fd, line, max_size)`` reads the socket and, when the read holds nothing but whole PUB commands
  whose line is ``line`` (the connection's last checked PUB line) with a body size in range, returns their
  bodies; anything else (another command, a partial command, a new topic) comes back as the bytes read, for the
  general parser, which stays the one authority on the protocol;
- the connection (``Connection.poll_ready``) hands such bodies to the step's ``PublishBatch`` instead of running
  the command; at the end of the poller step the batch publishes each topic's bodies of every connection served
  in the step with one ``Topic.publish`` (one ID run, one timestamp, one hand-off to the channels, as an MPUB),
  and writes each connection's OKs (``write_many``: one call for every connection);
- both exist in C (``nsqd/_speedups.c``, built by ``pip install -e .`` where a compiler is present) and here in
  Python; the C ones are used when they were built, unless ``TRIONSQ_NO_SPEEDUPS=1``. Same answers for the same
  bytes (``tests/nsqd/test_fastpath.py`` runs both).

What the client sees does not change: the same OK frames, one per PUB, in order, on its connection; a failed
publish is the same fatal ``E_PUB_FAILED`` (the general path's error, raised for each connection of the
batch). Only connections for which a PUB has nothing else to check take this path: plain TCP, no auth, no TLS
requirement, not subscribed (a consumer's publish may be delivered back to it and must be answered first),
no replication, not durable mode (their answers wait for peers or the disk), nothing unread or unsent.
"""

from __future__ import annotations

import os
import struct

from protocol.errors import ProtocolError
from protocol.frames import OK_FRAME

from .topic import TopicExiting, TopicFull

__all__ = ["ACCELERATED", "PublishBatch", "read_pubs", "write_many"]

RECEIVE_SIZE = 65536
_unpack_size = struct.Struct(">i").unpack_from


def _read_pubs(fd: int, line: bytes, max_size: int):
    """``read_pubs`` in Python (see the module notes and nsqd/_speedups.c)."""
    try:
        data = os.read(fd, RECEIVE_SIZE)
    except BlockingIOError:
        return None
    end = len(data)
    step = len(line) + 4
    pos = 0
    bodies = []
    while pos < end:
        if end - pos < step or not data.startswith(line, pos):
            return data
        size = _unpack_size(data, pos + step - 4)[0]
        start = pos + step
        if size <= 0 or size > max_size or size > end - start:
            return data
        pos = start + size
        bodies.append(data[start:pos])
    if not bodies:
        return data
    return end, bodies


def _write_many(fds: list[int], datas: list[bytes]) -> list[int]:
    """``write_many`` in Python: bytes written per descriptor, or -errno."""
    if len(fds) != len(datas):
        raise ValueError("fds and datas differ in length")
    result = []
    write = os.write
    for fd, data in zip(fds, datas):
        try:
            result.append(write(fd, data))
        except OSError as exc:
            result.append(-(exc.errno or 1))
    return result


ACCELERATED = False
read_pubs = _read_pubs
write_many = _write_many
if os.environ.get("TRIONSQ_NO_SPEEDUPS", "") in ("", "0"):
    try:
        from nsqd._speedups import read_pubs, write_many  # noqa: F811

        ACCELERATED = True
    except ImportError:  # not built (no compiler at install time): the Python twins above
        pass


class PublishBatch:
    """The PUB bodies that connections read in one poller step, published and answered at its end.

    ``add`` (from ``Connection.poll_ready``) registers the batch with the poller for the step's end
    (``ReadPoller.defer_reply``), which calls ``send_deferred``: per topic, one ``Topic.publish`` of every body in
    the order the connections were served, then one ``write_many`` of every connection's OKs. A connection whose
    OKs the socket does not take whole, or that has other output by then, gets them through its own output
    buffer and writer, as any answer."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        self._entries: list[tuple] = []  # (connection, topic name, bodies)

    def add(self, connection, topic: bytes, bodies: list[bytes]) -> None:
        if not self._entries:
            self.nsqd.read_poller.defer_reply(self)
        self._entries.append((connection, topic, bodies))

    def send_deferred(self) -> None:
        entries, self._entries = self._entries, []
        by_topic: dict[bytes, list] = {}
        for entry in entries:
            group = by_topic.get(entry[1])
            if group is None:
                by_topic[entry[1]] = [entry]
            else:
                group.append(entry)
        fds: list[int] = []
        datas: list[bytes] = []
        answered = []
        for raw_topic, group in by_topic.items():
            topic_name = raw_topic.decode("utf-8", "surrogateescape")
            bodies = group[0][2] if len(group) == 1 else [body for entry in group for body in entry[2]]
            error = self._publish(topic_name, bodies)
            # durable mode: a sync this made due is committed by the writers before these OKs leave
            owes_commit = bool(self.nsqd.sync_barrier)
            for connection, _, its_bodies in group:
                if error is not None:
                    connection.fast_publish_failed(error)
                    continue
                client = connection.client
                client.owes_commit = owes_commit
                count = len(its_bodies)
                client.published(topic_name, count)
                data = OK_FRAME if count == 1 else OK_FRAME * count
                if not owes_commit and connection.may_answer_now():
                    fds.append(connection.poll_fd)
                    datas.append(data)
                    answered.append(connection)
                else:
                    connection.answer_later(data)
        if fds:
            for connection, data, sent in zip(answered, datas, write_many(fds, datas)):
                if sent != len(data):
                    connection.answer_later(data[sent:] if sent > 0 else data)

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
