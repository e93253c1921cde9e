"""Channel: one consumer group's copy of a topic's stream.

State kept per channel:
- a bounded memory queue of ready messages (``--mem-queue-size``) whose overflow goes to the
  channel's disk queue (ephemeral channels have none and drop overflow, as nsqd does); the
  dispatcher refills it from disk in small batches when it runs dry. Published messages wait there
  packed, as a window on the topic's segment (``queues/packed.py``), the others as objects;
- the in-flight queue (messages delivered and not yet FIN/REQ'd, with their timeout deadline);
- the deferred queue (REQ with a delay, DPUB) ordered by due time;
- its consumers, and a mailbox of those that have credit, served by the channel's dispatcher actor.

Expired in-flight messages and due deferred ones are moved back by the queue scanner calling
``process_queues``. Nothing here awaits: every method is a synchronous fast path.

Persistence (DESIGN.md "Persistence"). A graceful stop writes the memory queue, then the in-flight
messages (attempts kept), then the deferred ones to the disk queue, as nsqd does; the deferred
messages' due times also go to the queue's deferred index (``queues/deferred_index.py``) so that
they keep their delay after a restart. In durable mode (``--mem-queue-size=0 --sync-every=1``) the
disk queue holds every record it hands out until the message is finished or written to the queue
again (``disk_token``), so a crash redelivers what was in flight; deferred messages are then
written to the queue too (not only kept in the heap) and recognised through the index when read.
A copy the channel's disk refuses is kept in memory; in durable mode the topic then keeps its own
record of the message until that copy is on disk or finished (``_topic_records``; topic.py explains
the choice).

Log channels (LOG-PROTOCOL.md). A channel made a log (``make_log``, or at start-up when its log's files
exist) keeps what it is given in its ``OffsetLog`` (``queues/offset_log.py``) instead of its queues: the
topic's copies, and messages its former consumers put back (REQ, timeouts, a graceful stop), are appended;
nothing is delivered to subscribers. Its disk queue stays open only for the records of messages those former
consumers still hold (durable mode acknowledges them when they are finished or appended). ``log_commit`` is the
one path of a commit (the hook point of its replication).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING

import trio

from protocol.log import Columns
from protocol.names import is_ephemeral
from protocol.replication import OP_EMPTIED, OP_LOG, OP_PAUSED, OP_UNPAUSED

from .client import Client
from .dispatch import ChannelDispatcher
from .message import Message, encode_record, split_messages
from .queues.deferred import EMPTY_DEFERRED, DeferredQueue, item_of
from .queues.deferred_index import DeferredIndex
from .queues.inflight import EMPTY_IN_FLIGHT, InFlightQueue
from .queues.packed import PackedQueue

if TYPE_CHECKING:  # for annotations only: the queues import nothing of the channel
    from .queues.diskqueue import DiskQueue
    from .queues.offset_log import OffsetLog
    from .queues.packed import _Packed

__all__ = ["Channel", "ChannelError"]

log = logging.getLogger("nsqd")


class ChannelError(Exception):
    """A FIN/REQ/TOUCH that the channel refuses; the text is NSQ's reason (``ID not in flight``)."""


class Channel:
    def __init__(
        self,
        topic,
        name: str,
        *,
        mem_queue_size: int,
        max_msg_timeout: float,
        actors,
        on_last_client_gone: Callable[[Channel], None],
        backend: DiskQueue | None = None,
        open_log: Callable[[str, bool], OffsetLog | None] | None = None,
    ) -> None:
        self.topic = topic
        self.topic_name = topic.name
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.mem_queue_size = mem_queue_size
        self.max_msg_timeout = max_msg_timeout
        self.paused = False
        self.exiting = False
        self.replication = None  # the origin's Replicator when this channel is replicated (nsqd/replication/)

        # messages kept packed (a window on the topic's segment, queues/packed.py) or as objects
        self.queue = PackedQueue()
        self.backend = backend
        # durable mode: the disk queue holds what it hands out until released (see the module notes)
        self.durable = backend is not None and backend.hold_reads
        self.deferred_index: DeferredIndex | None = None
        if backend is not None:
            self.deferred_index = DeferredIndex(backend.data_path, backend.name)
            self.deferred_index.load(backend.read_position(), backend.known_files)
        # the shared empty queues until the first delivery and the first deferred message (``open_in_flight``,
        # ``open_deferred``): an idle channel holds fewer objects for the cyclic collector to visit
        self.in_flight: InFlightQueue = EMPTY_IN_FLIGHT
        self.deferred: DeferredQueue = EMPTY_DEFERRED
        #: called with the channel when its in-flight or deferred queue goes from empty to holding something (the
        #: daemon's queue scanner: ``QueueScanner.activate``, one bound method for every channel)
        self.on_timed_work: Callable[[Channel], None] | None = None
        # durable mode: ID -> topic record token of each message kept only in memory after the disk refused it
        self._topic_records: dict[bytes, int] = {}
        self.clients: dict[int, Client] = {}
        self.mailbox: deque[Client] = deque()

        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.dropped_count = 0
        # end-to-end latency window (nsqd/e2e.py), set by the daemon when percentiles are configured
        self.e2e = None

        self._actors = actors
        self._on_last_client_gone = on_last_client_gone
        # the set the channel adds itself to where its /stats figures change: its topic's (``Topic.changed``)
        changed = getattr(topic, "changed", None)
        self.changed: set = changed if changed is not None else set()
        self.dispatcher = ChannelDispatcher(self)
        actors.add(self.dispatcher)
        #: the channel's ``OffsetLog`` once it is a log channel; ``open_log(name, create)`` opens one (the
        #: daemon's ``_open_log``; None: the channel cannot become a log, e.g. ephemeral or no data path)
        self.log: OffsetLog | None = None
        self._open_log = open_log
        #: called as ``hook(channel, old, new)`` after a commit moved the committed offset from ``old`` to ``new``
        #: (replication streams it as the FINs of the messages in between: ``self.log.ids_between(old, new)``)
        self.on_log_commit: Callable[[Channel, int, int], None] | None = None
        if open_log is not None and backend is not None:
            found = open_log(backend.name, False)
            if found is not None:
                self.log = found
                self._absorb_backlog()

    # -- queue -----------------------------------------------------------------------------------
    def open_in_flight(self) -> InFlightQueue:
        """The channel's own in-flight queue, made at its first delivery (the shared empty one until then)."""
        queue = self.in_flight
        if queue is EMPTY_IN_FLIGHT:
            queue = self.in_flight = InFlightQueue()
            queue.on_active = self._timed_work_hook()
        return queue

    def open_deferred(self) -> DeferredQueue:
        """The channel's own deferred queue, made at its first deferred message (the shared empty one until
        then)."""
        queue = self.deferred
        if queue is EMPTY_DEFERRED:
            queue = self.deferred = DeferredQueue()
            queue.on_active = self._timed_work_hook()
        return queue

    def _timed_work_hook(self) -> Callable[[], None] | None:
        hook = self.on_timed_work
        return None if hook is None else partial(hook, self)

    def put_many(self, messages: list[Message], deferred: bool | None = None, topic_token: int = -1) -> bool:
        """Accept messages from the topic pump (deferred ones go to the deferred heap). False when the disk
        refused some (they are kept in memory then, see ``_enqueue``). ``deferred``: whether some message
        may have a delay, when the topic knows (None: look at each). ``topic_token``: in durable mode, the
        token of the first message's record in the topic's disk queue (the others follow)."""
        self.message_count += len(messages)
        self.changed.add(self)
        if self.log is not None:
            return self._append(messages)
        if deferred is None:
            deferred = any(m.defer for m in messages)
        if deferred:
            if self.durable:
                return self._put_durable_deferred(messages, topic_token)
            now = trio.current_time()
            ready = []
            for m in messages:
                if m.defer:
                    self.open_deferred().push(m, now + m.defer)
                else:
                    ready.append(m)
            messages = ready
        stored = True
        if messages:
            stored = self._enqueue(messages, topic_token)
            self.wake(preempt=True)
        return stored

    def put_deferred(self, entries: list) -> bool:
        """Accept deferred messages from the topic pump with their deferred heap entries, made once for all its
        channels (``queues/deferred.py``); a log channel or durable mode takes the messages by ``put_many``."""
        if self.log is not None or self.durable:
            return self.put_many([item_of(entry) for entry in entries], True)
        self.message_count += len(entries)
        self.changed.add(self)
        push = self.open_deferred().push_entry
        for entry in entries:
            push(entry)
        return True

    def put_window(self, packed: _Packed, start: int, end: int) -> None:
        """Accept the messages ``start`` to ``end`` of a topic's segment (queues/packed.py): kept as they are
        while the memory queue has room for them, nothing is on disk before them and none has a delay; else as
        objects, by ``put_many``'s rules."""
        count = end - start
        if (
            self.mem_queue_size - self.queue.count >= count
            and not packed.deferred
            and self.log is None
            and not self._backlog_on_disk()
        ):
            self.message_count += count
            self.changed.add(self)
            self.queue.extend_window(packed, start, end)
            self.wake(preempt=True)
        else:
            self.put_many(packed.messages(start, end))

    def _put_durable_deferred(self, messages: list[Message], topic_token: int) -> bool:
        """Durable mode: deferred messages go to the disk queue like the others, their due time to the index;
        ``refill`` sends them to the deferred heap when it reads them back."""
        index = self.deferred_index
        now_ns = time.time_ns()
        for m in messages:
            if m.defer:
                index.add(m.id, now_ns + int(m.defer * 1e9))
        stored = self._enqueue(messages, topic_token)
        self.wake(preempt=True)
        return stored

    def _enqueue(self, messages: list[Message], topic_token: int = -1) -> bool:
        """Memory while there is room, then the disk queue (or, ephemeral, the floor). False when the disk
        refused them: they are then kept in memory (nsqd would lose them), and nsqd reports itself unhealthy.
        ``topic_token`` (durable mode, from the topic's drain): the topic keeps the records of what is kept in
        memory."""
        if self.log is not None:
            return self._append(messages)
        queue = self.queue
        room = self.mem_queue_size - len(queue)
        if self.backend is None and self.mem_queue_size == 0:
            room = self._handoff_room()
        if room >= len(messages) and not self._backlog_on_disk():
            queue.extend(messages)
            return True
        if self._backlog_on_disk():
            room = 0  # keep the order: nothing jumps ahead of what is already on disk
        if room > 0:
            queue.extend(messages[:room])
            messages = messages[room:]
        backend = self.backend
        if backend is None:
            self.dropped_count += len(messages)
            return True
        try:
            backend.put_many([encode_record(m) for m in messages])
        except OSError as exc:
            log.error(
                "CHANNEL(%s:%s): failed to write %d message(s) to disk, keeping them in memory - %s",
                self.topic_name,
                self.name,
                len(messages),
                exc,
            )
            if topic_token >= 0:
                records = self._topic_records
                owe = self.topic.owe_record
                for token, m in enumerate(messages, topic_token):  # the whole batch: room is 0 in durable mode
                    records[m.id] = token
                    owe(token)
            self._keep_in_memory(messages)
            return False
        self._stored(messages)
        return True

    def _stored(self, messages: list[Message]) -> None:
        """Durable mode: new copies of ``messages`` are on disk (synced, in the disk queue or the log): the records
        they were read from, and the topic's records kept for them, are no longer needed."""
        if not self.durable:
            return
        ack = self.backend.ack
        for m in messages:
            if m.disk_token >= 0:
                ack(m.disk_token)
                m.disk_token = -1
        if self._topic_records:
            self._release_topic_records(messages)

    def store_kept_copies(self) -> None:
        """Durable mode: write the ready copies kept in memory since the disk refused them, once the disk has
        taken a write again (``last_error`` cleared), so that the topic's records of them can go even while no
        consumer takes them. Called with the periodic syncs; in-flight and deferred copies are written when they
        come back to the queue. Ordering among those copies is not kept, as NSQ does not promise it."""
        records = self._topic_records
        backend = self.backend
        if not records or self.exiting or backend.last_error is not None:
            return
        kept = [m for m in self.queue if m.id in records]
        if not kept:
            return
        self.changed.add(self)
        try:
            backend.put_many([encode_record(m) for m in kept])
        except OSError:
            return  # logged by the queue; tried again once a write succeeds
        log.info("CHANNEL(%s:%s): wrote %d message(s) kept in memory to disk", self.topic_name, self.name, len(kept))
        queue = self.queue
        rest = [m for m in queue if m.id not in records]
        queue.clear()
        queue.extend(rest)
        self._release_topic_records(kept)
        self.wake()

    def _release_topic_records(self, messages: Iterable[Message]) -> None:
        """Durable mode: these copies no longer live only in memory (on disk now, finished, or dropped): the
        topic's records of those it kept for them can go."""
        records = self._topic_records
        release = self.topic.release_record
        for m in messages:
            token = records.pop(m.id, None)
            if token is not None:
                release(token)

    def _keep_in_memory(self, messages: list[Message]) -> None:
        index = self.deferred_index
        now = trio.current_time()
        now_ns = time.time_ns()
        for m in messages:
            due_ns = index.take(m.id) if index else None
            if due_ns is None or due_ns <= now_ns:
                self.queue.append(m)
            else:
                self.open_deferred().push(m, now + (due_ns - now_ns) / 1e9)

    def _handoff_room(self) -> int:
        """An ephemeral channel without a memory queue (``--mem-queue-size=0``) passes a message on only when
        a consumer is ready for it, like nsqd's unbuffered hand-off; the rest is dropped."""
        if self.paused:
            return 0
        credit = sum(max(c.credit(), 0) for c in self.clients.values())
        return credit - len(self.queue)

    def _backlog_on_disk(self) -> bool:
        backend = self.backend
        return backend is not None and backend.has_unread()

    def refill(self, count: int) -> bool:
        """Read up to ``count`` messages from disk into the memory queue; True if any came. Messages listed
        in the deferred index go to the deferred heap instead (and reading goes on)."""
        backend = self.backend
        if backend is None:
            return False
        self.changed.add(self)
        if not backend.has_unread():
            return False
        if not self.durable and not self.deferred_index:
            records = backend.read_split(count)
            self.queue.extend(split_messages(records))
            return bool(records)
        while True:
            if self.durable:
                token, records = backend.read_split_held(count)
            else:
                token, records = -1, backend.read_split(count)
            if not records:
                return False
            if self._take_from_disk(split_messages(records), token):
                return True

    def _take_from_disk(self, messages: Iterable[Message], token: int) -> bool:
        """The slow path of ``refill``: tokens (durable mode) and the deferred index. True if any message
        became ready."""
        index = self.deferred_index
        queue = self.queue
        ready = 0
        now = trio.current_time()
        now_ns = time.time_ns()
        for message in messages:
            if token >= 0:
                message.disk_token = token
                token += 1
            due_ns = index.take(message.id) if index else None
            if due_ns is None or due_ns <= now_ns:
                queue.append(message)
                ready += 1
            else:
                self.open_deferred().push(message, now + (due_ns - now_ns) / 1e9)
        index.reader_moved(self.backend.read_position())
        return ready > 0

    def discard(self, message: Message) -> None:
        """A message consumed without delivery (``sample_rate``, or a duplicate of one in flight): release
        its disk record."""
        self.changed.add(self)
        if message.disk_token >= 0:
            self.backend.ack(message.disk_token)
            message.disk_token = -1
        if self._topic_records:
            self._release_topic_records((message,))

    def has_ready(self) -> bool:
        if self.log is not None:
            return False  # read by offset, never delivered
        return bool(self.queue) or self._backlog_on_disk()

    def wake(self, preempt: bool = False) -> None:
        """Resume the dispatcher when there is something to send and someone to send it to. ``preempt`` (a
        publish): a quiet channel may deliver at once, in the caller's step (``ActorSystem.resume``)."""
        if self.mailbox and not self.paused and (self.queue or self._backlog_on_disk()):
            self._actors.resume(self.dispatcher, preempt)

    def depth(self) -> int:
        if self.log is not None:
            return self.log.depth()
        backend = self.backend
        return len(self.queue) + (backend.depth() if backend is not None else 0)

    def backend_depth(self) -> int:
        if self.log is not None:
            return self.log.depth()
        backend = self.backend
        return backend.depth() if backend is not None else 0

    # -- the log ---------------------------------------------------------------------------------
    def make_log(self):
        """Make this channel a log channel (LOG): its waiting messages take the first offsets, in delivery order
        (memory queue, disk backlog, deferred ones); in-flight ones are appended when they come back. Returns the
        log. OSError: the log could not be made (the channel is as it was, or its backlog partly appended:
        ``_absorb_backlog`` goes on at the next try)."""
        if self.log is not None:
            return self.log
        if self._open_log is None or self.backend is None:
            raise OSError("this channel has no data path")
        self.log = self._open_log(self.backend.name, True)
        log.info("CHANNEL(%s:%s): is a log channel now", self.topic_name, self.name)
        self._absorb_backlog()
        self.changed.add(self)
        if self.replication is not None:  # a replica that takes this node over makes its channel a log too
            self.replication.channel_op(self.topic_name, self.name, OP_LOG)
        return self.log

    def _absorb_backlog(self) -> None:
        """Append what waits in the channel's queues to its log: memory, then disk (in batches), then deferred.
        Durable mode: disk records are acknowledged once their messages are appended (synced)."""
        waiting = list(self.queue)
        self.queue.clear()
        if waiting:
            self._append(waiting)
        backend = self.backend
        while backend.has_unread():
            if self.durable:
                token, records = backend.read_split_held(1024)
            else:
                token, records = -1, backend.read_split(1024)
            if not records:
                break
            messages = list(split_messages(records))
            if token >= 0:
                for k, message in enumerate(messages, token):
                    message.disk_token = k
            self._append(messages)
        if self.deferred_index is not None:
            self.deferred_index.clear()
            self.deferred_index.remove_file()
        deferred = [message for _due, message in self.deferred.drain()]
        if deferred:
            self._append(deferred)
        log.info("CHANNEL(%s:%s): log offsets %d-%d", self.topic_name, self.name, self.log.start, self.log.end)

    def _append(self, messages: list[Message]) -> bool:
        """A log channel's ``_enqueue``: the messages take the next offsets. Their disk records (durable mode) are
        released once appended. False when the log's disk refused them: they are kept in memory then."""
        if not messages:
            return True
        self.changed.add(self)
        columns = Columns.from_messages(
            [m.id for m in messages],
            [m.timestamp for m in messages],
            [m.attempts for m in messages],
            [m.body for m in messages],
        )
        try:
            self.log.append(columns)
        except OSError as exc:
            log.error(
                "CHANNEL(%s:%s): failed to append %d message(s) to the log, keeping them in memory - %s",
                self.topic_name,
                self.name,
                len(messages),
                exc,
            )
            self.queue.extend(messages)  # appended by the next ``_absorb_backlog`` (a LOG, a restart)
            return False
        self._stored(messages)
        return True

    def log_commit(self, offset: int) -> bool:
        """LCOMMIT (and ``/channel/empty`` of a log channel): everything below ``offset`` is finished. The one path
        of a commit: ``on_log_commit`` (replication) sees every move. True if the committed offset moved.
        ``LogRangeError`` past the end, OSError when the commit could not be written (then nothing changed)."""
        channel_log = self.log
        old = channel_log.committed
        if not channel_log.commit(offset, remove=False):
            return False
        self.changed.add(self)
        hook = self.on_log_commit
        if hook is not None:
            hook(self, old, offset)  # before the files go: ``ids_between(old, offset)`` reads them
        channel_log.apply_retention()
        return True

    # -- consumers -------------------------------------------------------------------------------
    def add_client(self, client: Client) -> None:
        self.clients[client.id] = client
        self.changed.add(self)

    def remove_client(self, client: Client) -> None:
        """A consumer left. Its in-flight messages come back when their timeout expires, as in nsqd."""
        if self.clients.pop(client.id, None) is None:
            return
        self.changed.add(self)
        if client.in_mailbox:  # the dispatcher drops it too when it comes up, but an idle channel's never runs
            client.in_mailbox = False
            with contextlib.suppress(ValueError):  # (taken out by a dispatcher turn under way)
                self.mailbox.remove(client)
        if self.ephemeral and not self.clients and not self.exiting:
            self._on_last_client_gone(self)

    def client_credit_changed(self, client: Client) -> None:
        """RDY, FIN, REQ or a timeout gave ``client`` room: put it in the mailbox and wake up."""
        if not client.in_mailbox and client.credit() > 0:
            client.in_mailbox = True
            self.mailbox.append(client)
            self.wake()

    # -- FIN / REQ / TOUCH -----------------------------------------------------------------------
    @staticmethod
    def _refusal(message: Message | None) -> str:
        """NSQ's reason for refusing a FIN/REQ/TOUCH of an ID, given what is in flight under it."""
        return "ID not in flight" if message is None else "client does not own message"

    def _owned(self, client: Client, msg_id: bytes) -> Message:
        message = self.in_flight.get(msg_id)
        if message is None or message.client is not client:
            raise ChannelError(self._refusal(message))
        return message

    def finish(self, client: Client, msg_id: bytes) -> Message:
        message = self._owned(client, msg_id)
        self.in_flight.pop(msg_id)
        self._finished(client, (message,))
        return message

    def finish_many(self, client: Client, msg_ids: list[bytes]) -> list[tuple[bytes, str]]:
        """FIN of several IDs in a row (the lines of one receive buffer): the same as ``finish`` of each in
        turn, with the counters and the credit check once for all. Returns the refused ones, in order, with
        ``finish``'s reason: the caller answers each with its own error."""
        finished, refused = self.in_flight.pop_owned(msg_ids, client)
        if finished:
            self._finished(client, finished)
        return [(msg_id, self._refusal(message)) for msg_id, message in refused]

    def _finished(self, client: Client, messages) -> None:
        """The bookkeeping of finished messages (already out of the in-flight queue): disk acks (durable mode),
        end-to-end latency samples, the client's counters, and its credit."""
        self.changed.add(self)
        if self.durable:
            ack = self.backend.ack
            for message in messages:
                if message.disk_token >= 0:
                    ack(message.disk_token)
            if self._topic_records:
                self._release_topic_records(messages)
        e2e = self.e2e
        if e2e is not None:
            for message in messages:
                e2e.add(message.timestamp)
        if self.replication is not None:
            self.replication.finished(self.topic_name, self.name, messages)
        done = len(messages)
        client.in_flight -= done
        client.finish_count += done
        self.client_credit_changed(client)

    def requeue(self, client: Client, msg_id: bytes, delay: float) -> None:
        if self.exiting:
            raise ChannelError("exiting")
        message = self._owned(client, msg_id)
        self.in_flight.pop(msg_id)
        self.changed.add(self)
        message.client = None
        client.in_flight -= 1
        client.requeue_count += 1
        self.requeue_count += 1
        if delay > 0:
            self.open_deferred().push(message, trio.current_time() + delay)
        else:
            self._enqueue([message])
            self.wake()
        if self.replication is not None:
            due_ns = time.time_ns() + int(delay * 1e9) if delay > 0 else 0
            self.replication.requeued(self.topic_name, self.name, ((msg_id, message.attempts, due_ns),))
        self.client_credit_changed(client)

    def touch(self, client: Client, msg_id: bytes, msg_timeout: float) -> None:
        message = self._owned(client, msg_id)
        deadline = trio.current_time() + msg_timeout
        cap = message.delivered_at + self.max_msg_timeout
        if deadline >= cap:
            deadline = cap
        self.in_flight.touch(msg_id, deadline)

    # -- timers, driven by the queue scanner -------------------------------------------------------
    def has_timed_work(self) -> bool:
        """Something in flight or deferred: the queue scanner has work here (queue_scan.py)."""
        # the queues' own containers, not their ``len()`` (methods written in Python): the queue scanner asks
        # every channel every few seconds
        return bool(self.in_flight._entries or self.deferred._heap)

    def process_queues(self, now: float) -> bool:
        """Move expired in-flight and due deferred messages back to the queue; True if any moved."""
        if self.exiting:
            return False  # deleted (the scanner's channel list can lag behind)
        expired = self.in_flight.pop_expired(now)
        for message in expired:
            self.timeout_count += 1
            owner = message.client
            message.client = None
            if owner is not None:
                owner.in_flight -= 1
                if owner.channel is self:
                    self.client_credit_changed(owner)
        if expired:
            self._enqueue(expired)
            if self.replication is not None:
                self.replication.requeued(self.topic_name, self.name, [(m.id, m.attempts, 0) for m in expired])
        due = self.deferred.pop_due(now)
        if due:
            self._enqueue(due)
        if expired or due:
            self.changed.add(self)
            self.wake()
            return True
        return False

    # -- administration --------------------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True
        self.changed.add(self)
        if self.replication is not None:
            self.replication.channel_op(self.topic_name, self.name, OP_PAUSED)

    def unpause(self) -> None:
        self.paused = False
        self.changed.add(self)
        if self.replication is not None:
            self.replication.channel_op(self.topic_name, self.name, OP_UNPAUSED)
        self.wake()

    def empty(self) -> None:
        """Drop every ready and deferred message, and forget in-flight ones (nsqd's /channel/empty). A log
        channel commits everything it holds."""
        if self.log is not None:
            self.log_commit(self.log.end)
        if self.replication is not None:
            self.replication.channel_op(self.topic_name, self.name, OP_EMPTIED)
        self.queue.clear()
        self.changed.add(self)
        self._release_all_topic_records()
        if self.backend is not None:
            self.backend.empty()
            self.deferred_index.clear()
            self.deferred_index.remove_file()
        self.deferred.drain()
        self._forget_in_flight()

    def _forget_in_flight(self) -> None:
        """Empty the in-flight queue; each owner gets its credit back."""
        for message in self.in_flight.drain():
            owner = message.client
            message.client = None
            if owner is not None:
                owner.in_flight -= 1
                if owner.channel is self and not self.exiting:
                    self.client_credit_changed(owner)

    def close(self, *, persist: bool) -> None:
        """Stop dispatching. ``persist`` (nsqd exiting): write the memory queue, then every in-flight
        and every deferred message to disk, as nsqd does, and close the disk queue; otherwise
        (the channel is deleted) remove its files."""
        self.exiting = True
        self._actors.remove(self.dispatcher)
        backend = self.backend
        if not persist:
            # what is in flight is forgotten: its messages reference their consumers, whose channel is this one,
            # and the cyclic collector cannot follow a message (nsqd/message.py), so no such cycle is left behind
            self._forget_in_flight()
        if backend is None:
            return
        if self.log is not None:
            self._close_log(persist)
            return
        assert self.deferred_index is not None  # made with the backend
        if persist:
            now, now_ns = trio.current_time(), time.time_ns()
            # in durable mode, messages read ahead into memory are still held at their place in the queue
            pending = [m for m in self.queue if m.disk_token < 0]
            self.queue.clear()
            pending.extend(self.in_flight.drain())
            delays = []
            for due, message in self.deferred.drain():
                pending.append(message)
                delays.append((message.id, now_ns + int(max(due - now, 0) * 1e9)))
            try:
                if pending:
                    backend.put_many([encode_record(m) for m in pending])
                    log.info("CHANNEL(%s:%s): wrote %d message(s) to disk", self.topic_name, self.name, len(pending))
                    if self.durable:
                        for m in pending:
                            if m.disk_token >= 0:
                                backend.ack(m.disk_token)
                        self._release_all_topic_records()  # all written: the topic closes after its channels
                self.deferred_index.save(backend.write_position(), delays)
                if self.deferred_index or delays:
                    log.info(
                        "CHANNEL(%s:%s): saved the due time of %d deferred message(s)",
                        self.topic_name,
                        self.name,
                        len(self.deferred_index) + len(delays),
                    )
            finally:
                backend.close()
        else:
            self._release_all_topic_records()
            backend.delete()
            self.deferred_index.remove_file()

    def _close_log(self, persist: bool) -> None:
        """``close`` of a log channel: on a graceful stop what its former consumers hold and anything kept in
        memory is appended, then the log and the disk queue are closed; a deleted channel's files all go."""
        backend = self.backend
        if not persist:
            self._release_all_topic_records()
            self.log.delete()
            backend.delete()
            self.deferred_index.remove_file()
            return
        try:
            pending = list(self.queue)
            self.queue.clear()
            pending.extend(self.in_flight.drain())
            pending.extend(message for _due, message in self.deferred.drain())
            if pending and self._append(pending):
                log.info("CHANNEL(%s:%s): appended %d message(s) to the log", self.topic_name, self.name, len(pending))
            if self.queue:  # the log refused them: the disk queue keeps them, appended at the next start
                backend.put_many([encode_record(m) for m in self.queue])
                self.queue.clear()
            self.log.close()
        finally:
            backend.close()

    def _release_all_topic_records(self) -> None:
        records, self._topic_records = self._topic_records, {}
        release = self.topic.release_record
        for token in records.values():
            release(token)

    def __repr__(self) -> str:
        return f"Channel({self.topic_name}:{self.name})"
