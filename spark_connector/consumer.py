"""The driver-side consumer: one blocking V2 connection per nsqd, each on a thread of its own,
writing every message to the write-ahead log before Spark can see it.

Threads, not trio: this runs inside Spark's Python source runner, a plain process that calls the
stream reader's methods one at a time; a few daemon threads (one per nsqd, one polling lookupd)
are the least surprising guests there, and they die with the runner if Spark kills it.
The wire work is the client package's blocking driver (``trionsq.blocking``, no trio): it dials,
runs the handshake (IDENTIFY, TLS, snappy/deflate, AUTH) and SUB, then hands the raw stream to the
loop below; the source's options become a ``trionsq.Config`` (``connection.client_config``).

One connection's loop (``NsqdConsumer._serve``): receive what the socket holds (up to 8 MiB),
parse every frame of it in one pass over the buffer (one ``struct`` call per message gives its
size, type, timestamp, attempts and id; the body is one slice), answer heartbeats with NOP, drop
redelivered copies (known (nsqd, id)), append the new messages to the log as one record, fsync,
and then, in ``durable`` ack mode, FIN them all in one write. A message is therefore FIN'd only
once it is on disk: a crash between the two leaves it in the log *and* in nsqd, whose
redelivery is then recognised and dropped.
In ``commit`` ack mode nothing is FIN'd until Spark is done with the batch that holds it
(``commit(end)``, or ``release`` when Spark plans the next batch: see below); in the meantime
every such message is TOUCHed each half ``msg_timeout``. TOUCH cannot extend a message past
nsqd's ``--max-msg-timeout`` (15 min by default) after delivery: a batch that takes Spark longer
than that is redelivered, recognised as a copy and FIN'd at the commit.

Backpressure: when the log holds more than ``maxBacklogMessages`` messages Spark is not done
with, the connection sends ``RDY 0``; the next commit (or ``release``) that brings the backlog
under the bound restores its share of ``maxInFlight``. ``commit`` mode is also bounded by RDY
itself: nsqd sends nothing while ``maxInFlight`` messages wait for their FIN.
Spark is done with a batch once it plans the next one (``latestOffset``'s start: the batch is in
its commit log), though it commits the batch to the source only after that plan found new data.
Counted from the commit alone, a consumer held at RDY 0, or by unfinished messages, with every
logged message in finished batches would wait for a commit that only new data brings, so
``ConsumerGroup.release`` does at the plan what the commit does to the consumers (FIN, RDY).

Failures: a listed nsqd that cannot be reached within ``connectTimeoutMs`` when the query starts
fails the query with the address and the cause. A connection lost later is re-established with
a capped exponential backoff for as long as the query runs (nsqd restarts are routine). An error
frame that says the configuration is wrong (bad topic, auth refused) is not retried: it fails
the query at the next driver call.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from dataclasses import dataclass

from protocol.commands import NOP, encode_rdy
from protocol.errors import E_BAD_PROTOCOL, ProtocolError
from protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE
from trionsq.blocking import (
    BlockingConnection,
    ConnectionClosed,
    HandshakeError,
    LookupdError,
    NSQError,
    lookup_producers,
)

from .connection import NsqConnectionError, NsqSourceError, client_config, open_connection
from .options import ACK_DURABLE, SourceOptions
from .placement import check_placement
from .wal import MessageLog, WalDirectory

__all__ = ["ConsumerGroup", "NsqdConsumer"]

log = logging.getLogger("spark_connector.consumer")

_HEARTBEAT = b"_heartbeat_"
# [int32 size][int32 type] then, for a message, [int64 timestamp][uint16 attempts][16-byte id]
_unpack_frame_header = struct.Struct(">ii").unpack_from
_unpack_message_header = struct.Struct(">iiqH16s").unpack_from
_MESSAGE_HEADER_SIZE = 34
_MAX_FRAME_SIZE = 64 * 1024 * 1024
_RECV_SIZE = 1 << 20
_COALESCE_BYTES = 8 << 20
# The largest output buffer nsqd accepts by default: fewer, larger writes to read and log.
_OUTPUT_BUFFER_SIZE = 65536
_POLL_SECONDS = 0.25
_BACKOFF_MIN = 0.1
_BACKOFF_MAX = 2.0
_DRAIN_SECONDS = 1.0


# Errors that no retry can fix: the query is misconfigured for this nsqd.
_CONFIG_ERRORS = {
    "E_BAD_TOPIC",
    "E_BAD_CHANNEL",
    "E_AUTH_FAILED",
    "E_UNAUTHORIZED",
    "E_AUTH_FIRST",
    "E_IDENTIFY_FAILED",
    "E_BAD_BODY",
    "E_INVALID",
}


@dataclass
class ConsumerStats:
    received: int = 0
    logged: int = 0
    duplicates: int = 0
    connects: int = 0


class NsqdConsumer:
    """Consumes one nsqd into its log. ``start()`` runs the loop on a daemon thread."""

    def __init__(self, group: ConsumerGroup, address: str, mlog: MessageLog) -> None:
        self.group = group
        self.address = address
        self.log = mlog
        self.options = group.options
        self.stats = ConsumerStats()
        self.connected = threading.Event()
        self.last_error: BaseException | None = None
        self._conn: BlockingConnection | None = None
        self._conn_lock = threading.Lock()
        self._rdy_sent = -1
        self.held = False  # RDY 0 because of maxBacklogMessages
        self.local_address: str | None = None  # this side of the connection, as nsqd's /stats names it
        self._max_rdy = 2500
        self._msg_timeout_ms = 60_000
        # commit ack mode: id -> position of messages this connection must FIN at commit
        self._pending: dict[bytes, int] = {}
        self._pending_lock = threading.Lock()
        self._next_touch = 0.0
        self._thread = threading.Thread(target=self._run, name=f"nsq-consumer {address}", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff = _BACKOFF_MIN
        stopping = self.group.stopping
        while not stopping.is_set():
            try:
                conn = self._connect()
            except (NSQError, HandshakeError) as exc:
                self.last_error = exc
                if isinstance(exc, HandshakeError) or exc.code in _CONFIG_ERRORS:
                    self.group.fail(NsqConnectionError(f"nsqd {self.address} refused the consumer: {exc}"))
                    return
                log.warning("nsqd %s: %s; retrying in %.1fs", self.address, exc, backoff)
            except (ConnectionClosed, TimeoutError, ValueError) as exc:  # ConnectError is a ConnectionClosed
                self.last_error = exc
                log.warning("nsqd %s: cannot connect (%s); retrying in %.1fs", self.address, exc, backoff)
            else:
                backoff = _BACKOFF_MIN
                self.stats.connects += 1
                self.connected.set()
                try:
                    self._serve(conn)
                except NSQError as exc:
                    self.last_error = exc
                    if exc.code in _CONFIG_ERRORS:
                        self.group.fail(NsqConnectionError(f"nsqd {self.address}: {exc}"))
                        return
                    log.warning("nsqd %s: %s; reconnecting", self.address, exc)
                except (ConnectionClosed, ProtocolError) as exc:
                    if not stopping.is_set():
                        self.last_error = exc
                        log.warning("nsqd %s: connection lost (%s); reconnecting", self.address, exc)
                except BaseException as exc:  # the log failed (disk full...): nothing safe to do
                    self.group.fail(NsqSourceError(f"consumer of nsqd {self.address} failed: {exc!r}"))
                    raise
                finally:
                    with self._conn_lock:
                        self._conn = None
                    conn.close()
                    with self._pending_lock:
                        # Unacknowledged messages of a lost connection come back as new deliveries.
                        self._pending.clear()
            stopping.wait(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    # -- connection set-up -----------------------------------------------------------------

    def _connect(self) -> BlockingConnection:
        opts = self.options
        conn, deadline = open_connection(self.address, opts, self.group.config, receive_size=_RECV_SIZE)
        try:
            features = conn.features
            self._max_rdy = features.max_rdy_count
            self._msg_timeout_ms = int(features.msg_timeout * 1000)
            conn.subscribe(opts.topic, opts.channel, deadline)
        except BaseException:
            conn.close()
            raise
        self._rdy_sent = -1
        self._next_touch = time.monotonic() + self._msg_timeout_ms / 2000
        host, port = conn.sock.getsockname()[:2]
        self.local_address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        with self._conn_lock:
            self._conn = conn
        self._update_rdy(conn)
        return conn

    # -- the loop --------------------------------------------------------------------------

    def _serve(self, conn: BlockingConnection) -> None:
        stopping = self.group.stopping
        durable = self.options.ack_mode == ACK_DURABLE
        stop_by = None
        rest = conn.take_unparsed()  # an incomplete frame carried over to the next read
        handshake_rest = bool(rest)
        rest_need = 0  # the bytes that frame needs in all (0: unknown, parse at the next read)
        waiting: list[bytes] = []  # reads queued while they cannot complete that frame
        waiting_size = 0
        while True:
            if stopping.is_set():
                if stop_by is None:
                    # Graceful stop: no new deliveries; log and FIN what is already on its way.
                    conn.send(encode_rdy(0))
                    self._rdy_sent = 0
                    stop_by = time.monotonic() + _DRAIN_SECONDS
                elif time.monotonic() >= stop_by:
                    return
            if handshake_rest:
                raw = b""  # frames that came with the handshake's last answer: parse them first
                handshake_rest = False
            else:
                received = conn.read_available(_POLL_SECONDS, _COALESCE_BYTES)
                if received is None:  # idle
                    if stop_by is not None:
                        return  # drained
                    self._housekeeping(conn)
                    continue
                raw = received
            if rest:
                # Only join once the incomplete frame can be completed (a large body arriving in
                # many reads is copied a bounded number of times).
                waiting.append(raw)
                waiting_size += len(raw)
                if len(rest) + waiting_size < rest_need:
                    continue
                buf = b"".join([rest, *waiting])
                waiting.clear()
                waiting_size = 0
            else:
                buf = raw
            rest, rest_need = self._consume(conn, buf, durable)
            self._housekeeping(conn)

    def _consume(self, conn: BlockingConnection, buf: bytes, durable: bool) -> tuple[bytes, int]:
        """Parse, log and acknowledge every complete frame of ``buf``; returns the incomplete
        frame at its end and how many bytes that frame needs in all (0 when not yet known)."""
        mlog = self.log
        top_id = mlog.top_id
        position_of = mlog.position_of
        ids: list[bytes] = []
        timestamps: list[int] = []
        attempts: list[int] = []
        bodies: list[bytes] = []
        acks: list[bytes] = []
        pending_dups: list[tuple[bytes, int]] = []
        committed = self.group.done_position(self.address)
        size_of = len(buf)
        pos = 0
        need = 0
        while True:
            left = size_of - pos
            if left >= _MESSAGE_HEADER_SIZE:
                size, ftype, ts, att, mid = _unpack_message_header(buf, pos)
            elif left >= 8:
                size, ftype = _unpack_frame_header(buf, pos)
            else:
                break
            if size < 4 or size > _MAX_FRAME_SIZE or (ftype == FRAME_TYPE_MESSAGE and size < _MESSAGE_HEADER_SIZE - 4):
                raise ProtocolError(E_BAD_PROTOCOL, f"invalid frame size {size}")
            end = pos + 4 + size
            if end > size_of:
                need = 4 + size
                break
            if ftype == FRAME_TYPE_MESSAGE:
                if mid <= top_id and (position := position_of(mid)) is not None:
                    self.stats.duplicates += 1
                    if durable or position < committed:
                        acks.append(mid)
                    else:
                        pending_dups.append((mid, position))
                else:
                    ids.append(mid)
                    timestamps.append(ts)
                    attempts.append(att)
                    bodies.append(buf[pos + _MESSAGE_HEADER_SIZE : end])
            elif ftype == FRAME_TYPE_ERROR:
                error = NSQError.from_frame(buf[pos + 8 : end])
                if error.fatal:
                    raise error
                log.warning("nsqd %s: %s", self.address, error)
            elif buf[pos + 8 : end] == _HEARTBEAT:
                conn.send(NOP)
            pos = end
        if ids:
            first = mlog.append(ids, timestamps, attempts, bodies)
            mlog.sync()
            self.stats.received += len(ids)
            self.stats.logged += len(ids)
            if durable:
                acks.extend(ids)
            else:
                with self._pending_lock:
                    self._pending.update(zip(ids, range(first, first + len(ids)), strict=True))
        if pending_dups:
            with self._pending_lock:
                self._pending.update(pending_dups)
        if acks:
            conn.send(b"FIN " + b"\nFIN ".join(acks) + b"\n")
        return (buf[pos:] if pos < size_of else b""), need

    def _housekeeping(self, conn: BlockingConnection) -> None:
        self._update_rdy(conn)
        if self._pending and time.monotonic() >= self._next_touch:
            with self._pending_lock:
                ids = list(self._pending)
            if ids:
                conn.send(b"TOUCH " + b"\nTOUCH ".join(ids) + b"\n")
            self._next_touch = time.monotonic() + self._msg_timeout_ms / 2000

    def _update_rdy(self, conn: BlockingConnection) -> None:
        if self.group.stopping.is_set():
            return
        backlog = self.log.end - self.group.done_position(self.address)
        self.held = backlog >= self.options.max_backlog_messages
        want = 0 if self.held else min(self.group.rdy_share(), self._max_rdy)
        if want != self._rdy_sent:
            if want == 0:
                log.info("nsqd %s: %d messages await Spark's commit; pausing delivery (RDY 0)", self.address, backlog)
            conn.send(encode_rdy(want))
            self._rdy_sent = want

    # -- called from the driver thread -----------------------------------------------------

    def on_commit(self, position: int) -> None:
        """Spark is done with everything below ``position``: FIN what waits for it (commit mode),
        and let delivery resume if the backlog shrank."""
        with self._conn_lock:
            conn = self._conn
        if conn is None:
            return
        acks = []
        with self._pending_lock:
            pending = self._pending
            for mid, pos in list(pending.items()):
                if pos < position:
                    acks.append(mid)
                    del pending[mid]
        try:
            if acks:
                conn.send(b"FIN " + b"\nFIN ".join(acks) + b"\n")
            self._update_rdy(conn)
        except ConnectionClosed as exc:
            log.warning(
                "nsqd %s: could not send FIN (%s); nsqd will redeliver and the copies will be dropped",
                self.address,
                exc,
            )

    def pending_count(self) -> int:
        with self._pending_lock:
            return len(self._pending)


class ConsumerGroup:
    """Every consumer of one query, the lookupd poller, the log directory and the state they
    share with the stream reader (committed positions, the first fatal error)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.config = client_config(options, output_buffer_size=_OUTPUT_BUFFER_SIZE)
        self.stopping = threading.Event()
        self.wal: WalDirectory | None = None
        self.consumers: dict[str, NsqdConsumer] = {}
        self._lock = threading.Lock()
        self._committed: dict[str, int] = {}
        self._released: dict[str, int] = {}  # positions below which Spark is done (release)
        self.http_addresses: dict[str, str] = {}  # nsqd TCP address -> its HTTP API, as lookupd lists it
        self._error: BaseException | None = None
        self._poller: threading.Thread | None = None
        self.rebased: set[str] = set()  # logs started at a checkpoint's position (_continue_from)

    # -- start and stop --------------------------------------------------------------------

    def start(self, floor: dict[str, int] | None = None) -> None:
        """Open the log and connect. ``floor``: the positions of the offset Spark named in the
        call that starts the source (a checkpoint's); an empty log continues from them in commit
        ack mode, and is refused in durable mode (see ``_continue_from``)."""
        opts = self.options
        check_placement(opts)
        self.wal = WalDirectory(
            opts.wal_path,
            opts.topic,
            opts.channel,
            segment_bytes=opts.wal_segment_bytes,
            dedup_window=opts.dedup_window,
        ).open()
        committed = self.wal.read_committed()
        if committed:
            self._committed = dict(committed.get("positions", {}))
        elif floor and any(floor.values()) and all(m.end == 0 for m in self.wal.snapshot().values()):
            try:
                self._continue_from(floor)
            except BaseException:
                self.wal.close()
                self.wal = None
                raise
        for address in opts.nsqd_addresses:
            self.add_nsqd(address)
        if opts.lookupd_addresses:
            self._poll_lookupd(initial=True)
            self._poller = threading.Thread(target=self._poll_loop, name="nsq-lookupd-poller", daemon=True)
            self._poller.start()
        deadline = time.monotonic() + opts.connect_timeout_ms / 1000
        for address in opts.nsqd_addresses:
            consumer = self.consumers[address]
            while not consumer.connected.wait(min(max(deadline - time.monotonic(), 0), 0.05)):
                if self._error is not None or time.monotonic() >= deadline:
                    break
            if not consumer.connected.is_set():
                if self._error is not None:
                    error = self._error
                    self.stop()
                    raise error
                cause = consumer.last_error
                self.stop()
                raise NsqConnectionError(
                    f"cannot consume from nsqd {address} (topic {opts.topic!r}, channel "
                    f"{opts.channel!r}): {cause or 'no answer'} within {opts.connect_timeout_ms} ms "
                    f"(option connectTimeoutMs)"
                )
        self.raise_if_failed()

    def _continue_from(self, floor: dict[str, int]) -> None:
        """Spark's checkpoint refers to positions of a log this walPath does not have (a new or
        emptied walPath, a driver restarted on another machine). In commit ack mode nothing
        above the last commit was FIN'd: nsqd delivers those messages again, and each log starts
        at the checkpoint's position (what Spark asks below it is gone, and is read again from
        nsqd). In durable mode the lost log held messages nsqd no longer has: refuse."""
        opts = self.options
        if opts.ack_mode == ACK_DURABLE:
            raise NsqSourceError(
                f"nsq source: the checkpoint is at positions {floor} but walPath {opts.wal_path} holds no "
                f"write-ahead log: with ackMode=durable the messages logged there after the last commit were "
                f"already FIN'd and are lost with it. Restore that walPath, or start with a new checkpoint; "
                f"ackMode=commit lets a query continue with a new walPath"
            )
        for address, position in floor.items():
            if position > 0:
                self.wal.log_for(address).start_at(position)
                self._committed[address] = position
                self.rebased.add(address)
        log.warning(
            "nsq source: walPath %s is empty but the checkpoint is at %s; continuing from there "
            "(ackMode=commit: nsqd delivers again what was not committed)",
            opts.wal_path,
            floor,
        )

    def stop(self) -> None:
        self.stopping.set()
        for consumer in list(self.consumers.values()):
            consumer.join(_DRAIN_SECONDS + 2 * _POLL_SECONDS + 1)
        if self._poller is not None:
            self._poller.join(2)
        if self.wal is not None:
            self.wal.close()
            self.wal = None

    def add_nsqd(self, address: str) -> None:
        with self._lock:
            if address in self.consumers or self.stopping.is_set():
                return
            consumer = NsqdConsumer(self, address, self.wal.log_for(address))
            self.consumers[address] = consumer
        log.info("consuming %s/%s from nsqd %s", self.options.topic, self.options.channel, address)
        consumer.start()

    # -- lookupd ---------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        interval = self.options.lookupd_poll_interval_ms / 1000
        while not self.stopping.wait(interval):
            self._poll_lookupd(initial=False)

    def _poll_lookupd(self, initial: bool) -> None:
        opts = self.options
        reached = []
        failures = []
        for lookupd in opts.lookupd_addresses:
            try:
                producers = lookup_producers(lookupd, opts.topic, timeout=5.0)
            except LookupdError as exc:
                failures.append(f"{lookupd}: {exc}")
                continue
            reached.append(lookupd)
            if not producers:
                log.info("lookupd %s lists no nsqd for topic %r yet; asking again later", lookupd, opts.topic)
                continue
            for peer in producers:
                self.http_addresses[peer.tcp_address] = peer.http_address
                self.add_nsqd(peer.tcp_address)
        if failures:
            if initial and not reached:
                self.stop()
                raise NsqConnectionError("cannot reach any lookupd: " + "; ".join(failures))
            log.warning("lookupd unreachable: %s", "; ".join(failures))

    # -- shared state ----------------------------------------------------------------------

    def rdy_share(self) -> int:
        n = max(len(self.consumers), 1)
        return max(1, self.options.max_in_flight // n)

    def committed_position(self, address: str) -> int:
        return self._committed.get(address, 0)

    def done_position(self, address: str) -> int:
        """The position below which Spark needs nothing more of ``address``'s log (committed or released)."""
        return max(self._committed.get(address, 0), self._released.get(address, 0))

    def release(self, positions: dict[str, int]) -> None:
        """Spark is done with everything below ``positions`` (the start of a batch it plans: the
        batches before are in its commit log), though it has not committed them to the source
        yet: FIN them (commit mode) and count the backlog bound from here (see the module's
        notes on backpressure). The log keeps them until the commit."""
        released = self._released
        moved = [a for a, p in positions.items() if p > released.get(a, 0)]
        for address in moved:
            released[address] = positions[address]
            consumer = self.consumers.get(address)
            if consumer is not None:
                consumer.on_commit(positions[address])

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = error
        log.error("%s", error)

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def commit(self, positions: dict[str, int]) -> None:
        """Spark is done with everything below ``positions``: remember it durably, FIN (commit
        mode), resume delivery, delete covered segments."""
        merged = dict(self._committed)
        for address, position in positions.items():
            merged[address] = max(position, merged.get(address, 0))
        self.wal.write_committed({"version": 1, "positions": merged})
        self._committed = merged
        for address, position in merged.items():
            consumer = self.consumers.get(address)
            if consumer is not None:
                consumer.on_commit(position)
            mlog = self.wal.snapshot().get(address)
            if mlog is not None:
                mlog.delete_before(position)
