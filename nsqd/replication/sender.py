"""Replicator: the origin's side, an outbox of frames and one link per ``--replicate-to`` peer.

See the package notes for the design. Sequence numbers count the data frames of this process's session from 1.
``acked`` is the highest seq held by ``--replication-acks`` peers; a connection's writer holds its output while
the seq its last publish got is above it (``wait_acked``), so no OK leaves early and one write and one ACK per
peer cover every publish made meanwhile (group commit).

Taking ACKs while the loop is busy. A peer's ACK comes back in a fraction of a millisecond, but the task that
reads it runs only at the next turn of the event loop, after the read poller's step (the MPUB batches it
serves) or a channel's slice, and the writers it wakes only at the turn after: an ACK waited there 1-4 ms with
the peer and the publishers sharing two cores. So a plain TCP peer's socket is also a member of the node's
``ReadPoller`` (``_AckReader``) while it streams: the poller reads it between the connections it serves (more
than once in a step: each MPUB's OK waits on an ACK) and from the interludes of channel slices (it reads
little: it is served first), and an ACK taken there flushes the OKs it covers at once (``call_when_acked``, or
``wait_acked``'s ``flush``), from the publishers' own output buffers. The receive task then reads nothing itself:
it waits for what the poller passes on (an ERROR, a bad frame, the end of the stream: ``peer.early``, which ends
the connection) or for the peer's silence. Over TLS the receive task reads as before.
The sender task writes likewise without a turn of the loop when the socket takes its data (``_send``).
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import trio

from protocol.errors import ProtocolError
from protocol.replication import (
    E_BAD_VERSION,
    E_EXITING,
    HEARTBEAT_FRAME,
    MAGIC_R1,
    OP_CREATED,
    OP_LOG,
    OP_PAUSED,
    OP_VERSIONS,
    PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN,
    Ack,
    Adopted,
    ChannelOp,
    Error,
    Finished,
    Heartbeat,
    Hello,
    Ping,
    Pong,
    ReplicationDecoder,
    Requeued,
    Restore,
    Restored,
    Synced,
    Welcome,
    encode,
    encode_messages,
    encode_published,
)

from ..poller import ReadPoller
from ..queues.atomic_file import replace_file

__all__ = [
    "Replicator",
    "PeerStatistics",
    "ReplicatorStatistics",
    "attach_channel",
    "attach_replication",
    "load_state",
    "receive_event",
    "save_state",
    "side_connection",
]

log = logging.getLogger("nsqd")
_message_id = attrgetter("id")

CONNECT_TIMEOUT = 5.0
RETRY_MIN, RETRY_MAX = 0.1, 5.0
#: how long the connection that tells whether a node is up may take
PROBE_TIMEOUT = 2.0
#: a peer that said it stops (``E_EXITING``: SIGTERM, a restart) is tried every ``RETRY_MIN`` this long, not backed
#: off: while it is away this node refuses publishes (or takes them unreplicated), so its return must be seen at once
RESTART_WAIT = 30.0
#: an idle stream's heartbeat (HEARTBEAT, or PING on version 2) goes out after this long without a write
HEARTBEAT_INTERVAL = 1.0
#: A peer silent for this long (no ACK, heartbeat or PONG) is taken for gone and its connection closed; it is the
#: most a publish waits on a peer that stopped answering (a partition, a stopped process) before it is refused
#: (``--replication-degraded=refuse``) or taken unreplicated (``accept``). Five heartbeats: a replica answers
#: each at once, so only a peer stalled for seconds (its event loop, or a sync of its disk) is taken for gone
#: while it lives, and that costs one reconnection (the stream resumes where it was), not data. 15 s before:
#: publishes to an origin cut off from its peer hung that long.
PEER_TIMEOUT = 5 * HEARTBEAT_INTERVAL
#: message ids per FINISHED frame
FIN_BATCH = 4096
#: how long FINs alone wait for more FINs (or a publish) before they are sent
FIN_DELAY = 0.005
#: a frame this large is written as soon as it is made when nothing is ahead of it (a smaller one only when the
#: peer acknowledged everything: small frames made meanwhile go in one write)
DIRECT_SIZE = 16 * 1024
#: outbox bytes kept for a peer that is behind before the oldest frames are dropped (it then needs a backfill)
OUTBOX_LIMIT = 512 * 1024 * 1024


@dataclass(frozen=True)
class PeerStatistics:
    address: str
    state: str  # connecting, connected, down
    node: str
    acked: int
    sent: int
    pending_frames: int
    pending_bytes: int
    pending_messages: int
    lagging: bool
    version: int  # the protocol version of the stream (0 until a WELCOME came)
    round_trip_ms: float | None  # the last PING's round trip (version 2 peers, idle streams), None until one came


@dataclass(frozen=True)
class ReplicatorStatistics:
    node: str
    acks_required: int
    degraded_mode: str
    degraded: bool
    seq: int
    acked: int
    unreplicated_messages: int  # in the outbox and not yet held by enough peers
    accepted_unreplicated: int  # taken while degraded (``accept``), in all
    peers: tuple[PeerStatistics, ...]
    restored_messages: int = 0  # copies peers sent back after this node found its files damaged, in all
    replaced_peers: int = 0  # peers gone for good replaced by a candidate (``--replication-replace-after``)


class _Peer:
    __slots__ = (
        "address",
        "host",
        "port",
        "state",
        "node",
        "acked",
        "sent",
        "wake",
        "lagging",
        "last_heard",
        "synced",
        "welcomed",
        "unreachable",
        "failure",
        "fd",
        "sending",
        "tail",
        "early",
        "receiving",
        "version",
        "round_trip",
        "heal",
        "declared",
        "marks",
        "scope",
        "link",
        "down_at",
        "restarting_until",
    )

    def __init__(self, address: str) -> None:
        self.address = address
        host, _, port = address.rpartition(":")
        self.host = host.strip("[]")
        self.port = int(port)
        self.state = "connecting"
        self.node = ""
        self.acked = 0
        self.sent = 0
        self.wake = trio.Event()
        self.lagging = False
        self.last_heard = 0.0
        self.synced = 0  # the seq of the SYNCED that ends this peer's backfill
        self.welcomed = False  # a WELCOME came since this node started
        #: why the last attempt could not connect (refused, no route, unknown host); None while none failed so,
        #: or once one connected: such a peer is waited for at start-up, as one whose connection is only slow
        self.unreachable: str | None = None
        self.failure = ""  # how the last attempt ended, for the log
        #: the socket of a plain TCP stream while it streams, written directly by ``_append`` (else -1)
        self.fd = -1
        self.sending = False  # the sender task is in a write: nothing else may write meanwhile
        self.tail: bytes | None = None  # what a direct write left of its frame: the sender task writes it first
        #: events other than ACK and heartbeat that the read poller decoded: the receive task handles them
        self.early: deque = deque()
        self.receiving: trio.CancelScope | None = None  # the receive task's wait, cancelled when ``early`` fills
        self.version = 0  # the protocol version of the current stream (WELCOME): which frames it may be sent
        self.round_trip: float | None = None  # seconds, from the last PONG
        #: this node's queues found damaged whose lost copies this peer has not sent back yet (RESTORED): each
        #: backfill to it names them in its SYNCED, and a peer that owes some gets a backfill at every connection
        self.heal: set[tuple[str, str]] = set()
        self.declared: tuple[tuple[str, str], ...] = ()  # what the last SYNCED named
        #: queue name -> its write position at the capture of this peer's last backfill (``Backfill.marks``)
        self.marks: dict[str, tuple[int, int]] = {}
        self.scope: trio.CancelScope | None = None  # the current connection's, cancelled for a new backfill
        self.link: trio.CancelScope | None = None  # the link task's, cancelled when the peer is replaced
        #: since when it has not streamed (trio clock); None while it streams, and until its first stream: a peer
        #: never reached since this node started is not replaced (a cluster starting up)
        self.down_at: float | None = None
        self.restarting_until = 0.0  # it said it stops (E_EXITING): tried every RETRY_MIN until then

    @property
    def log_channels(self) -> bool:
        """The current stream's version has CHANNEL op LOG (``OP_VERSIONS``). Else the peer gets, in that frame's
        place, op CREATED of the same channel and seq (a no-op there: the seqs stay dense for a replica that
        predates log channels)."""
        return self.version >= OP_VERSIONS[OP_LOG]


class _AckReader:
    """A peer's plain TCP socket as a ``ReadPoller`` member while it streams (see the module notes)."""

    __slots__ = ("replicator", "peer", "decoder", "fd", "last_read", "poll_actor")

    def __init__(self, replicator: Replicator, peer: _Peer, decoder: ReplicationDecoder, fd: int) -> None:
        self.replicator = replicator
        self.peer = peer
        self.decoder = decoder
        self.fd = fd
        self.last_read = 0  # ACKs: served before the other members, and from the interludes of slices
        self.poll_actor = None

    def poll_ready(self) -> None:
        try:
            data = os.read(self.fd, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self.decoder.receive_data(data)
            self.take_events()
            return
        self.take_events()  # the end of the stream (or an error), after what came before it
        self.peer.early.append(trio.BrokenResourceError("connection closed by the peer"))
        self._pass_on()

    def take_events(self) -> None:
        """Handle the ACKs and heartbeats the decoder holds; anything else goes to the receive task, and this
        member leaves the poller."""
        peer = self.peer
        # an event is told by its type (``kind``), which mypy does not follow: read as Any, with no cast per frame
        next_event: Callable[[], Any] = self.decoder.next_event
        try:
            while (event := next_event()) is not None:
                kind = type(event)
                if kind is Ack:
                    self.replicator._on_ack(peer, event.seq)
                elif type(event) is Pong:
                    _on_pong(peer, event)
                elif kind is Restore or kind is Restored:
                    self.replicator._on_restore(peer, event)
                elif kind is not Heartbeat:
                    peer.early.append(event)
                    break
                peer.last_heard = trio.current_time()
        except ProtocolError as error:
            peer.early.append(error)
        if peer.early:
            self._pass_on()

    def _pass_on(self) -> None:
        """The receive task takes it from here (it ends the connection)."""
        poller = self.replicator.poller
        if poller is not None:  # it is: this reader is one of its members
            poller.discard(self.fd)
        if self.peer.receiving is not None:
            self.peer.receiving.cancel()


class Replicator:
    """The origin's replication (``NSQD.replication`` when ``--replicate-to`` is given)."""

    def __init__(
        self,
        node: str,
        peers: list[str],
        *,
        acks: int,
        degraded: str,
        durable: bool,
        epoch: int = 0,
        ssl_context=None,
        snapshot=None,
        on_adopted=None,
        node_id: int = 0,
        clean: bool = False,
        version: int = PROTOCOL_VERSION,
        on_restore=None,
        on_topology=None,
        candidates: tuple[str, ...] = (),
        replace_after: float = 0.0,
    ) -> None:
        self.node = node
        #: the newest protocol version this node speaks (below ``PROTOCOL_VERSION`` only when capped for a test)
        self.version = version
        self.peers = [_Peer(address) for address in peers]
        #: nodes that may take the place of a peer gone for good (``--replication-candidates``), and after how long
        #: (``--replication-replace-after``, 0: never)
        self.candidates = [address for address in candidates if address not in peers]
        self.replace_after = replace_after
        self.replaced_peers = 0
        self._nursery: trio.Nursery | None = None
        #: () -> candidates, awaited when ``candidates`` is empty (``replace.py``: the nodes nsqlookupd knows)
        self.find_candidates: Callable[[], Awaitable[list[str]]] | None = None
        #: (old, new): a peer was replaced (``replace.py``: kept in the data directory, the old one released)
        self.on_replaced: Callable[[str, str], None] | None = None
        self.acks_required = acks
        self.degraded_mode = degraded
        self.durable = durable
        self.node_id = node_id
        #: every message this node acknowledged is still in its data directory (a clean stop, or durable mode):
        #: its peers may drop what a backfill does not include; otherwise they adopt what they hold (HELLO)
        self.clean = clean
        self.epoch = epoch
        self.session = secrets.token_hex(8)
        self.ssl_context = ssl_context
        self.seq = 0  # last seq given to a frame
        self.acked = 0  # highest seq held by ``acks_required`` peers
        self.degraded = True  # until enough peers are connected
        self.accepted_unreplicated = 0  # messages taken while degraded (``accept``), counted once
        self._outbox: deque[tuple[int, bytes, int]] = deque()  # (seq, frame, messages in it)
        #: seq -> the frame sent instead to peers of version 1 (``_Peer.log_channels``): CHANNEL op LOG frames in
        #: the outbox
        self._fallbacks: dict[int, bytes] = {}
        self._outbox_bytes = 0
        self._outbox_messages = 0
        self._fins: dict[tuple[str, str], list[bytes]] = {}
        #: what channels put back since the last flush, sent before the FINs: (topic, channel) -> (id, attempts, due)
        self._requeues: dict[tuple[str, str], list[tuple[bytes, int, int]]] = {}
        #: writers waiting for an ACK, by the seq they wait for: (seq, order, event, flush), a min-heap. An ACK wakes
        #: only those it covers (waking every writer at every ACK costs a task switch each, FIN frames' ACKs
        #: included), and calls their ``flush`` first
        self._waiters: list[
            tuple[int, int, trio.Event | None, Callable[[], None] | None]
        ] = []  # None: ``call_when_acked``
        #: the node's ``ReadPoller`` (None: the peers' sockets are read by their receive tasks alone)
        self.poller: ReadPoller | None = None
        self._waiter_order = 0
        #: () -> ``snapshot.Backfill``: everything this node holds, captured now, sent by its ``send``
        self.snapshot = snapshot
        #: (peer address, epoch, ids): a peer adopted these messages of this node while it was away (``NSQD``)
        self.on_adopted = on_adopted
        #: (peer address, topic, channel, [ReplicatedMessage]) -> how many were put back: copies a peer sent back
        #: after a backfill that named damaged queues (``NSQD``); topic None: that peer's RESTORED
        self.on_restore = on_restore
        self.restored_messages = 0  # copies put back into this node's channels after damage, in all
        #: (peer address, WELCOME's topics): what a peer knew of this node's topics and channels, sent when this
        #: node was not ``clean`` (``NSQD``: the ones missing here are created before the node takes publishes)
        self.on_topology = on_topology
        #: True until every peer answered or failed once (start-up: the node learns its epoch before serving)
        self.starting = True
        self.started_check = trio.Event()
        self.ready = trio.Event()  # set once ``starting`` is over

    # -- what the broker calls (synchronous, once per batch) ----------------------------------------------------
    def refusing(self) -> bool:
        """True while publishes must be refused: degraded with ``--replication-degraded=refuse``, or at start-up
        until the peers said whether this node's messages were adopted."""
        return self.starting or (self.degraded and self.degraded_mode == "refuse")

    async def wait_started(self, timeout: float) -> None:
        """Start-up: wait until every peer answered (WELCOME, with the ids it adopted) or could not be connected to,
        then take publishes. A peer that took the connection and is slow to answer, or failed after it, is waited
        for (the link tries again), ``timeout`` at most: delivering before it answered would deliver what it
        adopted twice. Each peer not heard from is logged."""
        with trio.move_on_after(timeout):
            await self.started_check.wait()
        self.starting = False
        self.ready.set()
        silent = [peer for peer in self.peers if not peer.welcomed]
        if not silent:
            return
        if len(silent) == len(self.peers) and all(peer.unreachable is not None for peer in silent):
            log.warning(
                "REPLICATION: no peer reachable at start-up: delivering the messages this node holds (at-least-once)"
            )
            return
        for peer in silent:
            why = (
                f"unreachable ({peer.unreachable})"
                if peer.unreachable is not None
                else f"did not answer within {timeout:g} s ({peer.failure or 'no WELCOME yet'})"
            )
            log.warning(
                "REPLICATION: peer %s %s at start-up: delivering the messages this node holds, any it "
                "adopted included (at-least-once)",
                peer.address,
                why,
            )

    def _check_started(self) -> None:
        if all(peer.welcomed or peer.unreachable is not None for peer in self.peers):
            self.started_check.set()

    def offer(self, topic: str, messages) -> int:
        """A published batch of ``nsqd.message.Message``: one MESSAGES frame; returns its seq."""
        records = [
            (m.id, m.timestamp, m.attempts, m.timestamp + int(m.defer * 1e9) if m.defer else 0, m.body)
            for m in messages
        ]
        return self.offer_records(topic, records)

    def offer_published(
        self, topic: str, ids: list[bytes], bodies: list[bytes], timestamp: int, defer: float = 0.0
    ) -> int:
        """A published batch (``Topic.publish``: one timestamp and delay for all): one MESSAGES frame built from
        the IDs and bodies as they are, without a step per message; returns its seq."""
        self.seq += 1
        if self.degraded:
            self.accepted_unreplicated += len(ids)
        due_ns = timestamp + int(defer * 1e9) if defer else 0
        self._append(encode_published(self.seq, topic, ids, bodies, timestamp, due_ns), len(ids))
        return self.seq

    def offer_records(self, topic: str, records: list) -> int:
        """``offer`` of ``(id, timestamp, attempts, due_ns, body)`` tuples (adopted messages)."""
        self.seq += 1
        if self.degraded:
            self.accepted_unreplicated += len(records)
        self._append(encode_messages(self.seq, topic, records), len(records))
        return self.seq

    def finished(self, topic: str, channel: str, messages) -> None:
        """FINs of a channel: sent with the next write (at most ``FIN_DELAY`` later), no one waits for them."""
        self._gather(self._fins, (topic, channel), map(_message_id, messages))

    def requeued(self, topic: str, channel: str, entries) -> None:
        """Messages a channel put back (REQ, an in-flight timeout), ``(id, attempts, due_ns)``: sent like FINs, so
        that a takeover delivers them with their attempts and, after a REQ with a delay, at their time."""
        self._gather(self._requeues, (topic, channel), entries)

    def _gather(self, buffer: dict, key: tuple[str, str], items) -> None:
        """Add to what the next write sends (``_flush_fins``); a large pile goes into the outbox at once, where the
        outbox's bound holds (no sender task takes anything while every peer is gone)."""
        if not self._fins and not self._requeues:
            self._wake_senders()
        rows = buffer.get(key)
        if rows is None:
            rows = buffer[key] = []
        rows.extend(items)
        if len(rows) >= FIN_BATCH:
            self._flush_fins()

    def log_committed(self, channel, old: int, new: int) -> None:
        """A log channel's commit moved from ``old`` to ``new`` (``Channel.on_log_commit``): the messages in between
        are finished, sent as that channel's FINs (batched and asynchronous like FINs: a commit waits for no peer).
        Called before retention removes the files, which ``ids_between`` reads."""
        ids = channel.log.ids_between(old, new)
        if ids:
            self._gather(self._fins, (channel.topic_name, channel.name), ids)

    def channel_op(self, topic: str, channel: str, op: int) -> None:
        self._flush_fins()
        self.seq += 1
        if op == OP_LOG:
            self._fallbacks[self.seq] = encode(ChannelOp(self.seq, topic, channel, OP_CREATED))
        self._append(encode(ChannelOp(self.seq, topic, channel, op)), 0)

    def _append(self, frame: bytes, messages: int) -> None:
        seq = self.seq
        self._outbox.append((seq, frame, messages))
        self._outbox_bytes += len(frame)
        self._outbox_messages += messages
        if self._outbox_bytes > OUTBOX_LIMIT:  # no ACK comes to trim it (every peer gone, ``accept``)
            self._trim_outbox()
        direct = len(frame) >= DIRECT_SIZE
        fallback = seq in self._fallbacks
        for peer in self.peers:
            if (
                peer.fd < 0
                or peer.sent != seq - 1
                or peer.sending
                or peer.tail is not None
                or not (direct or peer.acked == peer.sent)
                or (fallback and not peer.log_channels)
            ):
                peer.wake.set()
                continue
            # the peer has everything before this frame and no write is under way, and the frame is a large batch
            # or nothing waits for an ACK: it leaves now, while the publishes read with it are handled (the
            # replica stores it meanwhile), not after them; small frames behind one in flight go together
            try:
                written = os.write(peer.fd, frame)
            except (BlockingIOError, InterruptedError):
                written = 0
            except OSError:
                peer.wake.set()  # the sender task's write meets the error and ends the connection
                continue
            peer.sent = seq
            if written < len(frame):
                peer.tail = frame[written:]
                peer.wake.set()

    def _wake_senders(self) -> None:
        for peer in self.peers:
            peer.wake.set()

    def _flush_fins(self) -> None:
        """FINs and requeues into frames of the outbox (requeues first: a message put back and then finished
        meanwhile ends finished)."""
        buffers: tuple[tuple[Any, dict[tuple[str, str], list[Any]]], ...] = (
            (Requeued, self._requeues),
            (Finished, self._fins),
        )
        self._requeues, self._fins = {}, {}
        for event, buffer in buffers:
            for (topic, channel), rows in buffer.items():
                for start in range(0, len(rows), FIN_BATCH):
                    self.seq += 1
                    frame = encode(event(self.seq, topic, channel, tuple(rows[start : start + FIN_BATCH])))
                    self._outbox.append((self.seq, frame, 0))
                    self._outbox_bytes += len(frame)
        if self._outbox_bytes > OUTBOX_LIMIT:
            self._trim_outbox()

    async def wait_acked(self, seq: int, flush=None) -> bool:
        """Wait until ``seq`` is held by enough peers: True; False when publishes are refused meanwhile (the
        peers went away in ``refuse`` mode). In ``accept`` mode a degraded replicator answers True at once.
        ``flush``: called (synchronously, must not raise) by the ACK that covers ``seq``, before the waiter wakes:
        the connection writes its OKs from there when it can (``Connection._flush_direct``)."""
        while seq > self.acked:
            if self.degraded:
                return self.degraded_mode != "refuse"
            event = trio.Event()
            self._waiter_order += 1
            heapq.heappush(self._waiters, (seq, self._waiter_order, event, flush))
            await event.wait()
        return True

    def call_when_acked(self, seq: int, callback) -> None:
        """Call ``callback()`` (synchronously, must not raise) once ``seq`` is held by enough peers, or at the
        next change of ``degraded`` (the callback looks at the state itself): ``wait_acked`` without a task."""
        self._waiter_order += 1
        heapq.heappush(self._waiters, (seq, self._waiter_order, None, callback))

    def _notify(self, everyone: bool) -> None:
        """Wake the writers whose seq is acknowledged now (``everyone``: all of them, to look at ``degraded``)."""
        waiters = self._waiters
        if everyone:
            self._waiters = []
            for _seq, _order, event, flush in waiters:
                if event is not None:
                    event.set()
                elif flush is not None:  # ``call_when_acked``
                    flush()
            return
        acked = self.acked
        while waiters and waiters[0][0] <= acked:
            _seq, _order, event, flush = heapq.heappop(waiters)
            if flush is not None:
                flush()
            if event is not None:
                event.set()

    # -- acknowledgements ------------------------------------------------------------------------------------
    def _peer_changed(self) -> None:
        """Recompute ``acked`` and ``degraded`` from the peers, trim the outbox, wake the waiting writers."""
        peers = self.peers
        connected = sum(1 for p in peers if p.state == "connected" and not p.lagging)
        acks = sorted((p.acked for p in peers), reverse=True)
        acked = acks[self.acks_required - 1] if self.acks_required <= len(acks) else 0
        degraded = connected < self.acks_required
        if degraded != self.degraded:
            if degraded:
                log.warning(
                    "REPLICATION: degraded: %d of %d required peer(s) connected (%s)",
                    connected,
                    self.acks_required,
                    "refusing publishes" if self.degraded_mode == "refuse" else "accepting publishes unreplicated",
                )
            else:
                log.info("REPLICATION: %d peer(s) connected, publishes are replicated", connected)
        degraded_changed = degraded != self.degraded
        changed = acked > self.acked or degraded_changed
        self.acked = max(acked, self.acked)
        self.degraded = degraded
        self._trim_outbox()
        if changed:
            self._notify(degraded_changed)

    def _trim_outbox(self) -> None:
        """Drop the frames every peer acknowledged, and the oldest beyond ``OUTBOX_LIMIT`` (a peer that still
        needed them falls behind: it gets a backfill when it comes back)."""
        peers = self.peers
        low = min(p.acked for p in peers)
        outbox = self._outbox
        while outbox and (outbox[0][0] <= low or self._outbox_bytes > OUTBOX_LIMIT):
            seq, frame, messages = outbox.popleft()
            if self._fallbacks:
                self._fallbacks.pop(seq, None)
            self._outbox_bytes -= len(frame)
            self._outbox_messages -= messages
            if seq > low:
                for peer in peers:
                    if peer.acked < seq and not peer.lagging:
                        peer.lagging = True
                        log.error(
                            "REPLICATION: peer %s fell %d bytes behind: frames dropped, it needs a backfill",
                            peer.address,
                            OUTBOX_LIMIT,
                        )

    # -- running ------------------------------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for peer in self.peers:
                nursery.start_soon(self._link, peer)
            if self.replace_after > 0 and (self.candidates or self.find_candidates is not None):
                nursery.start_soon(self._replace_gone)
            task_status.started()

    def hello(self, replica: str, *, release: bool = False) -> Hello:
        """The HELLO this node sends ``replica`` (``release``: a peer it replaced, ``replace.py``)."""
        return Hello(
            self.node,
            self.session,
            self.epoch,
            self.durable,
            node_id=self.node_id,
            clean=self.clean,
            version=self.version,
            min_version=PROTOCOL_VERSION_MIN,
            peers=tuple(p.address for p in self.peers),
            replica=replica,
            release=release or None,
        )

    async def _replace_gone(self) -> None:
        """``--replication-replace-after``: a peer that streamed since this node started and has not for that long is
        taken for gone for good, and the first candidate that is neither a peer nor this node and accepts a connection
        takes its place (its first connection is a backfill of everything this node holds, as for any new peer): the
        copies come back to their number without an operator. The peer it replaces becomes the last candidate."""
        while True:
            await trio.sleep(min(1.0, self.replace_after / 2))
            for peer in list(self.peers):
                if peer.down_at is None or trio.current_time() - peer.down_at < self.replace_after:
                    continue
                taken = {p.address for p in self.peers}
                if self.candidates:
                    candidates = list(self.candidates)
                elif self.find_candidates is not None:
                    candidates = await self.find_candidates()
                else:
                    candidates = []
                for candidate in candidates:
                    if candidate not in taken and candidate != self.node and await unreachable(candidate) is None:
                        if peer in self.peers and peer.down_at is not None:
                            self._replace(peer, candidate)
                        break

    def _replace(self, old: _Peer, address: str) -> None:
        assert self._nursery is not None
        new = _Peer(address)
        self.peers[self.peers.index(old)] = new
        if old.link is not None:
            old.link.cancel()
        if address in self.candidates:
            self.candidates.remove(address)
            self.candidates.append(old.address)
        self.replaced_peers += 1
        log.warning(
            "REPLICATION: peer %s has not streamed for %g s: replaced by %s, which gets a backfill",
            old.address,
            self.replace_after,
            address,
        )
        self._nursery.start_soon(self._link, new)
        self._peer_changed()
        if self.on_replaced is not None:
            self.on_replaced(old.address, address)

    async def _link(self, peer: _Peer) -> None:
        """Keep one peer connected: connect, handshake, stream; on any failure log, wait, again (until the peer is
        replaced)."""
        with trio.CancelScope() as peer.link:
            await self._keep_linked(peer)

    async def _keep_linked(self, peer: _Peer) -> None:
        delay = RETRY_MIN
        while True:
            peer.state = "connecting"
            try:
                with trio.CancelScope() as peer.scope:
                    await self._session(peer)
                delay = RETRY_MIN
            except* (
                OSError,
                trio.BrokenResourceError,
                trio.ClosedResourceError,
                trio.TooSlowError,
                ProtocolError,
            ) as group:
                exc = group.exceptions[0]
                while isinstance(exc, BaseExceptionGroup):
                    exc = exc.exceptions[0]
                peer.failure = str(exc) or type(exc).__name__
                if group.subgroup(lambda e: isinstance(e, ProtocolError) and e.code == E_EXITING) is not None:
                    # (its sender task may have failed first, on the closed socket)
                    peer.restarting_until = trio.current_time() + RESTART_WAIT
                if peer.state in ("connected", "backfilling"):
                    log.warning("REPLICATION: peer %s lost - %s", peer.address, exc)
                else:
                    log.info("REPLICATION: peer %s unreachable - %s", peer.address, exc or type(exc).__name__)
            finally:
                was = peer.state
                peer.state = "down"
                if was in ("connected", "backfilling"):
                    peer.down_at = trio.current_time()
                self._check_started()
                if was in ("connected", "backfilling"):
                    self._peer_changed()
            if trio.current_time() < peer.restarting_until:
                delay = RETRY_MIN
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    async def _session(self, peer: _Peer) -> None:
        try:
            with trio.fail_after(CONNECT_TIMEOUT):  # a timeout may be a slow peer: not taken for unreachable
                stream: trio.abc.Stream = await trio.open_tcp_stream(peer.host, peer.port)
        except OSError as exc:
            peer.unreachable = str(exc) or type(exc).__name__
            raise
        peer.unreachable = None
        async with stream:
            await stream.send_all(MAGIC_R1)
            if self.ssl_context is not None:
                ssl_stream = trio.SSLStream(stream, self.ssl_context, server_hostname=peer.host)
                with trio.fail_after(CONNECT_TIMEOUT):
                    await ssl_stream.do_handshake()
                stream = ssl_stream
            decoder = ReplicationDecoder(version=self.version)
            await stream.send_all(encode(self.hello(peer.address)))
            with trio.fail_after(CONNECT_TIMEOUT):
                welcome = await receive_event(stream, decoder)
            if type(welcome) is Error:
                raise ProtocolError(welcome.code, welcome.text)
            if type(welcome) is not Welcome:
                raise ProtocolError("E_BAD_PROTOCOL", f"expected WELCOME, got {type(welcome).__name__}")
            if not PROTOCOL_VERSION_MIN <= welcome.version <= self.version:
                raise ProtocolError(
                    E_BAD_VERSION,
                    f"the replica chose protocol version {welcome.version}, this node "
                    f"speaks {PROTOCOL_VERSION_MIN}-{self.version}",
                )
            # from here on this stream speaks the version the replica chose: no frame of a later one either way
            decoder.version = peer.version = welcome.version
            peer.round_trip = None
            peer.node = welcome.node
            peer.last_heard = trio.current_time()
            ids = await receive_adopted(stream, decoder, welcome.adopted) if welcome.adopted else []
            if welcome.epoch > self.epoch or ids:
                # that peer adopted this node's messages while it was away (``ids``: which): they are the peer's now
                self.epoch = max(welcome.epoch, self.epoch)
                if self.on_adopted is not None:
                    self.on_adopted(peer.address, self.epoch, ids)
            if welcome.topics and self.on_topology is not None:  # before the backfill's capture: it names them
                self.on_topology(peer.address, welcome.topics)
            peer.down_at = None  # it answered: streaming (or backfilling) from here
            first = self._outbox[0][0] if self._outbox else self.seq + 1
            backfill = None
            if welcome.session == self.session and welcome.seq + 1 >= first and not peer.heal:
                peer.sent = peer.acked = max(welcome.seq, peer.acked)  # a reconnection: resume after it
                peer.state = "connected"
                log.info(
                    "REPLICATION: peer %s (%s) connected, resuming after seq %d", peer.address, welcome.node, peer.sent
                )
            else:
                # the peer does not hold this session's stream: it gets everything this node holds unfinished
                # first, and counts toward the acks once it acknowledged the end of that (SYNCED)
                self._flush_fins()
                backfill = self.snapshot() if self.snapshot is not None else None
                peer.synced = peer.sent = self.seq
                peer.acked = 0
                peer.lagging = False
                peer.state = "backfilling"
                log.info(
                    "REPLICATION: peer %s (%s) connected, backfill up to seq %d",
                    peer.address,
                    welcome.node,
                    peer.synced,
                )
            peer.welcomed = True
            peer.restarting_until = 0.0
            self._check_started()
            self._peer_changed()
            if peer.state == "backfilling":
                if backfill is not None:
                    peer.marks = backfill.marks
                    try:
                        await backfill.send(stream.send_all, log_channels=peer.log_channels)
                    finally:
                        backfill.close()
                    peer.heal |= backfill.damaged
                    log.info("REPLICATION: peer %s backfill sent: %d message(s)", peer.address, backfill.count)
                await stream.send_all(encode(Synced(peer.synced, self._declare(peer))))
            reader = None
            poller = self.poller
            if poller is not None and type(stream) is trio.SocketStream:
                reader = _AckReader(self, peer, decoder, stream.socket.fileno())
                poller.add(reader.fd, reader, again=True)
                reader.take_events()  # what came with the handshake's reads
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._send_loop, peer, stream)
                    await self._receive_loop(peer, stream, decoder, reader is not None)
                    nursery.cancel_scope.cancel()
            finally:
                if reader is not None and poller is not None:
                    poller.discard(reader.fd)
                peer.early.clear()
                peer.receiving = None
                peer.fd = -1
                peer.tail = None
                peer.sending = False

    async def _receive_loop(self, peer: _Peer, stream, decoder: ReplicationDecoder, polled: bool) -> None:
        """Take the peer's ACKs; ``polled``: the read poller reads the stream, this task only waits for what it
        passes on (an error, the end of the stream) or for the peer's silence."""
        while True:
            if peer.early:  # decoded by the read poller (``_AckReader``)
                event = peer.early.popleft()
                if isinstance(event, Exception):
                    raise event
            else:
                with trio.move_on_at(peer.last_heard + PEER_TIMEOUT) as scope:
                    peer.receiving = scope
                    if polled:
                        await trio.sleep_forever()  # the read poller reads the socket (``_AckReader``)
                    event = await receive_event(stream, decoder)
                peer.receiving = None
                if scope.cancelled_caught:
                    if peer.early or trio.current_time() < peer.last_heard + PEER_TIMEOUT:
                        continue  # the read poller passed something on, or took what came
                    raise trio.TooSlowError(f"no word for {PEER_TIMEOUT:g} s")
            peer.last_heard = trio.current_time()
            kind = type(event)
            if kind is Ack:
                self._on_ack(peer, event.seq)
            elif kind is Pong:
                _on_pong(peer, event)
            elif kind is Restore or kind is Restored:
                self._on_restore(peer, event)
            elif kind is Error:
                raise ProtocolError(event.code, event.text)
            elif kind is not Heartbeat:
                raise ProtocolError("E_BAD_PROTOCOL", f"unexpected {kind.__name__} frame from the replica")

    def _declare(self, peer: _Peer) -> tuple[tuple[str, str], ...]:
        """The damaged queues the SYNCED to ``peer`` names (its ``heal``): a peer of version 1 cannot send copies
        back, so it drops what the backfill left out of them (logged)."""
        if not peer.heal:
            peer.declared = ()
        elif peer.version < 2:
            log.error(
                "REPLICATION: peer %s speaks protocol version %d, which cannot send back the copies this node "
                "lost from its damaged queues (%s): they are lost",
                peer.address,
                peer.version,
                ", ".join(f"{t}:{c}" if c else t for t, c in sorted(peer.heal)),
            )
            peer.heal.clear()
            peer.declared = ()
        else:
            peer.declared = tuple(sorted(peer.heal))
            log.warning(
                "REPLICATION: asking peer %s for the copies this node lost from its damaged queues: %s",
                peer.address,
                ", ".join(f"{t}:{c}" if c else t for t, c in peer.declared),
            )
        return peer.declared

    def _on_restore(self, peer: _Peer, event) -> None:
        """RESTORE: copies ``peer`` sends back for a damaged queue, put back into their channel; RESTORED: it sent
        them all for the SYNCED that named ``peer.declared``, which it no longer owes."""
        if type(event) is Restored:
            if event.seq == peer.synced:
                peer.heal.difference_update(peer.declared)
                log.info("REPLICATION: peer %s sent back everything it held of the damaged queues", peer.address)
            if self.on_restore is not None:  # what it sent that matched no lost record may go back now
                self.restored_messages += self.on_restore(peer.address, None, "", ())
            return
        if self.on_restore is not None:
            self.restored_messages += self.on_restore(peer.address, event.topic, event.channel, event.messages)

    def queue_damaged(self, name: str, where: tuple[int, int]) -> None:
        """A disk queue of this node (``name``: ``topic`` or ``topic:channel``) found a record damaged or lost at
        ``where`` (file number, byte) while reading it. A peer whose last backfill read that queue past ``where``
        was told already (that backfill found the same damage); any other gets a new backfill naming the queue,
        its connection closed and made again at once: the copies it holds of what the queue lost come back."""
        topic, _, channel = name.partition(":")
        for peer in self.peers:
            mark = peer.marks.get(name)
            if mark is not None and where < mark:
                continue
            peer.heal.add((topic, channel))
            if peer.scope is not None and peer.state in ("connected", "backfilling"):
                log.warning(
                    "REPLICATION: %s found damaged at %d,%d: peer %s gets a new backfill to send back its copies",
                    name,
                    *where,
                    peer.address,
                )
                peer.scope.cancel()

    def _on_ack(self, peer: _Peer, seq: int) -> None:
        if seq > peer.acked or peer.state == "backfilling":
            peer.acked = max(seq, peer.acked)
            if peer.state == "backfilling" and seq >= peer.synced:
                peer.state = "connected"
                log.info("REPLICATION: peer %s backfilled, counting toward acks", peer.address)
            self._peer_changed()

    async def _send_loop(self, peer: _Peer, stream) -> None:
        """Write what the outbox holds past ``peer.sent``. On a plain TCP stream ``_append`` writes a frame itself
        when nothing is ahead of it (``peer.fd``); this task writes the rest, ``peer.sending`` while it does."""
        outbox = self._outbox
        if type(stream) is trio.SocketStream:
            peer.fd = stream.socket.fileno()
        while True:
            with trio.move_on_after(HEARTBEAT_INTERVAL):
                await peer.wake.wait()
            peer.wake = trio.Event()
            if (self._fins or self._requeues) and (not outbox or outbox[-1][0] <= peer.sent):
                # only FINs to send: let more gather for a moment (a publish ends the wait at once)
                with trio.move_on_after(FIN_DELAY):
                    await peer.wake.wait()
                peer.wake = trio.Event()
            if self._fins or self._requeues:
                self._flush_fins()
            if not outbox or outbox[-1][0] <= peer.sent:
                # an idle stream's heartbeat: a PING to a peer that speaks version 2 (its PONG gives the round
                # trip), the empty HEARTBEAT of version 1 to one that does not
                await self._send(
                    peer, stream, encode(Ping(time.monotonic_ns())) if peer.version >= 2 else HEARTBEAT_FRAME
                )
                continue
            start = peer.sent + 1 - outbox[0][0]
            if start < 0:
                start = 0
            frames = [outbox[i][1] for i in range(start, len(outbox))]
            if self._fallbacks and not peer.log_channels:
                fallbacks = self._fallbacks
                frames = [fallbacks.get(outbox[i][0], frame) for i, frame in enumerate(frames, start)]
            last = outbox[-1][0]
            await self._send(peer, stream, b"".join(frames))
            peer.sent = max(peer.sent, last)

    @staticmethod
    async def _send(peer: _Peer, stream, data: bytes) -> None:
        """Write ``data`` after what a direct write left of its frame (``peer.tail``), if anything. On a plain TCP
        stream what the socket takes goes at once, without a turn of the event loop (``send_all`` yields to the
        scheduler even when the socket takes everything: the frames published meanwhile could not be written
        directly, ``peer.sending``); ``send_all`` writes the rest, errors included."""
        if peer.tail is not None:
            data, peer.tail = peer.tail + data, None
        if peer.fd >= 0:
            try:
                written = os.write(peer.fd, data)
            except OSError:  # BlockingIOError included: ``send_all`` waits, or meets the error
                written = 0
            if written == len(data):
                return
            data = data[written:]
        peer.sending = True
        try:
            await stream.send_all(data)
        finally:
            peer.sending = False

    # -- statistics ---------------------------------------------------------------------------------------------
    def statistics(self) -> ReplicatorStatistics:
        outbox = self._outbox
        peers = []
        for peer in self.peers:
            pending = [(len(frame), n) for seq, frame, n in outbox if seq > peer.acked]
            peers.append(
                PeerStatistics(
                    address=peer.address,
                    state=peer.state,
                    node=peer.node,
                    acked=peer.acked,
                    sent=peer.sent,
                    pending_frames=len(pending),
                    pending_bytes=sum(size for size, _ in pending),
                    pending_messages=sum(n for _, n in pending),
                    lagging=peer.lagging,
                    version=peer.version,
                    round_trip_ms=None if peer.round_trip is None else round(peer.round_trip * 1000, 3),
                )
            )
        return ReplicatorStatistics(
            node=self.node,
            acks_required=self.acks_required,
            degraded_mode=self.degraded_mode,
            degraded=self.degraded,
            seq=self.seq,
            acked=self.acked,
            peers=tuple(peers),
            unreplicated_messages=sum(n for seq, _, n in outbox if seq > self.acked),
            accepted_unreplicated=self.accepted_unreplicated,
            restored_messages=self.restored_messages,
            replaced_peers=self.replaced_peers,
        )


def _on_pong(peer: _Peer, pong: Pong) -> None:
    peer.round_trip = max(time.monotonic_ns() - pong.clock, 0) / 1e9


def attach_replication(replicator: Replicator, topic) -> None:
    """Replicate ``topic`` (not ephemeral) and its channels from now on: its state goes to the peers first
    (topic created, paused; each lasting channel created, paused, a log)."""
    topic.replication = replicator
    replicator.channel_op(topic.name, "", OP_CREATED)
    if topic.paused:
        replicator.channel_op(topic.name, "", OP_PAUSED)
    for channel in topic.channels.values():
        if not channel.ephemeral:
            attach_channel(replicator, channel)


def attach_channel(replicator: Replicator, channel) -> None:
    """Replicate ``channel`` (not ephemeral) from now on: created, paused and a log as it is; a log channel's
    commits go as its FINs (``log_committed``), and ``Channel.make_log`` tells the peers when it becomes one."""
    channel.replication = replicator
    channel.on_log_commit = replicator.log_committed
    replicator.channel_op(channel.topic_name, channel.name, OP_CREATED)
    if channel.paused:
        replicator.channel_op(channel.topic_name, channel.name, OP_PAUSED)
    if channel.log is not None:
        replicator.channel_op(channel.topic_name, channel.name, OP_LOG)


async def receive_event(stream, decoder: ReplicationDecoder):
    """The next event of a replication stream, reading as needed; BrokenResourceError at EOF."""
    while True:
        event = decoder.next_event()
        if event is not None:
            return event
        data = await stream.receive_some(65536)
        if not data:
            raise trio.BrokenResourceError("connection closed by the peer")
        decoder.receive_data(data)


async def unreachable(node: str) -> str | None:
    """Why ``node`` (``host:port``, an nsqd's TCP address) accepts no connection within ``PROBE_TIMEOUT``; None when
    it accepts one."""
    host, _, port = node.rpartition(":")
    try:
        with trio.fail_after(PROBE_TIMEOUT):
            stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
    except trio.TooSlowError:
        return f"no connection within {PROBE_TIMEOUT:g} s"
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__
    await stream.aclose()
    return None


@contextlib.asynccontextmanager
async def side_connection(node: str, ssl_context, connect_timeout: float = math.inf):
    """A connection of its own to ``node`` (``host:port``, an nsqd's TCP address) for one exchange beside the
    streams (CONFIRM, ASK, a HELLO ``release``): connected within ``connect_timeout``, the replication magic sent,
    TLS on when ``ssl_context`` is given; closed at once when the block ends."""
    host, _, port = node.rpartition(":")
    host = host.strip("[]")
    with trio.fail_after(connect_timeout):
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, int(port))
    try:
        await stream.send_all(MAGIC_R1)
        if ssl_context is not None:
            stream = trio.SSLStream(stream, ssl_context, server_hostname=host)
        yield stream
    finally:
        await trio.aclose_forcefully(stream)


async def receive_adopted(stream, decoder: ReplicationDecoder, count: int) -> list[bytes]:
    """The ``count`` message ids of the ADOPTED frames that follow a WELCOME."""
    ids: list[bytes] = []
    while len(ids) < count:
        with trio.fail_after(CONNECT_TIMEOUT):
            event = await receive_event(stream, decoder)
        if type(event) is not Adopted:
            raise ProtocolError("E_BAD_PROTOCOL", f"expected ADOPTED, got {type(event).__name__}")
        ids.extend(event.ids)
    return ids


STATE_FILE = "replication.dat"


def load_state(data_path: str) -> dict | None:
    """This node's replication state (``replication.dat``: ``epoch``, and ``running`` while it runs), None when
    the data directory has none (a node that never ran with replication, or an empty directory)."""
    try:
        with open(os.path.join(data_path, STATE_FILE), "rb") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.error("REPLICATION: could not read %s - %s", STATE_FILE, exc)
        return None
    return state if isinstance(state, dict) else None


def save_state(data_path: str, epoch: int, running: bool) -> None:
    replace_file(os.path.join(data_path, STATE_FILE), json.dumps({"epoch": epoch, "running": running}).encode())
