"""One node served by several worker processes (``--workers N``): what each worker owns, and what crosses.

Every worker accepts connections on the listening sockets the parent bound (``supervisor.py``) and does the
per-connection work of those it accepted: reads, parsing, IDENTIFY, AUTH, TLS, compression, heartbeats and
writes. Each topic, with its channels, queues, in-flight and deferred messages, has one owner:
``zlib.crc32(name) % N`` (``owner_of``). N alone decides it, not the order topics came in, so a restart with the
same N finds each topic where it was; the files of a topic are named by the topic alone, so a restart with
another N opens them in their new owner. NSQ's rules per channel are then one process's rules, with the code of
one nsqd.

What crosses, over one unix socketpair per pair of workers (``Link``), pickled as one batch per step of the read
poller (the records of one step go together), read at the other end by its read poller:

- a PUB, MPUB or DPUB (TCP or HTTP) to a topic owned elsewhere: the bodies go to the owner, acknowledged by this
  worker at once (``publish_acknowledged``), or the owner's answer comes back while its disk refuses the topic;
- a connection itself: after its first publish to a topic owned elsewhere, or with its SUB to one, a plain
  connection (no TLS, compression or AUTH, nothing unsent) goes to that owner with its descriptor (SCM_RIGHTS),
  its IDENTIFY state and its unparsed bytes (``hand_over``), once (a producer only while the owner is not busy,
  ``may_hand_over``; a consumer whatever its load): its later publishes and deliveries cross nothing;
- a SUB to a channel owned elsewhere: the owner adds a stand-in (``RemoteClient``) to the channel, which it
  dispatches to as to any consumer; the message frames it appends go back to the accepting worker in one record
  per step, which writes them to the socket. RDY, FIN, REQ, TOUCH, CLS and the close go to the owner
  (``RemoteChannel``), whose refusals (``E_FIN_FAILED``...) come back as error frames;
- the log commands (``LOG``, ``LSEEK``, ``LREAD``, ``LCOMMIT``) are answered by the owner (``log_command``);
- ``/topic/*``, ``/channel/*`` and ``/stats?topic=`` are answered by the owner; ``/stats`` and ``/metrics``
  without a topic ask every worker for its part and join them (``node_stats``);
- worker 0 alone registers with nsqlookupd and writes ``nsqd.dat``: the others send it their topics and channels as
  they change (``RelayLookup``, ``RelayMetadata``).

With replication (``--replicate-to``), worker 0 owns every topic and alone runs the node's replication: its
``Replicator``, its replica stores, takeovers and peer replacement, as one nsqd does. The other workers do their
connections' work, and their publishes cross to worker 0 as above, each answered once the peers hold it
(``_answer_replicated``), never acknowledged early. A replication stream another worker accepts goes to worker 0
before anything past its magic is parsed (``hand_replication``), and the replication routes of the HTTP API and
``/ping`` are answered by worker 0. Until worker 0's replicator is ready (its peers said what is still this
node's), the others' client connections wait, as worker 0's do (``replication_ready``).

Without ``--replicate-to`` the topics stay spread, and a node keeps copies for its peers all the same: worker 0
keeps the replica stores (replication streams, CONFIRM, ASK and release connections are handed to it, and
``/replica/takeover`` is answered by it), and a takeover adopts each origin's messages into the topics of their
owners (``MeshAdoption``): the topics and channels are made in each owner first, then each batch crosses as a
publish that keeps the messages' IDs, attempts, delays and finished channels, answered once placed (after the
group commit in durable mode); the store goes only once every owner answered, so a kill -9 of any worker in the
middle loses nothing acknowledged (the node stops, and adopts its store again once restarted). ADOPTED, the
epoch and the list of adopted IDs stay with the store in worker 0.

A link that closes while the node is not stopping means a worker died: this worker stops too (the parent stops
the node; see ``supervisor.py``).
"""

from __future__ import annotations

import array
import contextlib
import itertools
import json
import logging
import os
import pickle
import socket
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from protocol.errors import ProtocolError
from protocol.frames import FRAME_TYPE_ERROR, encode_frame
from protocol.http import Headers, Request
from protocol.log import E_LOG_FAILED
from protocol.lookup_v1 import encode_register, encode_unregister
from protocol.replication import ReplicatedMessage

from . import log_commands
from .activity import IDLE_SHARE, cpu_share
from .client import Client, ClientState, SubscribedChannel
from .lookup import Lookup
from .metadata_writer import MetadataWriter
from .replication.adopted import (
    Adoption,
    AdoptionFailed,
    LogEnd,
    note_adopted,
    place_refused,
    prepare_topics,
    settle_adopted,
)
from .stats import NodeStats, collect, memory_of_processes, producer_stats
from .topic import TopicExiting, TopicFull

__all__ = ["RemoteChannel", "WorkerMesh", "owner_of"]

log = logging.getLogger("nsqd")

_LENGTH = struct.Struct(">I")
#: how often worker 0 looks whether the lookupds it identified with changed (``MeshLookup``)
RELAY_INTERVAL = 1.0
#: how often each worker tells the others how busy it is (``WorkerMesh.may_hand_over``)
LOAD_INTERVAL = 0.5
#: a producer's connection goes to its topic's owner only while the owner was busy less than this share of a core
#: (``WorkerMesh.may_hand_over``): a hot topic's first producers join its owner; once it is busy, the next ones
#: stay where they were accepted and their publishes cross, so the topic's reads and answers use other cores
HAND_OVER_BELOW = 0.7
#: with ``TRIONSQ_SPREAD="<share>,<spare>"`` (unset: never), a busy owner gives one of its producers of big reads
#: (MPUB batches) to a worker that is not busy, every ``LOAD_INTERVAL``, while it used at least ``<share>`` of a
#: core and the machine had at least ``<spare>`` cores idle (``WorkerMesh.spread``): their reads and parsing then
#: run on another core and only their messages cross. Off unless set: measured on 2 cores, a message that crosses
#: so costs the two workers more than the whole publish costs the owner (bench/MULTICORE.md, sixth round, which
#: ran it with ``0.7,0.4``)
_RECEIVE_SIZE = 1 << 18
#: room for the descriptors of handed-over connections one read of a link can bring (``Link.poll_ready``)
_FD_SPACE = socket.CMSG_SPACE(64 * array.array("i").itemsize)
#: a takeover's batches of messages crossing to their topics' owners unanswered at once (``MeshAdoption``)
ADOPT_WINDOW = 16
#: how long a worker waits for worker 0 to write nsqd.dat in durable mode before its commit fails
METADATA_SYNC_TIMEOUT = 10.0


def spread_thresholds() -> tuple[float, float] | None:
    """The owner's share of a core and the machine's idle cores above which a busy owner spreads its producers
    (``TRIONSQ_SPREAD="<share>,<spare>"``); None (never) when unset or not two numbers."""
    text = os.environ.get("TRIONSQ_SPREAD", "")
    if not text:
        return None
    try:
        share, spare = (float(part) for part in text.split(","))
    except ValueError:
        log.error("WORKERS: TRIONSQ_SPREAD=%r is not <share>,<spare>: producers are not spread", text)
        return None
    return share, spare


def idle_ticks() -> int | None:
    """The idle and iowait clock ticks so far of the CPUs this process may run on (``/proc/stat``); None where
    there is none."""
    try:
        cpus = {f"cpu{cpu}" for cpu in os.sched_getaffinity(0)}
        with open("/proc/stat") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    total = 0
    for line in lines[1:]:
        fields = line.split()
        if not fields or not fields[0].startswith("cpu"):
            break
        if fields[0] in cpus and len(fields) > 5:
            total += int(fields[4]) + int(fields[5])
    return total


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def owner_of(name: str | bytes, count: int) -> int:
    """The worker that owns the topic ``name`` among ``count``."""
    return zlib.crc32(name if isinstance(name, bytes) else name.encode()) % count


class WorkerGone(Exception):
    """The worker a request went to stopped before answering."""


class Link:
    """This worker's end of the socketpair to one other worker.

    Records (``send``) and stand-ins' frames (``mark``) queued during a step of the read poller are written at
    the step's end, as one pickled batch (``[length][pickle of a list of records]``) with one ``write``
    (``ReadPoller.defer_reply``); queued outside a step (a channel's slice, an HTTP handler), the writer task
    writes them. The other end is read by the read poller like an idle connection (``poll_ready``), and each
    record of a batch goes to ``WorkerMesh.handle`` there: no task wakes up for a record in either direction."""

    #: what the read poller asks of a member (``poller.Polled``): reads are small, and it ranks before consumers
    last_read = 0
    poll_actor = None
    fast_line = None

    def __init__(self, mesh: WorkerMesh, peer: int, sock) -> None:
        self.mesh = mesh
        self.peer = peer
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        self.stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        self.poller = mesh.nsqd.read_poller
        self.pending: list[tuple] = []
        #: descriptors of connections handed over to the other worker (``WorkerMesh.hand_over``): they go with the
        #: next write, as SCM_RIGHTS, and are closed here once sent
        self.handing: list[int] = []
        self.received: deque[int] = deque()  # descriptors that came with reads, for the ``hand`` records in order
        self.dirty: dict[RemoteClient, None] = {}  # stand-ins with message frames to send back
        self._wake = trio.Event()
        self._scheduled = False  # a write of what is queued is arranged (step's end, or the writer task)
        self._writing = False  # the writer task is writing: what is queued waits for it, in order
        self._rest = b""  # what the socket did not take of a write outside the writer task
        self._buffer = bytearray()
        #: what one read fills (``poll_ready``), kept: ``recvmsg(size)`` allocates ``size`` bytes per call, which
        #: for a link's 256 KiB is an ``mmap``, a ``mremap`` and a ``munmap`` around every read
        self._receive = memoryview(bytearray(_RECEIVE_SIZE))
        self.lost: trio.Event = trio.Event()
        self.batches = 0
        self.records = 0

    def send(self, record: tuple) -> None:
        self.pending.append(record)
        if not self._scheduled:
            self._schedule()

    def backed_up(self) -> bool:
        """The socket did not take all of a write: the other worker reads slower than this one writes."""
        return self._writing or bool(self._rest)

    def mark(self, client: RemoteClient) -> None:
        self.dirty[client] = None
        if not self._scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self._scheduled = True
        if not self.poller.defer_reply(self):
            self._wake.set()

    def _encode(self) -> bytes:
        if self.dirty:
            dirty, self.dirty = self.dirty, {}
            for client in dirty:
                if client.out:
                    self.pending.append(("out", client.front_id, client.take_output()))
        if not self.pending:
            return b""
        batch, self.pending = self.pending, []
        data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        self.batches += 1
        self.records += len(batch)
        return _LENGTH.pack(len(data)) + data

    def send_deferred(self) -> None:
        """The end of a read poller's step: write what the step queued, in one write if the socket takes it."""
        self._scheduled = False
        if self._writing or self._rest:
            self._wake.set()  # the writer task goes on, in order
            return
        data = self._encode()
        if not data:
            return
        try:
            sent = self._write(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            return  # the reader sees the link closed
        if sent < len(data):
            self._rest = data[sent:]
            self._wake.set()

    def _write(self, data: bytes) -> int:
        """One non-blocking write of ``data``; the descriptors being handed over go with its first byte."""
        if not self.handing:
            return os.write(self.fd, data)
        fds, self.handing = self.handing, []
        try:
            return self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        finally:
            for fd in fds:  # in flight, the kernel holds its own reference until the other worker takes it
                os.close(fd)

    async def write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._writing = True
            try:
                while True:
                    if self._rest:
                        data, self._rest = self._rest, b""
                    else:
                        self._scheduled = False
                        data = self._encode()
                    if not data:
                        break
                    if self.handing:
                        await trio.lowlevel.wait_writable(self.sock)
                        try:
                            sent = self._write(data)
                        except BlockingIOError:
                            sent = 0
                        data = data[sent:]
                    await self.stream.send_all(data)
            finally:
                self._writing = False

    def poll_ready(self) -> None:
        """The read poller found the link readable: handle every whole batch read."""
        try:
            count, ancillary, _, _ = self.sock.recvmsg_into([self._receive], _FD_SPACE)
        except BlockingIOError:
            return
        except OSError:
            count = 0
            ancillary = []
        for level, kind, fds in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(fds[: len(fds) - len(fds) % received.itemsize])
                self.received.extend(received)
        if not count:
            self.poller.discard(self.fd)
            self.lost.set()
            return
        buffer = self._buffer
        buffer += self._receive[:count]
        handle = self.mesh.handle_batch
        peer = self.peer
        while len(buffer) >= 4:
            (size,) = _LENGTH.unpack_from(buffer)
            if len(buffer) < 4 + size:
                break
            batch = pickle.loads(bytes(buffer[4 : 4 + size]))
            del buffer[: 4 + size]
            handle(peer, batch)


class RemoteClient(Client):
    """In the topic's owner, the stand-in for a consumer connected to another worker: the channel dispatches to
    it as to any client; what it would write goes back to that worker (``Link.mark``), once per step."""

    link: Link
    front_id: int

    def attach(self, link: Link, front_id: int) -> None:
        """Made with ``Client.from_fields``: the link its output goes back over and the other worker's client id."""
        self.link = link
        self.front_id = front_id
        self.direct_flush = self._ship

    def _ship(self) -> bool:
        self.link.mark(self)
        return True

    def wake_writer(self) -> None:
        if self.out:
            self.link.mark(self)


#: what a stand-in copies of the connection it stands for (stats and dispatch read them)
_CLIENT_FIELDS = (
    "remote_address",
    "client_id",
    "hostname",
    "user_agent",
    "connect_ts",
    "identified",
    "msg_timeout",
    "heartbeat_interval",
    "output_buffer_size",
    "output_buffer_timeout",
    "sample_rate",
    "tls",
    "snappy",
    "deflate",
    "deflate_level",
    "tls_version",
    "tls_cipher_suite",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
    "tls_common_name",
    "auth_state",
)


class RemoteChannel:
    """In the worker a consumer connected to, the channel it subscribed to in another worker: what the connection
    asks of its channel (``client.SubscribedChannel``) goes to the owner. Refusals come back as error frames."""

    def __init__(self, mesh: WorkerMesh, owner: int, topic_name: str, name: str, front_id: int) -> None:
        self.mesh = mesh
        self.link = mesh.links[owner]
        self.topic_name = topic_name
        self.name = name
        self.front_id = front_id

    def client_credit_changed(self, client: Client) -> None:
        self.link.send(("rdy", self.front_id, client.rdy, int(client.state)))

    def remove_client(self, client: Client) -> None:
        self.mesh.consumer_gone(client)
        self.link.send(("gone", self.front_id))

    def finish(self, client: Client, msg_id: bytes) -> None:
        self.link.send(("fin", self.front_id, [msg_id]))

    def finish_many(self, client: Client, msg_ids: list[bytes]) -> list[tuple[bytes, str]]:
        self.link.send(("fin", self.front_id, list(msg_ids)))
        return []

    def requeue(self, client: Client, msg_id: bytes, delay: float) -> None:
        self.link.send(("req", self.front_id, msg_id, delay))

    def touch(self, client: Client, msg_id: bytes, msg_timeout: float) -> None:
        self.link.send(("touch", self.front_id, msg_id, msg_timeout))


class WorkerMesh:
    """This worker's links to the others, the topics' owners, and the handlers of what comes over the links."""

    def __init__(self, nsqd, sockets) -> None:
        self.nsqd = nsqd
        self.index: int = sockets.index
        self.count: int = sockets.count
        self.links: dict[int, Link] = {peer: Link(self, peer, sock) for peer, sock in sockets.links.items()}
        #: worker 0: the links on which the others wait for nsqd.dat in durable mode (``RelayMetadata.sync``)
        self.metadata_links: dict[int, Link] = {}
        #: another worker: its end of that link, used blocking (``RelayMetadata.sync``)
        self.metadata_socket = None
        if self.index == 0:
            self.metadata_links = {peer: Link(self, peer, sock) for peer, sock in sockets.metadata_links.items()}
        else:
            self.metadata_socket = sockets.metadata_links.get(0)
        #: durable mode: publishes are answered once the group commit at the end of their step covers them
        self.durable: bool = nsqd.durable
        #: ``--replicate-to``: worker 0 owns every topic and runs the node's replication (see "Replication" in
        #: bench/MULTICORE.md); a publish that crosses is answered once the peers hold it
        self.replicating: bool = bool(nsqd.opts.replicate_to)
        #: a worker other than 0 of a replicating node: set once worker 0 learnt from its peers what is still its
        #: own (``Replicator.ready``); client connections wait for it, as they wait for the replicator in worker 0
        self.replication_ready: trio.Event | None = trio.Event() if self.replicating and self.index else None
        #: durable mode, from a batch to the commit at the end of its step: the publishes taken, (worker, call id,
        #: the seq of its replication frame)
        self._uncommitted: list[tuple[int, int, int]] | None = None
        self._owners: dict[str | bytes, int] = {}
        self._calls: dict[int, Any] = {}  # request id -> [Event, answer, worker]
        self._callbacks: dict[int, tuple[int, Callable]] = {}  # request id -> (worker, called with the answer)
        self._ids = itertools.count(1)
        self._fronts: dict[tuple[int, int], RemoteClient] = {}  # (worker, its client id) -> stand-in here
        self._consumers: dict[int, Client] = {}  # client id -> a consumer here whose channel is elsewhere
        self._failing: dict[str, str] = {}  # topic -> why its owner's disk refused its last publish
        self._drained: dict[int, trio.Event] = {peer: trio.Event() for peer in self.links}
        self.kept_in_memory = 0  # acknowledged publishes the disk refused here, kept in memory
        self.handed_over = 0  # connections given to another worker (``hand_over``)
        self.peer_load: dict[int, float] = {}  # worker -> its share of a core in its last LOAD_INTERVAL
        self.taken_over = 0  # connections another worker gave to this one (``_on_hand``)
        self.spread_out = 0  # producers of a busy owner given to a worker that was not (``spread``)
        self.sent_messages = 0  # messages published through this worker to topics others own, acknowledged here
        self._spread_at = spread_thresholds()
        self._nursery: trio.Nursery | None = None
        self.router: Any = None  # the HTTP router that answers forwarded requests (set by the HTTP API)

    # -- ownership ---------------------------------------------------------------------------------------------
    def owner(self, name: str | bytes) -> int:
        if self.replicating:
            return 0
        owner = self._owners.get(name)
        if owner is None:
            if len(self._owners) > 100_000:
                self._owners.clear()
            owner = self._owners[name] = owner_of(name, self.count)
        return owner

    def owns(self, name: str | bytes) -> bool:
        return self.owner(name) == self.index

    # -- running -----------------------------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for link in self.links.values():
                nursery.start_soon(self._write, link)
                nursery.start_soon(self._watch, link)
                self.nsqd.read_poller.add(link.fd, link, again=True)
            for link in self.metadata_links.values():
                nursery.start_soon(self._write, link)
                self.nsqd.read_poller.add(link.fd, link, again=True)
            nursery.start_soon(self._report_load)
            task_status.started()

    async def _report_load(self) -> None:
        """Every ``LOAD_INTERVAL``, measure this worker's share of a core since the last time, and tell the others
        when it crossed ``HAND_OVER_BELOW`` (all ``may_hand_over`` asks): a worker that stays idle, or busy, sends
        nothing, and its peers' read pollers do not wake up for it (two records a second each way cost an idle
        pair of workers about as much CPU as the rest of their timers). A worker not busy that saw no activity
        for a whole interval (``nsqd/activity.py``) stops measuring until it sees some."""
        activity = self.nsqd.activity
        _, mark = cpu_share((0.0, 0.0))
        share = 0.0
        busy = False  # as the others take it before the first record (``peer_load`` defaults to 0)
        idle: int | None = None  # the machine's idle ticks at the last interval this worker was busy
        watch = activity.watch()
        while True:
            if not busy and share < IDLE_SHARE and not watch.is_set():
                await watch.wait()  # idle: nothing to measure until something happens
                _, mark = cpu_share(mark)
                idle = None
            watch = activity.watch()
            await trio.sleep(LOAD_INTERVAL)
            started = mark[1]
            share, mark = cpu_share(mark)
            if (share >= HAND_OVER_BELOW) != busy:
                busy = not busy
                for link in self.links.values():
                    link.send(("load", share))
            spread_at = self._spread_at
            if spread_at is None or share < spread_at[0] or self.durable or self.replicating:
                idle = None
                continue
            now_idle = idle_ticks()  # read only while busy: an idle worker's timers stay as cheap as they were
            if idle is not None and now_idle is not None:
                self.spread((now_idle - idle) / _CLOCK_TICKS / max(mark[1] - started, 1e-3))
            idle = now_idle

    def spread(self, spare: float) -> bool:
        """This worker was busy over the last ``LOAD_INTERVAL`` and the machine had ``spare`` cores idle: give one
        producer of big reads (MPUB batches, its last read above the read poller's ``light_read``) of a topic
        owned here to the least busy worker that is not busy (``HAND_OVER_BELOW``), if the machine had the idle
        cores ``TRIONSQ_SPREAD`` asks for (see "A hot topic's producers spread" in bench/MULTICORE.md). Its reads,
        parsing and answers then run there, and its messages cross back here in batches, acknowledged there
        (``publish_acknowledged``); it stays there (``Client.spread``). Never in durable mode or with replication,
        whose publishes that cross wait for the owner's answer. True if one went."""
        if self._spread_at is None or spare < self._spread_at[1] or self.nsqd.exiting:
            return False
        peers = [peer for peer in self.links if self.peer_load.get(peer, 0.0) < HAND_OVER_BELOW]
        if not peers:
            return False
        peer = min(peers, key=lambda index: self.peer_load.get(index, 0.0))
        poller = self.nsqd.read_poller
        light = poller.light_read
        for member in poller.members():
            spread_to = getattr(member, "spread_to", None)
            if spread_to is not None and member.last_read > light and spread_to(peer):
                self.spread_out += 1
                log.info("WORKERS: a producer goes to worker %d, %.2f cores of the machine idle", peer, spare)
                return True
        return False

    async def _write(self, link: Link) -> None:
        try:
            await link.write_loop()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("WORKERS: link to worker %d failed: %s", link.peer, exc)
            link.lost.set()
            await trio.sleep_forever()

    async def _watch(self, link: Link) -> None:
        """Once the link to a worker is lost: its answers never come; the node stops, unless it is stopping."""
        try:
            await link.lost.wait()
        finally:
            self.nsqd.read_poller.discard(link.fd)
            self._drained[link.peer].set()
        for call in list(self._calls.values()):
            if call[2] == link.peer:
                call[1] = WorkerGone(f"worker {link.peer} stopped")
                call[0].set()
        for call_id, (peer, answered) in list(self._callbacks.items()):
            if peer == link.peer:
                del self._callbacks[call_id]
                answered("exiting")
        if not self.nsqd.exiting:
            log.error("WORKERS: worker %d is gone: stopping", link.peer)
            self.nsqd.exit()

    async def call(self, peer: int, kind: str, *args) -> Any:
        """Send a request to ``peer`` and return its answer; ``WorkerGone`` if it stopped first."""
        call_id = next(self._ids)
        call = self._calls[call_id] = [trio.Event(), None, peer]
        self.links[peer].send((kind, call_id, *args))
        try:
            await call[0].wait()
        finally:
            del self._calls[call_id]
        if isinstance(call[1], WorkerGone):
            raise call[1]
        return call[1]

    def _answer(self, peer: int, call_id: int, value) -> None:
        self.links[peer].send(("re", call_id, value))

    # -- what this worker asks of the owners -------------------------------------------------------------------
    def call_soon(self, peer: int, kind: str, args: tuple, answered: Callable[[Any], None]) -> None:
        """Send a request to ``peer``; ``answered`` gets its answer when it comes back, with no task waiting
        (``exiting`` if ``peer`` stopped first)."""
        call_id = next(self._ids)
        self._callbacks[call_id] = (peer, answered)
        self.links[peer].send((kind, call_id, *args))

    def publish_soon(
        self, topic_name: str, bodies: list[bytes], defer: float, answered: Callable[[str | None], None]
    ) -> None:
        """Publish at the topic's owner; ``answered`` gets None, or the reason it refused (``exiting``, a full
        queue's error), when its answer comes back."""
        answer = partial(self._held_answered, topic_name, answered)
        self.call_soon(self.owner(topic_name), "pub", (topic_name, bodies, defer), answer)

    def _held_answered(self, topic_name: str, answered: Callable[[str | None], None], reason: str | None) -> None:
        if reason is None:
            self._failing.pop(topic_name, None)  # the owner's disk takes its publishes again
        answered(reason)

    def publish_acknowledged(self, topic_name: str, bodies: list[bytes], defer: float) -> bool:
        """Send a publish to the topic's owner that the caller acknowledges now (no answer comes back); False when
        it must wait for the owner's answer instead (``publish_soon``): the owner's disk refused this topic's
        last publish (until one is taken again), durable mode (an OK only after the owner's sync), replication (an
        OK only once the owner's peers hold the messages), or the link
        to the owner is backed up (the owner falls behind: its answers pace the producers, as one nsqd's pace).

        Nothing acknowledged so is lost while the node runs: the owner refuses a publish only while it stops,
        when its topic is being deleted, or when its disk fails. A stop is two-phase (``drain``): no worker stops
        its topics before every other has closed its client connections and sent what they read. A publish that
        meets its topic's deletion is deleted with it, as one made just before the deletion. A publish the disk
        refuses is kept in memory past ``--mem-queue-size`` (``Topic.publish_kept``), and the owner says so
        (``full``): this topic's next publishes here wait for the owner's answer, and are refused as a single
        nsqd refuses them. bench/MULTICORE.md has the argument in full."""
        link = self.links[self.owner(topic_name)]
        if self.durable or self.replicating or topic_name in self._failing or link.backed_up():
            return False
        link.send(("pubq", topic_name, bodies, defer))
        self.sent_messages += len(bodies)
        return True

    async def drain(self, timeout: float) -> None:
        """The first phase of a stop, once this worker's client connections are closed: tell every other worker,
        which stops too if it was not stopping, and wait until each has said the same (or is gone, or ``timeout``,
        a bound against a worker that hangs). A link's records arrive in order, so every publish a worker
        acknowledged is here before its ``drained``, and is published before this worker stops its topics."""
        metadata = self.nsqd.metadata
        if isinstance(metadata, RelayMetadata):  # worker 0 writes nsqd.dat last, after every drained: with these
            metadata.write_now()
        for link in self.links.values():
            link.send(("drained",))
        with trio.move_on_after(timeout) as waited:
            for peer in self.links:
                await self._drained[peer].wait()
        if waited.cancelled_caught:
            late = [peer for peer, drained in self._drained.items() if not drained.is_set()]
            log.error("WORKERS: stopping without what workers %s acknowledged: no word in %.1fs", late, timeout)

    async def configure(self, opt: str, value: Any) -> None:
        """``PUT /config``'s change, made here already, in every other worker, each answering once made."""
        async with trio.open_nursery() as nursery:
            for peer in self.links:
                nursery.start_soon(self._configure, peer, opt, value)

    async def _configure(self, peer: int, opt: str, value: Any) -> None:
        with contextlib.suppress(WorkerGone):  # it stopped: the node is stopping
            await self.call(peer, "config", opt, value)

    async def subscribe(self, client: Client, topic_name: str, channel_name: str) -> RemoteChannel:
        """SUB at the topic's owner; raises the ``ProtocolError`` it answered."""
        owner = self.owner(topic_name)
        info = {name: getattr(client, name) for name in _CLIENT_FIELDS}
        try:
            refusal = await self.call(owner, "sub", client.id, topic_name, channel_name, info)
        except WorkerGone:
            refusal = ("E_SUB_FAILED", "SUB failed to deleted topic/channel")
        if refusal is not None:
            raise ProtocolError(*refusal)
        self._consumers[client.id] = client
        return RemoteChannel(self, owner, topic_name, channel_name, client.id)

    def may_hand_over(self, owner: int) -> bool:
        """Whether a producer's connection may go to ``owner`` now: while it was not busy (``HAND_OVER_BELOW``)."""
        return self.peer_load.get(owner, 0.0) < HAND_OVER_BELOW

    def hand_over(self, owner: int, fd: int, client: Client, unread: bytes, *, spread: bool = False) -> None:
        """Give a producer's connection to ``owner`` (see "Connections go to their topic's owner" in
        bench/MULTICORE.md): a copy of its descriptor goes with the link's next write, after every record queued
        before it (its publishes among them), and the owner serves it from there with ``client``'s state and the
        bytes read here but not parsed yet (``unread``). The caller stops serving it here without a word to the
        client and closes its own descriptor. ``spread``: a busy owner gives its producer away (``spread``), and
        ``owner`` is the worker that takes it."""
        link = self.links[owner]
        info = {name: getattr(client, name) for name in _CLIENT_FIELDS}
        info["pub_counts"] = dict(client.pub_counts)
        info["spread"] = spread
        link.handing.append(os.dup(fd))
        link.send(("hand", info, unread))
        self.handed_over += 1

    def hand_replication(self, fd: int, unread: bytes) -> None:
        """Give a replication stream (``  R1``: an origin's stream, or a CONFIRM, ASK or release connection) to
        worker 0, which keeps the replica stores: its descriptor goes with the link's next write, with the bytes
        read past the magic (``unread``); the caller closes its own descriptor without a word to the peer."""
        link = self.links[0]
        link.handing.append(os.dup(fd))
        link.send(("r1", unread))
        self.handed_over += 1

    def adoption(self) -> Adoption:
        """A takeover's steps (``ReplicaHost._take_over``, in worker 0): in this worker when it owns every topic
        (``--replicate-to``), else in each topic's owner (``MeshAdoption``)."""
        return Adoption(self.nsqd) if self.replicating else MeshAdoption(self)

    def settle_adopted(self, node: str) -> None:
        """Worker 0: origin ``node`` heard what was adopted of it: every other worker's log channels say so too."""
        for link in self.links.values():
            link.send(("settle", node))

    def replication_started(self) -> None:
        """Worker 0: the replicator is ready (its peers said what is still this node's): the others serve
        their clients from now on."""
        for link in self.links.values():
            link.send(("ready",))

    def consumer_gone(self, client: Client) -> None:
        self._consumers.pop(client.id, None)

    async def log_command(self, request) -> bytes:
        """A log command (``log_commands``) answered by the topic's owner, this worker or another: its response
        frame, or the ``ProtocolError`` it refused with."""
        if self.owns(request.topic):
            await self._caught_up(request)
            return log_commands.answer(self.nsqd, request)
        try:
            answer = await self.call(self.owner(request.topic), "log", request)
        except WorkerGone:
            raise ProtocolError(E_LOG_FAILED, f"{request.verb} failed exiting") from None
        if isinstance(answer, tuple):
            raise ProtocolError(*answer)
        return answer

    async def _caught_up(self, request) -> None:
        """Before LOG or LSEEK answers offsets here: every publish another worker acknowledged before the command
        was sent is in the log. Such a publish may still be on its way (``publish_acknowledged``); each worker
        answers ``caught_up`` after what it sent before, as a link keeps its order, so once all have answered,
        all of it is here. LREAD and LCOMMIT name offsets a LOG gave, and need no such wait."""
        if request.verb not in ("LOG", "LSEEK"):
            return
        for peer in self.links:
            with contextlib.suppress(WorkerGone):
                await self.call(peer, "caught_up")

    async def forward_http(self, owner: int, request: Request) -> tuple[int, list, bytes]:
        headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in request.headers]
        return await self.call(
            owner,
            "http",
            request.method,
            request.path,
            request.raw_query,
            headers,
            request.body,
            request.remote_address,
            request.tls,
        )

    async def node_stats(
        self, channel: str | None, include_clients: bool, include_mem: bool, topic: str | None = None
    ) -> NodeStats:
        """The node's ``/stats``: this worker's and every other's, joined (topics in name order, producers and
        connections of every worker). The others' parts are asked for first: each answer comes after the publishes
        that worker acknowledged early to topics here (a link keeps its order), so this worker's part, collected
        last, counts them."""
        parts = []
        replication = None  # worker 0's section: it runs the node's replication and keeps its replica stores
        for peer in self.links:
            try:
                parts.append(await self.call(peer, "stats", channel, include_clients, include_mem, topic))
            except WorkerGone:
                continue
            if peer == 0:
                replication = parts[-1].replication
        own = self._stats_part(topic, channel, include_clients, include_mem)
        if self.index == 0:
            replication = own.replication
        parts.insert(0, own)
        topics = sorted((entry for part in parts for entry in part.topics or ()), key=lambda t: t.topic_name)
        found = any(part.topics is not None for part in parts)
        producers = [client for part in parts for client in part.producers or ()]
        # no such topic: no producers either, as from one nsqd
        listed = (own.producers is not None or bool(producers)) and found
        health = next((part.health for part in parts if part.health != "OK"), own.health)
        return NodeStats(
            version=own.version,
            health=health,
            start_time=own.start_time,
            uptime_ns=own.uptime_ns,
            topics=tuple(topics) if found else None,
            memory=memory_of_processes([part.memory for part in parts if part.memory]) if own.memory else None,
            producers=tuple(producers) if listed else None,
            tcp_connections=sum(part.tcp_connections for part in parts),
            http_connections=sum(part.http_connections for part in parts),
            replication=replication,
        )

    # -- what comes over the links -----------------------------------------------------------------------------
    def handle_batch(self, peer: int, batch: list[tuple]) -> None:
        """The records of one batch, in order; a run of publishes to one topic (PUBs of many connections, read in
        one step of the sender) is published with one ``Topic.publish``, as the fast path publishes a step's PUBs
        (``fastpath.py``), and each is answered. In durable mode the publishes are answered after a group commit
        at the end of the read poller's step (``ReadPoller.at_step_end``), after every batch and connection of
        the step was read: one fsync covers the publishes of every link and those of this worker's own producers
        (whose writers then find nothing owed), where a commit per batch made one fsync per link batch and
        another for the step's own publishes (durable MPUB with two workers ran at 0.28-0.41x of one worker's
        rate). The publishes taken, and a topic or channel created, are synced before any of their answers
        leaves (the links write them after the commit), and a failed sync answers each of its publishes
        ``sync``, as one nsqd fails them (E_PUB_FAILED). Outside a step the batch commits at its end."""
        if not self.durable:
            self._handle_records(peer, batch)
            return
        if self._uncommitted is not None:  # a commit is due at the end of this step already
            self._handle_records(peer, batch)
            return
        self._uncommitted = []
        if self.nsqd.read_poller.at_step_end(self._commit):
            self._handle_records(peer, batch)
            return
        try:
            self._handle_records(peer, batch)
        finally:
            self._commit()

    def _commit(self) -> None:
        uncommitted, self._uncommitted = self._uncommitted, None
        barrier = self.nsqd.sync_barrier
        failed = bool(barrier) and not barrier.commit()
        for peer, call_id, seq in uncommitted or ():
            if failed:
                self._answer(peer, call_id, "sync")
            else:
                self._answer_replicated(peer, call_id, seq)

    def _answer_published(self, peer: int, call_id: int, reason: str | None) -> None:
        """A publish's answer, given right after it was published here; in durable mode, a publish taken is
        answered after the commit that covers it; with replication, once the peers hold it
        (``_answer_replicated``)."""
        replication = self.nsqd.replication
        seq = replication.seq if replication is not None else 0  # the publish's frame: nothing came after it yet
        if reason is not None:
            self._answer(peer, call_id, reason)
        elif self._uncommitted is not None:
            self._uncommitted.append((peer, call_id, seq))
        else:
            self._answer_replicated(peer, call_id, seq)

    def _answer_replicated(self, peer: int, call_id: int, seq: int) -> None:
        """Answer a publish taken here once ``--replication-acks`` peers hold its frame ``seq``, as a connection
        here writes its OK (``Connection._writer``): at once in ``accept`` mode while degraded, ``replication
        degraded`` (the publish fails, the producer's connection closes) when the peers go away in ``refuse``
        mode first. The ACK that covers it answers, with no task (``Replicator.call_when_acked``)."""
        replication = self.nsqd.replication
        if replication is None or seq <= replication.acked:
            self._answer(peer, call_id, None)
        elif replication.degraded:
            self._answer(peer, call_id, "replication degraded" if replication.degraded_mode == "refuse" else None)
        else:
            replication.call_when_acked(seq, partial(self._answer_replicated, peer, call_id, seq))

    def _handle_records(self, peer: int, batch: list[tuple]) -> None:
        run: list[tuple] = []
        for record in batch:
            kind = record[0]
            if (kind == "pubq" and not record[3]) or (kind == "pub" and not record[4]):
                if run and (run[0][0] != kind or run[0][-3] != record[-3]):
                    self._publish_run(peer, run)
                    run = []
                run.append(record)
                continue
            if run:
                self._publish_run(peer, run)
                run = []
            self.handle(peer, record)
        if run:
            self._publish_run(peer, run)

    def _publish_run(self, peer: int, run: list[tuple]) -> None:
        if len(run) == 1:
            self.handle(peer, run[0])
            return
        topic_name = run[0][-3]
        bodies = [body for record in run for body in record[-2]]
        if run[0][0] == "pubq":
            self._on_pubq(peer, topic_name, bodies, 0.0)
            return
        reason = self._publish(topic_name, bodies, 0.0)
        answer = self._answer_published
        for record in run:
            answer(peer, record[1], reason)

    def handle(self, peer: int, record: tuple) -> None:
        kind = record[0]
        handler = _HANDLERS.get(kind)
        if handler is None:
            log.error("WORKERS: unknown record %r from worker %d", kind, peer)
            return
        handler(self, peer, *record[1:])

    def _on_answer(self, peer: int, call_id: int, value) -> None:
        waiting = self._callbacks.pop(call_id, None)
        if waiting is not None:
            waiting[1](value)
            return
        call = self._calls.get(call_id)
        if call is not None:
            call[1] = value
            call[0].set()

    def _on_pub(self, peer: int, call_id: int, topic_name: str, bodies: list[bytes], defer: float) -> None:
        self._answer_published(peer, call_id, self._publish(topic_name, bodies, defer))

    def _on_pubq(self, peer: int, topic_name: str, bodies: list[bytes], defer: float) -> None:
        """A publish the sending worker already acknowledged (``publish_acknowledged``): taken while this worker
        stops too, until its topics stop (after ``drain``)."""
        try:
            self.nsqd.get_topic(topic_name).publish(bodies, defer)
        except TopicExiting:
            return  # the topic is being deleted: gone with it, as a publish made just before the deletion
        except TopicFull as exc:
            self.nsqd.get_topic(topic_name).publish_kept(bodies, defer)
            self.kept_in_memory += len(bodies)
            log.error(
                "WORKERS: topic %s: the disk refused %d acknowledged message(s), kept in memory: %s",
                topic_name,
                len(bodies),
                exc,
            )
            self.links[peer].send(("full", topic_name, str(exc)))

    def _on_hand(self, peer: int, info: dict, unread: bytes) -> None:
        """A producer's connection the other worker gave to this one (``hand_over``): served here from now on,
        unless the node is stopping (then closed, as the other worker would have closed it)."""
        fd = self.links[peer].received.popleft()
        if self.nsqd.exiting:
            os.close(fd)
            return
        self.taken_over += 1
        self.nsqd.take_connection(fd, info, unread)

    def _on_r1(self, peer: int, unread: bytes) -> None:
        """A replication stream another worker accepted (``hand_replication``): served here, unless the node is
        stopping (then closed, as the other worker would have closed it)."""
        fd = self.links[peer].received.popleft()
        if self.nsqd.exiting:
            os.close(fd)
            return
        self.taken_over += 1
        self.nsqd.take_replication(fd, unread)

    def _on_adopt_topics(self, peer: int, call_id: int, states: dict) -> None:
        log.info("REPLICATION: worker %d makes %d topic(s) of a takeover", self.index, len(states))
        self._answer(peer, call_id, prepare_topics(self.nsqd, states))

    def _on_adopt(self, peer: int, call_id: int, topic_name: str, rows: list) -> None:
        """A takeover's messages of a topic owned here (``MeshAdoption.place``): answered as a publish is, after
        the group commit that covers them in durable mode."""
        self._answer_published(peer, call_id, self._adopt(topic_name, rows))

    def _adopt(self, topic_name: str, rows: list) -> str | None:
        if self.nsqd.exiting:
            return "exiting"
        batch = [(ReplicatedMessage(*fields), finished, requeued) for fields, finished, requeued in rows]
        return place_refused(self.nsqd, topic_name, batch)

    def _on_adopt_noted(self, peer: int, call_id: int, ends, topics, node: str, epoch: int, when: int) -> None:
        note_adopted(self.nsqd, ends, topics, node, epoch, when)
        self._answer(peer, call_id, None)

    def _on_settle(self, peer: int, node: str) -> None:
        settle_adopted(self.nsqd, node)

    def _on_ready(self, peer: int) -> None:
        if self.replication_ready is not None:
            self.replication_ready.set()

    def _on_load(self, peer: int, share: float) -> None:
        self.peer_load[peer] = share

    def _on_full(self, peer: int, topic_name: str, reason: str) -> None:
        self._failing[topic_name] = reason

    def _on_drained(self, peer: int) -> None:
        self._drained[peer].set()
        if not self.nsqd.exiting:  # it stops alone (a signal to it only): the node stops with it, now
            log.info("WORKERS: worker %d is stopping: stopping", peer)
            self.nsqd.exit()

    def _publish(self, topic_name: str, bodies: list[bytes], defer: float) -> str | None:
        """Into the topic here as a publish of a connection here; None, or why it was refused."""
        nsqd = self.nsqd
        if nsqd.exiting:
            return "exiting"
        if nsqd.replication is not None and nsqd.replication.refusing():
            return "replication degraded"
        try:
            nsqd.get_topic(topic_name).publish(bodies, defer, defer_sync=self.durable)  # synced by ``_commit``
        except TopicExiting:
            return "exiting"
        except TopicFull as exc:
            return str(exc)
        return None

    def _on_sub(self, peer: int, call_id: int, front_id: int, topic_name: str, channel_name: str, info) -> None:
        nsqd = self.nsqd
        if nsqd.exiting:
            self._answer(peer, call_id, ("E_SUB_FAILED", "SUB failed to deleted topic/channel"))
            return
        channel = nsqd.get_topic(topic_name).get_channel(channel_name)
        if channel.log is not None:  # (as ``Connection.SUB`` refuses it)
            refusal = f"SUB channel {topic_name}:{channel_name} is a log, read it with LREAD"
            self._answer(peer, call_id, ("E_INVALID", refusal))
            return
        limit = nsqd.opts.max_channel_consumers
        if limit and len(channel.clients) >= limit:
            refusal = f"SUB failed consumers for {topic_name}:{channel_name} exceeds limit of {limit}"
            self._answer(peer, call_id, ("E_SUB_FAILED", refusal))
            return
        client = RemoteClient.from_fields(next(nsqd._client_ids), info)
        client.attach(self.links[peer], front_id)
        client.channel = channel
        client.state = ClientState.SUBSCRIBED
        channel.add_client(client)
        self._fronts[(peer, front_id)] = client
        self._answer(peer, call_id, None)

    def _stand_in(self, peer: int, front_id: int) -> tuple[RemoteClient, SubscribedChannel] | None:
        """The stand-in for that worker's consumer and its channel; None once it left."""
        client = self._fronts.get((peer, front_id))
        if client is None or client.channel is None:
            return None
        return client, client.channel

    def _on_rdy(self, peer: int, front_id: int, rdy: int, state: int) -> None:
        found = self._stand_in(peer, front_id)
        if found is not None:
            client, channel = found
            client.rdy = rdy
            client.state = ClientState(state)
            channel.client_credit_changed(client)

    def _refused(self, client: RemoteClient, code: str, text: str) -> None:
        client.write_frame(encode_frame(FRAME_TYPE_ERROR, ProtocolError(code, text).payload()))

    def _on_fin(self, peer: int, front_id: int, msg_ids: list[bytes]) -> None:
        found = self._stand_in(peer, front_id)
        if found is None:
            return
        client, channel = found
        for msg_id, reason in channel.finish_many(client, msg_ids):
            self._refused(client, "E_FIN_FAILED", f"FIN {msg_id.decode('latin-1')} failed {reason}")

    def _on_req(self, peer: int, front_id: int, msg_id: bytes, delay: float) -> None:
        from .channel import ChannelError  # the channel module is loaded by then

        found = self._stand_in(peer, front_id)
        if found is None:
            return
        client, channel = found
        try:
            channel.requeue(client, msg_id, delay)
        except ChannelError as error:
            self._refused(client, "E_REQ_FAILED", f"REQ {msg_id.decode('latin-1')} failed {error}")

    def _on_touch(self, peer: int, front_id: int, msg_id: bytes, msg_timeout: float) -> None:
        from .channel import ChannelError

        found = self._stand_in(peer, front_id)
        if found is None:
            return
        client, channel = found
        try:
            channel.touch(client, msg_id, msg_timeout)
        except ChannelError as error:
            self._refused(client, "E_TOUCH_FAILED", f"TOUCH {msg_id.decode('latin-1')} failed {error}")

    def _on_gone(self, peer: int, front_id: int) -> None:
        client = self._fronts.pop((peer, front_id), None)
        if client is not None and client.channel is not None:
            channel, client.channel = client.channel, None
            client.rdy = 0
            client.state = ClientState.DISCONNECTED
            channel.remove_client(client)

    def _on_out(self, peer: int, front_id: int, data: bytes) -> None:
        client = self._consumers.get(front_id)
        if client is None or client.state == ClientState.DISCONNECTED:
            return
        client.out.append(data)
        client.out_bytes += len(data)
        client.flush()

    def _on_log(self, peer: int, call_id: int, request) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._answer_log, peer, call_id, request)

    async def _answer_log(self, peer: int, call_id: int, request) -> None:
        try:
            answer: bytes | tuple = await self.log_command(request)
        except ProtocolError as error:
            answer = (error.code, error.description, error.fatal)
        self._answer(peer, call_id, answer)

    def _on_caught_up(self, peer: int, call_id: int) -> None:
        self._answer(peer, call_id, None)

    def _on_http(self, peer: int, call_id: int, method, path, raw_query, headers, body, remote, tls) -> None:
        request = Request(method, path, raw_query, Headers(headers), body, remote, tls)
        assert self._nursery is not None
        self._nursery.start_soon(self._answer_http, peer, call_id, request)

    async def _answer_http(self, peer: int, call_id: int, request: Request) -> None:
        from protocol.http import run_deferred

        router = self.router
        assert router is not None
        response = await router.call(router.match(request.method, request.path, request.raw_query), request)
        self._answer(peer, call_id, (response.status, response.headers, response.body))
        if request.deferred is not None:
            run_deferred(request, log)

    def _on_config(self, peer: int, call_id: int, opt: str, value: Any) -> None:
        self.nsqd.configure(opt, value)
        self._answer(peer, call_id, None)

    def _on_stats(self, peer: int, call_id: int, channel, include_clients: bool, include_mem: bool, topic=None) -> None:
        self._answer(peer, call_id, self._stats_part(topic, channel, include_clients, include_mem))

    def _stats_part(self, topic: str | None, channel: str | None, include_clients: bool, include_mem: bool):
        """This worker's part of the node's ``/stats``; with ``topic``, its producers' counts for that topic
        whichever worker owns it (a producer publishes through the worker it is connected to)."""
        part = collect(
            self.nsqd, topic=topic, channel=channel, include_clients=include_clients, include_mem=include_mem
        )
        if topic and include_clients and part.topics is None:
            part.producers = producer_stats(self.nsqd, topic)
        return part

    def _on_lookup(self, peer: int, command: bytes, branch: str, topic: str, channel: str, created: bool) -> None:
        lookup = self.nsqd.lookup
        if isinstance(lookup, MeshLookup):
            lookup.remote_change(command, branch, topic, channel, created)

    def _on_lookupd_http(self, peer: int, addresses: list[str]) -> None:
        lookup = self.nsqd.lookup
        if isinstance(lookup, RelayLookup):
            lookup.lookupd_addresses(addresses)

    def _on_meta(self, peer: int, entries: list[bytes], generation: int = 0) -> None:
        metadata = self.nsqd.metadata
        if isinstance(metadata, MeshMetadata):
            metadata.remote_changed(peer, entries, generation)

    async def pull_metadata(self) -> None:
        """Worker 0, before a write that an answer waits for (an HTTP pause, a channel change): every other
        worker's entries as they are now, asked for and awaited, so that the write holds each change answered
        before it on whichever worker (their own sends follow their writer's interval)."""
        metadata = self.nsqd.metadata
        for peer in list(self.links):
            try:
                entries, generation = await self.call(peer, "metapull")
            except WorkerGone:
                continue
            if isinstance(metadata, MeshMetadata):
                metadata.remote_changed(peer, entries, generation)

    def _on_metapull(self, peer: int, call_id: int) -> None:
        metadata = self.nsqd.metadata
        if isinstance(metadata, RelayMetadata):
            metadata.sent += 1
            self._answer(peer, call_id, (metadata._build(), metadata.sent))
        else:
            self._answer(peer, call_id, ([], 0))

    def _on_metasync(self, peer: int, entries: list[bytes], generation: int) -> None:
        """Durable mode: a worker waits, blocked, until nsqd.dat holds its topics as they are now
        (``RelayMetadata.sync``); answered on the link it asked on, with None or why the write failed."""
        metadata = self.nsqd.metadata
        error = None
        if isinstance(metadata, MeshMetadata):
            metadata.remote_changed(peer, entries, generation)
            try:
                metadata.sync()
            except OSError as exc:
                error = str(exc)
        self.metadata_links[peer].send(("re", generation, error))

    def statistics(self) -> dict[str, int]:
        return {
            "batches": sum(link.batches for link in self.links.values()),
            "records": sum(link.records for link in self.links.values()),
            "handed_over": self.handed_over,
            "taken_over": self.taken_over,
            "spread": self.spread_out,
            "sent_messages": self.sent_messages,
        }


_HANDLERS: dict[str, Callable[..., None]] = {
    "re": WorkerMesh._on_answer,
    "pub": WorkerMesh._on_pub,
    "pubq": WorkerMesh._on_pubq,
    "full": WorkerMesh._on_full,
    "hand": WorkerMesh._on_hand,
    "r1": WorkerMesh._on_r1,
    "ready": WorkerMesh._on_ready,
    "adopt_topics": WorkerMesh._on_adopt_topics,
    "adopt": WorkerMesh._on_adopt,
    "adopt_noted": WorkerMesh._on_adopt_noted,
    "settle": WorkerMesh._on_settle,
    "load": WorkerMesh._on_load,
    "drained": WorkerMesh._on_drained,
    "sub": WorkerMesh._on_sub,
    "rdy": WorkerMesh._on_rdy,
    "fin": WorkerMesh._on_fin,
    "req": WorkerMesh._on_req,
    "touch": WorkerMesh._on_touch,
    "gone": WorkerMesh._on_gone,
    "out": WorkerMesh._on_out,
    "http": WorkerMesh._on_http,
    "log": WorkerMesh._on_log,
    "caught_up": WorkerMesh._on_caught_up,
    "stats": WorkerMesh._on_stats,
    "config": WorkerMesh._on_config,
    "lookup": WorkerMesh._on_lookup,
    "meta": WorkerMesh._on_meta,
    "metasync": WorkerMesh._on_metasync,
    "metapull": WorkerMesh._on_metapull,
    "lookupd_http": WorkerMesh._on_lookupd_http,
}


# -- takeover: worker 0 adopts into every worker's topics ---------------------------------------------------------
class MeshAdoption(Adoption):
    """Worker 0's takeover of an origin in a node whose topics are spread over the workers (no ``--replicate-to``):
    each step runs in each topic's owner. Its topics and channels are made there first (``adopt_topics``, awaited);
    each batch of messages crosses to its owner as a publish that keeps the messages' IDs, attempts, delays and
    finished channels (``adopt``), answered once placed there (in durable mode after the group commit that syncs
    it), ``ADOPT_WINDOW`` batches unanswered at most. The takeover removes the store only once every batch was
    answered (``placed``): a worker killed meanwhile stops the node, and the store, still whole, is adopted again
    after the restart (duplicates, never a loss). A refusal (the owner stops, its sync fails, its disk is full)
    fails the takeover the same way (``AdoptionFailed``). ADOPTED and the epoch stay with the store, in worker 0."""

    def __init__(self, mesh: WorkerMesh) -> None:
        super().__init__(mesh.nsqd)
        self.mesh = mesh
        self.parts: dict[int, tuple[list[str], list[LogEnd]]] = {}  # owner -> its topics, its log channels' ends
        self.unanswered = 0
        self.refusal: str | None = None
        self._answered = trio.Event()

    async def prepare(self, states: dict[str, tuple[bool, dict]]) -> None:
        mesh = self.mesh
        spread: dict[int, dict[str, tuple[bool, dict]]] = {}
        for name, state in states.items():
            spread.setdefault(mesh.owner(name), {})[name] = state
        for owner, part in sorted(spread.items()):
            if owner == mesh.index:
                ends = prepare_topics(self.nsqd, part)
            else:
                try:
                    ends = await mesh.call(owner, "adopt_topics", part)
                except WorkerGone as exc:
                    raise AdoptionFailed(str(exc)) from None
            self.parts[owner] = (list(part), ends)

    async def place(self, topic_name: str, batch: list) -> None:
        mesh = self.mesh
        owner = mesh.owner(topic_name)
        if owner == mesh.index:
            await super().place(topic_name, batch)
            return
        while self.unanswered >= ADOPT_WINDOW and self.refusal is None:
            await self._next_answer()
        self._check()
        rows = [((m.id, m.timestamp, m.attempts, m.due_ns, m.body), finished, again) for m, finished, again in batch]
        self.unanswered += 1
        mesh.call_soon(owner, "adopt", (topic_name, rows), self._on_answer)

    def _on_answer(self, refusal: str | None) -> None:
        self.unanswered -= 1
        if refusal is not None and self.refusal is None:
            self.refusal = refusal
        self._answered.set()

    async def _next_answer(self) -> None:
        await self._answered.wait()
        self._answered = trio.Event()

    def _check(self) -> None:
        if self.refusal is not None:
            raise AdoptionFailed(f"a worker did not take adopted messages: {self.refusal}")

    async def placed(self) -> None:
        while self.unanswered and self.refusal is None:
            await self._next_answer()
        self._check()

    async def note(self, node: str, epoch: int) -> None:
        when = int(time.time())
        for owner, (topics, ends) in self.parts.items():
            if owner == self.mesh.index:
                note_adopted(self.nsqd, ends, topics, node, epoch, when)
                continue
            try:
                await self.mesh.call(owner, "adopt_noted", ends, topics, node, epoch, when)
            except WorkerGone:  # every message is in its topic: only the note is missing, and the node stops
                log.error("REPLICATION: worker %d stopped before noting the takeover of %s", owner, node)


# -- lookupd: worker 0 registers the node --------------------------------------------------------------------------
class MeshLookup(Lookup):
    """Worker 0's registration: its own topics and channels and those the other workers report. It tells the
    others the HTTP addresses of the lookupds it identified with, for their topics' channel pre-creation."""

    def __init__(self, nsqd, mesh: WorkerMesh) -> None:
        super().__init__(nsqd)
        self.mesh = mesh
        self.remote: dict[str, list[str]] = {}  # topic -> channels, of the topics other workers own

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tell_workers)
            await nursery.start(super().run)
            task_status.started()

    async def _tell_workers(self) -> None:
        told: list[str] = []
        while True:
            await self.identified.wait()
            addresses = self.http_addresses()
            if addresses != told:
                for link in self.mesh.links.values():
                    link.send(("lookupd_http", addresses))
                told = addresses
            await trio.sleep(RELAY_INTERVAL)

    def registration_commands(self) -> list[bytes]:
        commands = super().registration_commands()
        for topic, channels in list(self.remote.items()):
            if not channels:
                commands.append(encode_register(topic))
            else:
                commands.extend(encode_register(topic, name) for name in channels)
        return commands

    def remote_change(self, command: bytes, branch: str, topic: str, channel: str, created: bool) -> None:
        if created:
            channels = self.remote.setdefault(topic, [])
            if channel and channel not in channels:
                channels.append(channel)
        elif not channel:
            self.remote.pop(topic, None)
        else:
            listed = self.remote.get(topic)
            if listed is not None and channel in listed:
                listed.remove(channel)
        if self.peers:
            self._notify(command, branch)


class RelayLookup(Lookup):
    """The registration of a worker other than 0: its changes go to worker 0, which registers the node. Its
    topics' channels are pre-created from the lookupds worker 0 identified with (``MeshLookup``)."""

    def __init__(self, nsqd, mesh: WorkerMesh) -> None:
        super().__init__(nsqd)
        self.link = mesh.links[0]
        self.relayed: list[str] = []

    def set_addresses(self, addresses: list[str]) -> None:
        self.nsqd.opts.lookupd_tcp_addresses = list(addresses)  # no connection of its own

    def http_addresses(self) -> list[str]:
        return list(self.relayed)

    def lookupd_addresses(self, addresses: list[str]) -> None:
        self.relayed = list(addresses)
        if addresses:
            self.identified.set()

    def _relay(self, command: bytes, branch: str, topic: str, channel: str, created: bool) -> None:
        self.link.send(("lookup", command, branch, topic, channel, created))

    def topic_created(self, topic) -> None:
        self._relay(encode_register(topic.name), "topic", topic.name, "", True)

    def topic_deleted(self, topic) -> None:
        for name in list(topic.channels):
            self._relay(encode_unregister(topic.name, name), "channel", topic.name, name, False)
        self._relay(encode_unregister(topic.name), "topic", topic.name, "", False)

    def channel_created(self, channel) -> None:
        self._relay(
            encode_register(channel.topic_name, channel.name), "channel", channel.topic_name, channel.name, True
        )

    def channel_deleted(self, channel) -> None:
        command = encode_unregister(channel.topic_name, channel.name)
        self._relay(command, "channel", channel.topic_name, channel.name, False)


# -- nsqd.dat: worker 0 writes the node's file ---------------------------------------------------------------------
def encode_entry(entry: dict) -> bytes:
    """A topic entry of ``metadata.load_metadata`` as ``metadata_writer.encode_topic`` writes one."""
    channels = [{"name": c["name"], "paused": c["paused"]} for c in entry["channels"]]
    document = {"name": entry["name"], "paused": entry["paused"], "channels": channels or None}
    return json.dumps(document, separators=(",", ":")).encode()


class MeshMetadata(MetadataWriter):
    """Worker 0's ``nsqd.dat``: its own topics' entries, then those each other worker sent last (seeded at start-up
    with the entries of the file it read, so a worker that has not reported yet keeps its topics listed)."""

    def __init__(self, data_path: str, topics: dict, mesh: WorkerMesh | None = None, **kwargs) -> None:
        super().__init__(data_path, topics, **kwargs)
        self.mesh = mesh
        self.remote: dict[int, list[bytes]] = {}
        self.generations: dict[int, int] = {}  # worker -> the generation of its entries held (``RelayMetadata``)

    async def flush(self) -> None:
        """As one nsqd's: return once nsqd.dat holds every change answered so far, the other workers' included."""
        if self.mesh is not None:
            await self.mesh.pull_metadata()
        await super().flush()

    def seed(self, owner: int, entry: dict) -> None:
        self.remote.setdefault(owner, []).append(encode_entry(entry))

    def _build(self) -> list[bytes]:
        entries = super()._build()
        for worker in sorted(self.remote):
            entries.extend(self.remote[worker])
        return entries

    def remote_changed(self, worker: int, entries: list[bytes], generation: int = 0) -> None:
        """A worker's entries; older than those held (its two links do not keep each other's order), ignored."""
        if generation < self.generations.get(worker, 0):
            return
        self.generations[worker] = generation
        if self.remote.get(worker) == entries:
            return  # as held (at start-up: as the file read lists them): nothing to write
        self.remote[worker] = list(entries)
        self.changes += 1
        if self._idle:
            self._wake.set()


class RelayMetadata(MetadataWriter):
    """A worker other than 0: its topics' entries go to worker 0 (``MeshMetadata``) instead of a file. Each send
    carries a generation, so that worker 0 keeps the newest of what came over either of its links."""

    def __init__(self, data_path: str, topics: dict, link: Link, *, sync_socket=None, **kwargs) -> None:
        super().__init__(data_path, topics, **kwargs)
        self.link = link
        self.sync_socket = sync_socket
        self.sent = 0
        # marks worker 0 has confirmed written to nsqd.dat; ``written`` counts marks sent over the link, which
        # worker 0 may not have written yet when a kill -9 comes
        self.synced = 0

    def _send(self) -> None:
        self.sent += 1
        self.link.send(("meta", self._build(), self.sent))

    async def _write(self) -> None:
        self._urgent = False
        generation = self.changes
        self._send()
        self._next_start = trio.current_time() + self.interval
        self.written = generation
        self.writes += 1
        self._written.set()
        self._written = trio.Event()
        await trio.lowlevel.checkpoint()

    def write_now(self) -> None:
        generation = self.changes
        self._send()
        self.written = max(self.written, generation)

    async def flush(self) -> None:
        """``NSQD.persist_metadata``: an HTTP pause or channel change answers once nsqd.dat holds it, as from one
        nsqd, so this waits for worker 0's write (``sync``); a failure is logged, as a failed write is."""
        try:
            self.sync()
        except OSError as exc:
            self.log.error("failed to persist metadata - %s", exc)

    def sync(self) -> None:
        """Durable mode (``SyncBarrier.commit``): return once worker 0 wrote nsqd.dat with this worker's topics
        as they are now, or raise ``OSError`` (the commit fails, and the publishes it was to cover with it). The
        event loop waits, blocked, as it waits for an fsync; worker 0 answers from its read poller and never
        waits for another worker, so the wait cannot come back to this one."""
        if self.synced >= self.changes:
            return
        if self.sync_socket is None:
            self.write_now()
            self.synced = self.written
            return
        generation = self.changes
        self.sent += 1
        sent = self.sent
        request = pickle.dumps([("metasync", self._build(), sent)], protocol=pickle.HIGHEST_PROTOCOL)
        sock = self.sync_socket
        sock.settimeout(METADATA_SYNC_TIMEOUT)
        sock.sendall(_LENGTH.pack(len(request)) + request)
        while True:  # an answer to an earlier request that timed out comes first: skipped
            for record in _receive_batch(sock):
                if record[0] == "re" and record[1] == sent:
                    if record[2] is not None:
                        raise OSError(f"nsqd.dat not written: {record[2]}")
                    self.written = max(self.written, generation)
                    self.synced = max(self.synced, generation)
                    return


def _receive_batch(sock) -> list[tuple]:
    """One batch (``Link``'s framing) read from a blocking socket; ``OSError`` at its end or on its timeout."""
    header = _receive_exactly(sock, 4)
    return pickle.loads(_receive_exactly(sock, _LENGTH.unpack(header)[0]))


def _receive_exactly(sock, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("worker 0 is gone")
        data += chunk
    return bytes(data)
