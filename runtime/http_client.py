"""The one HTTP/1.1 client of the daemons, on trio and h11: nsqd's queries to auth servers and to lookupds'
``/channels``, nsqadmin's calls to nsqd, nsqlookupd, Graphite and its notification endpoint.

Every call opens a connection, sends one request with ``Connection: close`` and reads the whole answer (at most
``max_bytes`` of body). ``connect_timeout`` bounds the TCP (and TLS) set-up, ``request_timeout`` the whole
exchange including the connect; ``https://`` URLs use ``ssl_context`` (the system's roots when None). The
upstreams are few and the calls seconds apart, so a pool would buy little and cost a reconnect policy.

Any failure (a URL that cannot be used, refused, timed out, TLS, an answer that is malformed, cut short or too
long) is one ``HTTPClientError`` whose text reads ``<METHOD> <url>: <reason>``; a caller wraps it in its own
error (nsqd's ``AuthError``, the admin's ``UpstreamError``). The status is the caller's to judge.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import trio

__all__ = ["HTTPClientError", "Reply", "fetch"]


class HTTPClientError(Exception):
    """A request that got no complete answer; the text names the method, the URL and the reason."""


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


async def fetch(
    method: str,
    url: str,
    *,
    body: bytes = b"",
    headers: list[tuple[str, str]] | tuple[tuple[str, str], ...] = (),
    ssl_context: ssl.SSLContext | None = None,
    connect_timeout: float,
    request_timeout: float,
    max_bytes: int,
) -> Reply:
    """Send one request to ``url`` and return the whole answer; ``HTTPClientError`` for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise HTTPClientError(f"{method} {url}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HTTPClientError(f"{method} {url}: unsupported URL")
    tls = parts.scheme == "https"
    port = port or (443 if tls else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    head = [("Host", parts.netloc.rpartition("@")[2]), *headers, ("Connection", "close")]
    if body or method not in ("GET", "HEAD"):
        head.append(("Content-Length", str(len(body))))
    try:
        with trio.fail_after(request_timeout):
            with trio.move_on_after(connect_timeout) as connecting:
                stream = await _connect(parts.hostname, port, ssl_context if tls else None, tls)
            if connecting.cancelled_caught:
                raise HTTPClientError(f"{method} {url}: dial tcp {parts.hostname}:{port}: i/o timeout")
            async with stream:
                return await _exchange(stream, h11.Request(method=method, target=target, headers=head), body, max_bytes)
    except trio.TooSlowError:
        raise HTTPClientError(f"{method} {url}: request timeout after {request_timeout}s") from None
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, ValueError) as exc:
        raise HTTPClientError(f"{method} {url}: {exc or type(exc).__name__}") from None


async def _connect(host: str, port: int, ssl_context: ssl.SSLContext | None, tls: bool) -> trio.abc.Stream:
    try:
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    except OSError as exc:
        # trio names the attempts; Go's words name the first one's reason (``connect: connection refused``)
        causes = getattr(exc.__cause__, "exceptions", None) or [exc]
        errno = getattr(causes[0], "errno", None)
        reason = os.strerror(errno) if errno else str(causes[0])
        raise OSError(f"dial tcp {host}:{port}: connect: {reason[:1].lower()}{reason[1:]}") from None
    if tls:
        stream = trio.SSLStream(
            stream, ssl_context or ssl.create_default_context(), server_hostname=host, https_compatible=True
        )
        try:
            await stream.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
    return stream


async def _exchange(stream: trio.abc.Stream, request: h11.Request, body: bytes, max_bytes: int) -> Reply:
    conn = h11.Connection(h11.CLIENT)
    data = conn.send(request)
    if body:
        data += conn.send(h11.Data(data=body))
    await stream.send_all(data + conn.send(h11.EndOfMessage()))
    status = 0
    headers: dict[str, str] = {}
    chunks: list[bytes] = []
    size = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            received = await stream.receive_some(65536)
            if not received and not status:
                raise ValueError("EOF")  # closed before answering, in Go's word
            conn.receive_data(bytes(received))  # h11 takes bytes (no copy of a bytes object)
        elif isinstance(event, h11.Response):
            status = event.status_code
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in event.headers}
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > max_bytes:
                raise ValueError(f"response body over {max_bytes} bytes")
            chunks.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage):
            return Reply(status, headers, b"".join(chunks))
        elif isinstance(event, h11.ConnectionClosed):
            raise ValueError("connection closed before the response ended")
        # an informational (1xx) answer: keep reading
