"""Topic: the stream producers publish to, copied to every channel.

A topic keeps a bounded memory queue (``--mem-queue-size``) and, unless ephemeral, a disk queue
for what does not fit. Its pump hands its messages to every channel that exists at that moment. A publish
is kept packed, without an object per message, in the topic's open segment (``queues/packed.py``): every
channel's queue gets a window on it, and makes the objects only when it delivers them. Without channels, or
while paused, messages accumulate in the topic, as in nsqd, its own queue holding the windows until the pump
hands them on. What comes as objects (a disk backlog, a takeover, deferred messages) reaches every channel
as the topic's own objects, which a channel copies only when it delivers one (nsqd/message.py), and a
deferred message's heap entry is made once for all of them (``queues/deferred.py``).

The memory part of the pump is synchronous and runs right after a publish, when a channel is
added and on unpause, so a publish reaches the channels with no task switch. A backlog on disk is
moved by a drain task in batches of ``DRAIN_BATCH`` with a checkpoint between batches, so a large
backlog never stalls the event loop. Channels always take what they are given (memory, then their
own disk queue), so the pump never waits for them.

Deferred messages (DPUB) do not count against the memory bound while the pump can pass them on at
once: they go to the channels' deferred heaps, as nsqd hands them over even with
``--mem-queue-size=0``. One that has to wait on the topic's disk queue keeps its due time in the
topic's deferred index (``queues/deferred_index.py``), which nsqd cannot do. In durable mode
(``--mem-queue-size=0 --sync-every=1``) every message goes through the topic's disk queue, and a
batch read from it is released (``ack``) only after every channel has stored it, so a crash
between the two repeats the copy instead of losing it.

Durable mode on a full disk. The ``OK`` of a publish promises the message survives a kill -9 on
every channel, and it leaves once the topic's record is synced; the copies to the channels are made
afterwards by the drain. A channel whose disk refuses its copy keeps it in memory (and delivers it);
the topic then keeps its own record of that message (``_owed``: how many channels' copies are still
only in memory) until each of those copies is on the channel's disk or finished
(``release_record``). A kill -9 in between restarts from that record and copies it to the channels
again (a duplicate for those that had it): nothing acknowledged is lost. The other answer, refusing
the publish (``E_PUB_FAILED``, what nsqd answers when the topic's write fails), would need every
channel's copy written and synced before the ``OK``: one fsync per channel per publish instead of
one group commit, and a channel write failing after others succeeded would still leave the message
delivered on those. nsqd itself only logs a failed channel write and loses that copy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from itertools import compress
from typing import TYPE_CHECKING

import trio

from protocol.names import is_ephemeral
from protocol.replication import OP_PAUSED, OP_UNPAUSED

from .channel import Channel
from .guid import GUIDFactory, GUIDUnavailable, next_packed_one
from .message import Message, encode_record, new_messages, split_messages
from .queues.deferred import entry as deferred_entry
from .queues.deferred_index import DeferredIndex
from .queues.packed import PackedQueue, Segments, extend_open, pack_ids

if TYPE_CHECKING:  # for annotations only
    from .queues.diskqueue import DiskQueue

__all__ = ["Topic", "TopicFull", "TopicExiting", "DRAIN_BATCH"]

#: messages moved from the topic's disk queue to its channels per step of the drain task
DRAIN_BATCH = 1024

log = logging.getLogger("nsqd")


def _ephemeral_channel_idle(channel: Channel) -> None:
    """An ephemeral channel's last consumer left: the channel goes (every channel's ``on_last_client_gone``, one
    function for all where a bound method would be one more object per channel)."""
    channel.topic.delete_channel(channel.name)


class TopicFull(Exception):
    """The message could not be stored: the disk queue failed (the cause is the exception's text)."""


class TopicExiting(Exception):
    """The topic is being deleted or nsqd is exiting."""


class Topic:
    # slots: the publish path reads a dozen of these per call, and a plain instance past 29 attributes keeps them
    # in a dict of its own, where each read is a lookup (CPython's inline values stop there)
    __slots__ = (
        "name",
        "ephemeral",
        "mem_queue_size",
        "max_msg_timeout",
        "paused",
        "replication",
        "held",
        "exiting",
        "channels",
        "queue",
        "_segments",
        "_queue_deferred",
        "message_count",
        "message_bytes",
        "node_id",
        "guid",
        "_make_backend",
        "_open_log",
        "backend",
        "durable",
        "deferred_index",
        "_spawn",
        "_draining",
        "_owed",
        "_owing",
        "_actors",
        "_on_channel_created",
        "_on_channel_deleted",
        "_on_last_channel_gone",
        "changed",
        "__weakref__",
    )

    def __init__(
        self,
        name: str,
        *,
        node_id: int,
        mem_queue_size: int,
        max_msg_timeout: float,
        actors,
        on_channel_created: Callable[[Channel], None] | None = None,
        on_channel_deleted: Callable[[Channel], None] | None = None,
        on_last_channel_gone: Callable[[Topic], None] | None = None,
        make_backend: Callable[[str], DiskQueue] | None = None,
        spawn: Callable | None = None,
        owing: dict | None = None,
        guid: GUIDFactory | None = None,
        changed: set | None = None,
        open_log: Callable | None = None,
    ) -> None:
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.mem_queue_size = mem_queue_size
        self.max_msg_timeout = max_msg_timeout
        self.paused = False
        self.replication = None  # the origin's Replicator when this topic is replicated (nsqd/replication/)
        # held while nsqd asks lookupd which channels to pre-create: messages wait in the topic
        self.held = False
        self.exiting = False
        self.channels: dict[str, Channel] = {}
        # what nothing takes yet (no channel, paused, held): published messages packed, no object each
        self.queue = PackedQueue()
        # the segment publishes are packed in, shared by the topic's queue and its channels' (queues/packed.py);
        # made by the first publish
        self._segments: Segments | None = None
        # False: no deferred (DPUB) message in ``queue``, so the channels need not look at each one
        self._queue_deferred = False
        self.message_count = 0
        self.message_bytes = 0
        self.node_id = node_id
        # the node's ID factory, shared by its topics: an ID names one message of the node, whatever its topic
        # (a replica's index and the list of adopted IDs key by ID alone); made by the first publish without one
        self.guid: GUIDFactory | None = guid
        self._make_backend = make_backend
        self._open_log = open_log  # opens a channel's offset log (log channels: channel.py)
        self.backend = make_backend(name) if make_backend is not None and not self.ephemeral else None
        self.durable = self.backend is not None and self.backend.hold_reads
        self.deferred_index: DeferredIndex | None = None
        if self.backend is not None:
            self.deferred_index = DeferredIndex(self.backend.data_path, self.backend.name)
            self.deferred_index.load(self.backend.read_position(), self.backend.known_files)
        self._spawn = spawn
        self._draining = False
        # durable mode: token of a record read from the disk queue -> number of channels holding their copy of
        # it only in memory (their disk refused it); the record is acknowledged when that reaches 0
        self._owed: dict[int, int] = {}
        # the daemon's topics that have owed records (shared): its periodic sync visits these alone
        self._owing = owing
        self._actors = actors
        self._on_channel_created = on_channel_created
        self._on_channel_deleted = on_channel_deleted
        self._on_last_channel_gone = on_last_channel_gone
        #: the topics and channels whose figures in /stats may have changed since the cache last looked (shared by
        #: the node's topics and their channels; ``stats_cache.py``): each adds itself where its figures change
        self.changed: set = changed if changed is not None else set()

    # -- publishing ------------------------------------------------------------------------------
    def publish(self, bodies: list[bytes], defer: float = 0.0, *, defer_sync: bool = False) -> None:
        """PUB, MPUB, DPUB: new messages with one timestamp and delay for the whole batch, stored by
        ``put_many``'s rules. A uniform batch spares the per-message scans ``put_many`` makes."""
        queue = self.queue
        count = len(bodies)
        backend = self.backend
        if (
            0 < count <= self.mem_queue_size - queue.count
            and not defer
            and self.replication is None
            and not self.exiting
            and (backend is None or not backend.has_unread())
        ):
            # the commonest publish: no delay, no replica, room in memory and nothing on disk before it. Kept packed
            # as the branch below keeps it (``packed_here``, no ID needed one by one), with its tests made once and,
            # into the topic's own queue, the segment and the window grown by one call (``extend_open``, in C)
            now_ns = time.time_ns()
            guid = self.guid or self._make_guid()
            packed_ids = next_packed_one(guid, now_ns) if count == 1 else None
            if packed_ids is None:
                try:
                    packed_ids = guid.next_packed(count, now_ns)
                except GUIDUnavailable:  # a used-up tick: ``new_ids`` waits for the clock
                    packed_ids = pack_ids(self.new_ids(count))
                    assert packed_ids is not None, "the GUID factory's IDs are 16 hex digits"
            size = sum(map(len, bodies))
            self.message_count += count
            self.message_bytes += size
            self.changed.add(self)
            segments = self._segments or self._make_segments()
            if self.paused or self.held or not self.channels:
                if not extend_open(queue, segments.open, packed_ids, bodies, now_ns, size):
                    queue.extend_window(*segments.add(packed_ids, bodies, now_ns, 0.0, size))
                return
            packed, start, end = segments.add(packed_ids, bodies, now_ns, 0.0, size)
            for channel in list(self.channels.values()):
                channel.put_window(packed, start, end)
            return
        if self.exiting:
            raise TopicExiting()
        now_ns = time.time_ns()
        size = sum(map(len, bodies))
        taken = not (self.paused or self.held or not self.channels)
        packed_here = (
            self.mem_queue_size - queue.count >= count
            and not (taken and defer)
            and not self._backlog_on_disk()
            and count > 0
        )
        guid = self.guid or self._make_guid()
        ids: list[bytes] | None = None
        joined: bytes | None = None
        try:
            if packed_here and self.replication is None:
                # kept packed, and nothing needs the IDs one by one: made as a segment keeps them (guid.py)
                joined = guid.next_packed(count, now_ns)
            else:
                ids = guid.next_ids(count, now_ns)
        except GUIDUnavailable:  # a used-up tick: ``new_ids`` waits for the clock
            ids = self.new_ids(count)
        if packed_here and joined is None:
            assert ids is not None
            joined = pack_ids(ids)
        if joined is not None:
            # kept as their parts (queues/packed.py), in the topic's queue until the pump hands them over when
            # nothing takes them now, else in each channel's (the same segment for all)
            packed, start, end = (self._segments or self._make_segments()).add(joined, bodies, now_ns, defer, size)
            self.message_count += count
            self.message_bytes += size
            self.changed.add(self)
            if taken:
                for channel in list(self.channels.values()):
                    channel.put_window(packed, start, end)
            else:
                queue.extend_window(packed, start, end)
                if defer:
                    self._queue_deferred = True
        else:
            assert ids is not None
            self._accept(new_messages(ids, bodies, now_ns, defer), size, bool(defer), defer_sync)
        if self.replication is not None:
            assert ids is not None
            self.replication.offer_published(self.name, ids, bodies, now_ns, defer)

    def publish_kept(self, bodies: list[bytes], defer: float = 0.0) -> None:
        """A publish acknowledged before it got here (another worker's, ``nsqd/workers.py``) that ``publish``
        could not store (``TopicFull``: the disk failed): kept in memory past ``--mem-queue-size``, as the
        messages a non-durable nsqd holds in memory, rather than lost."""
        messages = new_messages(self.new_ids(len(bodies)), bodies, time.time_ns(), defer)
        self.message_count += len(messages)
        self.message_bytes += sum(map(len, bodies))
        self.changed.add(self)
        if defer:
            self._queue_deferred = True
        self.queue.extend(messages)
        self.pump()

    def put(self, message: Message) -> None:
        self.put_many((message,))

    def put_many(self, messages, *, defer_sync: bool = False) -> None:
        """Accept a batch all or nothing: memory while there is room, then disk.
        ``defer_sync``: a disk sync this makes due is left to the daemon's sync barrier, which the
        caller commits before it acknowledges the batch (``queues/group_commit.py``)."""
        if self.exiting:
            raise TopicExiting()
        messages = list(messages)
        self._accept(messages, sum(len(m.body) for m in messages), any(m.defer for m in messages), defer_sync)

    def _accept(self, messages: list[Message], size: int, deferred: bool, defer_sync: bool) -> None:
        """``put_many`` of a batch of ``size`` body bytes; ``deferred``: some message may have a delay."""
        queue = self.queue
        count = len(messages)
        room = self.mem_queue_size - len(queue)
        if room < count or self._backlog_on_disk():
            try:
                messages = self._overflow(messages, room, defer_sync)
            except OSError as exc:
                raise TopicFull(str(exc)) from exc
        self.message_count += count
        self.message_bytes += size
        self.changed.add(self)
        if not queue and self.channels and not self.paused and not self.held:
            # the pump would take the batch straight back out of the queue: hand it over directly
            if messages:
                self._copy_to_channels(messages, deferred)
            return
        if deferred:
            self._queue_deferred = True
        queue.extend(messages)
        self.pump()

    def _overflow(self, messages: list[Message], room: int, defer_sync: bool = False) -> list[Message]:
        """A batch that does not fit in memory: returns what stays in memory; the rest goes to disk (all or
        nothing, OSError from the disk) or, for an ephemeral topic, is dropped, like nsqd."""
        pump_ready = bool(self.channels) and not self.paused and not self.held
        backend = self.backend
        if backend is None:
            # nsqd hands a message over when its pump is waiting for one (it always is here)
            return messages if pump_ready else messages[: max(room, 0)]
        kept: list[Message] = []
        deferred = [bool(m.defer) for m in messages]
        if pump_ready and not self.durable and any(deferred):
            kept = list(compress(messages, deferred))
            messages = [m for m in messages if not m.defer]
            deferred = [False] * len(messages)
        if self._backlog_on_disk():
            room = 0  # keep the order behind what is already on disk
        room = max(room, 0)
        spill = messages[room:]
        if spill:
            backend.put_many([encode_record(m) for m in spill], defer_sync=defer_sync)
            if any(deferred[room:]):
                now_ns = time.time_ns()
                for m in spill:
                    if m.defer:
                        self.deferred_index.add(m.id, now_ns + int(m.defer * 1e9))
            self._start_drain()
        return kept + messages[:room]

    def _backlog_on_disk(self) -> bool:
        backend = self.backend
        return backend is not None and backend.has_unread()

    def depth(self) -> int:
        backend = self.backend
        return len(self.queue) + (backend.depth() if backend is not None else 0)

    def backend_depth(self) -> int:
        backend = self.backend
        return backend.depth() if backend is not None else 0

    def pump(self) -> None:
        """Copy the memory queue to every channel (the synchronous part of the pump)."""
        queue = self.queue
        if not queue or self.paused or self.held or not self.channels or self.exiting:
            return
        self.changed.add(self)
        deferred = self._queue_deferred
        self._queue_deferred = False
        for run in queue.take_runs():
            if isinstance(run, list):
                self._copy_to_channels(run, deferred)
                continue
            packed, start, end = run
            if packed.deferred:  # the channels' deferred heaps take objects
                self._copy_to_channels(packed.messages(start, end), True)
                continue
            for channel in list(self.channels.values()):
                channel.put_window(packed, start, end)

    def _copy_to_channels(self, batch: list[Message], deferred: bool | None = None, token: int = -1) -> bool:
        """True when every channel stored the batch where it should (False: a channel's disk failed).
        ``deferred``: whether some message may have a delay (None: the channels look). ``token``: the
        batch's first record token in durable mode (see ``owe_record``). Every channel gets the same message
        objects: a channel's dispatcher copies a message it delivers while another channel still holds it
        (``message.claim_shared``); with several channels, the same deferred heap entries too."""
        channels = list(self.channels.values())
        if deferred is not False and token < 0 and len(channels) > 1:
            # each deferred message's heap entry made once, for every channel's deferred queue (queues/deferred.py)
            later = [m for m in batch if m.defer]
            if later:
                now = trio.current_time()
                entries = [deferred_entry(m, now + m.defer) for m in later]
                for channel in channels:
                    channel.put_deferred(entries)
                batch = [m for m in batch if not m.defer]
                deferred = False
        stored = True
        if batch:
            for channel in channels:
                stored = channel.put_many(batch, deferred, token) and stored
        return stored

    def owe_record(self, token: int) -> None:
        """Durable mode: a channel keeps its copy of the record ``token`` in memory only; the record stays."""
        self._owed[token] = self._owed.get(token, 0) + 1
        if self._owing is not None:
            self._owing[self] = None  # the owner drops it once nothing is owed

    def release_record(self, token: int) -> None:
        """Durable mode: a channel's in-memory copy of the record ``token`` is now on its disk, or finished."""
        owed = self._owed
        count = owed.get(token)
        if count is None:
            return  # emptied meanwhile
        if count > 1:
            owed[token] = count - 1
            return
        del owed[token]
        self.backend.ack(token)
        self.changed.add(self)

    def _start_drain(self) -> None:
        if self._draining or self._spawn is None or not self.channels or self.paused or self.held or self.exiting:
            return
        # not spawned while nsqd is still loading its metadata: ``run`` starts the drain once it can
        self._draining = bool(self._spawn(self._drain))

    async def _drain(self) -> None:
        """Move the disk backlog to the channels, a batch at a time."""
        try:
            backend = self.backend
            while self.channels and not self.paused and not self.exiting and self._backlog_on_disk():
                if self.durable:
                    token, records = backend.read_split_held(DRAIN_BATCH)
                else:
                    records = backend.read_split(DRAIN_BATCH)
                if not records:
                    break  # a read error (logged by the queue); the next publish starts the drain again
                self.changed.add(self)
                batch = list(split_messages(records))
                if self.deferred_index:
                    self._restore_delays(batch)
                if not self.durable:
                    self._copy_to_channels(batch)
                elif self._copy_to_channels(batch, None, token):
                    backend.ack_range(token, len(records))
                    if self._has_log_channel():
                        # recorded at once: a kill -9 then makes a log see again one batch at most, which it knows
                        # (offset_log.RECENT_IDS); a delay of --sync-timeout would leave it seconds of messages
                        try:  # noqa: SIM105 - the publish path: try costs nothing unless raised, suppress() a call
                            backend.sync()
                        except OSError:
                            pass  # logged and kept by the queue; its next sync records it
                else:  # what some channel keeps in memory waits for ``release_record``
                    owed = self._owed
                    for record in range(token, token + len(records)):
                        if record not in owed:
                            backend.ack(record)
                await trio.sleep(0)
        finally:
            self._draining = False

    def _has_log_channel(self) -> bool:
        return any(channel.log is not None for channel in self.channels.values())

    def _restore_delays(self, batch: list[Message]) -> None:
        """Messages that waited on disk get the rest of their delay back from the deferred index."""
        index = self.deferred_index
        now_ns = time.time_ns()
        for m in batch:
            due_ns = index.take(m.id)
            if due_ns is not None and due_ns > now_ns:
                m.defer = (due_ns - now_ns) / 1e9
        index.reader_moved(self.backend.read_position())

    def _make_segments(self) -> Segments:
        self._segments = Segments()
        return self._segments

    def _make_guid(self) -> GUIDFactory:
        self.guid = GUIDFactory(self.node_id)
        return self.guid

    def new_ids(self, count: int) -> list[bytes]:
        """IDs for a batch. A used-up tick or a clock that stepped back waits a moment and retries
        (nsqd sleeps 1 ms too); the wait blocks, but it is rare and bounded."""
        guid = self.guid or self._make_guid()
        for _ in range(1000):
            try:
                return guid.next_ids(count)
            except GUIDUnavailable:
                time.sleep(0.0005)
        return guid.next_ids(count)

    # -- channels --------------------------------------------------------------------------------
    def get_channel(self, name: str) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            backend = None
            if self._make_backend is not None and not is_ephemeral(name):
                backend = self._make_backend(f"{self.name}:{name}")
            channel = Channel(
                self,
                name,
                mem_queue_size=self.mem_queue_size,
                max_msg_timeout=self.max_msg_timeout,
                actors=self._actors,
                on_last_client_gone=_ephemeral_channel_idle,
                backend=backend,
                open_log=self._open_log if backend is not None else None,
            )
            self.channels[name] = channel
            log.info("TOPIC(%s): new channel(%s)", self.name, name)
            if self._on_channel_created is not None:
                self._on_channel_created(channel)
            self.pump()
            self._start_drain()
        return channel

    def delete_channel(self, name: str) -> bool:
        channel = self.channels.pop(name, None)
        if channel is None:
            return False
        channel.close(persist=False)
        log.info("TOPIC(%s): deleting channel %s", self.name, name)
        if self._on_channel_deleted is not None:
            self._on_channel_deleted(channel)
        if self.ephemeral and not self.channels and self._on_last_channel_gone is not None:
            self._on_last_channel_gone(self)
        return True

    # -- administration --------------------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True
        self.changed.add(self)
        if self.replication is not None:
            self.replication.channel_op(self.name, "", OP_PAUSED)

    def unpause(self) -> None:
        self.paused = False
        self.changed.add(self)
        if self.replication is not None:
            self.replication.channel_op(self.name, "", OP_UNPAUSED)
        self.pump()
        self._start_drain()

    def empty(self) -> None:
        self.queue.clear()
        self.changed.add(self)
        self._queue_deferred = False
        self._owed.clear()  # the tokens go stale with the records
        if self.backend is not None:
            self.backend.empty()
            self.deferred_index.clear()
            self.deferred_index.remove_file()

    def close(self, *, persist: bool) -> None:
        """``persist`` (nsqd exiting): channels write their messages to disk, then the topic its
        memory queue, and the disk queues are closed. Otherwise (deleted) every file goes."""
        self.exiting = True
        for channel in self.channels.values():
            try:
                channel.close(persist=persist)
            except OSError as exc:
                log.error("CHANNEL(%s:%s): failed to persist - %s", self.name, channel.name, exc)
        backend = self.backend
        if backend is None:
            return
        if persist:
            try:
                pending = self.queue.take_all()
                if pending:
                    backend.put_many([encode_record(m) for m in pending])
                    log.info("TOPIC(%s): wrote %d message(s) to disk", self.name, len(pending))
                    now_ns = time.time_ns()
                    for m in pending:
                        if m.defer:
                            self.deferred_index.add(m.id, now_ns + int(m.defer * 1e9))
                self.deferred_index.save(backend.write_position())
            finally:
                backend.close()
        else:
            backend.delete()
            self.deferred_index.remove_file()

    def owes_records(self) -> bool:
        """Durable mode: some channel keeps a copy of this topic's records in memory only (``owe_record``)."""
        return bool(self._owed)

    def __repr__(self) -> str:
        return f"Topic({self.name})"
