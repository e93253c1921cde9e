"""ReplicaStore: what this node holds for one origin node (see the package notes).

Files in the data directory, for origin ``node``::

    replica.<node>.diskqueue.*.dat / .meta.dat   received frames, one record per frame (hold mode)
    replica.<node>.json                          {"topics": {name: {"paused": bool, "channels": {name: paused}}},
                                                  "epoch": adopted epoch, "session": ..., "seq": ...}

Records are the frames as the protocol encodes them (MESSAGES, FINISHED, CHANNEL). The index in memory maps
each held message id to ``[token, topic, order, finished channels]``; ``_pending`` counts the held messages of
each MESSAGES record, which is acknowledged in the disk queue when that count reaches 0. FINISHED and CHANNEL
records are acknowledged at once: they stay on disk while any earlier record is held, which is exactly as long
as a restart needs them (``DiskQueue``'s hold mode keeps the committed position at the oldest held record).

``order`` numbers records as they are applied (received, or replayed at open); a channel remembers the order of
its creation (0 for one known from the JSON file: older than every record replayed).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator

from protocol.errors import ProtocolError
from protocol.replication import (
    OP_CREATED,
    OP_DELETED,
    OP_EMPTIED,
    OP_PAUSED,
    OP_UNPAUSED,
    ChannelOp,
    Finished,
    Messages,
    ReplicatedMessage,
    ReplicationDecoder,
    encode,
)

from ..queues.atomic_file import replace_file
from ..queues.diskqueue import DiskQueue

__all__ = ["ReplicaStore", "TopicState", "store_nodes"]

log = logging.getLogger("nsqd")

_PREFIX = "replica."
_JSON_SUFFIX = ".json"
#: records read per step when the store is replayed or adopted
READ_BATCH = 1024


def store_nodes(data_path: str) -> list[str]:
    """The origin nodes with a store in ``data_path``."""
    try:
        names = os.listdir(data_path)
    except FileNotFoundError:
        return []
    return sorted(name[len(_PREFIX):-len(_JSON_SUFFIX)] for name in names
                  if name.startswith(_PREFIX) and name.endswith(_JSON_SUFFIX))


class TopicState:
    __slots__ = ("paused", "channels")

    def __init__(self, paused: bool = False) -> None:
        self.paused = paused
        self.channels: dict[str, list] = {}  # name -> [creation order, paused]


class ReplicaStore:
    """The copies of one origin's messages; see the module notes. Synchronous (the host calls it from the loop)."""

    def __init__(self, node: str, data_path: str, *, durable: bool, max_record_size: int,
                 max_bytes_per_file: int = 104857600, sync_timeout: float = 2.0) -> None:
        self.node = node
        self.data_path = data_path
        self.durable = durable
        self._queue_args = dict(max_bytes_per_file=max_bytes_per_file, min_msg_size=5,
                                max_msg_size=max_record_size, sync_every=1 if durable else 1 << 30,
                                sync_timeout=sync_timeout, hold_reads=True, logger=log)
        self.topics: dict[str, TopicState] = {}
        self.held: dict[bytes, list] = {}  # message id -> [token, topic, order, finished channels, body size]
        self._pending: dict[int, int] = {}  # token of a MESSAGES record -> its messages still held
        self.held_bytes = 0
        self.epoch = 0  # the highest epoch of this origin adopted here
        self.session = ""
        self.seq = 0  # the last seq stored in ``session``
        self.duplicates = 0  # messages received again while held (a resent or backfilled frame)
        self._order = 0
        self.json_dirty = False  # topics or channels changed since the JSON file was written
        self._json_path = os.path.join(data_path, f"{_PREFIX}{node}{_JSON_SUFFIX}")
        self._load_json()
        self.queue = DiskQueue(f"{_PREFIX}{node}", data_path, **self._queue_args)
        self._replay()

    # -- files -------------------------------------------------------------------------------------------------
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
        for name, topic in state.get("topics", {}).items():
            ts = self.topics[name] = TopicState(bool(topic.get("paused")))
            for channel, paused in topic.get("channels", {}).items():
                ts.channels[channel] = [0, bool(paused)]

    def save_json(self) -> None:
        self.json_dirty = False
        state = {
            "node": self.node, "epoch": self.epoch, "session": self.session, "seq": self.seq,
            "topics": {name: {"paused": ts.paused, "channels": {c: v[1] for c, v in ts.channels.items()}}
                       for name, ts in self.topics.items()},
        }
        replace_file(self._json_path, json.dumps(state, separators=(",", ":")).encode())

    def _replay(self) -> None:
        """Index every record from the committed position on (the store's state before a restart)."""
        replayed = 0
        for token, event in self._read_all():
            self._apply(token, event)
            replayed += 1
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
        """Write a batch of data events (MESSAGES, FINISHED, CHANNEL) and index them; ``frames``: their frames as
        received, stored as they are (else encoded here). In durable mode they are synced before this returns.
        OSError from the disk: nothing of the batch is stored (the queue's rule)."""
        if not events:
            return
        records = frames if frames is not None else [encode(event) for event in events]
        queue = self.queue
        queue.put_many(records)
        first, read = queue.read_many_held(len(records))
        assert len(read) == len(records), "the replica queue had unread records"
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
        elif kind is Finished:
            self.queue.ack(token)
            self._apply_finished(event)
        elif kind is ChannelOp:
            self.queue.ack(token)
            self._apply_op(event)
        else:
            self.queue.ack(token)

    def _apply_messages(self, token: int, event: Messages) -> None:
        held = self.held
        topic = event.topic
        if topic not in self.topics:
            self.topics[topic] = TopicState()
        order = self._order
        count = 0
        for message in event.messages:
            if message.id in held:
                self.duplicates += 1
                continue
            held[message.id] = [token, topic, order, None, len(message.body)]
            self.held_bytes += len(message.body)
            count += 1
        if count:
            self._pending[token] = count
        else:
            self.queue.ack(token)

    def _apply_finished(self, event: Finished) -> None:
        ts = self.topics.get(event.topic)
        if ts is None:
            return
        held = self.held
        channel = event.channel
        for msg_id in event.ids:
            entry = held.get(msg_id)
            if entry is None or entry[1] != event.topic:
                continue
            if entry[3] is None:
                entry[3] = {channel}
            else:
                entry[3].add(channel)
            if self._is_done(ts, entry):
                self._release(msg_id, entry)

    def _apply_op(self, event: ChannelOp) -> None:
        name, channel, op = event.topic, event.channel, event.op
        ts = self.topics.get(name)
        if not channel:
            if op == OP_DELETED:
                self.topics.pop(name, None)
                self._recheck(name, deleted=True)
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
                ts.channels[channel] = [self._order, False]
            elif state[0] == 0:
                state[0] = self._order  # known from the JSON file: created where this record stands
        elif op == OP_DELETED:
            if ts.channels.pop(channel, None) is not None:
                self._recheck(name)
        elif op in (OP_PAUSED, OP_UNPAUSED):
            state = ts.channels.setdefault(channel, [self._order, False])
            state[1] = op == OP_PAUSED
        elif op == OP_EMPTIED:
            for msg_id, entry in list(self.held.items()):
                if entry[1] == name:
                    entry[3] = {channel} if entry[3] is None else entry[3] | {channel}
            self._recheck(name)

        self.json_dirty = True

    def _recheck(self, topic: str, *, deleted: bool = False) -> None:
        ts = self.topics.get(topic)
        for msg_id, entry in list(self.held.items()):
            if entry[1] == topic and (deleted or self._is_done(ts, entry)):
                self._release(msg_id, entry)

    @staticmethod
    def _is_done(ts: TopicState, entry: list) -> bool:
        """Finished by every channel that existed when the message arrived (every channel, if none did)."""
        finished = entry[3]
        if finished is None or not ts.channels:
            return False
        order = entry[2]
        required = [name for name, state in ts.channels.items() if state[0] < order] or list(ts.channels)
        return all(name in finished for name in required)

    def _release(self, msg_id: bytes, entry: list) -> None:
        del self.held[msg_id]
        self.held_bytes -= entry[4]
        token = entry[0]
        left = self._pending[token] - 1
        if left:
            self._pending[token] = left
        else:
            del self._pending[token]
            self.queue.ack(token)

    def begin_backfill(self) -> None:
        """The origin sends its whole state again: its topics and channels are what the backfill says."""
        self.topics.clear()
        self.json_dirty = True

    def release_unseen(self, seen: set[bytes]) -> int:
        """After a backfill: release the held messages it did not include (the origin no longer holds them: their
        FINs were lost with a connection or a restart). Returns how many."""
        gone = [(msg_id, entry) for msg_id, entry in self.held.items() if msg_id not in seen]
        for msg_id, entry in gone:
            self._release(msg_id, entry)
        return len(gone)

    def sync(self) -> None:
        self.queue.sync()

    def sync_if_due(self, now: float) -> None:
        self.queue.sync_if_due(now)

    # -- takeover ----------------------------------------------------------------------------------------------
    def adopt(self) -> Iterator[tuple[str, list[tuple[ReplicatedMessage, set]]]]:
        """For a takeover: the held messages, read again from disk in batches, each with the channels that
        finished it: ``(topic, [(message, finished channels), ...])`` per record. The store's files are read
        from the committed position by a fresh queue object; ``remove`` deletes them afterwards."""
        self.queue.close()
        self.queue = DiskQueue(f"{_PREFIX}{self.node}", self.data_path, **self._queue_args)
        held = self.held
        for _token, event in self._read_all():
            if type(event) is not Messages:
                continue
            batch = []
            for message in event.messages:
                entry = held.pop(message.id, None)
                if entry is not None:
                    batch.append((message, entry[3] or set()))
            if batch:
                yield event.topic, batch

    def remove(self) -> None:
        """Delete the queue's files (after a takeover); the JSON file stays with the new epoch and no topics."""
        self.queue.delete()
        self.held.clear()
        self._pending.clear()
        self.held_bytes = 0
        self.topics.clear()
        self.session = ""
        self.seq = 0
        self.save_json()
        self.queue = DiskQueue(f"{_PREFIX}{self.node}", self.data_path, **self._queue_args)

    def close(self) -> None:
        try:
            self.save_json()
        finally:
            self.queue.close()
