"""The admin's HTTP client for nsqd and nsqlookupd: one short exchange per call (``runtime.http_client``).

Timeouts are nsqadmin's: ``connect_timeout`` bounds the TCP (and TLS) set-up, ``request_timeout`` the whole
exchange including the connect. ``https://`` URLs use ``ssl_context`` (the ``--http-client-tls-*`` options).

Requests carry NSQ's V1 ``Accept`` header and the admin's ``User-Agent``. Any failure (refused, timed out, a
status other than 200, a body that is not JSON where JSON was asked for) is an ``UpstreamError`` whose text
names the URL, so the API can report which upstream failed.
"""

from __future__ import annotations

import json
import ssl

from protocol.version import NSQ_VERSION
from runtime.http_client import HTTPClientError, Reply, fetch

__all__ = ["HTTPClient", "Reply", "UpstreamError", "client_ssl_context"]

USER_AGENT = f"nsqadmin/v{NSQ_VERSION}"
ACCEPT_V1 = "application/vnd.nsq; version=1.0"
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class UpstreamError(Exception):
    """A request to nsqd or nsqlookupd that did not succeed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def client_ssl_context(opts) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=opts.http_client_tls_root_ca_file or None)
    if opts.http_client_tls_insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if opts.http_client_tls_cert:
        context.load_cert_chain(opts.http_client_tls_cert, opts.http_client_tls_key)
    return context


class HTTPClient:
    def __init__(
        self,
        *,
        connect_timeout: float = 2.0,
        request_timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        user_agent: str = USER_AGENT,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.ssl_context = ssl_context
        self.user_agent = user_agent

    async def request(
        self, method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None, accept: str = ACCEPT_V1
    ) -> Reply:
        head = [("User-Agent", self.user_agent), ("Accept", accept), *(headers or {}).items()]
        try:
            return await fetch(
                method,
                url,
                body=body,
                headers=head,
                ssl_context=self.ssl_context,
                connect_timeout=self.connect_timeout,
                request_timeout=self.request_timeout,
                max_bytes=MAX_RESPONSE_BYTES,
            )
        except HTTPClientError as exc:
            raise UpstreamError(str(exc)) from None

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
