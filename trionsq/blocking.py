"""The blocking driver: the client side of V2 over plain sockets, for scripts and for processes
that must not import trio (Spark's Python workers and its driver-side source).

It runs the same sans-IO core as the trio ``Connection`` (``trionsq._core``: handshake, upgrades,
AUTH, frames to events, the FIFO of replies); this module only moves bytes. It imports the
standard library, ``protocol`` and the client's trio-free modules (``_config``, ``_core``,
``_errors``, ``_lookupd``'s parsers, ``_message``), never trio.

``connect(address, config)`` -> ``BlockingConnection``
    dials within ``config.dial_timeout``, then magic, IDENTIFY, the TLS upgrade (``ssl``, context
    from ``config.ssl_context()``), snappy or deflate, AUTH, all before ``deadline`` (default:
    ``config.read_timeout`` from the dial). ``tls_v1`` asked of an nsqd that offers no TLS, and
    an nsqd that requires AUTH with no ``auth_secret`` set, raise ``HandshakeError``: retrying the
    same configuration cannot succeed.

    Two ways to read, for two kinds of loop:

    - ``read_event(deadline)``: the next ``Reply`` / ``ErrorReply`` / ``Message`` (heartbeats are
      answered on the way), through the core. Requests that expect a reply are written with
      ``send_command(data, token)`` so that the core matches replies to them in order.
    - ``read_available(timeout)``: the raw (decompressed) stream bytes the socket holds, for a loop
      that parses a whole receive buffer in one pass (the Spark source logs a read's messages as
      one record and FINs them in one write). It takes over the stream from the core:
      ``take_unparsed()`` first hands it the bytes the core already holds. After one read, it keeps
      reading what the socket already has, without waiting, up to ``coalesce`` bytes, into one
      receive buffer allocated once per connection (a fresh 1 MiB ``recv`` object per call cost
      14 us more per read), so one pass, one log record and one fsync cover all of it.

    ``send(data)`` writes commands (compressed when the connection is); it may be called from
    another thread than the reader (a lock keeps writes and the compressor's stream whole).

``Producer(addresses, config)``
    Pipelined publishing with fail-over. ``send(command)`` writes an encoded PUB, MPUB or DPUB on
    the current nsqd's connection and reads replies only when ``max_in_flight`` commands wait for
    one; ``flush()`` waits for every reply. ``publish``, ``multi_publish`` and
    ``deferred_publish`` are ``send`` then ``flush``. A lost connection, a reply timeout or a
    server-side failure (E_PUB_FAILED, E_MPUB_FAILED, E_DPUB_FAILED) moves to the next address
    and sends the unanswered commands there, each command trying every address at most once
    (at least once: a command whose reply was lost may have been stored); when one has failed
    everywhere, ``NoAvailableNsqd``. A request error (E_BAD_TOPIC, E_BAD_MESSAGE ...) is raised as
    ``NSQError`` at once; nsqd closes the connection after it, and the commands written behind the
    refused one, which it never ran, are sent again by the next ``send`` or ``flush``.

``lookup(lookupd, topic)``, ``lookup_producers``, ``nodes(lookupd)``, ``topics(lookupd)``
    One GET each (``urllib``), parsed by the trio driver's parsers (``trionsq._lookupd``).
"""

from __future__ import annotations

import logging
import math
import select
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from protocol.commands import NOP, encode_dpub, encode_mpub, encode_pub, encode_rdy, encode_sub
from protocol.errors import E_BAD_TOPIC, E_DPUB_FAILED, E_MPUB_FAILED, E_PUB_FAILED
from protocol.names import go_quote, is_valid_topic_name

from ._config import Config
from ._core import (
    HEARTBEAT,
    NEED_DATA,
    START_TLS,
    AuthResult,
    ClientCore,
    Connected,
    ErrorReply,
    Features,
    Reply,
    Send,
    split_address,
)
from ._errors import ConnectError, ConnectionClosed, NoAvailableNsqd, NSQError
from ._lookupd import (
    ACCEPT_V1,
    DEFAULT_TIMEOUT,
    MAX_BODY,
    LookupdError,
    Peer,
    lookup_url,
    parse_lookup,
    parse_nodes,
    parse_topics,
)
from ._message import Message

__all__ = [
    "AuthResult",
    "BlockingConnection",
    "Config",
    "ConnectError",
    "ConnectionClosed",
    "ErrorReply",
    "Features",
    "HandshakeError",
    "LookupdError",
    "Message",
    "NSQError",
    "NoAvailableNsqd",
    "Peer",
    "Producer",
    "ProducerStats",
    "Reply",
    "connect",
    "lookup",
    "lookup_producers",
    "nodes",
    "topics",
]

logger = logging.getLogger("trionsq.blocking")

RECEIVE_SIZE = 256 * 1024
#: errors after which another nsqd may well succeed (the others are the request's own fault)
SERVER_FAILURES = frozenset({E_PUB_FAILED, E_MPUB_FAILED, E_DPUB_FAILED})


class HandshakeError(ConnectError):
    """nsqd and the ``Config`` cannot agree, so retrying is pointless: ``tls_v1`` asked and nsqd
    offers no TLS, or nsqd requires AUTH and no ``auth_secret`` is set. ``features``: what nsqd
    answered to IDENTIFY."""

    def __init__(self, message: str, features: Features) -> None:
        super().__init__(message)
        self.features = features

    def __reduce__(self):
        return (type(self), (str(self), self.features))


def _checked(command: str, topic: str) -> str:
    """``topic`` if nsqd would take it: a space in it would split the command line and publish to
    its first word, so it is refused here with nsqd's own error."""
    if not is_valid_topic_name(topic):
        raise NSQError(E_BAD_TOPIC, f"{command} topic name {go_quote(topic)} is not valid")
    return topic


def _cause(exc: BaseException) -> str:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


# -- one connection ----------------------------------------------------------------------------------


def connect(address: str, config: Config | None = None, *, deadline: float | None = None,
            server_hostname: str | None = None, receive_size: int = RECEIVE_SIZE) -> BlockingConnection:
    """A connection to the nsqd at ``address``, through its handshake (see the module notes).

    ``deadline`` (``time.monotonic()``) bounds the dial and the handshake; ``server_hostname`` is
    the name the TLS certificate is checked against (default: the address's host). Raises
    ``ConnectError`` (refused, timed out, TLS or upgrade failure; ``HandshakeError`` when retrying
    cannot help) or ``NSQError`` (nsqd refused IDENTIFY or AUTH)."""
    config = config if config is not None else Config()
    host, port = split_address(address)
    started = time.monotonic()
    if deadline is None:
        deadline = started + config.dial_timeout + config.read_timeout
    try:
        sock = socket.create_connection((host, port), timeout=max(min(config.dial_timeout, deadline - started), 0.001))
    except OSError as exc:
        raise ConnectError(f"cannot connect to nsqd {address}: {_cause(exc)}") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = BlockingConnection(sock, config, address, receive_size)
    try:
        conn._handshake(deadline, server_hostname or host)
    except BaseException:
        conn.close()
        raise
    return conn


class BlockingConnection:
    """One nsqd connection driven by blocking calls; made by ``connect``."""

    def __init__(self, sock: socket.socket, config: Config, address: str, receive_size: int = RECEIVE_SIZE) -> None:
        self.sock: socket.socket = sock
        self.config = config
        self.address = address
        self.features: Features | None = None
        self.auth: AuthResult | None = None
        self.closed = False
        self._core = ClientCore(config, address, responder=self)
        self._send_lock = threading.Lock()
        self._receive_size = receive_size
        self._view: memoryview | None = None  # the receive buffer, made at the first read
        self._timeout: float | None = -1.0  # what the socket's timeout was last set to (handshake)
        self._poll: select.poll | None = None

    # -- the handshake -------------------------------------------------------------------------------

    def _handshake(self, deadline: float, server_hostname: str) -> None:
        core = self._core
        address = self.address
        tls = False
        try:
            self._write(core.handshake_bytes(), deadline)
            while True:
                try:
                    event = core.next_event()
                except ConnectError:
                    features = core.features
                    if features is not None and features.auth_required and not self.config.auth_secret:
                        raise HandshakeError(f"nsqd {address} requires AUTH and no auth_secret is set",
                                             features) from None
                    raise
                if event is NEED_DATA:
                    self._set_timeout(deadline)
                    data = self.sock.recv(RECEIVE_SIZE)
                    if not data:
                        raise ConnectError(f"nsqd {address} closed the connection during the handshake")
                    core.receive_data(data)
                elif event is START_TLS:
                    self._set_timeout(deadline)
                    self.sock = self.config.ssl_context().wrap_socket(self.sock, server_hostname=server_hostname)
                    self._timeout = -1.0
                    core.tls_started()
                    tls = True
                elif type(event) is Send:
                    self._write(event.data, deadline)
                elif type(event) is Connected:
                    self.features, self.auth = event.features, event.auth
                    break
                else:
                    raise ConnectError(f"unexpected {event!r} from nsqd {address} during the handshake")
        except (socket.timeout, TimeoutError):
            raise ConnectError(f"handshake with nsqd {address} timed out") from None
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; ValueError: a bad TLS setting
            raise ConnectError(f"handshake with nsqd {address} failed: {_cause(exc)}") from exc
        if self.config.tls_v1 and not tls:
            raise HandshakeError(f"nsqd {address} does not offer TLS (start it with --tls-cert and --tls-key)",
                                 self.features)
        self._blocking_mode()
        logger.debug("%s: connected (nsqd %s%s%s%s)", address, self.features.version or "without negotiation",
                     ", TLS" if tls else "", ", snappy" if self.features.snappy else "",
                     ", deflate" if self.features.deflate else "")

    def _set_timeout(self, deadline: float | None) -> None:
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            raise TimeoutError
        if timeout != self._timeout:
            self.sock.settimeout(timeout)
            self._timeout = timeout

    def _write(self, data: bytes, deadline: float | None) -> None:
        self._set_timeout(deadline)
        self.sock.sendall(data)

    def _blocking_mode(self) -> None:
        """From now on a reader and a writer may use the socket from two threads, so neither may
        change its timeout under the other: the socket blocks, a read waits for data with ``poll``
        (its own deadline), and the kernel bounds each write by ``write_timeout`` (SO_SNDTIMEO),
        and a read of a TLS record cut short by ``read_timeout`` (SO_RCVTIMEO)."""
        sock = self.sock
        sock.settimeout(None)
        for option, seconds in ((socket.SO_SNDTIMEO, self.config.write_timeout),
                                (socket.SO_RCVTIMEO, self.config.read_timeout)):
            whole = int(seconds)
            sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", whole, int((seconds - whole) * 1e6)))
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def _readable(self, timeout: float | None) -> bool:
        """Whether data came within ``timeout`` seconds (None: wait as long as it takes)."""
        sock = self.sock
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True  # decrypted bytes the kernel knows nothing of
        return bool(self._poll.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))

    # -- writing -------------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write commands (several may be joined: one write, one compressed piece). Blocks until the
        socket took them, at most ``write_timeout`` per call. ``ConnectionClosed`` when it fails."""
        with self._send_lock:
            self._send_locked(data)

    def send_command(self, data: bytes, token: Any) -> None:
        """Write one command that nsqd answers (PUB, MPUB, DPUB, SUB); its ``Reply`` or
        ``ErrorReply`` from ``read_event`` carries ``token``."""
        with self._send_lock:
            self._core.expect_reply(token)
            self._send_locked(data)

    def _send_locked(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionClosed(f"connection to nsqd {self.address} is closed")
        try:
            self.sock.sendall(self._core.wire_bytes(data))
        except OSError as exc:  # BlockingIOError: SO_SNDTIMEO passed, the peer reads nothing
            # part of a command may have gone out: the stream is unusable. Shut it down rather than
            # close it, so that a reader blocked in another thread wakes up to EOF
            self.closed = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            raise ConnectionClosed(f"cannot write to nsqd {self.address}: {_cause(exc)}") from exc

    # -- reading through the core ----------------------------------------------------------------------

    def read_event(self, deadline: float | None = None) -> Reply | ErrorReply | Message:
        """The next reply, error or message; heartbeats are answered on the way. ``TimeoutError``
        at ``deadline`` (the connection stays usable), ``ConnectionClosed`` at EOF, on a reset or
        on a corrupt stream."""
        core = self._core
        try:
            while True:
                event = core.next_event()
                if event is NEED_DATA:
                    if not self._readable(None if deadline is None else deadline - time.monotonic()):
                        raise TimeoutError(f"no answer from nsqd {self.address} in time")
                    core.receive_data(self._receive())
                elif event is HEARTBEAT:
                    self.send(NOP)
                else:
                    return event
        except ConnectionClosed:
            self.close()
            raise

    def request(self, data: bytes, deadline: float | None = None) -> bytes:
        """Send one command that nsqd answers and wait for the answer: its data (``b"OK"``), or
        ``NSQError`` (fatal: the connection is closed). For a connection used one request at a
        time that does not consume yet: a message or another command's reply meanwhile closes it."""
        token = object()
        self.send_command(data, token)
        if deadline is None:
            deadline = time.monotonic() + self.config.read_timeout
        while True:
            event = self.read_event(deadline)
            if type(event) is Reply and event.token is token:
                return event.data
            if type(event) is ErrorReply and not event.error.fatal:
                logger.warning("%s: %s", self.address, event.error)
                continue
            self.close()  # after a fatal error nsqd closes it too
            if type(event) is ErrorReply:
                raise event.error
            raise ConnectionClosed(f"unexpected {event!r} from nsqd {self.address} awaiting a reply")

    def _receive(self) -> bytes:
        view = self._view
        if view is None:
            view = self._view = memoryview(bytearray(self._receive_size))
        try:
            size = self.sock.recv_into(view[: self._receive_size])
        except OSError as exc:
            raise ConnectionClosed(f"connection to nsqd {self.address} lost: {_cause(exc)}") from exc
        if not size:
            raise ConnectionClosed(f"nsqd {self.address} closed the connection")
        return bytes(view[:size])

    def is_alive(self) -> bool:
        """Whether the connection is still open, found without waiting: what has arrived is read
        (heartbeats answered, non-fatal errors logged), and EOF or a reset closes it. For a
        connection with no reply due and no subscription (a producer's, between publishes)."""
        if self.closed:
            return False
        core = self._core
        try:
            while self._readable(0):
                core.receive_data(self._receive())
                while (event := core.next_event()) is not NEED_DATA:
                    if event is HEARTBEAT:
                        self.send(NOP)
                    elif type(event) is ErrorReply and not event.error.fatal:
                        logger.warning("%s: %s", self.address, event.error)
                    else:
                        raise ConnectionClosed(f"unexpected {event!r} from nsqd {self.address} while idle")
        except ConnectionClosed as exc:
            logger.info("%s", exc)
            self.close()
            return False
        return True

    # -- reading the raw stream --------------------------------------------------------------------------

    def take_unparsed(self) -> bytes:
        """The stream bytes (decompressed) the core holds past the last event it returned: where a
        loop that parses the stream itself starts."""
        return self._core.take_unparsed()

    def read_available(self, timeout: float | None, coalesce: int = 0) -> bytes | None:
        """What the socket holds, decompressed; None when nothing came within ``timeout`` seconds;
        ``ConnectionClosed`` at EOF, on a reset or a corrupt stream. Once data arrives, reads on
        without waiting while the socket has more, up to ``coalesce`` bytes in all (not over TLS,
        which reads with flags refuse)."""
        view = self._view
        chunk = self._receive_size
        if view is None or len(view) < coalesce + chunk:
            view = self._view = memoryview(bytearray(coalesce + chunk))
        if not self._readable(timeout):
            return None
        sock = self.sock
        try:
            size = sock.recv_into(view[:chunk])
            if size and coalesce and not isinstance(sock, ssl.SSLSocket):
                while size < coalesce:
                    try:
                        read = sock.recv_into(view[size : size + chunk], 0, socket.MSG_DONTWAIT)
                    except (BlockingIOError, InterruptedError):
                        break
                    if not read:
                        break  # EOF: the next call reports it
                    size += read
        except OSError as exc:
            self.close()
            raise ConnectionClosed(f"connection to nsqd {self.address} lost: {_cause(exc)}") from exc
        if not size:
            self.close()
            raise ConnectionClosed(f"nsqd {self.address} closed the connection")
        try:
            return self._core.decompress(bytes(view[:size]))
        except ConnectionClosed:
            self.close()
            raise

    # -- commands ----------------------------------------------------------------------------------------

    def publish(self, topic: str, body: bytes) -> None:
        """PUB: one round trip; ``NSQError`` if nsqd refuses it."""
        self.request(encode_pub(_checked("PUB", topic), body))

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """MPUB: one round trip."""
        self.request(encode_mpub(_checked("MPUB", topic), list(bodies)))

    def deferred_publish(self, topic: str, delay: float, body: bytes) -> None:
        """DPUB, ``delay`` in seconds (sent as whole milliseconds)."""
        self.request(encode_dpub(_checked("DPUB", topic), max(0, int(delay * 1000)), body))

    def subscribe(self, topic: str, channel: str, deadline: float | None = None) -> None:
        """SUB; deliveries start after ``ready``."""
        self.request(encode_sub(topic, channel), deadline)

    def ready(self, count: int) -> None:
        """RDY ``count`` (no reply)."""
        self.send(encode_rdy(count))

    def close(self) -> None:
        """Close the socket (nsqd requeues what this connection had in flight when each message
        times out). Idempotent."""
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> BlockingConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- Message's responder -----------------------------------------------------------------------------

    def _message_finished(self, message: Message, data: bytes) -> None:
        self._answer(data)

    def _message_requeued(self, message: Message, data: bytes, backoff: bool) -> None:
        self._answer(data)

    def _message_touched(self, message: Message, data: bytes) -> None:
        self._answer(data)

    def _answer(self, data: bytes) -> None:
        try:
            self.send(data)
        except ConnectionClosed:
            logger.debug("%s: %s after close dropped", self.address, data[:3].decode())

    def __repr__(self) -> str:
        return f"<BlockingConnection {self.address}{' closed' if self.closed else ''}>"


# -- the producer -------------------------------------------------------------------------------------


class _Command:
    __slots__ = ("data", "messages", "failures", "sent_before")

    def __init__(self, data: bytes, messages: int) -> None:
        self.data = data
        self.messages = messages
        self.failures: dict[str, BaseException] = {}  # address -> why it failed there
        self.sent_before = False  # its reply was lost: it may be stored already


@dataclass(frozen=True)
class ProducerStats:
    messages: int  # acknowledged by an nsqd
    commands: int  # written (retries included)
    retried_commands: int  # written again after a failure
    resent_messages: int  # in commands whose reply was lost: they may be stored twice
    connects: int
    per_nsqd: dict[str, int]  # acknowledged messages by address


class Producer:
    """Blocking, pipelined publishing to the first nsqd of ``addresses`` that works (see the module
    notes). ``max_in_flight`` commands may wait for their reply; ``response_timeout`` (default
    ``config.read_timeout``) bounds the wait for the oldest. Not thread-safe: one per thread.

    With no thread of its own, a producer cannot answer heartbeats while idle, so its connections
    IDENTIFY with heartbeats off; before writing on a connection that had nothing to wait for, it
    checks without blocking that nsqd did not close it meanwhile, and reconnects if it did."""

    def __init__(self, addresses: str | Sequence[str], config: Config | None = None, *, max_in_flight: int = 16,
                 response_timeout: float | None = None) -> None:
        addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        if not addresses:
            raise ValueError("a Producer needs at least one nsqd address")
        for address in addresses:
            split_address(address)
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.addresses = addresses
        self.config = config if config is not None else Config()
        # no reader runs between calls to answer heartbeats, and nsqd drops a connection that misses
        # two: a producer's connections ask for none (nsqd then sets no read deadline either)
        self._connect_config = self.config.copy(heartbeat_interval=-1)
        self.max_in_flight = max_in_flight
        self.response_timeout = self.config.read_timeout if response_timeout is None else response_timeout
        self._current = 0
        self._conn: BlockingConnection | None = None
        self._waiting: deque[_Command] = deque()  # written on _conn, reply not read yet
        self._queue: deque[_Command] = deque()  # to write (first sends and retries)
        self._messages = self._commands = self._retried = self._resent = self._connects = 0
        self._per_nsqd: dict[str, int] = {}

    # -- publishing ----------------------------------------------------------------------------------

    def publish(self, topic: str, body: bytes) -> None:
        """PUB, then ``flush``: returns once nsqd acknowledged it (and everything sent before)."""
        self.send(encode_pub(_checked("PUB", topic), body))
        self.flush()

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """MPUB of ``bodies`` (all or none stored), then ``flush``."""
        self.send(encode_mpub(_checked("MPUB", topic), list(bodies)), len(bodies))
        self.flush()

    def deferred_publish(self, topic: str, delay: float, body: bytes) -> None:
        """DPUB (``delay`` in seconds, sent as whole milliseconds), then ``flush``."""
        self.send(encode_dpub(_checked("DPUB", topic), max(0, int(delay * 1000)), body))
        self.flush()

    def send(self, command: bytes, messages: int = 1) -> None:
        """Write one encoded PUB/MPUB/DPUB (``protocol.commands.encode_*``) of ``messages``
        messages without waiting for its reply, unless ``max_in_flight`` replies are due."""
        self._queue.append(_Command(command, messages))
        self._pump()

    def flush(self) -> None:
        """Wait until every command sent so far is acknowledged."""
        self._pump()
        while self._waiting or self._queue:
            self._read_replies(0)
            self._pump()

    def stats(self) -> ProducerStats:
        return ProducerStats(self._messages, self._commands, self._retried, self._resent, self._connects,
                             dict(self._per_nsqd))

    def close(self) -> None:
        """Close the connection; replies not read are abandoned (call ``flush`` first)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._waiting.clear()
        self._queue.clear()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()

    # -- machinery ---------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Write the queued commands, reading replies whenever ``max_in_flight`` are due."""
        queue = self._queue
        while queue:
            command = queue.popleft()
            conn = self._connection_for(command)
            if command.failures or command.sent_before:
                self._retried += 1
                if command.sent_before:
                    self._resent += command.messages
            self._waiting.append(command)
            self._commands += 1
            try:
                conn.send_command(command.data, command)
            except ConnectionClosed as exc:
                command.sent_before = True  # some of it may have gone out
                self._lost(exc)
                continue
            if len(self._waiting) >= self.max_in_flight:
                self._read_replies(self.max_in_flight - 1)

    def _connection_for(self, command: _Command) -> BlockingConnection:
        """The current connection if ``command`` has not failed there, else one to the next address
        it has not failed at; ``NoAvailableNsqd`` (and every unacknowledged command forgotten) when
        there is none."""
        addresses = self.addresses
        for _ in range(len(addresses)):
            address = addresses[self._current]
            if address not in command.failures:
                conn = self._conn
                # between publishes nsqd may have gone away (restarted): found before writing, that is
                # no failure of this command, just a new connection
                if conn is not None and conn.address == address and (self._waiting or conn.is_alive()):
                    return conn
                self._drop()
                try:
                    self._conn = connect(address, self._connect_config)
                except (ConnectError, NSQError) as exc:
                    logger.warning("%s", exc)
                    command.failures[address] = exc
                else:
                    self._connects += 1
                    return self._conn
            self._next_address()
        self._drop()
        self._queue.clear()
        raise NoAvailableNsqd(command.failures)

    def _read_replies(self, left: int) -> None:
        """Read replies until at most ``left`` commands wait for one."""
        waiting = self._waiting
        while len(waiting) > left:
            conn = self._conn
            assert conn is not None
            try:
                event = conn.read_event(time.monotonic() + self.response_timeout)
            except TimeoutError:
                self._lost(ConnectionClosed(f"no reply from nsqd {conn.address} within {self.response_timeout} s"))
                return
            except ConnectionClosed as exc:
                self._lost(exc)
                return
            kind = type(event)
            if kind is Reply:
                command = waiting.popleft()
                assert event.token is command
                self._messages += command.messages
                self._per_nsqd[conn.address] = self._per_nsqd.get(conn.address, 0) + command.messages
            elif kind is ErrorReply and event.token is None and not event.error.fatal:
                logger.warning("nsqd %s: %s", conn.address, event.error)
            elif kind is ErrorReply and event.token is not None:
                command = waiting.popleft()
                assert event.token is command
                error = event.error
                self._drop()  # nsqd closes the connection after a refused publish
                if error.code not in SERVER_FAILURES:
                    raise error
                logger.warning("nsqd %s: %s; trying the next nsqd", conn.address, error)
                command.failures[conn.address] = error
                self._queue.appendleft(command)
                self._next_address()
                return
            else:
                self._lost(ConnectionClosed(f"unexpected {event!r} from nsqd {conn.address}"))
                return

    def _lost(self, cause: BaseException) -> None:
        """The connection failed: what waits on it may or may not be stored; it goes to the next
        address."""
        conn = self._conn
        assert conn is not None
        logger.warning("%s; %d commands go to the next nsqd", cause, len(self._waiting))
        for command in self._waiting:
            command.failures[conn.address] = cause
            command.sent_before = True
        self._drop()
        self._next_address()

    def _drop(self) -> None:
        """Close the current connection; the commands waiting on it are written again (first)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._queue.extendleft(reversed(self._waiting))
        self._waiting.clear()

    def _next_address(self) -> None:
        self._current = (self._current + 1) % len(self.addresses)


# -- nsqlookupd --------------------------------------------------------------------------------------


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=dict([ACCEPT_V1]))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(MAX_BODY)
    except urllib.error.URLError as exc:
        raise LookupdError(f"GET {url}: {_cause(exc.reason) if isinstance(exc.reason, BaseException) else exc.reason}"
                           ) from None
    except (OSError, ValueError) as exc:
        raise LookupdError(f"GET {url}: {_cause(exc)}") from None


def lookup_producers(lookupd_http_address: str, topic: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[Peer]:
    """The nsqd a lookupd lists for ``topic`` (``[]`` when it knows no such topic);
    ``LookupdError`` when it gives no usable answer."""
    url = lookup_url(lookupd_http_address, "/lookup", topic=topic)
    return parse_lookup(url, *_get(url, timeout))


def lookup(lookupd_http_address: str, topic: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """``broadcast_address:tcp_port`` of each nsqd a lookupd lists for ``topic``, in its order."""
    return [peer.tcp_address for peer in lookup_producers(lookupd_http_address, topic, timeout=timeout)]


def nodes(lookupd_http_address: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[Peer]:
    """Every nsqd registered with a lookupd (``/nodes``), with its topics."""
    url = lookup_url(lookupd_http_address, "/nodes")
    return parse_nodes(url, *_get(url, timeout))


def topics(lookupd_http_address: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Every topic a lookupd knows (``/topics``)."""
    url = lookup_url(lookupd_http_address, "/topics")
    return parse_topics(url, *_get(url, timeout))
