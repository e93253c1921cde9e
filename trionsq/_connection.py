"""The trio driver of one connection to nsqd.

``Connection`` runs ``trionsq._core`` over a trio stream: it dials within ``dial_timeout``, performs
the handshake (magic, IDENTIFY, TLS through ``trio.SSLStream``, snappy/deflate, AUTH) within
``read_timeout``, then runs two tasks in a nursery of its own until it closes:

- the *reader* receives, decodes and dispatches: replies wake the waiting callers, messages go to
  ``on_message`` (a sync callable), heartbeats are answered with NOP. No frame for
  ``read_timeout`` seconds (nsqd sends a heartbeat every ``heartbeat_interval``) closes the
  connection;
- the *writer* sends what ``send_nowait`` queued: everything queued since its last write is joined
  and sent (compressed) as one write, so a burst of publishes or FINs costs one system call. It
  sleeps while nothing is queued and is woken by the first ``send_nowait`` of the next batch; a
  write that takes longer than ``write_timeout`` closes the connection.

Cost per operation: every trip through trio's scheduler is a few microseconds, so the hot paths
take as few as they can. Without TLS the two tasks drive the socket themselves once the handshake
is done (``trio.SocketStream``'s socket is detached into a plain non-blocking socket): a read that
returns data or a write that the kernel takes whole costs no scheduler trip of its own, where a
stream's ``receive_some``/``send_all`` adds one to every call; the tasks park only in
``wait_readable``/``wait_writable`` (a short read means the socket is drained, so the reader parks
at once instead of trying again). Over TLS the ``trio.SSLStream`` is used as it is.

Requests are pipelined: ``publish`` queues its command, registers itself as the next reply expected
(``ClientCore.expect_reply``) and parks until the reader hands it its reply. Commands leave in call
order and nsqd answers in order, so replies match callers first-in first-out, with no per-call task
and one await per call. A caller cancelled while waiting stays in the queue, marked abandoned, and
its reply is dropped.

Lifetime: ``await nursery.start(conn.run)`` (or ``await open_connection(..., nursery=...)``, or
``async with Connection(...)``) returns once the handshake succeeded, and raises ``ConnectError`` or
``NSQError`` if it failed (``tls_v1`` set and nsqd offering no TLS is a ``ConnectError``: go-nsq
would carry on in the clear). The connection then lives until ``close()`` (CLS and CLOSE_WAIT within
a bound when subscribed), an I/O error, EOF, a read timeout, a fatal error frame (nsqd closes the
connection after one; the request it answers gets the ``NSQError``), or the cancellation of the
nursery. A failed write waits up to half a second for the reader, which may still hold nsqd's
answer to the command being written (an oversized body is refused on its size). However it ends,
every waiting request fails with ``ConnectionClosed``, ``closed`` becomes true, the socket is closed
and ``on_close(conn)`` is called once; ``run`` itself returns normally, so a lost connection never
tears down the caller's nursery.

Messages answer through the connection that delivered them (it is their *responder*, see
``trionsq._message``): ``finish``/``requeue``/``touch`` queue FIN/REQ/TOUCH with ``send_nowait``,
update ``in_flight`` and call ``on_response(message, finished, backoff)`` for FIN and REQ. An answer
after the connection closed is dropped (nsqd has requeued the message already).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable
from typing import Any

import outcome
import trio

from protocol.commands import CLS, NOP, encode_dpub, encode_mpub, encode_pub, encode_rdy, encode_sub
from protocol.errors import E_BAD_CHANNEL
from protocol.names import go_quote, is_valid_channel_name

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
    check_topic,
    local_host,
    split_address,
)
from ._errors import ConnectError, ConnectionClosed, NSQError
from ._message import Message
from ._nursery import leave_nursery

__all__ = ["Connection", "open_connection"]

logger = logging.getLogger("trionsq.connection")

_RECEIVE_SIZE = 256 * 1024
_CLOSE_WAIT_TIMEOUT = 5.0
_WRITE_FAILURE_GRACE = 0.5
_reschedule = trio.lowlevel.reschedule
_wait_readable = trio.lowlevel.wait_readable
_wait_writable = trio.lowlevel.wait_writable
_checkpoint = trio.lowlevel.checkpoint
_Value = outcome.Value
_Error = outcome.Error


class _Waiter:
    """A caller parked until its reply; ``task`` None once it gave up (cancelled)."""

    __slots__ = ("task",)

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task: trio.lowlevel.Task | None = task

    def abort(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        self.task = None
        return trio.lowlevel.Abort.SUCCEEDED


class Connection:
    """One connection to one nsqd, for code that needs the protocol itself.

    Start it with ``async with Connection(address, config) as conn:``, ``await nursery.start(conn.run)`` or
    `open_connection`: each returns once the connection is ready. It dials within ``dial_timeout`` and performs the
    handshake (IDENTIFY, TLS, snappy or deflate, AUTH when nsqd asks) within ``read_timeout``. Then a reader task
    hands replies to their callers, messages to ``on_message`` and answers heartbeats with NOP (no frame for
    ``read_timeout`` closes the connection), and a writer task sends everything queued since its last write in one
    write (a write over ``write_timeout`` closes the connection). Requests are pipelined and matched to their
    replies in order, with no task per call.

    However the connection ends (`close`, EOF, an I/O error, a read timeout, a fatal error frame, the nursery's
    cancellation), every waiting request raises `ConnectionClosed`, ``closed`` becomes true, ``close_reason`` says
    why and ``on_close`` runs once; a lost connection never tears down the caller's nursery. A ``Connection`` runs
    once.

    Args:
        address: ``host:port`` of nsqd's TCP listener.
        config: Connection options; ``Config()`` when omitted.
        on_message: A sync callable, run by the reader task for each delivered `Message` (after `subscribe`).
        on_response: Called as ``on_response(message, finished, backoff)`` after each FIN (``finished``) or REQ.
        on_close: Called once as ``on_close(conn)`` when the connection has closed.

    Raises:
        ValueError: ``address`` is not ``host:port``.

    Attributes:
        address: The ``host:port`` given.
        config: The `Config` in use.
        features: What nsqd granted in IDENTIFY (`Features`), once connected.
        auth: What AUTH granted (`AuthResult`), when nsqd asked for it.
        closed: True once the connection has ended.
        close_reason: Why it ended.
        subscribed: True after a successful `subscribe`.
        in_flight: Messages delivered and not yet FIN'd or REQ'd.
        rdy: The last RDY count sent.
        last_message_time: ``trio.current_time()`` of the last message delivered (0 before the first).
        messages_received: Messages delivered so far.
        writes: Writes to the socket so far (each carries every command queued since the previous one).
    """

    def __init__(
        self,
        address: str,
        config: Config | None = None,
        *,
        on_message: Callable[[Message], Any] | None = None,
        on_response: Callable[[Message, bool, bool], Any] | None = None,
        on_close: Callable[[Connection], Any] | None = None,
    ) -> None:
        self.address = address
        self.host, self.port = split_address(address)
        self.config = config if config is not None else Config()
        self.on_message = on_message
        self.on_response = on_response
        self.on_close = on_close
        self.features: Features | None = None
        self.auth: AuthResult | None = None
        self.closed = False
        self.close_reason = ""
        self.subscribed = False
        #: messages delivered and not yet FIN'd or REQ'd
        self.in_flight = 0
        #: the last RDY count sent
        self.rdy = 0
        #: trio.current_time() of the last message delivered (0 before the first)
        self.last_message_time = 0.0
        self.messages_received = 0
        #: writes to the socket (each carries every command queued since the previous one)
        self.writes = 0
        self._core = ClientCore(self.config, address, responder=self)
        self._stream: trio.abc.Stream | None = None
        self._sock: socket.socket | None = None  # the plain TCP socket, without TLS, once connected
        self._outbox: list[bytes] = []
        self._writer_task: trio.lowlevel.Task | None = None
        self._writer_parked = False
        self._flush_waiter: trio.Event | None = None  # set when the writer parks with nothing queued (close)
        self._tasks_scope: trio.CancelScope | None = None
        self._started = False
        self._finished = trio.Event()
        self._reader_done = trio.Event()
        self._nursery_manager: Any = None

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("open" if self._core.connected else "connecting")
        return f"<trionsq.Connection {self.address} {state}>"

    # -- lifetime ---------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, then serve the connection until it closes: use as ``await nursery.start(conn.run)``.

        ``nursery.start`` returns once the handshake succeeded; ``run`` itself returns normally when the
        connection ends, however it ends.

        Raises:
            ConnectError: The dial, the TLS upgrade or the handshake failed (``tls_v1`` asked of an nsqd that
                offers no TLS included).
            NSQError: nsqd refused IDENTIFY or AUTH (``E_AUTH_FAILED``...).
            RuntimeError: The connection was started before.
        """
        await self._connect()
        await self._serve(task_status=task_status)

    async def close(self, timeout: float = _CLOSE_WAIT_TIMEOUT) -> None:
        """Close the connection and wait until it has shut down; calling it again does nothing more.

        A subscribed connection first sends CLS and waits, at most ``timeout`` seconds, for nsqd's CLOSE_WAIT (nsqd
        refuses CLS on a connection that never subscribed, so a publishing one just closes its socket, as
        go-nsq's does). Answers queued by then (FIN/REQ of messages that came with CLOSE_WAIT) are written before
        the socket closes, within the same bound.

        Args:
            timeout: How long to wait for CLOSE_WAIT, in seconds.
        """
        if not self.closed and self.subscribed:
            with trio.move_on_after(timeout):
                with contextlib.suppress(ConnectionClosed, NSQError):
                    await self._request(CLS)
                # nsqd sends no message after CLOSE_WAIT, but messages it had buffered may come in the same read,
                # and on_message may have answered them already: those answers leave before the socket closes,
                # or nsqd would hold the messages in flight until its --msg-timeout (go-nsq's connection also
                # writes its pending answers before it closes)
                await self._flushed()
        self._mark_closed("closed by the client")
        if self._started:
            await self._finished.wait()

    async def __aenter__(self) -> Connection:
        # Connect before opening the nursery, so that a failure is raised as itself, not inside
        # the nursery's exception group.
        await self._connect()
        self._nursery_manager = trio.open_nursery()
        nursery = await self._nursery_manager.__aenter__()
        nursery.start_soon(self._serve)
        return self

    async def __aexit__(self, *exc_info: Any) -> bool:
        return await leave_nursery(self._nursery_manager, exc_info, self.close, self._abandon)

    async def _flushed(self) -> None:
        """Return once the writer has written everything queued so far, or the connection has ended."""
        while (self._outbox or not self._writer_parked) and not self.closed:
            event = self._flush_waiter = trio.Event()
            await event.wait()

    def _abandon(self) -> None:
        self._mark_closed("closed by the client")

    async def _connect(self) -> None:
        if self._started:
            raise RuntimeError("a Connection runs once")
        self._started = True
        try:
            await self._open()
        except BaseException as exc:
            self._mark_closed(f"connect failed: {exc}")
            await self._close_stream()
            self._finished.set()
            raise

    async def _serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._tasks_scope = nursery.cancel_scope
                if self.closed:  # closed between the handshake and now
                    nursery.cancel_scope.cancel()
                nursery.start_soon(self._read_loop)
                nursery.start_soon(self._write_loop)
                task_status.started()
        finally:
            self._mark_closed("connection closed")
            await self._close_stream()
            self._finished.set()
            logger.info("%s: closed (%s)", self.address, self.close_reason)
            if self.on_close is not None:
                self.on_close(self)

    # -- requests ---------------------------------------------------------------------------------

    async def publish(self, topic: str, body: bytes) -> None:
        """Publish one message (PUB) and return once nsqd answered ``OK``.

        Args:
            topic: A valid NSQ topic name (checked before sending, with nsqd's error text).
            body: The message, at most nsqd's ``--max-msg-size``.

        Raises:
            NSQError: nsqd's error frame (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``, ``E_PUB_FAILED``...), or an invalid
                topic name.
            ConnectionClosed: The connection ended before the reply, or was closed.
        """
        check_topic("PUB", topic)
        await self._request(encode_pub(topic, body))

    async def multi_publish(self, topic: str, bodies: list[bytes]) -> None:
        """Publish several messages in one MPUB: nsqd stores all of them or none.

        Args:
            topic: A valid NSQ topic name.
            bodies: At least one message; together at most nsqd's ``--max-body-size``.

        Raises:
            NSQError: nsqd's error frame (``E_BAD_BODY``, ``E_MPUB_FAILED``...), or an invalid topic name.
            ConnectionClosed: The connection ended before the reply, or was closed.
            ValueError: ``bodies`` is empty.
        """
        check_topic("MPUB", topic)
        if not bodies:
            raise ValueError("multi_publish needs at least one message body")
        await self._request(encode_mpub(topic, bodies))

    async def deferred_publish(self, topic: str, delay_seconds: float, body: bytes) -> None:
        """Publish one message (DPUB) that nsqd delivers ``delay_seconds`` from now.

        Args:
            topic: A valid NSQ topic name.
            delay_seconds: The delay, sent as whole milliseconds (never negative); at most nsqd's
                ``--max-req-timeout``.
            body: The message.

        Raises:
            NSQError: nsqd's error frame (``E_INVALID`` for a delay out of range, ``E_DPUB_FAILED``...).
            ConnectionClosed: The connection ended before the reply, or was closed.
        """
        check_topic("DPUB", topic)
        await self._request(encode_dpub(topic, max(0, int(delay_seconds * 1000)), body))

    async def subscribe(self, topic: str, channel: str) -> None:
        """Subscribe (SUB) to ``topic``/``channel``; messages then flow to ``on_message`` as `ready` allows.

        Args:
            topic: A valid NSQ topic name.
            channel: A valid NSQ channel name.

        Raises:
            NSQError: nsqd's error frame, or an invalid topic or channel name (``E_BAD_TOPIC``,
                ``E_BAD_CHANNEL``).
            ConnectionClosed: The connection ended before the reply, or was closed.
        """
        check_topic("SUB", topic)
        if not is_valid_channel_name(channel):
            raise NSQError(E_BAD_CHANNEL, f"SUB channel name {go_quote(channel)} is not valid")
        await self._request(encode_sub(topic, channel))
        self.subscribed = True

    def ready(self, count: int) -> None:
        """Send RDY ``count``: how many messages nsqd may have in flight on this connection.

        Synchronous: the command is queued for the writer.

        Args:
            count: From 0 (pause) to the ``max_rdy_count`` nsqd granted (2500 by default).

        Raises:
            ValueError: ``count`` out of that range.
            ConnectionClosed: The connection is closed.
        """
        limit = self.features.max_rdy_count if self.features is not None else 2500
        if not 0 <= count <= limit:
            raise ValueError(f"RDY count {count} out of range 0-{limit} for nsqd {self.address}")
        self.send_nowait(encode_rdy(count))
        self.rdy = count

    def send_nowait(self, data: bytes) -> None:
        """Queue encoded command bytes for the writer, which joins them with the rest of its batch.

        For commands nsqd does not answer (RDY, FIN, NOP...); a reply to anything sent this way is not matched to
        a caller.

        Raises:
            ConnectionClosed: The connection is closed.
        """
        if self.closed:
            raise ConnectionClosed(f"connection to nsqd {self.address} is closed ({self.close_reason})")
        self._outbox.append(data)
        if self._writer_parked:
            self._writer_parked = False
            _reschedule(self._writer_task)  # type: ignore[arg-type]

    async def _request(self, data: bytes) -> bytes:
        """Queue a command that nsqd answers and park until its reply."""
        if self.closed:
            raise ConnectionClosed(f"connection to nsqd {self.address} is closed ({self.close_reason})")
        waiter = _Waiter(trio.lowlevel.current_task())
        self.send_nowait(data)
        self._core.expect_reply(waiter)
        reply: bytes = await trio.lowlevel.wait_task_rescheduled(waiter.abort)
        return reply

    # -- message responder (see trionsq._message) -------------------------------------------------

    def _message_finished(self, message: Message, data: bytes) -> None:
        self._answer(message, data, True, False)

    def _message_requeued(self, message: Message, data: bytes, backoff: bool) -> None:
        self._answer(message, data, False, backoff)

    def _message_touched(self, message: Message, data: bytes) -> None:
        if not self.closed:
            self.send_nowait(data)

    def _answer(self, message: Message, data: bytes, finished: bool, backoff: bool) -> None:
        if self.closed:
            logger.debug("%s: %s after close dropped", self.address, data[:3].decode())
        else:
            self.send_nowait(data)
        self.in_flight -= 1
        if self.on_response is not None:
            self.on_response(message, finished, backoff)

    # -- the handshake ----------------------------------------------------------------------------

    async def _open(self) -> None:
        config = self.config
        try:
            with trio.fail_after(config.dial_timeout):
                self._stream = await trio.open_tcp_stream(
                    self.host, self.port, local_address=local_host(config.local_addr)
                )
        except (OSError, trio.TooSlowError) as exc:
            cause = "timed out" if isinstance(exc, trio.TooSlowError) else _dial_cause(exc)
            raise ConnectError(f"cannot connect to nsqd {self.address}: {cause}") from exc
        try:
            with trio.fail_after(config.read_timeout):
                await self._handshake()
        except trio.TooSlowError:
            raise ConnectError(f"handshake with nsqd {self.address} timed out") from None
        except (trio.BrokenResourceError, OSError) as exc:
            raise ConnectError(f"handshake with nsqd {self.address} failed: {_cause(exc)}") from exc
        features = self.features
        assert features is not None
        if config.tls_v1 and not features.tls_v1:
            # go-nsq would carry on in the clear; a client configured for TLS refuses to
            raise ConnectError(f"nsqd {self.address} does not offer TLS (start it with --tls-cert and --tls-key)")
        logger.info(
            "%s: connected (nsqd %s%s%s%s%s)",
            self.address,
            features.version or "without feature negotiation",
            ", TLS" if features.tls_v1 else "",
            ", snappy" if features.snappy else "",
            f", deflate level {features.deflate_level}" if features.deflate else "",
            f", authenticated as {self.auth.identity!r}" if self.auth is not None else "",
        )

    async def _handshake(self) -> None:
        core = self._core
        stream = self._stream
        assert stream is not None
        await stream.send_all(core.handshake_bytes())
        while True:
            event = core.next_event()
            if event is NEED_DATA:
                data = await stream.receive_some(_RECEIVE_SIZE)
                if not data:
                    raise ConnectError(f"nsqd {self.address} closed the connection during the handshake")
                core.receive_data(data)
            elif event is START_TLS:
                stream = self._stream = trio.SSLStream(stream, self.config.ssl_context(), server_hostname=self.host)
                await stream.do_handshake()
                core.tls_started()
            elif type(event) is Send:
                await stream.send_all(event.data)
            elif type(event) is Connected:
                self.features = event.features
                self.auth = event.auth
                if type(stream) is trio.SocketStream:  # no TLS: the tasks drive the socket (module docstring)
                    sock = self._sock = socket.socket(fileno=stream.socket.detach())
                    sock.setblocking(False)
                    self._stream = None
                return
            else:
                raise ConnectError(f"unexpected {event!r} from nsqd {self.address} during the handshake")

    # -- the two tasks ----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        core = self._core
        stream = self._stream
        sock = self._sock
        recv = sock.recv if sock is not None else None
        read_timeout = self.config.read_timeout
        on_message = self.on_message
        drained = True  # the last read was short: the socket had nothing more
        try:
            with trio.CancelScope(deadline=trio.current_time() + read_timeout) as timer:
                while True:
                    if recv is None:
                        data = await stream.receive_some(_RECEIVE_SIZE)  # type: ignore[union-attr]
                    else:
                        if drained:  # park until more comes, rather than try a recv that would fail
                            await _wait_readable(sock)  # type: ignore[arg-type]  # set when recv is
                        else:  # more is probably there: the tasks the last read woke run first
                            await _checkpoint()
                        try:
                            data = recv(_RECEIVE_SIZE)
                        except BlockingIOError:
                            drained = True
                            continue
                        drained = len(data) < _RECEIVE_SIZE
                    if not data:
                        self._mark_closed("nsqd closed the connection")
                        return
                    now = trio.current_time()
                    timer.deadline = now + read_timeout
                    for event in core.receive_events(data):  # the whole read, decoded in one pass
                        kind = type(event)
                        if kind is Reply:
                            waiter = event.token
                            if waiter is not None and waiter.task is not None:
                                _reschedule(waiter.task, _Value(event.data))
                        elif kind is Message:
                            self.in_flight += 1
                            self.messages_received += 1
                            self.last_message_time = now
                            if on_message is None:
                                on_message = self.on_message  # set after construction
                            if on_message is not None:
                                on_message(event)
                            else:
                                logger.warning("%s: message %s with no on_message handler", self.address, event.id)
                        elif event is HEARTBEAT:
                            self.send_nowait(NOP)
                        elif kind is ErrorReply:
                            self._error_frame(event)
                        if self.closed:
                            return
            self._mark_closed(f"no data from nsqd for {read_timeout:g}s (read_timeout)")
        except ConnectionClosed as exc:  # a corrupt stream
            self._mark_closed(str(exc))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._mark_closed(f"read failed: {_cause(exc)}")
        finally:
            self._reader_done.set()

    def _error_frame(self, event: ErrorReply) -> None:
        waiter = event.token
        error = event.error
        if waiter is not None:
            if waiter.task is not None:
                _reschedule(waiter.task, _Error(error))
        elif error.fatal:
            logger.error("%s: error from nsqd: %s", self.address, error)
        else:
            logger.warning("%s: error from nsqd: %s", self.address, error)
        if error.fatal:
            # nsqd closes the connection after a fatal error and ignores what follows: the
            # requests behind this one fail now, and no new one is sent into the closing socket
            self._mark_closed(f"nsqd sent {error.code}")

    async def _write_loop(self) -> None:
        core = self._core
        stream = self._stream
        sock = self._sock
        write_timeout = self.config.write_timeout
        self._writer_task = trio.lowlevel.current_task()
        try:
            while True:
                if not self._outbox:
                    self._writer_parked = True
                    if self._flush_waiter is not None:
                        self._flush_waiter.set()
                        self._flush_waiter = None
                    await trio.lowlevel.wait_task_rescheduled(self._abort_writer_wait)
                batch = self._outbox
                self._outbox = []
                data = core.wire_bytes(batch[0] if len(batch) == 1 else b"".join(batch))
                self.writes += 1
                if sock is not None:
                    try:
                        sent = sock.send(data)
                    except BlockingIOError:
                        sent = 0
                    if sent == len(data):
                        continue  # the common case: the kernel took it all, no scheduler trip
                    with trio.move_on_after(write_timeout) as timer:
                        await self._send_rest(sock, memoryview(data)[sent:])
                else:
                    with trio.move_on_after(write_timeout) as timer:
                        await stream.send_all(data)  # type: ignore[union-attr]
                if timer.cancelled_caught:
                    self._mark_closed(f"write to nsqd took over {write_timeout:g}s (write_timeout)")
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            reason = f"write failed: {_cause(exc)}"
        # nsqd may have answered and closed while we were still writing (it refuses an oversized
        # body on its size field): the reader gets a moment to deliver that answer to its caller
        # before every request still waiting fails
        with trio.move_on_after(_WRITE_FAILURE_GRACE):
            await self._reader_done.wait()
        self._mark_closed(reason)

    @staticmethod
    async def _send_rest(sock: socket.socket, data: memoryview) -> None:
        """What the kernel did not take at once, as it makes room."""
        while data:
            await _wait_writable(sock)
            with contextlib.suppress(BlockingIOError):
                data = data[sock.send(data) :]

    def _abort_writer_wait(self, _raise_cancel: Any) -> trio.lowlevel.Abort:
        self._writer_parked = False
        return trio.lowlevel.Abort.SUCCEEDED

    # -- shutting down ----------------------------------------------------------------------------

    def _mark_closed(self, reason: str) -> None:
        """Close (once): fail every waiting request, stop the tasks; ``run`` closes the socket."""
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        for waiter in self._core.pending_tokens():
            if waiter is not None and waiter.task is not None:
                error = ConnectionClosed(f"connection to nsqd {self.address} closed: {reason}")
                _reschedule(waiter.task, _Error(error))
        self._outbox.clear()
        if self._flush_waiter is not None:
            self._flush_waiter.set()
            self._flush_waiter = None
        if self._tasks_scope is not None:
            self._tasks_scope.cancel()

    async def _close_stream(self) -> None:
        sock = self._sock
        if sock is not None:
            self._sock = None
            trio.lowlevel.notify_closing(sock)
            sock.close()
        stream = self._stream
        if stream is None:
            return
        self._stream = None
        with trio.CancelScope(shield=True):
            with trio.move_on_after(1.0) as timer:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    await stream.aclose()
            if timer.cancelled_caught:
                # a TLS close_notify the peer does not read must not hold us: drop the socket
                await trio.aclose_forcefully(stream)


def _dial_cause(exc: OSError) -> str:
    """The reason of a failed dial: trio gathers each attempt's error in a group under a summary."""
    group = exc.__cause__
    if isinstance(group, BaseExceptionGroup):
        reasons = {e.strerror for e in group.exceptions if isinstance(e, OSError) and e.strerror}
        if reasons:
            return ", ".join(sorted(reasons))
    return exc.strerror or str(exc)


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__ or exc
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(cause) or type(cause).__name__


async def open_connection(
    address: str,
    config: Config | None = None,
    *,
    nursery: trio.Nursery,
    on_message: Callable[[Message], Any] | None = None,
    on_response: Callable[[Message, bool, bool], Any] | None = None,
    on_close: Callable[[Connection], Any] | None = None,
) -> Connection:
    """Connect to nsqd and run the connection's tasks in ``nursery``; return the `Connection` once it is ready.

    The arguments are `Connection`'s; the connection lives until it is closed or ``nursery`` is cancelled.

    Raises:
        ConnectError: The dial, the TLS upgrade or the handshake failed.
        NSQError: An error frame during the handshake, such as ``E_AUTH_FAILED``.
        ValueError: ``address`` is not ``host:port``.
    """
    conn = Connection(address, config, on_message=on_message, on_response=on_response, on_close=on_close)
    await nursery.start(conn.run)
    return conn
