"""One nsqd connection over a plain socket: ``connect`` and ``BlockingConnection``; the design is
told in ``trionsq.blocking``, whose public names these are."""

from __future__ import annotations

import contextlib
import logging
import math
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

from protocol.commands import NOP, encode_dpub, encode_mpub, encode_pub, encode_rdy, encode_sub
from protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE

from ._config import Config
from ._core import (
    _HEARTBEAT_DATA,
    _MAX_FRAME_SIZE,
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
    check_topic,
    local_host,
    split_address,
)
from ._errors import ConnectError, ConnectionClosed, NSQError
from ._message import Message

__all__ = ["BlockingConnection", "HandshakeError", "connect"]

logger = logging.getLogger("trionsq.blocking")

RECEIVE_SIZE = 256 * 1024
_FRAME_HEADER = struct.Struct(">iI")  # size (of what follows it), frame type


class HandshakeError(ConnectError):
    """nsqd and the ``Config`` cannot agree, so retrying is pointless: ``tls_v1`` asked and nsqd
    offers no TLS (refused rather than going on in the clear), or nsqd requires AUTH and no
    ``auth_secret`` is set.

    Attributes:
        features: What nsqd answered to IDENTIFY.
    """

    def __init__(self, message: str, features: Features) -> None:
        super().__init__(message)
        self.features = features

    def __reduce__(self) -> tuple[type[HandshakeError], tuple[str, Features]]:
        return (type(self), (str(self), self.features))


def cause(exc: BaseException) -> str:
    """An exception as a short reason for a message ("timed out", "Connection refused")."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


# -- one connection ----------------------------------------------------------------------------------


def connect(
    address: str,
    config: Config | None = None,
    *,
    deadline: float | None = None,
    server_hostname: str | None = None,
    receive_size: int = RECEIVE_SIZE,
) -> BlockingConnection:
    """Connect to the nsqd at ``address`` and go through the handshake: magic, IDENTIFY, the TLS
    upgrade, snappy or deflate, AUTH.

    Args:
        address: ``host:port`` of nsqd's TCP listener.
        config: Connection options; ``Config()`` when omitted.
        deadline: A ``time.monotonic()`` time bounding the dial (at most ``dial_timeout``) and the
            whole handshake; default ``dial_timeout + read_timeout`` from the call.
        server_hostname: The name nsqd's TLS certificate is checked against; default the address's
            host.
        receive_size: Bytes per read from the socket.

    Returns:
        The connection, ready for commands; use it as a context manager to close it.

    Raises:
        ConnectError: Refused, timed out, or the TLS or compression upgrade failed.
        HandshakeError: ``tls_v1`` asked of an nsqd without TLS, or AUTH required and no
            ``auth_secret``: retrying cannot help.
        NSQError: nsqd refused IDENTIFY or AUTH (``E_AUTH_FAILED``...).
        ValueError: ``address`` is not ``host:port``.
    """
    config = config if config is not None else Config()
    host, port = split_address(address)
    started = time.monotonic()
    if deadline is None:
        deadline = started + config.dial_timeout + config.read_timeout
    source = local_host(config.local_addr)
    try:
        sock = socket.create_connection(
            (host, port),
            timeout=max(min(config.dial_timeout, deadline - started), 0.001),
            source_address=None if source is None else (source, 0),
        )
    except OSError as exc:
        raise ConnectError(f"cannot connect to nsqd {address}: {cause(exc)}") from exc
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = BlockingConnection(sock, config, address, receive_size)
    try:
        conn._handshake(deadline, server_hostname or host)
    except BaseException:
        conn.close()
        raise
    return conn


class BlockingConnection:
    """One nsqd connection driven by blocking calls, made by `connect`; a context manager that closes it.

    After the handshake the socket blocks: reads wait with ``poll`` until their own deadline, writes
    are bounded by ``write_timeout``, and a write that fails shuts the connection down. One thread may
    read while another writes (`send` is thread-safe). Messages read here answer through this
    connection: their ``finish()``, ``requeue()`` and ``touch()`` write at once.

    Three ways to read, for three kinds of loop: `read_event` (replies, errors and messages through
    the client's protocol core, heartbeats answered on the way), `request` and `request_into` (one
    command and its answer at a time), and `take_unparsed` then `read_available` (the raw stream, for
    a loop that parses whole receive buffers itself, as the Spark source does).

    Attributes:
        address: The ``host:port`` connected to.
        config: The `Config` in use.
        features: What nsqd granted in IDENTIFY (`Features`).
        auth: What AUTH granted (`AuthResult`), when nsqd asked for it.
        closed: True once the connection is closed or found lost.
    """

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
                        raise HandshakeError(
                            f"nsqd {address} requires AUTH and no auth_secret is set", features
                        ) from None
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
        except TimeoutError:
            raise ConnectError(f"handshake with nsqd {address} timed out") from None
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; ValueError: a bad TLS setting
            raise ConnectError(f"handshake with nsqd {address} failed: {cause(exc)}") from exc
        if self.config.tls_v1 and not tls:
            raise HandshakeError(
                f"nsqd {address} does not offer TLS (start it with --tls-cert and --tls-key)", self.features
            )
        self._blocking_mode()
        logger.debug(
            "%s: connected (nsqd %s%s%s%s)",
            address,
            self.features.version or "without negotiation",
            ", TLS" if tls else "",
            ", snappy" if self.features.snappy else "",
            ", deflate" if self.features.deflate else "",
        )

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
        for option, seconds in (
            (socket.SO_SNDTIMEO, self.config.write_timeout),
            (socket.SO_RCVTIMEO, self.config.read_timeout),
        ):
            whole = int(seconds)
            sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", whole, int((seconds - whole) * 1e6)))
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)

    def _readable(self, timeout: float | None) -> bool:
        """Whether data came within ``timeout`` seconds (None: wait as long as it takes)."""
        sock = self.sock
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True  # decrypted bytes the kernel knows nothing of
        assert self._poll is not None  # set with the socket
        return bool(self._poll.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))

    # -- writing -------------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write encoded commands: several may be joined, for one write and one compressed piece.

        Blocks until the socket took them, at most ``write_timeout`` per call. Thread-safe.

        Raises:
            ConnectionClosed: The connection is closed, or the write failed (the connection is then shut
                down: part of a command may have gone out).
        """
        with self._send_lock:
            self._send_locked(data)

    def send_command(self, data: bytes, token: Any) -> None:
        """Write one command that nsqd answers (PUB, MPUB, DPUB, SUB), for pipelining.

        Its `Reply` or `ErrorReply` from `read_event` carries ``token``; replies come in the order
        the commands were sent.

        Raises:
            ConnectionClosed: As `send`.
        """
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
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            raise ConnectionClosed(f"cannot write to nsqd {self.address}: {cause(exc)}") from exc

    # -- reading through the core ----------------------------------------------------------------------

    def read_event(self, deadline: float | None = None) -> Reply | ErrorReply | Message:
        """The next reply, error or message; heartbeats are answered on the way.

        Args:
            deadline: A ``time.monotonic()`` time; None waits as long as it takes.

        Raises:
            TimeoutError: Nothing came by ``deadline``; the connection stays usable.
            ConnectionClosed: EOF, a reset or a corrupt stream (the connection is closed).
        """
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
                    answer: Reply | ErrorReply | Message = event
                    return answer
        except ConnectionClosed:
            self.close()
            raise

    def request(self, data: bytes, deadline: float | None = None) -> bytes:
        """Send one command that nsqd answers and wait for its answer.

        For a connection used one request at a time that does not consume yet: a message or another
        command's reply meanwhile closes it. Non-fatal error frames are logged on the way.

        Args:
            data: The encoded command.
            deadline: A ``time.monotonic()`` time; default ``read_timeout`` from the call.

        Returns:
            The answer's data, e.g. ``b"OK"``.

        Raises:
            NSQError: nsqd's error frame (fatal: the connection is closed).
            TimeoutError: No answer by ``deadline``.
            ConnectionClosed: The connection was lost, or something else than the answer came.
        """
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

    def request_into(self, data: bytes, deadline: float | None = None) -> bytes | bytearray:
        """`request` for a command whose answer is large (a range of messages, megabytes).

        The answer's frame is read from the socket straight into one buffer of its size, where the
        core's frame buffer would copy it three or four times on the way (each received piece copied
        out of the receive buffer, appended to the core's buffer, the frame cut out of it). Used on an
        uncompressed stream with no other reply due; otherwise this is `request`. Heartbeats are
        answered and non-fatal errors logged on the way, as `request` does.

        Raises:
            NSQError: nsqd's error frame.
            TimeoutError: No whole answer by ``deadline``.
            ConnectionClosed: The connection was lost. Any failure, a timeout included (a frame read in
                part leaves the stream unusable), closes the connection.
        """
        core = self._core
        if core._decoder is not None or core._pending:
            return self.request(data, deadline)
        if deadline is None:
            deadline = time.monotonic() + self.config.read_timeout
        held = memoryview(core.take_unparsed())  # normally empty: nothing follows the last reply
        try:
            self.send(data)
            while True:
                header = bytearray(8)
                held = self._fill(memoryview(header), held, deadline)
                size, frame_type = _FRAME_HEADER.unpack(header)
                if size < 4 or size > _MAX_FRAME_SIZE:
                    raise ConnectionClosed(f"corrupt stream from nsqd {self.address}: invalid frame size {size}")
                body = bytearray(size - 4)
                held = self._fill(memoryview(body), held, deadline)
                if frame_type == FRAME_TYPE_RESPONSE:
                    if body == _HEARTBEAT_DATA:
                        self.send(NOP)
                        continue
                    core.receive_data(bytes(held))  # nothing, unless nsqd sent more than it was asked
                    return body
                if frame_type == FRAME_TYPE_ERROR:
                    error = NSQError.from_frame(bytes(body))
                    if not error.fatal:
                        logger.warning("%s: %s", self.address, error)
                        continue
                    raise error
                raise ConnectionClosed(
                    f"unexpected frame of type {frame_type} from nsqd {self.address} awaiting a reply"
                )
        except BaseException:
            self.close()
            raise

    def _fill(self, view: memoryview, held: memoryview, deadline: float) -> memoryview:
        """Fill ``view``: first from ``held`` (bytes already received), then from the socket; returns
        what is left of ``held``. ``TimeoutError`` at ``deadline``, ``ConnectionClosed`` at EOF."""
        taken = min(len(held), len(view))
        view[:taken] = held[:taken]
        filled = taken
        while filled < len(view):
            if not self._readable(deadline - time.monotonic()):
                raise TimeoutError(f"no answer from nsqd {self.address} in time")
            try:
                size = self.sock.recv_into(view[filled:])
            except OSError as exc:
                raise ConnectionClosed(f"connection to nsqd {self.address} lost: {cause(exc)}") from exc
            if not size:
                raise ConnectionClosed(f"nsqd {self.address} closed the connection")
            filled += size
        return held[taken:]

    def _receive(self) -> bytes:
        view = self._view
        if view is None:
            view = self._view = memoryview(bytearray(self._receive_size))
        try:
            size = self.sock.recv_into(view[: self._receive_size])
        except OSError as exc:
            raise ConnectionClosed(f"connection to nsqd {self.address} lost: {cause(exc)}") from exc
        if not size:
            raise ConnectionClosed(f"nsqd {self.address} closed the connection")
        return bytes(view[:size])

    def is_alive(self) -> bool:
        """Whether the connection is still open, found without waiting.

        What has arrived is read (heartbeats answered, non-fatal errors logged), and EOF or a reset
        closes the connection. For a connection with no reply due and no subscription (a producer's,
        between publishes).
        """
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
        """The stream bytes (decompressed) the core holds past the last event it returned.

        Where a loop that parses the stream itself starts, before it calls `read_available`.
        """
        return self._core.take_unparsed()

    def read_available(self, timeout: float | None, coalesce: int = 0) -> bytes | None:
        """What the socket holds, decompressed, for a loop that parses the raw stream itself.

        Once data arrives, it reads on without waiting while the socket has more, up to ``coalesce``
        bytes in all (not over TLS, which reads with flags refuse), into one receive buffer allocated
        once per connection.

        Args:
            timeout: Seconds to wait for data; None waits as long as it takes.
            coalesce: Bytes to gather in one call at most, past the first read.

        Returns:
            The bytes, or None when nothing came within ``timeout``.

        Raises:
            ConnectionClosed: EOF, a reset or a corrupt stream (the connection is closed).
        """
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
            raise ConnectionClosed(f"connection to nsqd {self.address} lost: {cause(exc)}") from exc
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
        """Publish one message (PUB): one round trip.

        Raises:
            NSQError: nsqd refused it, or the topic name is invalid.
            TimeoutError: No answer within ``read_timeout``.
            ConnectionClosed: The connection was lost.
        """
        self.request(encode_pub(check_topic("PUB", topic), body))

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """Publish several messages in one MPUB (all or none): one round trip.

        Raises:
            NSQError: nsqd refused it, or the topic name is invalid.
            TimeoutError: No answer within ``read_timeout``.
            ConnectionClosed: The connection was lost.
        """
        self.request(encode_mpub(check_topic("MPUB", topic), list(bodies)))

    def deferred_publish(self, topic: str, delay: float, body: bytes) -> None:
        """Publish one message (DPUB) that nsqd delivers ``delay`` seconds from now (sent as whole
        milliseconds): one round trip.

        Raises:
            NSQError: nsqd refused it, or the topic name is invalid.
            TimeoutError: No answer within ``read_timeout``.
            ConnectionClosed: The connection was lost.
        """
        self.request(encode_dpub(check_topic("DPUB", topic), max(0, int(delay * 1000)), body))

    def subscribe(self, topic: str, channel: str, deadline: float | None = None) -> None:
        """Subscribe (SUB) to ``topic``/``channel``; deliveries start after `ready`.

        Raises:
            NSQError: nsqd refused it (``E_BAD_TOPIC``, ``E_BAD_CHANNEL``, ``E_UNAUTHORIZED``...).
            TimeoutError: No answer by ``deadline`` (default ``read_timeout``).
            ConnectionClosed: The connection was lost.
        """
        self.request(encode_sub(topic, channel), deadline)

    def ready(self, count: int) -> None:
        """Send RDY ``count``: how many messages nsqd may have in flight here (nsqd does not answer).

        Raises:
            ConnectionClosed: As `send`.
        """
        self.send(encode_rdy(count))

    def close(self) -> None:
        """Close the socket; calling it again does nothing.

        nsqd requeues what this connection had in flight when each message times out.
        """
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()

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
