"""ReplicaStore: what this node holds for one origin node (see the package notes).

Files in the data directory, for origin ``node``::

    replica.<node>.diskqueue.*.dat / .meta.dat   received frames, one record per frame (hold mode)
    replica.<node>.json                          {"topics": {name: {"paused": bool, "channels": {name: paused},
                                                                     "logs": [log channel names]}},
                                                  "epoch": adopted epoch, "session": ..., "seq": ...}

Records are the frames as received (MESSAGES, FINISHED, CHANNEL, SYNCED); a message is decoded again only for
a takeover. The index in memory (``HeldIndex``, ``held.py``) finds by message ID the token of the MESSAGES frame
that holds it, with a few entries per frame rather than one per message; the token names the frame's
``_Record``: its topic, order, how many it still holds, and per channel the IDs that channel finished while
others have not yet; the record is acknowledged in the disk queue once it holds no message. FINs are applied per
run of IDs of one record, with C-level slice, set and bisection operations: a FINISHED frame costs Python steps
per record it touches, not per message. FINISHED, CHANNEL and SYNCED records are
acknowledged at once: they stay on disk while any earlier record is held, which is exactly as long as a restart
needs them (``DiskQueue``'s hold mode keeps the committed position at the oldest held record).

``order`` numbers records as they are applied (received, or replayed at open); a channel remembers the order of
its creation (0 for one known from the JSON file: older than every record replayed).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from protocol.errors import ProtocolError
from protocol.replication import (
    OP_CREATED,
    OP_DELETED,
    OP_EMPTIED,
    OP_LOG,
    OP_PAUSED,
    OP_UNPAUSED,
    ChannelOp,
    Finished,
    Messages,
    ReplicatedMessage,
    ReplicationDecoder,
    Requeued,
    Synced,
    encode,
)

from ..queues.atomic_file import replace_file
from ..queues.diskqueue import DiskQueue
from ..queues.span import QueueSpan
from .held import HeldIndex

__all__ = ["ReplicaStore", "TopicState", "store_nodes"]

log = logging.getLogger("nsqd")

_PREFIX = "replica."
_JSON_SUFFIX = ".json"
#: records read per step when the store is replayed or adopted
READ_BATCH = 1024
_UNSEEN: Any = object()


def store_nodes(data_path: str) -> list[str]:
    """The origin nodes with a store in ``data_path``."""
    try:
        names = os.listdir(data_path)
    except FileNotFoundError:
        return []
    return sorted(
        name[len(_PREFIX) : -len(_JSON_SUFFIX)]
        for name in names
        if name.startswith(_PREFIX) and name.endswith(_JSON_SUFFIX)
    )


class TopicState:
    __slots__ = ("paused", "channels")

    def __init__(self, paused: bool = False) -> None:
        self.paused = paused
        self.channels: dict[str, list] = {}  # name -> [creation order, paused, a log channel]


class _Record:
    """A MESSAGES record of the disk queue while it holds messages. ``ids``: the frame's IDs (those it holds map
    to it in ``ReplicaStore.held``); ``left``: how many are still held; ``size``: their body bytes
    (a partial release takes an even share); ``fins``: channel -> IDs of this record it finished, kept while
    they wait for other channels; ``holder``: in a backfill, the channel that holds them (None: the topic)."""

    __slots__ = ("token", "topic", "order", "ids", "left", "size", "fins", "holder", "backfill", "requeued")

    def __init__(self, token: int, topic: str, order: int, ids: tuple[bytes, ...]) -> None:
        self.token = token
        self.topic = topic
        self.order = order
        self.ids = ids
        self.left = 0
        self.size = 0
        self.fins: dict[str, set[bytes]] | None = None
        self.holder: str | None = None
        self.backfill = False  # received in the backfill that is running
        #: channel -> {id: (attempts, due ns)} of its messages a channel put back (REQUEUED), the latest
        self.requeued: dict[str, dict[bytes, tuple[int, int]]] | None = None


class ReplicaStore:
    """The copies of one origin's messages; see the module notes. Synchronous (the host calls it from the loop)."""

    def __init__(
        self,
        node: str,
        data_path: str,
        *,
        durable: bool,
        max_record_size: int,
        max_bytes_per_file: int = 104857600,
        sync_timeout: float = 2.0,
    ) -> None:
        self.node = node
        self.data_path = data_path
        self.durable = durable
        self._queue_args: dict[str, Any] = dict(
            max_bytes_per_file=max_bytes_per_file,
            min_msg_size=5,
            max_msg_size=max_record_size,
            sync_every=1 if durable else 1 << 30,
            sync_timeout=sync_timeout,
            hold_reads=True,
            logger=log,
            checksums=True,
            on_damage=self._damaged,
        )
        #: records of this store found damaged or lost on reading (checksums: ``queues/checksums.py``)
        self.damaged = 0
        self.topics: dict[str, TopicState] = {}
        #: message id -> the token of the record that holds it
        self.held = HeldIndex()
        # token -> record, while it holds messages; asked with HeldIndex.get's answer (None: an id not held)
        self._records: dict[int | None, _Record] = {}
        self.held_bytes = 0
        self.epoch = 0  # the highest epoch of this origin adopted here
        #: the origin's ``--replicate-to`` as its last HELLO named them: the order in which its replicas take it over
        self.peers: tuple[str, ...] = ()
        self.me = ""  # which of them is this replica
        self.session = ""
        self.seq = 0  # the last seq stored in ``session``
        self.duplicates = 0  # messages received again while held (a resent or backfilled frame)
        self._order = 0
        #: while a backfill runs: message id -> the channels a backfill frame named as holding it (None: the
        #: topic, every channel), for the messages it named that were held already
        self._backfill: dict[bytes, set[str] | None] | None = None
        self.backfill_released = 0  # messages the last backfill left out (released at its SYNCED)
        #: (topic, channel) -> ids to send back to the origin, from a backfill that named damaged queues
        self.restore: dict[tuple[str, str], list[bytes]] = {}
        self._unapplied: list[tuple[int | None, list]] = []  # (first token, events) written, not yet indexed
        self.json_dirty = False  # topics, channels or the session changed since the JSON file was written
        self._json_path = os.path.join(data_path, f"{_PREFIX}{node}{_JSON_SUFFIX}")
        self._load_json()
        self.queue = self._open_queue()
        self._replay()

    # -- files -------------------------------------------------------------------------------------------------
    def _open_queue(self) -> DiskQueue:
        """The store's disk queue, with a meta file from the start: a queue that finds none at its next start
        begins empty, while one that finds a meta file older than its data keeps the records past it. So a replica
        killed (without durable mode) before the store's first sync still holds what it acknowledged, which two
        nodes killed at once may need."""
        queue = DiskQueue(f"{_PREFIX}{self.node}", self.data_path, **self._queue_args)
        if not os.path.exists(queue.meta_file_name):
            queue.sync()
        return queue

    def _load_json(self) -> None:
        try:
            with open(self._json_path, "rb") as f:
                state = json.load(f)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.error("REPLICA(%s): could not read %s - %s", self.node, self._json_path, exc)
            return
        self.epoch = int(state.get("epoch", 0))
        self.session = str(state.get("session", ""))
        self.seq = int(state.get("seq", 0))
        self.peers = tuple(str(peer) for peer in state.get("peers", ()))
        self.me = str(state.get("me", ""))
        for name, topic in state.get("topics", {}).items():
            ts = self.topics[name] = TopicState(bool(topic.get("paused")))
            logs = set(topic.get("logs", ()))
            for channel, paused in topic.get("channels", {}).items():
                ts.channels[channel] = [0, bool(paused), channel in logs]

    def _damaged(self, queue, count: int) -> None:
        """Records of the store that cannot be read (never indexed, never delivered by a takeover): the copies
        they held are gone here. The store forgets the origin's session, so that the origin's next connection
        gets a WELCOME it cannot resume from and sends a backfill of everything it holds; until this replica
        acknowledged that backfill's end the origin does not count it toward --replication-acks."""
        self.damaged += count
        log.error(
            "REPLICA(%s): %d record(s) of the store damaged or lost: the origin will be asked for a new backfill",
            self.node,
            count,
        )
        if self.session:
            self.session = ""
            self.seq = 0
            self.json_dirty = True

    def save_json(self) -> None:
        self.json_dirty = False
        state = {
            "node": self.node,
            "epoch": self.epoch,
            "session": self.session,
            "seq": self.seq,
            "peers": list(self.peers),
            "me": self.me,
            "topics": {
                name: {
                    "paused": ts.paused,
                    "channels": {c: v[1] for c, v in ts.channels.items()},
                    "logs": [c for c, v in ts.channels.items() if v[2]],
                }
                for name, ts in self.topics.items()
            },
        }
        replace_file(self._json_path, json.dumps(state, separators=(",", ":")).encode())

    def _replay(self) -> None:
        """Index every record from the committed position on (the store's state before a restart). A backfill
        found there is settled again at its SYNCED record; one without it stays as it is (its messages wait for
        every channel)."""
        replayed = 0
        for token, event in self._read_all():
            if type(event) is Messages and event.seq == 0 and self._backfill is None:
                self._backfill = {}
            self._apply(token, event)
            replayed += 1
        self._stop_backfill()
        # copies a backfill kept for a damaged origin before a restart: the origin asks again (its next backfill
        # names the damage until it heard RESTORED), so they are not sent from here
        self.restore = {}
        if replayed:
            log.info("REPLICA(%s): replayed %d record(s), %d message(s) held", self.node, replayed, len(self.held))

    def _read_all(self) -> Iterator[tuple[int, object]]:
        queue = self.queue
        decoder = ReplicationDecoder(max_frame_size=self._queue_args["max_msg_size"])
        while True:
            first, records = queue.read_many_held(READ_BATCH)
            if not records:
                return
            for offset, record in enumerate(records):
                decoder.receive_data(record)
                try:
                    event = decoder.next_event()
                except ProtocolError as exc:
                    event = None
                    log.error("REPLICA(%s): skipped a bad record - %s", self.node, exc)
                decoder.take_unparsed()
                if event is None:
                    queue.ack(first + offset)
                    continue
                yield first + offset, event

    # -- receiving ---------------------------------------------------------------------------------------------
    def store(self, events: list, frames: list[bytes] | None = None) -> None:
        """``write`` then ``apply``: the events are on disk and indexed when this returns."""
        self.write(events, frames)
        self.apply()

    def write(self, events: list, frames: list[bytes] | None = None) -> None:
        """Write a batch of events (MESSAGES, FINISHED, CHANNEL, SYNCED); ``frames``: their frames as received,
        stored as they are (else encoded here). In durable mode they are synced before this returns. OSError from
        the disk: nothing of the batch is stored (the queue's rule). They are indexed by ``apply``, which the host
        calls once it has acknowledged them (they are on disk: the ACK need not wait for the index), after the
        batches that came meanwhile; everything that reads the index applies what is pending first."""
        if not events:
            return
        records = frames if frames is not None else [encode(event) for event in events]
        # held as written: their tokens without reading them back (None: read back by ``apply``)
        self._unapplied.append((self.queue.put_many_held(records), events))

    @property
    def unapplied(self) -> int:
        """Batches written and not yet indexed."""
        return len(self._unapplied)

    def apply(self) -> None:
        """Index the batches ``write`` stored that are not yet, in order."""
        pending = self._unapplied
        if not pending and not self.json_dirty:
            return
        self._unapplied = []
        for first, events in pending:
            if first is None:
                first, read = self.queue.read_many_held(len(events))
                assert len(read) == len(events), "the replica queue had unread records"
            for offset, event in enumerate(events):
                self._apply(first + offset, event)
        if self.json_dirty:
            self.save_json()
            self.json_dirty = False

    def _apply(self, token: int, event) -> None:
        self._order += 1
        kind = type(event)
        if kind is Messages:
            self._apply_messages(token, event)
            return
        self.queue.ack(token)  # FINISHED, REQUEUED, CHANNEL, SYNCED: needed only while an earlier record is
        if kind is Finished:
            self._apply_finished(event)
        elif kind is Requeued:
            self._apply_requeued(event)
        elif kind is ChannelOp:
            self._apply_op(event)
        elif kind is Synced:
            self.backfill_released = self._end_backfill(event.damaged)

    def _apply_messages(self, token: int, event: Messages) -> None:
        ids = event.ids
        topic = event.topic
        if topic not in self.topics:
            self.topics[topic] = TopicState()
        held = self.held
        record = _Record(token, topic, self._order, ids)
        added = len(held.add(token, ids))
        if added != len(ids):  # some were held already (this record is not in ``_records`` yet)
            self._held_again(ids, event.channel or None)
        self.duplicates += len(ids) - added
        if not added:
            self.queue.ack(token)
            return
        record.left = added
        record.size = event.body_bytes if added == len(ids) else event.body_bytes * added // len(ids)
        self.held_bytes += record.size
        self._records[token] = record
        if self._backfill is not None:
            record.backfill = True
            record.holder = event.channel or None

    def _held_again(self, ids: tuple[bytes, ...], holder: str | None) -> None:
        """In a backfill: note the holder of the messages it names that are held already."""
        seen = self._backfill
        if seen is None:
            return
        held, records = self.held, self._records
        for msg_id in ids:
            record = records.get(held.get(msg_id))
            if record is None:
                continue
            holders = seen.get(msg_id, _UNSEEN)
            if holders is None:
                continue
            if holders is _UNSEEN:
                holders = set() if not record.backfill else (None if record.holder is None else {record.holder})
                if holders is None:
                    seen[msg_id] = None
                    continue
            if holder is None:
                seen[msg_id] = None
            else:
                holders.add(holder)
                seen[msg_id] = holders

    def _apply_finished(self, event: Finished) -> None:
        topic = event.topic
        ts = self.topics.get(topic)
        if ts is None:
            return
        ids = event.ids
        channel = event.channel
        records = self._records
        alone = len(ts.channels) == 1 and channel in ts.channels  # then every message waits for it alone
        for token, run_ids in self.held.runs(ids):  # one step per record: FINs follow the publishes
            record = records.get(token)
            if record is None or record.topic != topic:
                continue
            if alone:
                self._release_ids(record, run_ids)
                continue
            required = self._required(ts, record)
            if required == (channel,):
                self._release_ids(record, run_ids)
                continue
            fins = record.fins
            if fins is None:
                fins = record.fins = {}
            finished = fins.get(channel)
            if finished is None:
                fins[channel] = set(run_ids)
            else:
                finished.update(run_ids)
            if channel in required:
                self._settle(record, required)

    def _apply_requeued(self, event: Requeued) -> None:
        """Keep, per channel, the attempts and due time of the held messages it put back (the latest counts): a
        takeover delivers them so. A step per message: REQ and timeouts are rare beside publishes and FINs."""
        held, records = self.held, self._records
        channel = event.channel
        for msg_id, attempts, due_ns in event.entries:
            record = records.get(held.get(msg_id))
            if record is None:
                continue
            if record.requeued is None:
                record.requeued = {}
            kept = record.requeued.get(channel)
            if kept is None:
                kept = record.requeued[channel] = {}
            kept[msg_id] = (attempts, due_ns)

    @staticmethod
    def _required(ts: TopicState, record: _Record) -> tuple[str, ...]:
        """The channels that must finish the messages of ``record``: those that existed when it arrived (every
        channel, if none did)."""
        order = record.order
        return tuple(name for name, state in ts.channels.items() if state[0] < order) or tuple(ts.channels)

    def _settle(self, record: _Record, required: tuple[str, ...]) -> None:
        """Release the messages of ``record`` that every required channel finished."""
        fins = record.fins
        if not required or not fins:
            return
        sets: list[Any] = [fins.get(name) for name in required]
        if None in sets:
            return
        done = sets[0].intersection(*sets[1:])
        if done:
            self._release_ids(record, done)

    def _release_ids(self, record: _Record, ids) -> None:
        """Release ``ids``, IDs that ``record`` held (those it still holds are released)."""
        count = self.held.release(record.token, ids)
        if record.fins:
            for finished in record.fins.values():
                finished.difference_update(ids)
        if not count:
            return
        left = record.left - count
        if left <= 0:
            self.held_bytes -= record.size
            del self._records[record.token]
            self.queue.ack(record.token)
            return
        share = record.size * count // record.left
        record.size -= share
        self.held_bytes -= share
        record.left = left

    def _held_ids(self, record: _Record) -> list[bytes]:
        return self.held.held_ids(record.token)

    def _topic_records(self, topic: str) -> list[_Record]:
        return [record for record in self._records.values() if record.topic == topic]

    def _apply_op(self, event: ChannelOp) -> None:
        name, channel, op = event.topic, event.channel, event.op
        ts = self.topics.get(name)
        if not channel:
            if op == OP_DELETED:
                self.topics.pop(name, None)
                for record in self._topic_records(name):
                    self._release_ids(record, self._held_ids(record))
            elif ts is None:
                self.topics[name] = TopicState(op == OP_PAUSED)
            elif op in (OP_PAUSED, OP_UNPAUSED):
                ts.paused = op == OP_PAUSED
            self.json_dirty = True
            return
        if ts is None:
            ts = self.topics[name] = TopicState()
        if op == OP_CREATED:
            state = ts.channels.get(channel)
            if state is None:
                ts.channels[channel] = [self._order, False, False]
            elif state[0] == 0:
                state[0] = self._order  # known from the JSON file: created where this record stands
        elif op == OP_DELETED:
            if ts.channels.pop(channel, None) is not None:
                for record in self._topic_records(name):
                    self._settle(record, self._required(ts, record))
        elif op in (OP_PAUSED, OP_UNPAUSED):
            state = ts.channels.setdefault(channel, [self._order, False, False])
            state[1] = op == OP_PAUSED
        elif op == OP_LOG:  # a takeover makes it a log here too (its messages go on at this node's offsets)
            ts.channels.setdefault(channel, [self._order, False, False])[2] = True
        elif op == OP_EMPTIED:
            for record in self._topic_records(name):
                if record.fins is None:
                    record.fins = {}
                record.fins[channel] = set(self._held_ids(record))
                self._settle(record, self._required(ts, record))
        self.json_dirty = True

    def begin_backfill(self) -> None:
        """The origin sends its whole state again: its topics and channels are what the backfill says; each
        message it sends names the channel that holds it (or the topic), and SYNCED ends it (``_end_backfill``)."""
        self.apply()
        self._stop_backfill()
        self.topics.clear()
        self._backfill = {}
        self.json_dirty = True

    def _stop_backfill(self) -> None:
        """A backfill that did not reach its SYNCED: what it sent stays held, waiting for every channel."""
        self._backfill = None
        for record in self._records.values():
            record.backfill = False

    def _end_backfill(self, damaged: tuple[tuple[str, str], ...] = ()) -> int:
        """SYNCED: release the held messages the backfill did not name (the origin no longer holds them: their FINs
        were lost with a connection or a restart), and count every channel that holds none of the others as
        having finished it. Returns how many were released. ``damaged``: the origin's queues whose files it found
        damaged: what they lost is kept and sent back (``_keep_for_restore``), not released."""
        seen = self._backfill
        if seen is None:
            return 0
        if damaged:
            self._keep_for_restore(damaged, seen)
        released = 0
        for record in list(self._records.values()):
            ts = self.topics.get(record.topic)
            if record.backfill and not seen:  # the common case: no message named twice
                ids = record.ids if record.left == len(record.ids) else self._held_ids(record)
                if record.holder is not None:
                    self._finished_by_others(record, ts, ids, {record.holder})
                continue
            ids = self._held_ids(record)
            if not record.backfill:
                unseen = [msg_id for msg_id in ids if msg_id not in seen]
                if unseen:
                    released += len(unseen)
                    self._release_ids(record, unseen)
                    ids = [msg_id for msg_id in ids if msg_id in seen]
            default = {record.holder} if record.backfill and record.holder is not None else None
            for msg_id in ids:
                holders = seen.get(msg_id, default)
                if holders is not None:
                    self._finished_by_others(record, ts, (msg_id,), holders, settle=False)
            if ts is not None and record.left > 0:
                self._settle(record, self._required(ts, record))
        self._stop_backfill()
        return released

    def _keep_for_restore(self, damaged: tuple[tuple[str, str], ...], seen: dict) -> None:
        """A backfill that names damaged queues (``(topic, channel or "")``) left out what their files lost, not
        only what the origin finished: each message held from before the backfill that a damaged channel did not
        name and had not finished here (by its FINs), or that nobody named when the topic's own queue is damaged,
        stays held for those channels, as if they had named it, and goes into ``restore`` to be sent back to the
        origin (``read_restore``), which puts it into them again. What they had finished is never sent back; what
        they finished without the FIN reaching this replica comes twice."""
        lost: dict[str, set[str]] = {}
        for topic, channel in damaged:
            lost.setdefault(topic, set()).add(channel)
        restore = self.restore
        for record in self._records.values():
            hit = lost.get(record.topic)
            ts = self.topics.get(record.topic)
            if hit is None or ts is None or record.backfill:
                continue  # a message first held in this backfill: what the damaged channel did with it is unknown
            required = self._required(ts, record)
            fins = record.fins or {}
            for msg_id in self._held_ids(record):
                holders = seen.get(msg_id, _UNSEEN)
                if holders is None:
                    continue  # still in the topic: every channel gets it
                unseen = holders is _UNSEEN
                named = set() if unseen else holders
                targets = {
                    name
                    for name in required
                    if name not in named
                    and (name in hit or (unseen and "" in hit))
                    and msg_id not in fins.get(name, ())
                }
                if targets:
                    seen[msg_id] = named | targets
                    for name in targets:
                        restore.setdefault((record.topic, name), []).append(msg_id)

    def take_restore(self) -> dict[tuple[str, str], list[bytes]]:
        """The copies to send back, ``(topic, channel) -> ids``, since the last call (see ``_keep_for_restore``)."""
        restore, self.restore = self.restore, {}
        return restore

    def read_restore(self, restore: dict[tuple[str, str], list[bytes]], batch: int = READ_BATCH):
        """The messages of ``restore`` (``take_restore``) read from the store's files, checked, from its committed
        position on: ``(topic, channel, [ReplicatedMessage])`` per MESSAGES record that holds some, each with the
        attempts and due time its channel last put it back with (REQUEUED), else as published. A generator."""
        self.apply()
        wanted: dict[bytes, list[tuple[str, str]]] = {}
        for key, ids in restore.items():
            for msg_id in ids:
                wanted.setdefault(msg_id, []).append(key)
        decoder = ReplicationDecoder(max_frame_size=self._queue_args["max_msg_size"])
        for records in QueueSpan(self.queue, self.queue.committed_position(), log=log).records(batch, split=False):
            for raw in records:
                decoder.receive_data(raw)
                try:
                    event = decoder.next_event()
                except ProtocolError:
                    event = None
                decoder.take_unparsed()
                if type(event) is not Messages or not any(map(wanted.__contains__, event.ids)):
                    continue
                out: dict[tuple[str, str], list[ReplicatedMessage]] = {}
                for message in event.messages:
                    keys = wanted.pop(message.id, None)
                    if not keys:
                        continue
                    record = self._records.get(self.held.get(message.id))
                    for key in keys:
                        again = record.requeued.get(key[1], {}).get(message.id) if record and record.requeued else None
                        out.setdefault(key, []).append(
                            message
                            if again is None
                            else ReplicatedMessage(message.id, message.timestamp, again[0], again[1], message.body)
                        )
                for (topic, channel), messages in out.items():
                    yield topic, channel, messages
            if not wanted:
                return

    def _finished_by_others(
        self, record: _Record, ts: TopicState | None, ids, holders: set[str], *, settle: bool = True
    ) -> None:
        """Backfilled messages of ``record``: the channels of the topic not among ``holders`` finished them."""
        if ts is None or record.left <= 0:
            return
        others = [name for name in ts.channels if name not in holders]
        if not others:
            return
        if record.fins is None:
            record.fins = {}
        for name in others:
            finished = record.fins.get(name)
            if finished is None:
                record.fins[name] = set(ids)
            else:
                finished.update(ids)
        if settle:
            self._settle(record, self._required(ts, record))

    def sync(self) -> None:
        self.queue.sync()

    def sync_if_due(self, now: float) -> None:
        self.queue.sync_if_due(now)

    # -- takeover ----------------------------------------------------------------------------------------------
    def adopt(self) -> Iterator[tuple[str, list[tuple[ReplicatedMessage, set, dict | None]]]]:
        """For a takeover: the held messages, read again from disk in batches, each with the channels that
        finished it and those that put it back: ``(topic, [(message, finished channels, {channel: (attempts,
        due ns)} or None), ...])`` per record. The store's files are read from the committed position by a fresh
        queue object; ``remove`` deletes them afterwards."""
        self.apply()
        self.queue.close()
        self.queue = self._open_queue()
        held = self.held
        for _token, event in self._read_all():
            if type(event) is not Messages or not any(map(held.__contains__, event.ids)):
                continue
            batch = []
            for message in event.messages:
                token = held.pop(message.id)
                if token is not None:
                    record = self._records.get(token)
                    fins = record.fins if record is not None else None
                    requeued = record.requeued if record is not None else None
                    requeued_here = None
                    if requeued:
                        requeued_here = {
                            name: rows[message.id] for name, rows in requeued.items() if message.id in rows
                        } or None
                    batch.append(
                        (
                            message,
                            {name for name, ids in fins.items() if message.id in ids} if fins else set(),
                            requeued_here,
                        )
                    )
            if batch:
                yield event.topic, batch

    def topology(self) -> dict[str, Any]:
        """The origin's topics and channels as known here, as WELCOME's ``topics`` carries them."""
        return {
            name: {"paused": ts.paused, "channels": {c: v[1] for c, v in ts.channels.items()}}
            for name, ts in self.topics.items()
        }

    def remove(self) -> None:
        """Delete the queue's files (after a takeover); the JSON file stays with the new epoch and the origin's
        topics and channels as they were (``topology``: an origin back without its directory learns them here)."""
        self.queue.delete()
        self.held.clear()
        self._records.clear()
        self.held_bytes = 0
        self.session = ""
        self.seq = 0
        self.save_json()
        self.queue = self._open_queue()

    def close(self) -> None:
        try:
            self.apply()
            self.save_json()
        finally:
            self.queue.close()
