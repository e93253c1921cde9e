"""The backfill: everything this node holds unfinished, as the frames a replica needs to hold it too.

Sent to a peer whose WELCOME shows it does not hold this session's stream (it restarted empty, or this node
restarted): the topics and channels as they are (created, paused), then every unfinished message once
(MESSAGES), then, for each channel that does not hold a message its topic passed on to others, a FINISHED for
it, so that the replica's release rule gives the same answer as this node's queues. All frames carry seq 0
(see PROTOCOL.md); SYNCED follows them.

Where unfinished messages are: the topic's memory queue and disk backlog (not yet copied to channels: every
channel will get them), and each channel's memory queue, disk backlog, in-flight and deferred messages. A disk
backlog is read from the queue's files between its reader and its writer without moving either
(``peek_records``); in durable mode the records between the committed position and the reader are in memory
(the channel's queue or in flight), so nothing is missed. Built synchronously, so that no publish or FIN can
fall between the snapshot and the outbox frames that follow it.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterator

import trio

from protocol.replication import (
    OP_CREATED,
    OP_PAUSED,
    ChannelOp,
    Finished,
    encode,
    encode_messages,
)

from ..queues.segment_reader import SplitRecords

__all__ = ["backfill_frames", "peek_records"]

log = logging.getLogger("nsqd")

_LENGTH = struct.Struct(">i")
_HEADER = SplitRecords.HEADER  # timestamp, attempts, id
#: messages per MESSAGES frame of a backfill
BATCH = 512


def peek_records(queue) -> Iterator[bytes]:
    """The unread records of a ``DiskQueue``, read from its files without moving its reader."""
    if queue is None or not queue.has_unread():
        return
    read_num, read_pos = queue.read_position()
    write_num, write_pos = queue.write_position()
    for num in range(read_num, write_num + 1):
        start = read_pos if num == read_num else 0
        try:
            with open(queue.file_name(num), "rb") as f:
                f.seek(start)
                data = f.read() if num < write_num else f.read(max(write_pos - start, 0))
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.error("REPLICATION: could not read %s for a backfill - %s", queue.file_name(num), exc)
            continue
        pos = 0
        end = len(data)
        while pos + 4 <= end:
            size = _LENGTH.unpack_from(data, pos)[0]
            if size <= 0 or pos + 4 + size > end:
                break
            yield data[pos + 4:pos + 4 + size]
            pos += 4 + size


def _record_tuple(record: bytes, due_ns: int) -> tuple:
    timestamp, attempts, msg_id = _HEADER.unpack_from(record)
    return msg_id, timestamp, attempts, due_ns, record[_HEADER.size:]


def _message_tuple(message, due_ns: int = 0) -> tuple:
    if not due_ns and message.defer:
        due_ns = message.timestamp + int(message.defer * 1e9)
    return message.id, message.timestamp, message.attempts, due_ns, message.body


def _topic_messages(topic) -> tuple[dict[bytes, tuple], dict[bytes, set[str] | None]]:
    """Every unfinished message of ``topic`` once, and which channels hold it (None: the topic, so all)."""
    now, now_ns = trio.current_time(), time.time_ns()
    messages: dict[bytes, tuple] = {}
    holders: dict[bytes, set[str] | None] = {}
    for message in topic.queue:
        messages[message.id] = _message_tuple(message)
        holders[message.id] = None
    index = topic.deferred_index
    for record in peek_records(topic.backend):
        item = _record_tuple(record, 0)
        due_ns = index.due.get(item[0], 0) if index is not None else 0
        messages[item[0]] = item[:3] + (due_ns,) + item[4:]
        holders[item[0]] = None
    for channel in topic.channels.values():
        if channel.ephemeral:
            continue
        name = channel.name
        found = [(m, 0) for m in channel.queue]
        found += [(channel.in_flight.get(msg_id), 0) for msg_id in channel.in_flight]
        found += [(m, now_ns + int(max(due - now, 0) * 1e9)) for due, m in channel.deferred.entries()]
        for message, due_ns in found:
            if message is None:
                continue
            if message.id not in messages:
                messages[message.id] = _message_tuple(message, due_ns)
            held = holders.get(message.id, set())
            if held is not None:
                held.add(name)
                holders[message.id] = held
        index = channel.deferred_index
        for record in peek_records(channel.backend):
            item = _record_tuple(record, 0)
            if item[0] not in messages:
                due_ns = index.due.get(item[0], 0) if index is not None else 0
                messages[item[0]] = item[:3] + (due_ns,) + item[4:]
            held = holders.get(item[0], set())
            if held is not None:
                held.add(name)
                holders[item[0]] = held
    return messages, holders


def backfill_frames(nsqd) -> tuple[list[bytes], int]:
    """The frames of a backfill (seq 0) and how many messages they carry."""
    frames: list[bytes] = []
    count = 0
    for topic in list(nsqd.topics.values()):
        if topic.ephemeral or topic.replication is None:
            continue
        name = topic.name
        frames.append(encode(ChannelOp(0, name, "", OP_CREATED)))
        if topic.paused:
            frames.append(encode(ChannelOp(0, name, "", OP_PAUSED)))
        channels = [c for c in topic.channels.values() if not c.ephemeral]
        for channel in channels:
            frames.append(encode(ChannelOp(0, name, channel.name, OP_CREATED)))
            if channel.paused:
                frames.append(encode(ChannelOp(0, name, channel.name, OP_PAUSED)))
        messages, holders = _topic_messages(topic)
        items = list(messages.values())
        count += len(items)
        for start in range(0, len(items), BATCH):
            frames.append(encode_messages(0, name, items[start:start + BATCH]))
        for channel in channels:
            done = tuple(msg_id for msg_id, held in holders.items() if held is not None and channel.name not in held)
            for start in range(0, len(done), BATCH * 8):
                frames.append(encode(Finished(0, name, channel.name, done[start:start + BATCH * 8])))
    return frames, count

