"""The trio driver of ``protocol.http``: listeners, one task per connection, timeouts, keep-alive and pipelining.

One task serves one connection from start to end; no task and no cancel scope is created per request. The task
parses every complete request it has received, answers each in order, and writes the answers of a pipelined
batch in one write just before it would wait for more input (or when 64 KiB are pending).

A plain socket is read and written directly where trio's ``SocketStream`` would cost a scheduler round-trip
that buys nothing: answers go out with one ``os.write`` (the stream's ``send_all`` takes over only when the
socket does not take them whole), and a client that sends one request at a time is read by waiting for the
socket to become readable, then reading it, rather than first trying a read that cannot succeed yet. A client
that pipelines (the last read held several requests) is read with ``receive_some``, whose first try usually
finds the next batch. Measured with ``bench/http_server.py``, this takes about a fifth off the server's time
per request for one-at-a-time clients. TLS streams go through the stream throughout.

Timeouts use one cancel scope per connection whose deadline is moved (about 2 µs) before each wait:
- ``idle_timeout`` while waiting for the first byte of a request, and while writing responses;
- ``header_timeout`` from the first byte of a request until its head is complete, however slowly it trickles
  in (slowloris);
- ``body_timeout`` from the end of the head until the end of the body;
- none while a handler runs: handlers bound their own work.
When a deadline passes the connection is closed without an answer, as Go's net/http does.

Bodies are read whole before the handler runs, up to the route's limit. A ``Content-Length`` over the limit is
answered at once (the route's ``body_too_big`` response, 413 by default) without reading the body; a chunked body
is cut off as soon as it passes the limit. ``Expect: 100-continue`` gets ``100 Continue`` only when the body will
be read. A connection that stops reading a body it was sent is closed after the answer with a short linger, so
the client reads the answer before the kernel resets the connection.

Errors: a malformed request gets the bytes Go's net/http writes itself (``protocol.http.refusal_bytes``: a plain-text
``400 Bad Request``, with Go's words for a missing or repeated Host, ``431`` for an oversized head, ``501`` for a
transfer coding other than chunked, ``505`` for a well-formed version other than HTTP/1.x) and the connection is closed;
a handler's exception is the router's 500. Nothing a connection raises reaches the listener's nursery (``except*``
below), so one client never disturbs another.
"""

from __future__ import annotations

import email.utils
import logging
import math
import os
import time
from functools import partial

import trio

from protocol.http import (
    CONNECTION_CLOSED,
    END_OF_BODY,
    NEED_DATA,
    BadRequest,
    Headers,
    Request,
    RequestParser,
    Router,
    encode_response,
    error_response,
    refusal_bytes,
    run_deferred,
)

from .startup import format_address

__all__ = ["DEFAULT_MAX_BODY_BYTES", "HTTPServer", "format_address", "go_duration", "serve_http"]

DEFAULT_MAX_BODY_BYTES = 5 * 1024 * 1024  # nsqd's --max-body-size default
RECEIVE_SIZE = 65536
FLUSH_BYTES = 65536
_DIRECT_IO = os.name == "posix"  # os.read and os.write work on sockets
LINGER_SECONDS = 1.0
LINGER_MAX_BYTES = 4 * 1024 * 1024
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

_date_cache: list = [0, ""]


def _http_date() -> str:
    now = int(time.time())
    if now != _date_cache[0]:
        _date_cache[0] = now
        _date_cache[1] = email.utils.formatdate(now, usegmt=True)
    return _date_cache[1]


def _fraction(value: int, unit: int) -> str:
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    return f"{whole}." + str(rest).rjust(len(str(unit)) - 1, "0").rstrip("0")


def go_duration(ns: int) -> str:
    """Go's ``time.Duration.String`` (``523.1µs``, ``1.234567ms``, ``1m2.5s``) for access-log lines."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_fraction(ns, 1_000)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{_fraction(ns, 1_000_000)}ms"
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = _fraction(rest, 1_000_000_000) + "s"
    if hours or minutes:
        text = f"{minutes}m" + text
    if hours:
        text = f"{hours}h" + text
    return sign + text


def _limit(value) -> int:
    return value() if callable(value) else value


class HTTPServer:
    """Serves ``router`` on ``address`` (``host:port``, port 0 picks one) or on given ``listeners``.

    ``await nursery.start(server.run)`` returns the bound address (``ip:port`` of the first listener); ``port``
    and ``addresses`` are set by then. ``ssl_context`` wraps the listeners in TLS (``request.tls`` is then true).
    ``max_body_bytes`` (int or callable) is the limit for routes that do not set theirs. ``connections`` and
    ``requests`` count open connections and requests served.
    """

    def __init__(
        self,
        router: Router,
        *,
        logger: logging.Logger,
        address: str | None = None,
        listeners=None,
        ssl_context=None,
        name: str = "HTTP",
        max_header_bytes: int = 64 * 1024,
        max_body_bytes=DEFAULT_MAX_BODY_BYTES,
        idle_timeout: float = 60.0,
        header_timeout: float = 10.0,
        body_timeout: float = 60.0,
    ) -> None:
        if (address is None) == (listeners is None):
            raise ValueError("give either address or listeners")
        self.router = router
        self.logger = logger
        self.name = name
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes
        self.idle_timeout = idle_timeout
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.ssl_context = ssl_context
        self._address = address
        self._listeners = listeners
        self.addresses: list[str] = []
        self.port: int | None = None
        self.connections = 0
        self.requests = 0

    async def _open(self) -> list:
        if self._listeners is not None:
            listeners = list(self._listeners)
        else:
            host, sep, port = self._address.rpartition(":")
            if not sep:
                raise ValueError(f"invalid address {self._address!r}")
            listeners = await trio.open_tcp_listeners(int(port), host=host.strip("[]") or None)
        if self.ssl_context is not None:
            listeners = [trio.SSLListener(listener, self.ssl_context, https_compatible=True) for listener in listeners]
        return listeners

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await self._open()
        for listener in listeners:
            inner = listener.transport_listener if isinstance(listener, trio.SSLListener) else listener
            if isinstance(inner, trio.SocketListener):
                sockname = inner.socket.getsockname()
                self.addresses.append(format_address(sockname))
                if self.port is None and not isinstance(sockname, (str, bytes)):
                    self.port = sockname[1]
                self.logger.info("%s: listening on %s", self.name, self.addresses[-1])
        task_status.started(self.addresses[0] if self.addresses else None)
        await self.serve(listeners)

    async def serve(self, listeners, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve already-open listeners until cancelled (closing them then)."""
        await trio.serve_listeners(self._handle, listeners, task_status=task_status)

    async def _handle(self, stream) -> None:
        self.connections += 1
        try:
            await _Connection(self, stream).run()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            self.logger.debug("%s: connection error: %s", self.name, group.exceptions[0])
        except* Exception as group:
            self.logger.error("%s: internal error", self.name, exc_info=group)
        finally:
            self.connections -= 1
            await trio.aclose_forcefully(stream)


async def serve_http(
    listeners,
    router: Router,
    *,
    logger: logging.Logger,
    max_header_bytes: int = 64 * 1024,
    max_body_bytes=DEFAULT_MAX_BODY_BYTES,
    idle_timeout: float = 60.0,
    header_timeout: float = 10.0,
    body_timeout: float = 60.0,
    name: str = "HTTP",
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``router`` on open listeners (plain or ``trio.SSLListener``) until cancelled, closing them then.
    With ``nursery.start`` it returns the listeners. The options are ``HTTPServer``'s."""
    server = HTTPServer(
        router,
        logger=logger,
        listeners=listeners,
        name=name,
        max_header_bytes=max_header_bytes,
        max_body_bytes=max_body_bytes,
        idle_timeout=idle_timeout,
        header_timeout=header_timeout,
        body_timeout=body_timeout,
    )
    await server.serve(listeners, task_status=task_status)


class _Connection:
    __slots__ = (
        "server",
        "stream",
        "scope",
        "out",
        "out_bytes",
        "remote",
        "tls",
        "parser",
        "socket",
        "fd",
        "pipelining",
    )

    def __init__(self, server: HTTPServer, stream) -> None:
        self.server = server
        self.stream = stream
        self.scope = trio.CancelScope()
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.tls = isinstance(stream, trio.SSLStream)
        transport = stream.transport_stream if self.tls else stream
        try:
            self.remote = format_address(transport.socket.getpeername())
        except (AttributeError, OSError):
            self.remote = "@"
        self.parser = RequestParser(server.max_header_bytes)
        # a plain socket is read and written directly (see the module notes); TLS goes through the stream
        self.socket: trio.socket.SocketType | None
        if type(stream) is trio.SocketStream and _DIRECT_IO:
            self.socket = stream.socket
            self.fd = stream.socket.fileno()
        else:
            self.socket = None
            self.fd = -1
        self.pipelining = False  # the last read held more than one request

    async def _receive(self) -> bytes:
        """The next bytes from the client (``b""`` at its end)."""
        fd = self.fd
        if fd < 0 or self.pipelining:
            return await self.stream.receive_some(RECEIVE_SIZE)
        while True:
            await trio.lowlevel.wait_readable(fd)
            try:
                return os.read(fd, RECEIVE_SIZE)
            except BlockingIOError:  # a spurious wake-up
                pass

    async def run(self) -> None:
        server = self.server
        with self.scope:
            try:
                linger = await self._serve_requests()
            except BadRequest as exc:
                server.logger.debug("%s: bad request from %s: %s", server.name, self.remote, exc.reason)
                self.out.append(refusal_bytes(exc))
                linger = True
            self.scope.deadline = trio.current_time() + server.idle_timeout
            await self._flush()
            if linger:
                await self._linger()
            await self.stream.aclose()
        if self.scope.cancelled_caught:
            server.logger.debug("%s: closing %s after a timeout", server.name, self.remote)

    async def _flush(self, answered: Request | None = None) -> None:
        """Write the queued answers in one go: directly when the socket takes them all, else through the stream.
        ``answered``: a request whose ``after_answer`` work runs once its answer (the last queued) is out, before
        anything else runs (see ``Request.after_answer``): right after the direct write (also when it fails: the
        work belongs to the request, not to the client), before the stream's, which may let other tasks run once
        the answer is in the kernel."""
        if not self.out:
            if answered is not None:
                run_deferred(answered, self.server.logger)
            return
        data = b"".join(self.out) if len(self.out) > 1 else self.out[0]
        self.out.clear()
        self.out_bytes = 0
        sent = 0
        try:
            if self.fd >= 0:
                try:  # noqa: SIM105 - each answer's write: try costs nothing unless raised, suppress() a call
                    sent = os.write(self.fd, data)
                except BlockingIOError:
                    pass
        finally:
            if answered is not None:
                run_deferred(answered, self.server.logger)
        if sent < len(data):
            await self.stream.send_all(memoryview(data)[sent:] if sent else data)

    async def _linger(self) -> None:
        """Stop writing, then discard what the client still sends for a while, so that closing with unread
        input (which makes the kernel send a reset) does not destroy the answer before the client reads it."""
        stream = self.stream
        if not isinstance(stream, trio.abc.HalfCloseableStream):
            return
        self.scope.deadline = trio.current_time() + LINGER_SECONDS
        await stream.send_eof()
        discarded = 0
        while discarded < LINGER_MAX_BYTES:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                break
            discarded += len(data)

    def _respond_now(self, response, head, match) -> None:
        """Queue an answer given without reading the request body; the connection closes after it."""
        self.out.append(encode_response(response, date=_http_date(), head_only=head.method == "HEAD", close=True))
        self.server.requests += 1
        self._log(match.access_log, response.status, head, 0)

    def _log(self, enabled: bool, status: int, head, elapsed_ns: int) -> None:
        logger = self.server.logger
        if enabled and logger.isEnabledFor(logging.INFO):
            logger.info("%d %s %s (%s) %s", status, head.method, head.target, self.remote, go_duration(elapsed_ns))

    async def _serve_requests(self) -> bool:
        """Answer requests until the connection should close; True when the client may still be sending."""
        server = self.server
        router = server.router
        logger = server.logger
        parser = self.parser
        scope = self.scope
        out = self.out
        head_started = None
        served = 0  # requests since the last read
        while True:
            head = parser.next_event()
            if head is NEED_DATA:
                self.pipelining = served > 1
                served = 0
                now = trio.current_time()
                if parser.has_partial_request:
                    if head_started is None:
                        head_started = now
                    scope.deadline = head_started + server.header_timeout
                else:
                    scope.deadline = now + server.idle_timeout
                if out:
                    await self._flush()
                parser.receive_data(await self._receive())
                continue
            if head is CONNECTION_CLOSED:
                return False
            head_started = None
            served += 1

            match = router.match(head.method, head.path, head.raw_query)
            route = match.route
            limit = 0
            if head.has_body:
                if route is not None and route.max_body_bytes is not None:
                    limit = _limit(route.max_body_bytes)
                else:
                    limit = _limit(server.max_body_bytes)
                too_big = head.content_length is not None and head.content_length > limit
                if match.response is not None and (too_big or head.expect_continue):
                    self._respond_now(match.response, head, match)
                    return True
                if too_big:
                    self._respond_now(route.body_too_big or error_response(413, "BODY_TOO_BIG"), head, match)
                    return True
                if head.expect_continue:
                    out.append(CONTINUE)

            # the body (END_OF_BODY comes at once when there is none)
            parts = []
            size = 0
            body_deadline = None
            while True:
                item = parser.next_event()
                if item is END_OF_BODY:
                    break
                if item is NEED_DATA:
                    if body_deadline is None:
                        body_deadline = trio.current_time() + server.body_timeout
                    scope.deadline = body_deadline
                    if out:
                        await self._flush()
                    parser.receive_data(await self._receive())
                    continue
                size += len(item)  # type: ignore[arg-type]  # a piece of the body: the sentinels are taken above
                if size > limit:
                    response = match.response
                    if response is None:
                        response = route.body_too_big or error_response(413, "BODY_TOO_BIG")
                    self._respond_now(response, head, match)
                    return True
                parts.append(item)
            body = (bytes(parts[0]) if len(parts) == 1 else b"".join(parts)) if parts else b""  # type: ignore[arg-type]

            request = Request(
                head.method,
                head.path,
                head.raw_query,
                Headers(head.headers),
                body,
                self.remote,
                self.tls,
                target=head.target,
                http_version=head.http_version,
            )
            if scope.deadline != math.inf:
                scope.deadline = math.inf
            log_it = match.access_log and logger.isEnabledFor(logging.INFO)
            started = time.perf_counter_ns() if log_it else 0
            response = await router.call(match, request)
            keep_alive = head.keep_alive
            try:
                data = encode_response(
                    response,
                    date=_http_date(),
                    head_only=head.method == "HEAD",
                    close=not keep_alive,
                    keep_alive_header=keep_alive and head.http_version == "1.0",
                )
            except ValueError as exc:
                server.logger.error("%s: bad response to %s %s: %s", server.name, head.method, head.target, exc)
                response = error_response(500, "INTERNAL_ERROR")
                data = encode_response(response, date=_http_date(), close=not keep_alive)
            out.append(data)
            self.out_bytes += len(data)
            server.requests += 1
            if request.deferred is not None:  # answered now, then its deferred work (and its line after that)
                if log_it:
                    elapsed_ns = time.perf_counter_ns() - started
                    request.after_answer(partial(self._log, True, response.status, head, elapsed_ns))
                scope.deadline = trio.current_time() + server.idle_timeout
                await self._flush(request)
                if not keep_alive:
                    return False
                continue
            if log_it:
                self._log(True, response.status, head, time.perf_counter_ns() - started)
            if not keep_alive:
                return False
            if self.out_bytes >= FLUSH_BYTES:
                scope.deadline = trio.current_time() + server.idle_timeout
                await self._flush()
