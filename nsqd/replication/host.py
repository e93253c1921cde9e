"""ReplicaHost: the replica's side, in every node: the ``  R1`` connections, the stores, takeover.

A connection is served by ``serve`` (called by the TCP listener after the magic): HELLO, WELCOME, then every
receive buffer's data frames are written in one ``ReplicaStore.write`` (one write, one sync in durable mode),
answered by one ACK, and only then indexed (``ReplicaStore.apply``: the ACK waits for the disk, not for the
index); when more has arrived meanwhile it is stored and acknowledged before the index catches up. A bad frame gets an
ERROR frame and closes that connection only. ``run`` watches the origins whose stream closed and takes them over after
``--replica-takeover-timeout`` once their address refuses connections (an origin that still accepts them is alive: this
replica restarted, or the origin's reconnections back off, up to 5 s; it is waited for, ``REACHABLE_GRACE`` at most);
``takeover`` does it at once (``POST /replica/takeover``), in slices of ``TAKEOVER_SLICE`` between which the event
loop runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from protocol.errors import E_BAD_PROTOCOL, ProtocolError
from protocol.replication import (
    E_BAD_HELLO,
    E_BAD_SEQ,
    E_EXITING,
    E_NODE_CONFLICT,
    E_STORE_FAILED,
    E_TAKING_OVER,
    HEARTBEAT_FRAME,
    PROTOCOL_VERSION_MIN,
    Ack,
    Adopted,
    Ask,
    ChannelOp,
    Confirm,
    Confirmed,
    Error,
    Finished,
    Heartbeat,
    Hello,
    Holding,
    Messages,
    Ping,
    Pong,
    ReplicationDecoder,
    Requeued,
    Restored,
    Synced,
    Welcome,
    encode,
    encode_restore,
    negotiate,
)

from ..streams import PrefixedStream
from .adopted import FRAME_IDS, AdoptedIds, Adoption, AdoptionFailed, settle_adopted
from .sender import receive_adopted, receive_event, side_connection, unreachable
from .store import ReplicaStore, store_nodes

__all__ = ["ReplicaHost", "OriginStatistics"]

log = logging.getLogger("nsqd")

HANDSHAKE_TIMEOUT = 5.0
#: an origin silent this long is taken for gone and its connection closed (the takeover wait starts then): an
#: origin of version 2 or later heartbeats after each second without a write; one of version 1 every 5 s, so a
#: version 1 stream gets ``ORIGIN_SILENCE_V1``
ORIGIN_SILENCE = 5.0
ORIGIN_SILENCE_V1 = 15.0
#: bytes asked for per read of an origin's stream: a group commit's frames of several connections in one read,
#: so one store and one ACK cover them
RECEIVE_SIZE = 256 * 1024
_DATA_EVENTS = (Messages, Finished, Requeued, ChannelOp)
#: received batches stored and acknowledged while more data waited, before they are indexed all the same
APPLY_LAG = 16
#: a silent origin whose address still accepts connections is waited for this long (from the end of its stream, or
#: this node's start) before its copies are adopted all the same: a process hung with its port open
REACHABLE_GRACE = 60.0
#: an origin back without its data (its HELLO says ``clean: false``) waits this long at most for its replicas to
#: agree which one adopts its copies (``_agree``), within the 5 s it waits for a WELCOME
AGREE_ON_HELLO = 2.5
#: the ids of a takeover are told to the origin's other replicas (ASK) this long after the origin heard them too
RECENT_TAKEOVER = 30.0
#: how often a replica asks again the replica ahead of it whether it adopted the origin
AGREE_INTERVAL = 0.25
#: a takeover places the messages it adopts for this long at most, then lets the event loop run a turn: the streams
#: of the other origins (their ACKs and heartbeat answers), clients and ASK go on while it adopts. Done in one step,
#: the takeover of an origin that left a backlog of 964,320 messages held this node's loop for 7.7 s on the 2-core
#: development machine, past the 5 s after which each origin streaming here takes it for gone
#: (``sender.PEER_TIMEOUT``): with ``--replication-min-insync`` equal to its copies, such an origin refused
#: publishes until it reconnected.
TAKEOVER_SLICE = 0.02
#: the most JSON a WELCOME's ``topics`` carries (an origin's decoder takes frames of 64 MiB; thousands of topics
#: take a few hundred KiB)
TOPOLOGY_LIMIT = 16 * 1024 * 1024


def _write_now(stream, data: bytes) -> int:
    """Write what a plain TCP stream takes of ``data`` right now, without a turn of the event loop; returns how
    much (the rest, errors included, is left to ``send_all``)."""
    if type(stream) is not trio.SocketStream:
        return 0
    try:
        return os.write(stream.socket.fileno(), data)
    except OSError:
        return 0


def _read_now(stream) -> bytes | None:
    """What a plain TCP stream holds right now (None: nothing, end of stream or error, all left to the awaited
    read), without a turn of the event loop."""
    if type(stream) is not trio.SocketStream:
        return None
    try:
        return os.read(stream.socket.fileno(), RECEIVE_SIZE) or None
    except OSError:
        return None


@dataclass(frozen=True)
class OriginStatistics:
    node: str
    state: str  # connected, gone, adopted
    held_messages: int
    held_bytes: int
    topics: int
    epoch: int
    seq: int
    down_since: float | None  # wall-clock seconds
    #: records of the store found damaged or lost since start-up (a new backfill was asked for: see store.py)
    damaged_records: int = 0


class _Origin:
    __slots__ = (
        "node",
        "store",
        "connected",
        "down_since",
        "down_at",
        "cancel",
        "session",
        "generation",
        "probe_at",
        "probing",
        "adopted_ids",
        "adopted_at",
        "agree_logged",
        "taking",
        "listed",
    )

    def __init__(self, node: str, store: ReplicaStore) -> None:
        self.node = node
        self.store = store
        self.connected = False
        self.down_since: float | None = time.time()  # wall clock, for /stats
        self.down_at = trio.current_time() if _in_trio() else 0.0
        self.cancel: trio.CancelScope | None = None
        self.session = ""  # the session of the connected stream
        self.generation = 0  # counts the connections; only the current one may mark the origin gone
        self.probe_at = 0.0  # a silent origin found reachable: when to look again (trio clock)
        self.probing = False  # a connection to its address is under way
        self.adopted_ids: list[bytes] = []  # the last takeover's, answered to ASK a while after the origin heard them
        self.adopted_at = -RECENT_TAKEOVER  # when (trio clock)
        self.agree_logged = False  # the wait for a replica ahead was logged
        self.taking: _Takeover | None = None  # a takeover under way
        #: the ids the other replicas listed as adopted when this one last asked them (``_agree``): left to them by a
        #: takeover that stops waiting for the replica ahead
        self.listed: frozenset[bytes] = frozenset()


class _Takeover:
    """A takeover under way: what it leaves to another replica, the ids it adopted so far, and its end."""

    __slots__ = ("left", "adopted", "done")

    def __init__(self, left: frozenset[bytes]) -> None:
        self.left = left
        self.adopted: list[bytes] = []
        self.done = trio.Event()


def _in_trio() -> bool:
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


class ReplicaHost:
    """The stores this node keeps for its origins (``NSQD.replica_host``)."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        self.opts = nsqd.opts
        self.origins: dict[str, _Origin] = {}
        self.takeovers = 0
        self.adopted_messages = 0
        self.left_to_peers = 0  # held copies a takeover left to the replica that had adopted them (``_agree``)
        self._wake = trio.Event()
        self._tls_client = None  # the context of CONFIRM's connections over TLS, made at the first

    @property
    def node(self) -> str:
        return self.nsqd.node_name

    def _open_store(self, node: str) -> ReplicaStore:
        opts = self.opts
        return ReplicaStore(
            node,
            self.nsqd.data_path,
            durable=self.nsqd.durable,
            max_record_size=opts.max_body_size + (1 << 20),
            max_bytes_per_file=opts.max_bytes_per_file,
            sync_timeout=opts.sync_timeout,
        )

    def load(self) -> None:
        """Open the stores left in the data directory (start-up)."""
        for node in store_nodes(self.nsqd.data_path):
            try:
                origin = self.origins[node] = _Origin(node, self._open_store(node))
            except (OSError, ValueError) as exc:
                log.error("REPLICA(%s): could not open the store - %s", node, exc)
                continue
            if origin.store.held:
                log.info("REPLICA(%s): holding %d message(s)", node, len(origin.store.held))

    def close(self) -> None:
        for origin in self.origins.values():
            try:
                origin.store.close()
            except OSError as exc:
                log.error("REPLICA(%s): failed to close - %s", origin.node, exc)

    # -- the connection --------------------------------------------------------------------------------------------
    async def serve(self, stream, remote: str, initial: bytes) -> None:
        """One origin's stream, after the ``  R1`` magic; ``initial``: the bytes read after it."""
        if not initial:  # what follows the magic says whether the origin starts TLS
            with trio.move_on_after(HANDSHAKE_TIMEOUT):
                try:
                    initial = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return
        tls = initial[:1] == b"\x16"  # a TLS ClientHello: the origin upgrades
        if tls:
            context = self.nsqd.tls_context
            if context is None:
                log.error("REPLICATION: [%s] TLS asked for but this node has no certificate, closing", remote)
                await self._send_error(stream, E_BAD_PROTOCOL, "TLS is not configured on this node")
                return
            stream = trio.SSLStream(PrefixedStream(stream, initial), context, server_side=True)
            initial = b""
        elif self.opts.tls_required_on_tcp():  # as for V2 clients: nothing passes this port in the clear
            log.error("REPLICATION: [%s] a stream without TLS, which this node requires, closing", remote)
            await self._send_error(stream, E_BAD_PROTOCOL, "TLS is required on this node")
            return
        decoder = ReplicationDecoder(max_frame_size=self.opts.max_body_size + (1 << 20))
        decoder.receive_data(initial)
        origin = None
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                hello = await receive_event(stream, decoder)
            if type(hello) is Confirm:
                await self._answer_confirm(stream, hello)
                return
            if type(hello) is Ask:
                await self._answer_ask(stream, hello)
                return
            if type(hello) is not Hello:
                raise ProtocolError(E_BAD_HELLO, f"expected HELLO, got {type(hello).__name__}")
            if hello.node == self.node:
                raise ProtocolError(E_NODE_CONFLICT, f"node {hello.node} is this node")
            # the stream speaks the newest version both ends speak: an older origin gets only its own frames
            version = decoder.version = negotiate(
                self.nsqd.replication_version, PROTOCOL_VERSION_MIN, hello.version, hello.min_version
            )
            await self._confirm(hello, tls)
            origin = self._claim(hello)
            generation = origin.generation
            store = origin.store
            store.apply()  # what a previous connection left unindexed
            if hello.peers and (hello.peers, hello.replica) != (store.peers, store.me):
                store.peers, store.me = hello.peers, hello.replica
                store.json_dirty = True
            if not hello.clean and store.held and hello.session != store.session:
                # the origin may have lost acknowledged messages (killed without durable mode, or back with an
                # empty directory): what is held here is delivered here; the epoch tells the origin to drop its own
                log.warning(
                    "REPLICATION: origin %s is back without all of its messages: taking over what is held here",
                    hello.node,
                )
                left: frozenset[bytes] | str = "ahead"
                with trio.move_on_after(AGREE_ON_HELLO):
                    while isinstance(left := await self._agree(origin, hello=True), str):
                        await trio.sleep(AGREE_INTERVAL)
                if origin.generation == generation and store.held:
                    await self.takeover(hello.node, origin.listed if isinstance(left, str) else left)
            log.info(
                "REPLICATION: [%s] origin %s connected (session %s, epoch %d)",
                remote,
                hello.node,
                hello.session,
                hello.epoch,
            )
            adopted = AdoptedIds(self.nsqd.data_path, hello.node)
            ids = adopted.load()
            await stream.send_all(
                encode(
                    Welcome(
                        self.node,
                        store.session,
                        store.seq,
                        store.epoch,
                        len(store.held),
                        adopted=len(ids),
                        version=version,
                        # an origin that may have lost its directory learns its channels before it takes a publish
                        topics=None if hello.clean else self._topology(store),
                    )
                )
            )
            for start in range(0, len(ids), FRAME_IDS):  # what the origin must not deliver again
                await stream.send_all(encode(Adopted(tuple(ids[start : start + FRAME_IDS]))))
            if hello.node_id == self.opts.node_id:
                log.warning(
                    "REPLICATION: origin %s has this node's --node-id %d: the message IDs of adopted "
                    "messages may collide with this node's own; give every node its own --node-id",
                    hello.node,
                    hello.node_id,
                )
            if hello.epoch < store.epoch:
                log.warning(
                    "REPLICATION: origin %s returns with epoch %d: its messages were adopted here (epoch %d)",
                    hello.node,
                    hello.epoch,
                    store.epoch,
                )
            with trio.CancelScope() as origin.cancel:
                if ids:  # the origin reads the whole list before it sends anything: then it may go
                    data = b""
                    with trio.move_on_after(ORIGIN_SILENCE if version >= 2 else ORIGIN_SILENCE_V1):
                        data = await stream.receive_some(65536)
                    if not data:
                        raise trio.BrokenResourceError("no answer to the list of adopted messages")
                    decoder.receive_data(data)
                    adopted.clear()
                    self._settle(hello.node)
                if hello.release:
                    self._release(origin)
                else:
                    await self._stream(origin, hello.session, stream, decoder, version)
        except ProtocolError as error:
            log.error("REPLICATION: [%s] %s %s, closing", remote, error.code, error.description)
            await self._send_error(stream, error.code, error.description)
        except trio.TooSlowError:
            log.error("REPLICATION: [%s] no HELLO within %g s, closing", remote, HANDSHAKE_TIMEOUT)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("REPLICATION: [%s] connection closed - %s", remote, exc)
        finally:
            if origin is not None and self.nsqd.exiting:
                with trio.CancelScope(shield=True):
                    await self._say_exiting(stream)
            if origin is not None:
                try:
                    origin.store.apply()
                except OSError as exc:
                    log.error("REPLICA(%s): could not index what was stored - %s", origin.node, exc)
            if origin is not None and origin.generation == generation:
                origin.connected = False
                origin.cancel = None
                origin.down_since = time.time()
                origin.down_at = trio.current_time()
                self._wake.set()
                if origin.store.held:
                    log.info("REPLICATION: origin %s gone, holding %d message(s)", origin.node, len(origin.store.held))

    def _release(self, origin: _Origin) -> None:
        """The origin replaced this node by another replica (it was away too long, PROTOCOL.md "A peer gone for
        good"): what is held of it goes, and the stream ends. A HELLO that is not ``clean`` took over first, as any."""
        held = len(origin.store.held)
        origin.store.remove()
        log.warning(
            "REPLICATION: origin %s replaced this node as its replica: %d held message(s) dropped", origin.node, held
        )

    def _topology(self, store: ReplicaStore) -> dict | None:
        """WELCOME's ``topics`` for an origin that is not ``clean``: its topics and channels as this store knows them;
        None when it knows none, or (logged) when their JSON passes ``TOPOLOGY_LIMIT`` bytes."""
        topology = store.topology()
        if not topology:
            return None
        size = len(json.dumps(topology, separators=(",", ":")))
        if size > TOPOLOGY_LIMIT:
            log.warning(
                "REPLICATION: origin %s has %d topic(s), %d bytes past what a WELCOME carries: it learns its channels "
                "from nsqlookupd alone",
                store.node,
                len(topology),
                size,
            )
            return None
        return topology

    async def _confirm(self, hello: Hello, tls: bool) -> None:
        """Whether the node a HELLO names sent it: the replica asks that address, on a connection of its own
        (TLS when the HELLO came over TLS), whether the HELLO's session is its own (CONFIRM, CONFIRMED). A claim
        not confirmed is ``E_NODE_CONFLICT``: whatever a connection says of itself, it cannot stream for a node
        it is not (a dead node's name would force a takeover, and a clean HELLO with an empty backfill would drop
        that node's copies), and two nodes that share a name find out."""
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                async with side_connection(hello.node, self._client_tls() if tls else None) as stream:
                    await stream.send_all(encode(Confirm(hello.node, hello.session)))
                    answer = await receive_event(stream, ReplicationDecoder())
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError) as exc:
            why = str(exc) or type(exc).__name__
        except trio.TooSlowError:
            why = f"no answer within {HANDSHAKE_TIMEOUT:g} s"
        else:
            if answer == Confirmed(hello.node, hello.session):
                return
            why = f"{answer.code} {answer.text}" if type(answer) is Error else f"answered {type(answer).__name__}"
        raise ProtocolError(E_NODE_CONFLICT, f"node {hello.node} did not confirm session {hello.session} - {why}")

    async def _answer_confirm(self, stream, ask: Confirm) -> None:
        """The other side of ``_confirm``: a HELLO naming this node with ``ask.session`` was its own."""
        sender = self.nsqd.replication
        if sender is None or ask.node != sender.node or ask.session != sender.session:
            raise ProtocolError(E_NODE_CONFLICT, f"node {ask.node} with session {ask.session} is not this node")
        await stream.send_all(encode(Confirmed(ask.node, ask.session)))

    async def _answer_ask(self, stream, ask: Ask) -> None:
        """Another replica of ``ask.node`` is about to take it over: what this node holds of it, whether its stream
        is connected here, and the ids of its messages adopted here (``_agree`` on the other side)."""
        origin = self.origins.get(ask.node)
        ids = AdoptedIds(self.nsqd.data_path, ask.node).load()
        held = len(origin.store.held) if origin is not None else 0
        if origin is not None and (taking := origin.taking) is not None:
            # what it still holds is being adopted here too: the asker must leave it, and need not wait for it (none
            # of it is held here for a takeover still to come)
            left = taking.left
            ids = ids + taking.adopted + [msg_id for msg_id in origin.store.held if msg_id not in left]
            held = 0
        elif not ids and origin is not None and trio.current_time() - origin.adopted_at < RECENT_TAKEOVER:
            ids = origin.adopted_ids  # the origin heard of them already, the other replicas may not have
        connected = origin is not None and origin.connected
        await stream.send_all(encode(Holding(ask.node, connected, held, len(ids))))
        for start in range(0, len(ids), FRAME_IDS):
            await stream.send_all(encode(Adopted(tuple(ids[start : start + FRAME_IDS]))))

    async def _ask(self, peer: str, node: str) -> tuple[Holding, list[bytes]] | None:
        """Ask ``peer`` (as the origin ``node`` names it) what it holds and adopted of ``node``; None when it does not
        answer (down, or a node of a version without ASK, which answers ERROR)."""
        tls = self._client_tls() if self.nsqd.tls_context is not None else None
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                async with side_connection(peer, tls) as stream:
                    await stream.send_all(encode(Ask(node)))
                    decoder = ReplicationDecoder()
                    answer = await receive_event(stream, decoder)
                    if type(answer) is not Holding:
                        return None
                    ids = await receive_adopted(stream, decoder, answer.adopted) if answer.adopted else []
        except (OSError, ValueError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            return None
        except ProtocolError:
            return None
        return answer, ids

    async def _agree(self, origin: _Origin, *, hello: bool) -> frozenset[bytes] | str:
        """Before this replica takes ``origin`` over: which of its held messages another replica of the same origin
        adopted already (this node adopts the rest), or why to wait instead: a replica ahead of this one in the
        origin's ``--replicate-to`` order holds copies it has not adopted yet (``"ahead"``), or (``hello`` False:
        the origin is silent here) another replica has the origin's stream connected (``"alive"``: a partition
        cuts this node off, the origin lives). PROTOCOL.md, "Two replicas of one origin"."""
        store = origin.store
        peers, me = store.peers, store.me
        others = [peer for peer in peers if peer != me]
        if not others or me not in peers:
            return frozenset()  # an origin of one replica, or of a version that does not say its peers
        ahead = peers[: peers.index(me)]
        answers: dict[str, tuple[Holding, list[bytes]] | None] = {}

        async def ask(peer: str) -> None:
            answers[peer] = await self._ask(peer, origin.node)

        async with trio.open_nursery() as nursery:
            for peer in others:
                nursery.start_soon(ask, peer)
        adopted: set[bytes] = set()
        alive, holding_ahead = [], []
        for peer in others:
            answer = answers.get(peer)
            if answer is None:
                continue
            holding, ids = answer
            adopted.update(ids)
            if holding.connected and not hello:
                alive.append(peer)
            elif peer in ahead and holding.held:
                # copies it holds for a takeover of its own still to come, whatever ids it lists: those may be an
                # earlier takeover's (the origin came back, and died again within ``RECENT_TAKEOVER``), which say
                # nothing of the copies held now; adopting these here too would deliver them twice
                holding_ahead.append(peer)
        origin.listed = frozenset(adopted)
        if not alive and not holding_ahead:
            return origin.listed
        if not origin.agree_logged:
            origin.agree_logged = True
            log.info(
                "REPLICATION: origin %s: %s, waiting",
                origin.node,
                f"its stream is connected to {', '.join(alive)}"
                if alive
                else f"{', '.join(holding_ahead)}, ahead of this node in its order, takes it over",
            )
        return "alive" if alive else "ahead"

    def _client_tls(self):
        if self._tls_client is None:
            self._tls_client = self.nsqd.replication_ssl_context()
        return self._tls_client

    def _claim(self, hello: Hello) -> _Origin:
        """The origin a confirmed HELLO names, marked connected."""
        node = hello.node
        origin = self.origins.get(node)
        if origin is None:
            origin = self.origins[node] = _Origin(node, self._open_store(node))
            self._wake.set()  # its store is synced from now on (``run``)
        if origin.taking is not None:  # its store is being read and removed: it comes back to the store's end
            raise ProtocolError(E_TAKING_OVER, f"node {node} is being taken over here")
        if origin.connected and origin.cancel is not None:
            # the node at that address confirmed this stream: its previous connection broke without this side
            # noticing yet (the same session: it reconnected; another: it restarted)
            log.info("REPLICATION: origin %s reconnected, closing its previous connection", node)
            origin.cancel.cancel()
        elif origin.connected:
            raise ProtocolError(E_NODE_CONFLICT, f"node {node} is already connected")
        origin.connected = True
        origin.session = hello.session
        origin.generation += 1
        origin.down_since = None
        origin.probe_at = 0.0
        return origin

    async def _stream(self, origin: _Origin, session: str, stream, decoder: ReplicationDecoder, version: int) -> None:
        """Store what each receive buffer holds, then answer it: ACK of the last seq, or a heartbeat for a
        heartbeat. A session this replica knows resumes with the next seq; otherwise the stream opens with a
        backfill (data frames of seq 0, then SYNCED), after which messages not in it are released."""
        store = origin.store
        silence = ORIGIN_SILENCE if version >= 2 else ORIGIN_SILENCE_V1
        last = store.seq if session == store.session else 0
        first_frame = True
        damaged = store.damaged
        backfill = False  # a backfill is running (data frames of seq 0 until SYNCED)
        # an event is told by its type (``kind``), which mypy does not follow: read as Any, with no cast per frame
        next_event: Callable[[], Any] = decoder.next_event
        while True:
            events = []
            frames = []  # as received: stored without encoding them again
            acked = last
            heartbeat = synced = False
            ping = None
            restore_for = None  # the seq of a SYNCED that named damaged queues of the origin
            while (event := next_event()) is not None:
                kind = type(event)
                if kind in _DATA_EVENTS or kind is Synced:
                    if first_frame and (event.seq == 0 or kind is Synced):  # a backfill (maybe empty)
                        backfill = True
                        store.begin_backfill()
                    first_frame = False
                    if backfill:
                        if kind is Synced:
                            backfill = False
                            last = event.seq
                            synced = True
                            if event.damaged:
                                restore_for = event.seq
                        elif event.seq != 0:
                            raise ProtocolError(E_BAD_SEQ, f"frame seq {event.seq} inside a backfill")
                    else:
                        if event.seq != last + 1:
                            raise ProtocolError(E_BAD_SEQ, f"frame seq {event.seq} after {last}")
                        last = event.seq
                        if kind is Synced:
                            continue
                        if kind is Messages and event.channel:
                            raise ProtocolError(E_BAD_PROTOCOL, "MESSAGES frame of a channel outside a backfill")
                    events.append(event)
                    frames.append(decoder.last_frame)
                elif kind is Heartbeat:
                    heartbeat = True
                elif kind is Ping:  # version 2 (the decoder refuses it on an older stream)
                    ping = event
                else:
                    raise ProtocolError(E_BAD_PROTOCOL, f"unexpected {kind.__name__} frame from an origin")
            if events:
                self._on_disk(store.write, events, frames)
            if last != acked or synced:
                if session != store.session:
                    store.json_dirty = True  # a restart of this replica must know the origin's session
                store.session, store.seq = session, last
                ack = encode(Ack(last))  # on disk: the index follows the ACK
                written = _write_now(stream, ack)
                if written < len(ack):
                    await stream.send_all(ack[written:])
            elif heartbeat:
                await stream.send_all(HEARTBEAT_FRAME)
            if ping is not None:
                await stream.send_all(encode(Pong(ping.clock)))
            # what came meanwhile is stored and acknowledged first; the index follows once the socket is idle
            data = _read_now(stream) if not synced and store.unapplied < APPLY_LAG else None
            if data is None:
                self._on_disk(store.apply)
                if store.damaged != damaged:
                    # reading back what it stored, the store found records damaged (it forgot the session):
                    # the origin reconnects at once and sends a new backfill
                    raise ProtocolError(E_STORE_FAILED, "records of the store found damaged: a new backfill is needed")
                if synced:
                    log.info(
                        "REPLICATION: origin %s backfilled: %d message(s) held, %d released",
                        origin.node,
                        len(store.held),
                        store.backfill_released,
                    )
                if restore_for is not None:
                    await self._restore(origin, stream, restore_for)
                with trio.move_on_after(silence) as scope:
                    data = await stream.receive_some(RECEIVE_SIZE)
                if scope.cancelled_caught:
                    raise trio.BrokenResourceError(f"origin silent for {silence:g} s")
                if not data:
                    raise trio.BrokenResourceError("closed by the origin")
            decoder.receive_data(data)

    async def _restore(self, origin: _Origin, stream, seq: int) -> None:
        """The origin's backfill up to ``seq`` named queues it found damaged: send back the copies it left out of
        them (``ReplicaStore._keep_for_restore``), read again from the store's files: one RESTORE frame per stored
        MESSAGES frame and channel, then RESTORED(seq), after which the origin no longer asks for them."""
        store = origin.store
        restore = store.take_restore()
        wanted = sum(map(len, restore.values()))
        sent = 0
        if restore:
            copies = store.read_restore(restore)
            try:
                for topic, channel, messages in copies:
                    rows = [(m.id, m.timestamp, m.attempts, m.due_ns, m.body) for m in messages]
                    await stream.send_all(encode_restore(topic, channel, rows))
                    sent += len(rows)
            finally:
                copies.close()
        await stream.send_all(encode(Restored(seq)))
        log.warning(
            "REPLICATION: origin %s found its files damaged: sent back %d cop(ies) it had lost (%d wanted)",
            origin.node,
            sent,
            wanted,
        )

    @staticmethod
    def _on_disk(step, *args) -> None:
        """A store's ``write`` or ``apply``: a disk error ends the stream with ``E_STORE_FAILED``."""
        try:
            step(*args)
        except OSError as exc:
            raise ProtocolError(E_STORE_FAILED, f"could not store: {exc}") from None

    @staticmethod
    async def _say_exiting(stream) -> None:
        """A graceful stop: ``E_EXITING`` tells the origin to reconnect as soon as this node is back instead of
        backing off. Then read until the origin closes (1 s at most): closing with its frames unread would reset the
        connection, and a reset can take the ERROR with it before the origin read it."""
        with trio.move_on_after(1):
            with contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError, OSError
            ):
                await stream.send_all(encode(Error(E_EXITING, "this node is stopping")))
                while await stream.receive_some(RECEIVE_SIZE):
                    pass

    @staticmethod
    async def _send_error(stream, code: str, text: str) -> None:
        with trio.move_on_after(1):
            with contextlib.suppress(
                trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError, OSError
            ):
                await stream.send_all(encode(Error(code, text)))

    # -- takeover --------------------------------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Take over the origins whose stream stayed closed for ``--replica-takeover-timeout`` and whose address
        refuses connections (``_take_over_if_gone``); sync the stores that are not synced per batch."""
        timeout = self.opts.replica_takeover_timeout
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                now = trio.current_time()
                # no origin, nothing to sync or take over: sleep until one comes (``_claim``), not every sync_timeout
                next_at = now + max(self.opts.sync_timeout, 0.05) if self.origins else math.inf
                for origin in list(self.origins.values()):
                    if origin.taking is not None:
                        continue  # its store is the takeover's
                    if not self.nsqd.durable:
                        origin.store.sync_if_due(now)
                    if origin.connected or origin.probing or not origin.store.held or timeout <= 0:
                        continue
                    due = max(origin.down_at + timeout, origin.probe_at)
                    if due <= now:
                        origin.probing = True
                        nursery.start_soon(self._take_over_if_gone, origin, timeout)
                    else:
                        next_at = min(next_at, due)
                with trio.move_on_at(next_at):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def _take_over_if_gone(self, origin: _Origin, timeout: float) -> None:
        """``origin`` is silent for ``timeout``: take it over unless its address accepts a connection. A replica
        that restarts finds its origins silent though they live (their reconnections back off, up to 5 s): adopting
        their copies would deliver their backlogs twice. One that stays reachable and silent for
        ``REACHABLE_GRACE`` is taken over all the same."""
        try:
            await self._take_over_if_agreed(origin, timeout)
        except AdoptionFailed:  # (logged) tried again a while later
            origin.probe_at = trio.current_time() + max(timeout, 1.0)
        finally:
            origin.probing = False
            self._wake.set()

    async def _take_over_if_agreed(self, origin: _Origin, timeout: float) -> None:
        why = await unreachable(origin.node)
        now = trio.current_time()
        if origin.connected or not origin.store.held or origin.down_at + timeout > now:
            return  # it came back meanwhile
        silent = now - origin.down_at
        if why is None:
            if silent < REACHABLE_GRACE:
                if not origin.probe_at:
                    log.info(
                        "REPLICATION: origin %s silent for %g s but accepting connections: waiting for its stream",
                        origin.node,
                        timeout,
                    )
                origin.probe_at = now + max(timeout, 0.5)
                return
            log.warning(
                "REPLICATION: origin %s silent for %g s though it accepts connections, taking over",
                origin.node,
                REACHABLE_GRACE,
            )
        left = await self._agree(origin, hello=False)
        now = trio.current_time()
        if origin.connected or not origin.store.held:
            return
        if isinstance(left, str):
            # alive elsewhere: held while it lives there; a replica ahead: given REACHABLE_GRACE to take it over
            if left == "alive" or now - origin.down_at < REACHABLE_GRACE:
                origin.probe_at = now + 4 * AGREE_INTERVAL
                return
            log.warning(
                "REPLICATION: origin %s: the replica ahead of this node did not take it over in %g s, taking over",
                origin.node,
                REACHABLE_GRACE,
            )
            left = origin.listed
        if why is not None:
            log.warning(
                "REPLICATION: origin %s silent for %g s and unreachable (%s), taking over",
                origin.node,
                timeout,
                why,
            )
        await self.takeover(origin.node, left)

    async def takeover(self, node: str, left: frozenset[bytes] = frozenset()) -> int:
        """Adopt the unfinished messages of ``node`` into this node's topics and channels, but those in ``left``
        (another replica adopted them: ``_agree``); returns how many. KeyError for a node this replica holds
        nothing of. A takeover already under way is waited for (this one then finds nothing: 0).

        It runs in slices of ``TAKEOVER_SLICE``, shielded from cancellation (half of it done would be adopted again
        from the store after a restart). Meanwhile the origin's HELLO is refused (``E_TAKING_OVER``: its store is
        being read, then removed) and an ASK is answered with every id the takeover adopts, done or still held."""
        origin = self.origins[node]
        if origin.taking is not None:
            await origin.taking.done.wait()
            return 0
        taking = origin.taking = _Takeover(left)
        count = 0
        try:
            with trio.CancelScope(shield=True):
                count = await self._take_over(origin, taking)
        finally:
            origin.taking = None
            taking.done.set()
            self._wake.set()
        return count

    async def _take_over(self, origin: _Origin, taking: _Takeover) -> int:
        node, left = origin.node, taking.left
        if origin.cancel is not None:
            origin.cancel.cancel()  # a live stream stops: the data is ours now
        store = origin.store
        nsqd = self.nsqd
        count = 0
        # topics and channels as they were on the origin, before any message goes in
        states = {name: (ts.paused, dict(ts.channels)) for name, ts in store.topics.items()}
        mesh = getattr(nsqd, "mesh", None)
        adoption = Adoption(nsqd) if mesh is None else mesh.adoption()
        adopted = taking.adopted
        skipped = 0
        try:
            await adoption.prepare(states)
            slice_end = trio.current_time() + TAKEOVER_SLICE
            for topic_name, batch in store.adopt():
                if left:
                    kept = [entry for entry in batch if entry[0].id not in left]
                    skipped += len(batch) - len(kept)
                    if not kept:
                        continue
                    batch = kept
                await adoption.place(topic_name, batch)
                count += len(batch)
                adopted.extend(m.id for m, _finished, _requeued in batch)
                if trio.current_time() >= slice_end:
                    await trio.sleep(0)
                    slice_end = trio.current_time() + TAKEOVER_SLICE
            await adoption.placed()  # the store goes only once every message is in its topic (its owner answered)
        except AdoptionFailed as exc:
            log.error("REPLICATION: takeover of origin %s stopped, its copies kept for the next one - %s", node, exc)
            if not nsqd.exiting:  # (the takeover read the store's index away: read again from its files)
                store.close()
                origin.store = self._open_store(node)
            raise
        AdoptedIds(nsqd.data_path, node).add(adopted)  # before the store goes: its origin must hear of them
        origin.adopted_ids, origin.adopted_at = adopted, trio.current_time()
        origin.agree_logged = False
        store.epoch += 1
        await adoption.note(node, store.epoch)
        store.remove()
        self.takeovers += 1
        self.adopted_messages += count
        self.left_to_peers += skipped
        log.warning(
            "REPLICATION: took over origin %s: %d message(s) adopted (epoch %d)%s",
            node,
            count,
            store.epoch,
            f", {skipped} left to the replica that adopted them first" if skipped else "",
        )
        return count

    def _settle(self, node: str) -> None:
        """Origin ``node`` heard which of its messages were adopted here: the log channels' notes of those
        takeovers say so from now on (``settled``), in every worker's."""
        settle_adopted(self.nsqd, node)
        mesh = getattr(self.nsqd, "mesh", None)
        if mesh is not None:
            mesh.settle_adopted(node)

    # -- statistics ------------------------------------------------------------------------------------------------
    def statistics(self) -> list[OriginStatistics]:
        out = []
        for node, origin in sorted(self.origins.items()):
            store = origin.store
            store.apply()
            state = "connected" if origin.connected else ("gone" if store.held else "idle")
            out.append(
                OriginStatistics(
                    node=node,
                    state=state,
                    held_messages=len(store.held),
                    held_bytes=store.held_bytes,
                    topics=len(store.topics),
                    epoch=store.epoch,
                    seq=store.seq,
                    down_since=origin.down_since,
                    damaged_records=store.damaged,
                )
            )
        return out
