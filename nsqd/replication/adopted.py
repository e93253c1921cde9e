"""Adopted messages: where they go, and the list of their ids a replica keeps for their origin.

``place`` puts messages into a topic's channels as they were elsewhere (each into the channels that had not
finished it) and replicates them from here: a takeover adopts an origin's copies with it, and an origin whose
messages a replica adopted puts back with it the ones the replica did not adopt.

``drop_adopted`` is the origin's side at start-up (or when a partition ends): it takes the messages a replica
adopted out of this node's topics and channels, memory and disk backlogs and log channels' uncommitted offsets
alike, and puts the others back with ``place`` (into a log channel: at its next offsets, the old ones committed).

``prepare_topics``, ``place`` and ``note_adopted`` are a takeover's three steps in the process that owns the topics;
``Adoption`` runs them in this one. With ``--workers`` above 1 and no ``--replicate-to`` the topics are spread over the
workers, and worker 0, which keeps the stores, runs them in each topic's owner (``workers.MeshAdoption``).

``AdoptedIds`` is ``replica.<node>.adopted`` in the data directory: the ids of the messages of origin ``node``
this replica adopted (16 bytes each, appended at each takeover). They go to that origin in ADOPTED frames the next
time it connects (PROTOCOL.md): it drops the ones it still holds (the replica delivers them) and counts the ones
it had finished (delivered twice: its FINs had not reached the replica). The file goes once the origin heard them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import trio

from protocol.log import decode_range
from protocol.replication import ReplicatedMessage

from ..message import Message
from ..queues.span import QueueSpan
from ..topic import TopicExiting, TopicFull

__all__ = [
    "AdoptedIds",
    "Adoption",
    "AdoptionFailed",
    "drop_adopted",
    "note_adopted",
    "note_takeover",
    "place",
    "place_refused",
    "prepare_topics",
    "settle_adopted",
]

log = logging.getLogger("nsqd")

ID_SIZE = 16
#: ids per ADOPTED frame (1 MiB)
FRAME_IDS = 65536


#: a log channel's place before a takeover's messages went in: (topic, channel, the log's end then)
LogEnd = tuple[str, str, int]


class AdoptionFailed(OSError):
    """A takeover's messages could not all be placed (a topic's owner refused them, or stopped): the store is kept,
    and adopted again by the next takeover."""


def prepare_topics(nsqd, states: dict[str, tuple[bool, dict]]) -> list[LogEnd]:
    """A takeover's first step: the topics and channels of ``states`` (``{topic: (paused, {channel: [order, paused,
    a log]})}``, as the origin had them) made here, paused as there, before any message goes in; a channel that is a
    log there is made one here, so the adopted messages take this node's next offsets of it. Returns the end of each
    log channel of these topics: where its adopted offsets begin (``note_adopted``)."""
    for name, (paused, channels) in states.items():
        topic = nsqd.get_topic(name)
        for channel_name, (_order, channel_paused, channel_log) in channels.items():
            channel = topic.get_channel(channel_name)
            if channel_paused and not channel.paused:
                channel.pause()
            if channel_log and channel.log is None:
                # (a channel of that name that is already a log here goes on)
                try:
                    channel.make_log()
                except OSError as exc:
                    log.error(
                        "REPLICATION: could not make %s:%s a log channel, its adopted messages wait "
                        "as an ordinary backlog (LOG converts it) - %s",
                        name,
                        channel_name,
                        exc,
                    )
        if paused and not topic.paused:
            topic.pause()
    return [
        (name, channel.name, channel.log.end)
        for name in states
        for channel in nsqd.topics[name].channels.values()
        if channel.log is not None
    ]


def note_adopted(nsqd, ends: list[LogEnd], topics: list[str], node: str, epoch: int, when: int) -> None:
    """A takeover's last step, once every message is placed: each log channel notes the offsets it adopted (LOG
    answers it, LOG-PROTOCOL.md "Replication": a reader of the origin finds its messages here), and nsqd.dat
    follows with the paused flags."""
    for topic_name, channel_name, before in ends:
        topic = nsqd.topics.get(topic_name)
        channel = topic.channels.get(channel_name) if topic is not None else None
        if channel is None or channel.log is None:
            continue  # deleted while the takeover ran
        entry = {"node": node, "epoch": epoch, "time": when, "from": before, "to": channel.log.end, "settled": False}
        note_takeover(channel, "adopted", entry)
    for name in topics:
        nsqd.metadata_changed(name)


def settle_adopted(nsqd, node: str) -> None:
    """Origin ``node`` heard which of its messages were adopted here: the log channels' notes of those takeovers say
    so from now on (``settled``)."""
    for topic in list(nsqd.topics.values()):
        for channel in list(topic.channels.values()):
            if channel.log is not None:
                try:
                    channel.log.settle_adopted(node)
                except OSError as exc:
                    log.error(
                        "REPLICATION: could not note in %s that origin %s is back - %s", channel.log.name, node, exc
                    )


class Adoption:
    """A takeover's steps in this process, which owns every topic (``workers.MeshAdoption`` spreads them)."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        self.ends: list[LogEnd] = []
        self.topics: list[str] = []

    async def prepare(self, states: dict[str, tuple[bool, dict]]) -> None:
        self.topics = list(states)
        self.ends = prepare_topics(self.nsqd, states)

    async def place(self, topic_name: str, batch: list) -> None:
        refusal = place_refused(self.nsqd, topic_name, batch)
        if refusal is not None:
            raise AdoptionFailed(f"topic {topic_name} did not take adopted messages: {refusal}")

    async def placed(self) -> None:
        """Return once every message given to ``place`` is in its topic; ``AdoptionFailed`` if some were refused."""

    async def note(self, node: str, epoch: int) -> None:
        note_adopted(self.nsqd, self.ends, self.topics, node, epoch, int(time.time()))


def place_refused(nsqd, topic_name: str, batch: list) -> str | None:
    """``place`` for a takeover: None, or why topic ``topic_name`` did not take all of ``batch``: it is being
    deleted or the node stops (``exiting``), or its disk refused it (in durable mode, a channel's disk too: what a
    channel keeps in memory instead would not outlive a kill -9, and the takeover's store is kept for it)."""
    refused: list[str] = []
    try:
        place(nsqd, topic_name, batch, refused)
    except TopicExiting:
        return "exiting"
    except TopicFull as exc:
        return str(exc)
    if refused and nsqd.durable:
        return f"the disk refused them in {topic_name}:{','.join(refused)}"
    return None


def place(nsqd, topic_name: str, batch: list, refused: list[str] | None = None) -> int:
    """Put ``batch``, ``[(message, channels that finished it, channels that put it back), ...]`` of
    ``ReplicatedMessage``-like messages, into topic ``topic_name``: each into every channel not in its set (into
    the topic when it has no channel, or when the set is None: the topic held it), deferred ones with the rest of
    their delay; a channel that put it back (``{channel: (attempts, due ns)}`` or None) gets it with those attempts
    and that due time. Replicated to this node's peers with FINs for the channels that finished it, and the
    requeues. Returns how many; ``refused`` gets the names of the channels whose disk refused them (they keep them
    in memory)."""
    topic = nsqd.get_topic(topic_name)
    now_ns = time.time_ns()
    messages = [Message(m.id, m.body, m.timestamp, m.attempts, _delay(m.due_ns, now_ns)) for m, _f, _r in batch]
    channels = list(topic.channels.values())
    to_topic = (
        messages
        if not channels
        else [m for m, (_, finished, _r) in zip(messages, batch, strict=True) if finished is None]
    )
    if to_topic:
        topic.put_many(to_topic)
    for channel in channels:
        name = channel.name
        pending = []
        for m, (_, finished, requeued) in zip(messages, batch, strict=True):
            if finished is None or name in finished:
                continue
            again = requeued.get(name) if requeued else None
            if again is None:
                pending.append(Message(m.id, m.body, m.timestamp, m.attempts, m.defer))
            else:
                pending.append(Message(m.id, m.body, m.timestamp, again[0], _delay(again[1], now_ns)))
        if pending and not channel.put_many(pending) and refused is not None:
            refused.append(name)
    replication = nsqd.replication
    if replication is not None and not topic.ephemeral and messages:
        replication.offer(topic_name, messages)
        for channel in channels:
            if channel.ephemeral:
                continue
            done = [
                m
                for m, (_, finished, _r) in zip(messages, batch, strict=True)
                if finished is not None and channel.name in finished
            ]
            if done:
                replication.finished(topic_name, channel.name, done)
            again = [
                (m.id, *requeued[channel.name])
                for m, (_, finished, requeued) in zip(messages, batch, strict=True)
                if requeued and channel.name in requeued and (finished is None or channel.name not in finished)
            ]
            if again:
                replication.requeued(topic_name, channel.name, again)
    return len(messages)


def _delay(due_ns: int, now_ns: int) -> float:
    """Seconds from ``now_ns`` to a due time (0: none, or past)."""
    return max(due_ns - now_ns, 0) / 1e9 if due_ns else 0.0


def note_takeover(channel, key: str, entry: dict) -> None:
    """``OffsetLog.add_note`` of a log channel (``adopted`` on a replica, ``handed_over`` on an origin; LOG answers
    them); a disk error is logged (the note goes with the log's next commit)."""
    try:
        channel.log.add_note(key, entry)
    except OSError as exc:
        log.error("REPLICATION: could not note a takeover in %s - %s", channel.log.name, exc)


def drop_adopted(nsqd, adopted: set[bytes], peer: str = "", epoch: int = 0) -> tuple[int, int]:
    """Start-up, or a partition's end (what is in flight is forgotten too): take the messages in ``adopted`` (by
    ``peer``, at ``epoch``) out of every lasting topic of ``nsqd`` and keep the rest where it was. A log channel of such
    a topic notes the offsets it handed over (``handed_over``: its uncommitted span, committed now; what it keeps is
    appended after it). Returns (adopted messages found and dropped here, others kept in their topics)."""
    found = kept = 0
    for topic in list(nsqd.topics.values()):
        if topic.ephemeral or not adopted:
            continue
        messages: dict[bytes, ReplicatedMessage] = {}
        holders: dict[bytes, set[str] | None] = {}  # None: the topic's (every channel gets it)
        for holder, items in _holdings(topic):
            for message in items:
                messages.setdefault(message.id, message)
                if holder is None:
                    holders[message.id] = None
                elif (names_held := holders.setdefault(message.id, set())) is not None:
                    names_held.add(holder)
        drop = messages.keys() & adopted
        if not drop:
            continue
        found += len(drop)
        names = {channel.name for channel in topic.channels.values() if not channel.ephemeral}
        keep = [
            (message, None if (held := holders[msg_id]) is None else names - held, None)
            for msg_id, message in messages.items()
            if msg_id not in drop
        ]
        spans = [
            (channel, channel.log.committed, channel.log.end)
            for channel in topic.channels.values()
            if channel.log is not None and channel.log.end > channel.log.committed
        ]
        topic.empty()
        for channel in topic.channels.values():
            channel.empty()
        now = int(time.time())
        for channel, committed, end in spans:
            # LOG answers it (LOG-PROTOCOL.md "Replication"): a reader that stands in [from, through) goes on at
            # ``through`` (the messages are the replica's now), not a loss
            note_takeover(
                channel, "handed_over", {"by": peer, "epoch": epoch, "time": now, "from": committed, "through": end}
            )
        kept += place(nsqd, topic.name, keep)
    return found, kept


def _holdings(topic):
    """``(channel name, or None for the topic, messages)`` for each place of ``topic`` that holds messages: memory
    queues, in-flight and deferred messages, disk backlogs (read without moving their reader)."""
    now, now_ns = trio.current_time(), time.time_ns()
    yield None, [_replicated(m) for m in topic.queue]
    yield None, _backlog(topic.backend, topic.deferred_index)
    for channel in topic.channels.values():
        if channel.ephemeral:
            continue
        in_flight = [channel.in_flight.get(msg_id) for msg_id in channel.in_flight]
        yield channel.name, [_replicated(m) for m in [*channel.queue, *in_flight] if m is not None]
        yield (
            channel.name,
            [_replicated(m, now_ns + int(max(due - now, 0) * 1e9)) for due, m in channel.deferred.entries()],
        )
        yield channel.name, _backlog(channel.backend, channel.deferred_index)
        if channel.log is not None:
            yield channel.name, _log_backlog(channel.log)


def _replicated(message, due_ns: int = 0) -> ReplicatedMessage:
    if not due_ns and message.defer:
        due_ns = message.timestamp + int(message.defer * 1e9)
    return ReplicatedMessage(message.id, message.timestamp, message.attempts, due_ns, message.body)


def _backlog(queue, index) -> list[ReplicatedMessage]:
    """The records of a disk queue between its reader and its writer, from its files, each checked against its
    side file (``QueueSpan``): a damaged one is neither kept nor replicated."""
    if queue is None or not queue.has_unread():
        return []
    due = index.due if index is not None else {}
    out: list[ReplicatedMessage] = []
    for batch in QueueSpan(queue, log=log).records(4096):
        out.extend(
            map(
                ReplicatedMessage,
                batch.ids,
                batch.timestamps,
                batch.attempts,
                [due.get(msg_id, 0) for msg_id in batch.ids],
                batch.bodies,
            )
        )
    return out


def _log_backlog(channel_log) -> list[ReplicatedMessage]:
    """A log channel's uncommitted messages (emptying the channel commits them: the kept ones go in again, at the
    log's next offsets)."""
    out: list[ReplicatedMessage] = []
    offset, end = channel_log.committed, channel_log.end
    try:
        while offset < end:
            frame = decode_range(channel_log.read(offset, end, 1 << 22))
            out.extend(
                ReplicatedMessage(msg_id, timestamp, attempts, 0, body)
                for _offset, msg_id, timestamp, attempts, body in frame.messages()
            )
            offset = frame.next
    except OSError as exc:
        log.error("REPLICATION: could not read the log of %s - %s", channel_log.name, exc)
    return out


class AdoptedIds:
    """The ids of origin ``node``'s messages adopted here that the origin has not heard of yet."""

    def __init__(self, data_path: str, node: str) -> None:
        self.path = os.path.join(data_path, f"replica.{node}.adopted")

    def add(self, ids: list[bytes]) -> None:
        """Append (synced: the origin must hear of every message adopted here, even after this node's crash)."""
        if not ids:
            return
        with open(self.path, "ab") as f:
            f.write(b"".join(ids))
            f.flush()
            os.fsync(f.fileno())

    def load(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return []
        size = len(raw) - len(raw) % ID_SIZE  # a write cut short by a crash leaves a partial id: ignored
        return [raw[i : i + ID_SIZE] for i in range(0, size, ID_SIZE)]

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.path)
