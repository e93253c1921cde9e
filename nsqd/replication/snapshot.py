"""The backfill: everything this node holds unfinished, as the frames a replica needs to hold it too.

Sent to a peer whose WELCOME shows it does not hold this session's stream (it restarted empty, or this node
restarted): the topics and channels as they are (created, paused), then every unfinished message, in MESSAGES
frames that name where it is: the topic (not yet copied to channels: every channel will get it) or the channel
that holds it. A message held by several channels comes once per channel; the replica joins them, and at SYNCED
counts every channel that named none of a message's frames as having finished it (PROTOCOL.md). So this node
keeps no index of what it sent, however large the backlog.

``Backfill(nsqd)`` captures, synchronously (no publish or FIN can fall between the capture and the outbox frames
that follow it), where everything is: the topology, references to the messages in memory (each topic's and
channel's memory queue, in-flight and deferred messages: no copy of a body), and for each disk backlog its
segment files, opened, with the span between the queue's reader and its writer (``queues/span.py``). ``send`` then
encodes and sends it in bounded steps (``BATCH`` messages) while publishes go on: the files stay readable through their
descriptors even once the queue has read and deleted them, and records appended after the capture are not read (they are
in the outbox after it). A message finished meanwhile is still sent; its FIN follows in the outbox. In durable mode the
records between a queue's committed position and its reader are in memory (the channel's queue or in flight), so nothing
is missed. A log channel's uncommitted offsets are captured as a span ``[committed, end)`` and read from the log in
steps, each from the log's ``committed`` of that moment (``_LogSpan``): a commit meanwhile has its FINs in the outbox,
and its files may be gone.

The backlogs are read as their queues read them, each record checked against its side file of checksums: a
damaged record is never sent as a message. A backlog found damaged (a bad record, a file cut short or missing) is
named in ``damaged``, and SYNCED tells the replica so (PROTOCOL.md, "Damage"): what it holds of that queue and
the backfill did not name, it sends back instead of dropping it.
"""

from __future__ import annotations

import logging
import time
from contextlib import aclosing
from typing import Any

import trio

from protocol.log import decode_range
from protocol.replication import OP_CREATED, OP_LOG, OP_PAUSED, ChannelOp, Requeued, encode, encode_messages

from ..queues.span import QueueSpan

__all__ = ["Backfill"]

log = logging.getLogger("nsqd")

#: messages per MESSAGES frame of a backfill (and per step of encoding)
BATCH = 512
#: bytes of frames gathered before one write to the peer
SEND_SIZE = 256 * 1024
#: bytes of a log channel's range read per step
LOG_READ_SIZE = 256 * 1024


class _Span:
    """The unread records of a disk queue at the capture (``QueueSpan``: its files, open, read checked), with
    the due times of its deferred messages."""

    __slots__ = ("records", "due")

    def __init__(self, queue, index) -> None:
        self.due = dict(index.due) if index is not None and index.due else {}
        self.records = QueueSpan(queue, log=log)

    def close(self) -> None:
        self.records.close()


class _LogSpan:
    """A log channel's uncommitted offsets at the capture, ``[first, end)``. Read in steps while commits go on:
    each step starts at the log's ``committed`` if that passed it (those messages are finished, and their FINs
    follow in the outbox), so nothing is read from a file retention removed."""

    __slots__ = ("channel", "log", "first", "end")

    def __init__(self, channel) -> None:
        self.channel = channel
        self.log = channel.log
        self.first = self.log.committed
        self.end = self.log.end


def _has_backlog(queue) -> bool:
    return queue is not None and queue.has_unread()


def _message_tuple(message, due_ns: int = 0) -> tuple:
    if not due_ns and message.defer:
        due_ns = message.timestamp + int(message.defer * 1e9)
    return message.id, message.timestamp, message.attempts, due_ns, message.body


class Backfill:
    """One backfill: captured when made, sent by ``send``; ``count``: the messages sent so far."""

    def __init__(self, nsqd) -> None:
        self.count = 0
        #: where what a disk backlog is found to have lost is noted (``restore.LostCopies``)
        self._lost_copies = nsqd.lost_copies
        #: (topic, channel or "") of the disk backlogs found damaged while they were sent
        self.damaged: set[tuple[str, str]] = set()
        #: queue name -> its write position at the capture: damage its own reader finds later before that
        #: position was in this backfill's span (``Replicator.queue_damaged``)
        self.marks: dict[str, tuple[int, int]] = {}
        self.topology: list[bytes] = []
        self.log_ops: list[bytes] = []  # CHANNEL op LOG frames, for peers that take them (``send``)
        #: (topic, holder channel or "", memory items or a disk span), in the order they are sent
        self.parts: list[tuple[str, str, list[Any] | _Span | _LogSpan]] = []
        try:
            self._capture(nsqd)
        except BaseException:
            self.close()
            raise

    def _capture(self, nsqd) -> None:
        now, now_ns = trio.current_time(), time.time_ns()
        topology, parts = self.topology, self.parts
        for topic in list(nsqd.topics.values()):
            if topic.ephemeral or topic.replication is None:
                continue
            name = topic.name
            topology.append(encode(ChannelOp(0, name, "", OP_CREATED)))
            if topic.paused:
                topology.append(encode(ChannelOp(0, name, "", OP_PAUSED)))
            if topic.queue:
                parts.append((name, "", [(m, 0) for m in topic.queue]))
            self._mark(topic.backend)
            if _has_backlog(topic.backend):
                parts.append((name, "", _Span(topic.backend, topic.deferred_index)))
            for channel in list(topic.channels.values()):
                if channel.ephemeral:
                    continue
                topology.append(encode(ChannelOp(0, name, channel.name, OP_CREATED)))
                if channel.paused:
                    topology.append(encode(ChannelOp(0, name, channel.name, OP_PAUSED)))
                if channel.log is not None:
                    self.log_ops.append(encode(ChannelOp(0, name, channel.name, OP_LOG)))
                    if channel.log.end > channel.log.committed:
                        parts.append((name, channel.name, _LogSpan(channel)))
                held = [(m, 0) for m in channel.queue]
                in_flight = channel.in_flight
                held += [(in_flight.get(msg_id), 0) for msg_id in in_flight]
                held += [(m, now_ns + int(max(due - now, 0) * 1e9)) for due, m in channel.deferred.entries()]
                if held:
                    parts.append((name, channel.name, held))
                self._mark(channel.backend)
                if _has_backlog(channel.backend):
                    parts.append((name, channel.name, _Span(channel.backend, channel.deferred_index)))

    def _mark(self, queue) -> None:
        if queue is not None:
            self.marks[queue.name] = queue.write_position()

    def close(self) -> None:
        for _topic, _channel, source in self.parts:
            if type(source) is _Span:
                source.close()
        self.parts = []

    async def send(self, send_all, *, log_channels: bool = True) -> None:
        """Encode and send everything captured (``await send_all(bytes)`` per write of about ``SEND_SIZE``),
        one step of ``BATCH`` messages at a time; the files are closed at the end. ``log_channels``: the peer's
        protocol version has CHANNEL op LOG (else a log channel's messages go as an ordinary channel's)."""
        pending: list[bytes] = self.topology + self.log_ops if log_channels else list(self.topology)
        size = sum(map(len, pending))
        try:
            for topic, channel, source in self.parts:
                if isinstance(source, _Span):
                    steps = self._disk_frames(topic, channel, source)
                elif isinstance(source, _LogSpan):
                    steps = self._log_frames(topic, channel, source)
                else:
                    steps = self._memory_frames(topic, channel, source)
                async with aclosing(steps):
                    async for frame in steps:
                        pending.append(frame)
                        size += len(frame)
                        if size >= SEND_SIZE:
                            await send_all(b"".join(pending))
                            pending, size = [], 0
            if pending:
                await send_all(b"".join(pending))
        finally:
            self.close()

    def _frames(self, topic: str, channel: str, batch: list) -> bytes:
        """The MESSAGES frame of ``batch``; a channel's copies go with no attempts and no due time, and a REQUEUED
        frame after it gives those the channel has (delivered, put back, deferred): what a channel did with a
        message is that channel's alone, not that of the others that hold it too (PROTOCOL.md)."""
        self.count += len(batch)
        if not channel:
            return encode_messages(0, topic, batch)
        rows = tuple((msg_id, attempts, due_ns) for msg_id, _ts, attempts, due_ns, _body in batch if attempts or due_ns)
        if not rows:
            return encode_messages(0, topic, batch, channel)
        plain = [(msg_id, timestamp, 0, 0, body) for msg_id, timestamp, _a, _d, body in batch]
        return encode_messages(0, topic, plain, channel) + encode(Requeued(0, topic, channel, rows))

    async def _memory_frames(self, topic: str, channel: str, items: list):
        for start in range(0, len(items), BATCH):
            batch = [_message_tuple(m, due_ns) for m, due_ns in items[start : start + BATCH] if m is not None]
            if batch:
                yield self._frames(topic, channel, batch)
            await trio.lowlevel.checkpoint()

    async def _log_frames(self, topic: str, channel: str, span: _LogSpan):
        """A log channel's uncommitted messages as the channel's (their attempts in a REQUEUED frame)."""
        channel_log = span.log
        offset = span.first
        while offset < span.end:
            if span.channel.log is not channel_log or channel_log.closed:
                return  # the channel was deleted meanwhile (its DELETED op follows in the outbox)
            offset = max(offset, channel_log.committed)
            if offset >= span.end:
                return
            try:
                frame = decode_range(channel_log.read(offset, span.end, LOG_READ_SIZE))
            except OSError as exc:
                log.error("REPLICATION: could not read the log of %s:%s for a backfill - %s", topic, channel, exc)
                return
            batch = [
                (msg_id, timestamp, attempts, 0, body)
                for _offset, msg_id, timestamp, attempts, body in frame.messages()
            ]
            offset = frame.next
            for start in range(0, len(batch), BATCH):
                yield self._frames(topic, channel, batch[start : start + BATCH])
            await trio.lowlevel.checkpoint()

    async def _disk_frames(self, topic: str, channel: str, span: _Span):
        """The records of a disk backlog, read checked (``QueueSpan``): a damaged record is never sent; a backlog
        found damaged (or missing a file) is noted in ``damaged``, which SYNCED tells the replica (PROTOCOL.md,
        "Damage"): it sends back what it holds of that queue that the backfill left out, instead of dropping it."""
        due = span.due
        records = span.records
        for batch in records.records(BATCH):
            yield self._frames(
                topic,
                channel,
                [
                    (msg_id, timestamp, attempts, due.get(msg_id, 0), body)
                    for msg_id, timestamp, attempts, body in zip(
                        batch.ids, batch.timestamps, batch.attempts, batch.bodies, strict=True
                    )
                ],
            )
            await trio.lowlevel.checkpoint()
        if records.found:
            self.damaged.add((topic, channel))
            self._lost_copies.note(topic, channel, records.lost)
            log.error(
                "REPLICATION: the backfill found %d record(s) of %s damaged or lost: the replica is asked for "
                "its copies",
                records.damaged,
                f"{topic}:{channel}" if channel else topic,
            )
