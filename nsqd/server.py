"""NSQD: the daemon. Owns the topics, the listeners, the actor system and the queue scanner.

``run`` starts everything inside one nursery and reports readiness through ``task_status``;
``exit`` stops accepting, closes every client connection, and stops the loops, in nsqd's order.
Connections are served by ``tcp.Connection``; this module only accepts them and keeps the registry.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from functools import partial
from typing import Any

import trio

from protocol.frames import FRAME_TYPE_ERROR, encode_frame
from protocol.identify import IdentifyLimits
from protocol.names import is_ephemeral, is_valid_channel_name, is_valid_topic_name
from protocol.replication import MAGIC_R1, OP_DELETED, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN
from protocol.version import version_string
from runtime.allocator import RELEASE_PERIOD, release_free_memory
from runtime.collector import FreezingCollector
from runtime.daemon import accept_connections, adopt_listeners, format_address
from runtime.http_server import HTTPServer
from runtime.logfmt import set_log_level

from .activity import IDLE_SHARE, Activity, NotingDict, cpu_share
from .actors import ActorSystem
from .auth import Authenticator
from .client import Client
from .e2e import E2ELatency
from .fastpath import PublishBatch
from .guid import GUIDFactory
from .heartbeats import HeartbeatTimer
from .http_api import build_router, make_http_server
from .lookup import Lookup
from .message import Message
from .metadata import FILE_NAME, Prebound, bind_addresses, load_metadata, lock_data_path
from .metadata_writer import MetadataWriter
from .options import replication_acks
from .poller import ReadPoller
from .queue_scan import QueueScanner
from .queues.atomic_file import remove_stray_temporaries
from .queues.diskqueue import DiskQueue
from .queues.group_commit import SyncBarrier
from .queues.offset_log import OffsetLog
from .replication import ReplicaHost, Replicator, attach_channel, attach_replication
from .replication.adopted import drop_adopted
from .replication.replace import PeerReplacer, current_peers
from .replication.restore import LostCopies
from .replication.sender import load_state, save_state
from .replication.snapshot import Backfill
from .stats_cache import StatsCache
from .statsd import StatsdPusher
from .tcp import MAGIC_V2, Connection
from .tls import client_ssl_context, server_ssl_context
from .topic import Topic
from .workers import MeshLookup, MeshMetadata, RelayLookup, RelayMetadata, WorkerMesh

__all__ = ["NSQD"]

log = logging.getLogger("nsqd")

#: how long a starting node waits for its --replicate-to peers to say whether its messages were adopted (a peer
#: that refuses the connection is not waited for; one that took it and is slow to answer is, this long at most)
REPLICATION_START_TIMEOUT = 30.0
#: how long a stopping worker waits for the others to close their connections and send what they acknowledged
MESH_DRAIN_TIMEOUT = 5.0
#: Tests only: the newest replication protocol version this node speaks, below ``PROTOCOL_VERSION`` (a node not
#: yet upgraded, in a test of a rolling upgrade). Not a flag: an operator has no reason to speak an older version.
REPLICATION_VERSION_ENV = "NSQD_TEST_REPLICATION_VERSION"


def _replication_version() -> int:
    cap = os.environ.get(REPLICATION_VERSION_ENV, "")
    if not cap:
        return PROTOCOL_VERSION
    return max(PROTOCOL_VERSION_MIN, min(PROTOCOL_VERSION, int(cap)))


class NSQD:
    def __init__(self, opts) -> None:
        self.opts = opts
        self.topics: dict[str, Topic] = {}
        # every channel of every topic, kept by the create and delete hooks: the queue scanner's refresh copies it
        # instead of walking every topic (milliseconds at 10,000 topics)
        self._channel_registry: dict = {}
        # moves at every topic and channel create and delete (stats_cache.py keeps its sorted lists until then)
        self.topology_version = 0
        self._channels: list = []  # all_channels(), as of _channels_version
        self._channels_version: int | None = None
        self.clients: dict[int, Client] = {}
        self.exiting = False
        self.start_time = int(time.time())
        self.tcp_address: str | None = None
        self.http_address: str | None = None  # bound HTTP address (ip:port), None when --http-address=""
        self.http_server: HTTPServer | None = None
        self.lookup = Lookup(self)  # registration with every --lookupd-tcp-address
        self.https_address: str | None = None  # bound HTTPS address, None without a TLS certificate
        self.https_server: HTTPServer | None = None
        # A channel whose consumers return credit in bursts (many consumers with small RDY) suspends
        # whenever all of them are momentarily full; with a wake slack of one slice it would forfeit
        # that time to channels with deep windows. Four slices let it catch up, still bounded (measured:
        # 50 consumers against 2 got 0.17 s against 0.21 s of dispatch time with one slice, equal with four).
        self.actors = ActorSystem(
            workers=opts.actor_workers,
            slice_seconds=opts.actor_slice,
            wake_slack=4 * opts.actor_slice,
            interlude_seconds=opts.actor_interlude,
        )
        #: what wakes the loops an idle node lets sleep (activity.py): the poller's wake-ups, deliveries, disk work
        self.activity = Activity()
        self.read_poller = ReadPoller()  # idle plain-TCP connections are read by one task (poller.py)
        self.read_poller.activity = self.activity
        self.publish_batch = PublishBatch(self)  # a poller step's plain PUBs, published at its end (fastpath.py)
        self.read_poller.bulk_read = self.publish_batch.read_producers
        self.read_poller.step_poll = self.publish_batch.poll_producers
        self.heartbeats = HeartbeatTimer()  # and one task writes their heartbeats (heartbeats.py)
        # light connections are read between the consumers of a busy channel's slice too (actors.py)
        self.actors.interlude_hook = self.read_poller.poll_light
        self.scanner = QueueScanner(
            self.all_channels,
            interval=opts.queue_scan_interval,
            refresh_interval=opts.queue_scan_refresh_interval,
            selection_count=opts.queue_scan_selection_count,
            worker_pool_max=opts.queue_scan_worker_pool_max,
            dirty_percent=opts.queue_scan_dirty_percent,
            on_wake=self.activity.note,
        )
        # what survives a full collection is frozen, and handed back once enough topics, channels and connections
        # were let go (runtime/collector.py); hooked to the collector by the entry point (``__main__``)
        self.collector = FreezingCollector(self._kept_objects)
        self._scanner_activate = self.scanner.activate  # every channel's ``on_timed_work`` (one object for all)
        self._on_queue_damage = self._queue_damaged  # every disk queue's ``on_damage`` (one object for all)
        self.tls_context = server_ssl_context(opts)  # None without --tls-cert/--tls-key; shared with HTTPS
        self.authenticator = Authenticator.from_options(opts)
        self.identify_limits = IdentifyLimits(
            max_rdy_count=opts.max_rdy_count,
            max_msg_timeout_ms=int(opts.max_msg_timeout * 1000),
            msg_timeout_ms=int(opts.msg_timeout * 1000),
            max_heartbeat_interval_ms=int(opts.max_heartbeat_interval * 1000),
            heartbeat_interval_ms=int(opts.client_timeout * 1000 / 2),
            output_buffer_size=16384,
            output_buffer_timeout_ms=int(opts.output_buffer_timeout * 1000),
            min_output_buffer_timeout_ms=int(opts.min_output_buffer_timeout * 1000),
            max_output_buffer_timeout_ms=int(opts.max_output_buffer_timeout * 1000),
            max_output_buffer_size=opts.max_output_buffer_size,
            tls_available=self.tls_context is not None,
            snappy_enabled=opts.snappy,
            deflate_enabled=opts.deflate,
            max_deflate_level=opts.max_deflate_level,
            auth_required=self.authenticator.enabled,
        )
        self.data_path = opts.data_path or os.getcwd()
        # group commit of publishes: connections commit it before an OK leaves (queues/diskqueue.py)
        self.sync_barrier = SyncBarrier()
        # replication (nsqd/replication/): the origin's sender, None without --replicate-to; the replica side
        self.replication: Replicator | None = None
        self.replacer: PeerReplacer | None = None  # with --replicate-to: peers gone for good (replace.py)
        #: the newest replication protocol version this node speaks, both as an origin and as a replica
        self.replication_version = _replication_version()
        self.replica_host = ReplicaHost(self)
        #: messages of this node a replica adopted that it had finished (``_replication_adopted``): delivered twice
        self.duplicates_after_takeover = 0
        #: what this node's queues found lost, and which copies replicas sent back for them go in again
        self.lost_copies = LostCopies()
        self.failing_queues: dict[DiskQueue, None] = {}  # queues that have failed (DiskQueue.failing)
        #: queues owing a periodic sync (DiskQueue.active; each insertion wakes an idle sync loop)
        self.active_queues: dict[DiskQueue, None] = NotingDict(self.activity)
        #: the topics and channels whose /stats figures may have changed since the stats cache last looked (they add
        #: themselves: ``Topic.changed``; the cache empties it)
        self.stats_changed: set = set()
        #: the ``StatsCache``s made for this node; with more than one, each reads every key (the one that emptied
        #: ``stats_changed`` would hide its marks from the others). The HTTP and HTTPS servers share one
        #: (``stats_cache``).
        self.stats_readers = 0
        self._stats_cache: StatsCache | None = None
        #: durable mode: topics whose channels kept copies (Topic._owing; each insertion wakes an idle sync loop)
        self.owing_topics: dict[Topic, None] = NotingDict(self.activity)
        self.metadata = MetadataWriter(self.data_path, self.topics, logger=log)  # nsqd.dat, kept up to date
        # the names of the files the data directory held at start-up (``load_metadata``); a disk queue or deferred
        # index whose file is not among them opens nothing (queues/diskqueue.py, "Many queues"); None: look
        self.files_at_start: frozenset[str] | None = None
        # what every topic is given (made once: a bound method per topic would be five more objects each)
        #: message IDs of every topic: unique on the node, not only per topic as nsqd's (a replica keys by ID)
        self.guid = GUIDFactory(opts.node_id)
        self._topic_hooks: dict[str, Any] = {
            "on_channel_created": self._channel_created,
            "on_channel_deleted": self._channel_deleted,
            "on_last_channel_gone": self._ephemeral_topic_idle,
            "make_backend": self._make_backend,
            "spawn": self._spawn,
            "owing": self.owing_topics,
            "changed": self.stats_changed,
            "open_log": self._open_log,
        }
        #: with ``--workers`` above 1, this worker's links to the others and the topics' owners (workers.py)
        self.mesh: WorkerMesh | None = None
        self._data_lock: int | None = None
        self._prebound: Prebound | None = None
        self._loading = False
        self._nursery: trio.Nursery | None = None
        self._client_ids = itertools.count(1)
        self._accept_scope = trio.CancelScope()
        self._connections_scope = trio.CancelScope()
        self._connections: trio.Nursery | None = None  # the client connections' tasks (``_serve``)
        #: connections handed over before ``_serve`` started (``take_connection``, ``take_replication``)
        self._taken_early: list[tuple] = []
        self._stopped = trio.Event()

    # -- topics ----------------------------------------------------------------------------------
    def get_topic(self, name: str, *, after=None, precreate: bool = True) -> Topic:
        """The topic ``name``, created if need be. ``after``: a new topic's announcement (its log line, nsqd.dat,
        lookupd) is handed to this (``Request.after_answer``) instead of being made at once, as nsqd 1.3.0 answers
        ``/topic/create`` once the topic exists and persists and notifies from a goroutine; the topic itself is
        there, publishable and listed, on return. ``precreate``: a new topic asks nsqlookupd for its channels
        (False: the caller knows them)."""
        topic = self.topics.get(name)
        if topic is None:
            opts = self.opts
            topic = Topic(
                name,
                node_id=opts.node_id,
                mem_queue_size=opts.mem_queue_size,
                max_msg_timeout=opts.max_msg_timeout,
                actors=self.actors,
                guid=self.guid,
                **self._topic_hooks,
            )
            self.topics[name] = topic
            self.topology_version += 1
            if self.replication is not None and not topic.ephemeral:
                attach_replication(self.replication, topic)
            if after is None:
                self._topic_created(topic, precreate)
            else:
                after(partial(self._topic_created, topic, precreate))
        return topic

    def _topic_created(self, topic: Topic, precreate: bool = True) -> None:
        log.info("TOPIC(%s): created", topic.name)
        if not topic.ephemeral:
            self.metadata_changed(topic.name)
        self.lookup.topic_created(topic)
        if precreate and not self._loading:
            self.lookup.prepare_topic(topic)  # pre-create the channels lookupd knows

    def _make_backend(self, name: str) -> DiskQueue:
        opts = self.opts
        return DiskQueue(
            name,
            self.data_path,
            max_bytes_per_file=opts.max_bytes_per_file,
            min_msg_size=26,
            max_msg_size=opts.max_msg_size + 26,
            sync_every=opts.sync_every,
            sync_timeout=opts.sync_timeout,
            hold_reads=self.durable,
            barrier=self.sync_barrier,
            failing=self.failing_queues,
            active=self.active_queues,
            logger=log,
            known_files=self.files_at_start,
            checksums=True,
            on_damage=self._on_queue_damage,
        )

    def _queue_damaged(self, queue: DiskQueue, count: int) -> None:
        """A disk queue found records damaged or lost while reading: its replicas send back their copies
        (``Replicator.queue_damaged``); without replication they are lost, counted in ``damaged_count``."""
        lost = queue.take_lost()
        if self.replication is not None and queue.damage_at is not None:
            self.lost_copies.note_queue(queue.name, lost)
            self.replication.queue_damaged(queue.name, queue.damage_at)

    def _open_log(self, name: str, create: bool) -> OffsetLog | None:
        """The offset log of the channel ``name`` (``<topic>:<channel>``): opened when its files exist, else made
        when ``create`` (LOG), else None. OSError from the files."""
        # the directory's listing at start-up answers while loading (many channels); later, the file itself
        known = self.files_at_start if self._loading else None
        if not create and not OffsetLog.exists(self.data_path, name, known):
            return None
        opts = self.opts
        return OffsetLog(
            self.data_path,
            name,
            max_bytes_per_file=opts.max_bytes_per_file,
            durable=self.durable,
            retention_time=opts.log_retention_time,
            retention_bytes=opts.log_retention_bytes,
            active=self.active_queues,
            logger=log,
        ).open()

    @property
    def durable(self) -> bool:
        """Durable mode (``--mem-queue-size=0 --sync-every=1``): nothing acknowledged or in flight is lost on
        a crash; see DESIGN.md "Persistence"."""
        return self.opts.mem_queue_size == 0 and self.opts.sync_every == 1

    def _spawn(self, async_fn, *args) -> bool:
        """Start a task in the daemon's nursery; False before ``run`` has one (the caller retries later)."""
        if self._nursery is None:
            return False
        self._nursery.start_soon(async_fn, *args)
        return True

    def lock_data_path(self) -> None:
        if self._data_lock is None:
            self._data_lock = lock_data_path(self.data_path)

    def adopt(self, prebound: Prebound) -> None:
        """Take the data directory lock and the listening sockets ``nsqd``'s entry point took before start-up."""
        self._data_lock = prebound.data_lock
        self._prebound = prebound
        if prebound.mesh is not None:
            self._join_workers(prebound.mesh)

    def _join_workers(self, sockets) -> None:
        """One of ``--workers`` processes: worker 0 registers the node with lookupd and writes nsqd.dat, with what
        the others send it (workers.py)."""
        mesh = self.mesh = WorkerMesh(self, sockets)
        log.info("NSQ: worker %d of %d", mesh.index, mesh.count)
        self.start_time = sockets.start_time
        # IDs are the node's (its --node-id) and unique on it: each worker issues its share of every tick's sequences
        self.guid = GUIDFactory(self.opts.node_id, mesh.index, mesh.count)
        if mesh.index == 0:
            self.lookup = MeshLookup(self, mesh)
            self.metadata = MeshMetadata(self.data_path, self.topics, mesh, logger=log)
        else:
            self.lookup = RelayLookup(self, mesh)
            self.metadata = RelayMetadata(
                self.data_path, self.topics, mesh.links[0], sync_socket=mesh.metadata_socket, logger=log
            )

    def metadata_changed(self, topic_name: str) -> None:
        """A topic, one of its channels or a paused flag changed: nsqd.dat follows shortly (metadata.py)."""
        if self._loading or self._data_lock is None:
            return
        self.metadata.mark(topic_name)
        if self.durable:
            self.sync_barrier.owe(self.metadata)  # written before the next acknowledgement leaves (group commit)

    async def persist_metadata(self) -> None:
        """Return once nsqd.dat holds every change made so far (an HTTP pause answers after this, as in nsqd)."""
        if self._data_lock is not None:
            await self.metadata.flush()

    def write_metadata(self) -> None:
        """Write all of nsqd.dat inline (after loading, at shutdown)."""
        if self._data_lock is None:
            return
        self.metadata.mark_all()
        self.metadata.write_now()

    def load_metadata(self) -> None:
        self._loading = True
        try:
            if self._data_lock is not None:  # nobody else writes here: what a killed nsqd left can go
                if self.mesh is None:  # (with --workers, the parent removed it before they started)
                    for name in remove_stray_temporaries(self.data_path):
                        log.info("NSQ: removed %s, a temporary file left by an interrupted write", name)
                # nothing but this process adds files here from now on (it holds the lock; with --workers, only a
                # topic's owner makes its files)
                self.files_at_start = frozenset(os.listdir(self.data_path))
            mesh = self.mesh
            for entry in load_metadata(self.data_path):
                if mesh is not None and not mesh.owns(entry["name"]):
                    if isinstance(self.metadata, MeshMetadata):
                        self.metadata.seed(mesh.owner(entry["name"]), entry)  # listed until its owner reports
                    continue
                topic = self.get_topic(entry["name"])
                for channel_entry in entry["channels"]:
                    channel = topic.get_channel(channel_entry["name"])
                    if channel_entry["paused"]:
                        channel.pause()
                if entry["paused"]:
                    topic.pause()
            self._load_unlisted_logs()
        finally:
            self._loading = False

    def _load_unlisted_logs(self) -> None:
        """Log channels whose files exist but that nsqd.dat does not list (a kill before the coalesced write of
        nsqd.dat that follows a LOG): their files say they exist, so they are loaded as listed ones are (else their
        messages would wait, unlisted and unreplicated, for the next LOG, and a node back after a takeover would not
        drop from them what its replica adopted)."""
        suffix = ".log.meta"
        for file_name in sorted(self.files_at_start or ()):
            if not file_name.endswith(suffix):
                continue
            topic_name, _, channel_name = file_name[: -len(suffix)].partition(":")
            if not (is_valid_topic_name(topic_name) and is_valid_channel_name(channel_name)):
                continue
            if is_ephemeral(topic_name) or is_ephemeral(channel_name):
                continue
            if self.mesh is not None and not self.mesh.owns(topic_name):
                continue  # its owner loads it
            topic = self.topics.get(topic_name)
            if topic is not None and channel_name in topic.channels:
                continue
            log.info("NSQ: log channel %s:%s is not in %s, found by its files", topic_name, channel_name, FILE_NAME)
            self.get_topic(topic_name).get_channel(channel_name)  # (nsqd.dat is written whole after loading)

    def health(self) -> str:
        """``OK``, or ``NOK - <error>`` while a disk queue's last write failed (only the queues that have failed
        are looked at: the cost does not follow the number of topics), or while replication refuses publishes."""
        failing = self.failing_queues
        for queue in list(failing):
            if queue.closed or queue.last_error is None:
                failing.pop(queue, None)
            else:
                return f"NOK - {queue.last_error}"
        if self.replication is not None and self.replication.refusing():
            return "NOK - replication degraded"
        return "OK"

    def get_existing_topic(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def delete_topic(self, name: str) -> bool:
        topic = self.topics.pop(name, None)
        if topic is None:
            return False
        self.topology_version += 1
        self.lookup.topic_deleted(topic)
        for channel in topic.channels.values():
            self._channel_registry.pop(channel, None)
            self.stats_changed.discard(channel)
        self.stats_changed.discard(topic)  # (held there until the next /stats request otherwise)
        self.collector.release(1 + len(topic.channels))
        self.activity.note()  # its memory is freed: the sync loop's release has work
        topic.close(persist=False)
        if topic.replication is not None:
            topic.replication.channel_op(name, "", OP_DELETED)
        log.info("TOPIC(%s): deleting", name)
        if not topic.ephemeral:
            self.metadata_changed(name)
        return True

    def _channel_created(self, channel) -> None:
        self.topology_version += 1
        self._channel_registry[channel] = None
        self.scanner.invalidate()
        channel.on_timed_work = self._scanner_activate
        if channel.topic.replication is not None and not channel.ephemeral:
            attach_channel(channel.topic.replication, channel)
        self.lookup.channel_created(channel)
        percentiles = self.opts.e2e_processing_latency_percentiles
        if percentiles:
            channel.e2e = E2ELatency(percentiles, self.opts.e2e_processing_latency_window_time)
        if not channel.ephemeral:
            self.metadata_changed(channel.topic_name)

    def _channel_deleted(self, channel) -> None:
        self.topology_version += 1
        self._channel_registry.pop(channel, None)
        self.stats_changed.discard(channel)
        self.collector.release()
        self.activity.note()
        self.scanner.invalidate()
        if channel.replication is not None:
            channel.replication.channel_op(channel.topic_name, channel.name, OP_DELETED)
        self.lookup.channel_deleted(channel)
        if not channel.ephemeral:
            self.metadata_changed(channel.topic_name)

    def set_lookupd_addresses(self, addresses: list[str]) -> None:
        """Replace ``--lookupd-tcp-address`` at run time: close the peers left out, connect the new ones."""
        self.lookup.set_addresses(list(addresses))

    def configure(self, opt: str, value: Any) -> None:
        """``PUT /config/<opt>`` in this process, ``value`` checked (with ``--workers``, each worker makes it)."""
        if opt == "nsqlookupd_tcp_addresses":
            self.set_lookupd_addresses(value)
            log.info("CONFIG: nsqlookupd_tcp_addresses set to %s", value)
        elif opt == "log_level":
            set_log_level(log, value)
            self.opts.log_level = value
        else:
            raise KeyError(opt)

    def _ephemeral_topic_idle(self, topic: Topic) -> None:
        self.delete_topic(topic.name)

    def stats_cache(self) -> StatsCache:
        """The node's ``StatsCache`` (its ``/stats`` and ``/metrics``, whichever server they come through)."""
        if self._stats_cache is None:
            self._stats_cache = StatsCache(self)
        return self._stats_cache

    def _kept_objects(self) -> int:
        """The topics, channels and connections the node keeps (``FreezingCollector``)."""
        return len(self.topics) + len(self._channel_registry) + len(self.clients)

    def all_channels(self) -> list:
        """Every topic's channels: the registry the create and delete hooks keep, listed again only when a topic or
        a channel came or went (``topology_version``). The queue scanner asks every few seconds; an idle node with
        20,000 channels spent most of its time listing them again."""
        if self._channels_version != self.topology_version:
            self._channels = list(self._channel_registry)
            self._channels_version = self.topology_version
        return self._channels

    # -- running ---------------------------------------------------------------------------------
    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        opts = self.opts
        self.lock_data_path()
        log.info("%s", version_string("nsqd"))
        log.info("ID: %d", opts.node_id)
        if self.durable:
            log.info("NSQ: durable mode: every message is synced to disk before OK, in-flight ones survive a crash")
        self.load_metadata()
        self.write_metadata()
        # every listener is bound before anything runs, so an address in use stops start-up with its name
        prebound, self._prebound = self._prebound, None
        if prebound is not None:  # bound by the entry point before the imports (see Prebound)
            tcp, http, https = prebound.tcp, prebound.http, prebound.https
        else:
            tcp, http, https = bind_addresses(opts)
        listeners = adopt_listeners(tcp)
        http_listeners = adopt_listeners(http) if http else None
        https_listeners = adopt_listeners(https) if https else None
        self.tcp_address = format_address(listeners[0].socket.getsockname())
        self._start_replication()
        for listener in listeners:
            log.info("TCP: listening on %s", format_address(listener.socket.getsockname()))
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.mesh is not None:
                    self.mesh.router = build_router(self)
                    await nursery.start(self.mesh.run)
                await nursery.start(self.actors.run)
                await nursery.start(self.metadata.run)
                await nursery.start(self.read_poller.run)
                await nursery.start(self.heartbeats.run)
                await nursery.start(self.scanner.run)
                if http_listeners:
                    self.http_server = make_http_server(self, http_listeners)
                    self.http_address = await nursery.start(self.http_server.run)
                if https_listeners:
                    # nsqd serves HTTPS only with a certificate; the TCP upgrade shares the context
                    self.https_server = make_http_server(
                        self, https_listeners, name="HTTPS", ssl_context=self.tls_context
                    )
                    self.https_address = await nursery.start(self.https_server.run)
                if opts.statsd_address and (self.mesh is None or self.mesh.index == 0):
                    await nursery.start(StatsdPusher(self).run)
                nursery.start_soon(self._sync_loop)
                await nursery.start(self.replica_host.run)
                if self.replication is not None:
                    await nursery.start(self.replication.run)
                    nursery.start_soon(self.replication.wait_started, REPLICATION_START_TIMEOUT)
                    if self.mesh is not None:
                        nursery.start_soon(self._tell_workers_started)
                if self.replacer is not None:
                    await nursery.start(self.replacer.run)
                nursery.start_soon(self._serve, listeners)
                await nursery.start(self.lookup.run)
                for topic in list(self.topics.values()):
                    topic._start_drain()
                task_status.started()
                await self._stopped.wait()
                nursery.cancel_scope.cancel()
        finally:
            for listener in listeners:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
            self._close_topics()

    async def _tell_workers_started(self) -> None:
        assert self.replication is not None and self.mesh is not None
        await self.replication.ready.wait()
        self.mesh.replication_started()

    @property
    def node_name(self) -> str:
        """This node as its peers name it in ``--replicate-to``: broadcast address and TCP port."""
        address = self.tcp_address
        assert address is not None  # asked once the TCP listener is bound
        port = self.opts.broadcast_tcp_port or int(address.rpartition(":")[2])
        return f"{self.opts.broadcast_address}:{port}"

    def _start_replication(self) -> None:
        """Open the replica stores, and with ``--replicate-to`` the origin's sender (its node name needs the
        bound TCP port); the topics loaded from the metadata join it. With ``--workers``, worker 0 alone
        (workers.py)."""
        if self.mesh is not None and self.mesh.index != 0:
            return
        self.replica_host.load()
        opts = self.opts
        if not opts.replicate_to:
            return
        state = load_state(self.data_path)
        epoch = int(state.get("epoch", 0)) if state else 0
        # what its peers hold may go only if this directory still has every message this node acknowledged
        clean = state is not None and (self.durable or not state.get("running", True))
        if state is not None and not clean:
            log.warning("REPLICATION: the last run did not stop cleanly: the peers adopt what they hold")
        save_state(self.data_path, epoch, True)
        peers = current_peers(self.data_path, opts.replicate_to)  # a peer replaced in an earlier run stays so
        self.replication = Replicator(
            self.node_name,
            peers,
            acks=replication_acks(opts),
            degraded=opts.replication_degraded,
            durable=self.durable,
            ssl_context=self.replication_ssl_context(),
            epoch=epoch,
            snapshot=partial(Backfill, self),
            on_adopted=self._replication_adopted,
            node_id=opts.node_id,
            clean=clean,
            version=self.replication_version,
            on_restore=self._replication_restored,
            candidates=tuple(opts.replication_candidates),
            replace_after=opts.replication_replace_after,
            on_topology=self._replication_topology,
        )
        self.replication.poller = self.read_poller  # ACKs are read between connections too (sender.py)
        log.info(
            "REPLICATION: %s keeps copies on %s (%d ack(s) required, %s when degraded)",
            self.node_name,
            ", ".join(peers),
            self.replication.acks_required,
            opts.replication_degraded,
        )
        for topic in self.topics.values():
            if not topic.ephemeral:
                attach_replication(self.replication, topic)
        # a peer gone for good is replaced (``--replication-replace-after``), one replaced is released
        self.replacer = PeerReplacer(self, self.replication)

    def _replication_adopted(self, peer: str, epoch: int, ids: list[bytes]) -> None:
        """Peer ``peer`` adopted these messages of this node (``ids``) while it was away, or cut off from it (a
        partition longer than the peer's takeover wait, while this node ran). The ones held here are dropped (the
        peer delivers them: one owner for each message) and every other message stays, those accepted unreplicated
        meanwhile included, and goes to the peers (the backfill that follows). The adopted messages this node no
        longer held were finished here: delivered twice, counted. While the node runs (a partition) its channels
        may hold some of them in flight: those are forgotten (a FIN for them fails), and the peer delivers them
        again; the other messages of their topics are put back in their channels (an in-flight one among them
        comes again)."""
        replication = self.replication
        assert replication is not None  # the peers that adopt are this node's replication peers
        save_state(self.data_path, epoch, True)
        adopted = set(ids)
        accepted = replication.accepted_unreplicated  # what goes back in was not accepted now
        held, kept = drop_adopted(self, adopted, peer, epoch)
        replication.accepted_unreplicated = accepted
        finished = len(adopted) - held
        if replication.clean or not replication.starting:
            self.duplicates_after_takeover += finished
        if not replication.starting:
            log.warning(
                "REPLICATION: peer %s adopted %d message(s) of this node (epoch %d) while it was connected "
                "elsewhere (a partition, or a start that did not wait for that peer): dropped the %d held here "
                "(the peer delivers them), kept %d other(s) of their topics; %d had been finished here "
                "(delivered twice)",
                peer,
                len(adopted),
                epoch,
                held,
                kept,
                finished,
            )
            return
        log.warning(
            "REPLICATION: peer %s adopted this node's messages while it was away (epoch %d): dropped the "
            "%d message(s) it adopted that were held here, kept %d other(s) of their topics; %s",
            peer,
            epoch,
            held,
            kept,
            f"{finished} it adopted had been finished here (delivered twice)"
            if replication.clean
            else "how many of them had been finished here is unknown (the last run did not stop cleanly)",
        )

    def _replication_topology(self, peer: str, topics: dict) -> None:
        """Peer ``peer`` knew these topics and channels of this node (WELCOME, to a node that did not stop cleanly:
        killed, or back on an empty directory). The ones missing here are created, paused ones paused, before the
        node takes a publish: a message published now reaches every channel its consumers use, not only the first
        one a consumer makes again (``Topic``: a topic without channels gives its backlog to its first channel)."""
        created = 0
        for name, state in topics.items():
            topic = self.topics.get(name)
            if topic is None:
                topic = self.get_topic(name, precreate=False)  # its channels are known: nsqlookupd is not asked
                if state.get("paused"):
                    topic.pause()
                created += 1
            for channel_name, paused in state.get("channels", {}).items():
                if channel_name not in topic.channels:
                    channel = topic.get_channel(channel_name)
                    if paused:
                        channel.pause()
                    created += 1
        if created:
            log.info(
                "REPLICATION: peer %s knew %d topic(s) and channel(s) of this node that it lacked: created",
                peer,
                created,
            )

    def _replication_restored(self, peer: str, topic_name: str | None, channel_name: str, messages) -> int:
        """Copies replica ``peer`` sent back for channel ``channel_name`` after this node found its files damaged
        (``topic_name`` None: its RESTORED, after the last of them). ``LostCopies`` (``replication/restore.py``)
        says which go into their channel again: those that match a record lost here, and the others only when
        what was lost is not fully known. Each goes in with the attempts and due time it had there. The replica
        still holds them, waiting for this channel's FINs, so they are not replicated again. Returns how many
        went in."""
        lost = self.lost_copies
        if topic_name is None:
            batches = lost.settle(peer, self._channel_holds)
        elif self._channel(topic_name, channel_name) is None:
            return 0
        else:
            held = partial(self._channel_holds, topic_name, channel_name)
            batches = [(topic_name, channel_name, lost.sort(peer, topic_name, channel_name, messages, held))]
        count = 0
        now_ns = time.time_ns()
        for topic_name, channel_name, copies in batches:
            channel = self._channel(topic_name, channel_name)
            if channel is None or not copies:
                continue
            channel.put_many(
                [
                    Message(m.id, m.body, m.timestamp, m.attempts, max(m.due_ns - now_ns, 0) / 1e9 if m.due_ns else 0.0)
                    for m in copies
                ]
            )
            count += len(copies)
            log.warning(
                "REPLICATION: %d message(s) of %s:%s lost to damaged files put back from the copies of %s",
                len(copies),
                topic_name,
                channel_name,
                peer,
            )
        return count

    def _channel(self, topic_name: str, channel_name: str):
        topic = self.topics.get(topic_name)
        return topic.channels.get(channel_name) if topic is not None else None

    def _channel_holds(self, topic_name: str, channel_name: str) -> set[bytes]:
        """The ids a channel holds in memory, in flight or deferred (its disk backlog is not read)."""
        channel = self._channel(topic_name, channel_name)
        if channel is None:
            return set()
        held = {m.id for m in channel.queue}
        held.update(channel.in_flight)
        held.update(m.id for _due, m in channel.deferred.entries())
        return held

    def replication_ssl_context(self):
        """With a certificate, replication streams go over TLS: peers checked against ``--tls-root-ca-file``
        (or the system's roots), this node's certificate offered for their client-auth policy."""
        if self.tls_context is None:
            return None
        context = client_ssl_context(self.opts)
        context.load_cert_chain(self.opts.tls_cert, self.opts.tls_key)
        return context

    async def _sync_loop(self) -> None:
        """fsync disk queues that have had activity for ``--sync-timeout`` (their own rule). Only the queues that
        changed since their last sync are visited, so idle topics and channels cost nothing here. Once a second
        at most, and after activity only, the C heap's free pages go back to the system (``runtime.allocator``).
        Once a pass found nothing owed (no queue to sync, no kept copies, no log retention, nothing happened since
        the last release), the loop sleeps until the next sign of activity (activity.py)."""
        period = max(min(self.opts.sync_timeout / 2, 1.0), 0.01)
        active = self.active_queues
        released_at = trio.current_time()
        watch = self.activity.watch()
        _, mark = cpu_share((0.0, 0.0))
        release_owed = False  # something happened since the last release
        while True:
            if not (active or self.owing_topics or release_owed or self.opts.log_retention_time > 0):
                await watch.wait()  # idle: nothing to sync or release until something happens
            await trio.sleep(period)
            now = trio.current_time()
            share, mark = cpu_share(mark)
            if watch.is_set() or share >= IDLE_SHARE:
                release_owed = True
                watch = self.activity.watch()
            if release_owed and now - released_at >= RELEASE_PERIOD:
                # what delivered backlogs left free in the C heap goes back to the system (runtime/allocator.py)
                release_free_memory()
                released_at = now
                release_owed = False
            # copies a full disk made channels keep in memory go to their disk once it takes writes again
            # (Topic: durable mode on a full disk); only the topics that have such copies are visited
            for topic in list(self.owing_topics):
                if topic.owes_records() and not topic.exiting:
                    for channel in list(topic.channels.values()):
                        if channel.backend is not None:
                            channel.store_kept_copies()
                if not topic.owes_records() or topic.exiting:
                    self.owing_topics.pop(topic, None)
            if self.opts.log_retention_time > 0:
                # committed segments of log channels age out even while nothing is appended or committed
                for channel in list(self._channel_registry):
                    if channel.log is not None and not channel.log.closed:
                        try:
                            channel.log.apply_retention()
                        except OSError as exc:
                            log.error("LOG(%s): retention failed - %s", channel.log.name, exc)
            for queue in list(active):
                try:
                    queue.sync_if_due(now)
                except OSError as exc:
                    log.error("DISKQUEUE(%s): sync failed - %s", queue.name, exc)
                if not queue.owes_sync:
                    active.pop(queue, None)

    def _close_topics(self) -> None:
        """nsqd's shutdown order: metadata, then each topic writes its channels' and its own messages."""
        if self._data_lock is None:
            return
        self.write_metadata()
        self.replica_host.close()
        if self.replication is not None:
            try:
                save_state(self.data_path, self.replication.epoch, False)  # a clean stop
            except OSError as exc:
                log.error("REPLICATION: failed to save %s - %s", "replication.dat", exc)
        self.actors.clear()  # the workers have stopped: no channel is run again, each leaves in O(1)
        for topic in list(self.topics.values()):
            try:
                topic.close(persist=True)
            except OSError as exc:
                log.error("TOPIC(%s): failed to persist - %s", topic.name, exc)
        os.close(self._data_lock)
        self._data_lock = None

    async def _serve(self, listeners) -> None:
        with self._connections_scope:
            async with trio.open_nursery() as connections:
                self._connections = connections
                for stream, client, unread, replication in self._taken_early:
                    if replication:
                        connections.start_soon(self._serve_replication, stream, unread)
                    else:
                        connections.start_soon(self._handle_tcp, stream, client, unread)
                self._taken_early.clear()
                with self._accept_scope:
                    async with trio.open_nursery() as acceptors:
                        for listener in listeners:
                            acceptors.start_soon(accept_connections, listener, connections, self._handle_tcp, log)
                log.info("TCP: closing %d listener(s)", len(listeners))
                await trio.sleep_forever()

    def take_connection(self, fd: int, info: dict, unread: bytes) -> None:
        """Serve a producer's connection another worker handed over (``WorkerMesh.hand_over``): past its magic and
        IDENTIFY, with the state ``info`` carries and the bytes read there but not parsed yet."""
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)))
        if self.exiting:
            stream.socket.close()
            return
        client = Client.from_fields(next(self._client_ids), info)
        client.handed_over = True
        self.clients[client.id] = client  # listed at once: a /stats meanwhile finds the producer in one worker
        if self._connections is None:  # read off a link before this worker serves clients: served once it does
            self._taken_early.append((stream, client, unread, False))
        else:
            self._connections.start_soon(self._handle_tcp, stream, client, unread)

    def take_replication(self, fd: int, unread: bytes) -> None:
        """Serve a replication stream another worker accepted (``WorkerMesh.hand_replication``), with the bytes it
        read past the magic."""
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)))
        if self.exiting:
            stream.socket.close()
            return
        if self._connections is None:
            self._taken_early.append((stream, None, unread, True))
        else:
            self._connections.start_soon(self._serve_replication, stream, unread)

    async def _serve_replication(self, stream: trio.SocketStream, unread: bytes) -> None:
        try:
            remote = format_address(stream.socket.getpeername())
        except OSError:
            await stream.aclose()
            return
        log.info("TCP: replication stream(%s) taken over from another worker", remote)
        try:
            await self.replica_host.serve(stream, remote, unread)
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            log.info("[%s] connection error: %s", remote, group.exceptions[0])
        except* Exception as group:
            log.exception("[%s] internal error", remote, exc_info=group)
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _handle_tcp(self, stream: trio.SocketStream, handed: Client | None = None, unread: bytes = b"") -> None:
        """Serve one TCP connection: a new one from its magic on, or one another worker ``handed`` over."""
        try:
            remote = format_address(stream.socket.getpeername())
        except OSError:
            if handed is not None:
                self.clients.pop(handed.id, None)
            await stream.aclose()
            return
        client = handed
        if client is not None:
            log.info("TCP: client(%s) taken over from another worker", remote)
        else:
            log.info("TCP: new client(%s)", remote)
        try:
            if client is not None:
                await Connection(self, stream, client).run(unread)
                return
            magic = b""
            with trio.move_on_after(self.opts.client_timeout):
                while len(magic) < 4:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    magic += chunk
            if len(magic) < 4:
                log.info("[%s] closed before sending the protocol magic", remote)
                return
            if magic[:4] == MAGIC_R1 and self.mesh is not None and self.mesh.index != 0:
                # worker 0 keeps the replica stores (workers.py)
                log.info("[%s] replication stream: handed to worker 0", remote)
                self.mesh.hand_replication(stream.socket.fileno(), magic[4:])
                return
            if magic[:4] == MAGIC_R1:  # another trionsq node's replication stream (nsqd/replication/)
                await self.replica_host.serve(stream, remote, magic[4:])
                return
            if magic[:4] != MAGIC_V2:
                log.error("client(%s) bad protocol magic %r", remote, magic[:4])
                with trio.move_on_after(1):
                    await stream.send_all(encode_frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL"))
                return
            log.info("[%s] PROTOCOL(V2)", remote)
            if self.replication is not None and self.replication.starting:
                await self.replication.ready.wait()  # clients wait until the peers said what is still ours
            elif self.mesh is not None and self.mesh.replication_ready is not None:
                await self.mesh.replication_ready.wait()  # (worker 0's replicator: ``replication_started``)
            opts = self.opts
            client = Client(
                next(self._client_ids),
                remote,
                msg_timeout=opts.msg_timeout,
                heartbeat_interval=opts.client_timeout / 2,
                output_buffer_size=16384,
                output_buffer_timeout=opts.output_buffer_timeout,
            )
            self.clients[client.id] = client
            await Connection(self, stream, client).run(magic[4:])
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            log.info("[%s] connection error: %s", remote, group.exceptions[0])
        except* Exception as group:
            log.exception("[%s] internal error", remote, exc_info=group)
        finally:
            if client is not None:
                self.clients.pop(client.id, None)
                self.collector.release()
                self.activity.note()
                client.state = client.state  # keep the last state for logs
                channel = client.channel
                client.channel = None
                client.rdy = 0
                if channel is not None:
                    channel.remove_client(client)
            with trio.CancelScope(shield=True):
                await stream.aclose()

    def exit(self) -> None:
        """Start a graceful stop: no new connections, close the open ones, stop the loops."""
        if self.exiting:
            return
        self.exiting = True
        log.info("NSQ: exiting")
        actors = self.actors.statistics()
        log.info(
            "NSQ: channel scheduler ran %d slices (%d at once for a publish) and %d interludes",
            actors.slices,
            actors.preempted,
            actors.interludes,
        )
        if self.mesh is not None:
            crossed = self.mesh.statistics()
            log.info(
                "NSQ: worker %d sent %d records to the others in %d writes, handed over %d connection(s), took %d, "
                "spread %d producer(s), acknowledged %d message(s) for topics of the others",
                self.mesh.index,
                crossed["records"],
                crossed["batches"],
                crossed["handed_over"],
                crossed["taken_over"],
                crossed["spread"],
                crossed["sent_messages"],
            )
        self._accept_scope.cancel()
        self._connections_scope.cancel()
        if self.mesh is not None and self._nursery is not None:
            # every worker's acknowledged publishes reach their owners before any stops its topics (workers.py)
            self._nursery.start_soon(self._drain_then_stop)
        else:
            self._stopped.set()

    async def _drain_then_stop(self) -> None:
        assert self.mesh is not None
        await self.mesh.drain(MESH_DRAIN_TIMEOUT)
        self._stopped.set()
