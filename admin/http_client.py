"""The admin's HTTP client for nsqd and nsqlookupd: one short HTTP/1.1 exchange per call, on trio and h11.

Every call opens a connection, sends one request with ``Connection: close`` and reads the whole answer. The
upstreams are few and the calls seconds apart, so a pool would buy little and cost a reconnect policy.
Timeouts are nsqadmin's: ``connect_timeout`` bounds the TCP (and TLS) set-up, ``request_timeout`` the whole
exchange including the connect. ``https://`` URLs use ``ssl_context`` (the ``--http-client-tls-*`` options).

Requests carry NSQ's V1 ``Accept`` header and the admin's ``User-Agent``. Any failure (refused, timed out, a
status other than 200, a body that is not JSON where JSON was asked for) is an ``UpstreamError`` whose text
names the URL, so the API can report which upstream failed.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import trio

from protocol.version import NSQ_VERSION

__all__ = ["HTTPClient", "Reply", "UpstreamError", "client_ssl_context"]

USER_AGENT = f"nsqadmin/v{NSQ_VERSION}"
ACCEPT_V1 = "application/vnd.nsq; version=1.0"
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class UpstreamError(Exception):
    """A request to nsqd or nsqlookupd that did not succeed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def client_ssl_context(opts) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=opts.http_client_tls_root_ca_file or None)
    if opts.http_client_tls_insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if opts.http_client_tls_cert:
        context.load_cert_chain(opts.http_client_tls_cert, opts.http_client_tls_key)
    return context


class HTTPClient:
    def __init__(self, *, connect_timeout: float = 2.0, request_timeout: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None, user_agent: str = USER_AGENT) -> None:
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.ssl_context = ssl_context
        self.user_agent = user_agent

    async def request(self, method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None,
                      accept: str = ACCEPT_V1) -> Reply:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UpstreamError(f"{method} {url}: unsupported URL")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        head = [("Host", parts.netloc), ("User-Agent", self.user_agent), ("Accept", accept),
                ("Connection", "close"), ("Content-Length", str(len(body)))]
        head += list((headers or {}).items())
        try:
            with trio.fail_after(self.request_timeout):
                return await self._exchange(parts.hostname, port, tls, method, target, head, body)
        except trio.TooSlowError:
            raise UpstreamError(f"{method} {url}: timed out") from None
        except (OSError, trio.BrokenResourceError, h11.ProtocolError, ssl.SSLError) as exc:
            raise UpstreamError(f"{method} {url}: {exc}") from None

    async def _exchange(self, host: str, port: int, tls: bool, method: str, target: str, head, body: bytes
                        ) -> Reply:
        with trio.fail_after(self.connect_timeout):
            stream = await trio.open_tcp_stream(host, port)
            if tls:
                context = self.ssl_context or ssl.create_default_context()
                stream = trio.SSLStream(stream, context, server_hostname=host, https_compatible=True)
                await stream.do_handshake()
        async with stream:
            conn = h11.Connection(h11.CLIENT)
            data = conn.send(h11.Request(method=method, target=target, headers=head))
            if body:
                data += conn.send(h11.Data(data=body))
            data += conn.send(h11.EndOfMessage())
            await stream.send_all(data)
            status = 0
            headers: dict[str, str] = {}
            chunks: list[bytes] = []
            size = 0
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    size += len(event.data)
                    if size > MAX_RESPONSE_BYTES:
                        raise OSError("response too large")
                    chunks.append(bytes(event.data))
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
            return Reply(status, headers, b"".join(chunks))

    async def get_json(self, url: str):
        """GET ``url`` and decode its JSON body; ``UpstreamError`` unless the answer is a 200 with JSON."""
        reply = await self.request("GET", url)
        _check_status("GET", url, reply)
        try:
            return json.loads(reply.body)
        except ValueError:
            raise UpstreamError(f"GET {url}: response is not JSON", reply.status) from None

    async def post(self, url: str, body: bytes = b"") -> Reply:
        """POST ``url``; ``UpstreamError`` unless the answer is a 200."""
        reply = await self.request("POST", url, body)
        _check_status("POST", url, reply)
        return reply


def _check_status(method: str, url: str, reply: Reply) -> None:
    if reply.status != 200:
        text = reply.body[:200].decode("utf-8", "replace")
        raise UpstreamError(f"{method} {url}: got response {reply.status} {text!r}", reply.status)
