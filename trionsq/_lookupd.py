"""nsqlookupd discovery: which nsqd serve a topic, which nodes a lookupd knows, which topics exist.

Two halves. The parsers (``lookup_url``, ``parse_lookup``, ``parse_nodes``, ``parse_topics``) are plain functions of
bytes with no I/O and no trio, so the blocking driver (``trionsq.blocking``) shares them. The trio half
(``lookup``, ``lookup_producers``, ``nodes``, ``topics``) sends one GET per call through the daemons' HTTP client
(``runtime.http_client``: one connection, ``Connection: close``, bounded body); discovery runs once a minute, so a
pool would buy nothing.

Both answer shapes are read, as go-nsq and pynsq do:

- NSQ >= 1.0 answers the object itself: ``{"channels": [...], "producers": [peer, ...]}``;
- NSQ 0.x wrapped it unless asked not to: ``{"status_code": 200, "status_txt": "OK", "data": {...}}``, errors as HTTP
  500 with ``status_txt`` holding the code. Requests carry ``Accept: application/vnd.nsq; version=1.0``, which
  makes a 0.3 lookupd answer the bare shape too; the envelope is still unwrapped when it comes.

A peer is reached at ``broadcast_address:tcp_port`` (0.x peers before 0.2.28 named it ``address``). An unknown topic
(404 ``TOPIC_NOT_FOUND``, or its 0.x form) is an empty list, not an error: a consumer may start before the first
publish. Anything else that is not an answer (refused, timed out, not JSON, another status) is ``LookupdError``, whose
text names the URL and the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

__all__ = [
    "ACCEPT_V1",
    "LookupdError",
    "Peer",
    "lookup",
    "lookup_producers",
    "lookup_url",
    "nodes",
    "parse_lookup",
    "parse_nodes",
    "parse_topics",
    "topics",
]

ACCEPT_V1 = ("Accept", "application/vnd.nsq; version=1.0")
# lookupd's answers are small; nsqd bounds what it reads from lookupd by --max-body-size (5 MiB) too
MAX_BODY = 5 * 1024 * 1024
DEFAULT_TIMEOUT = 60.0  # go-nsq's lookupd_poll_timeout


class LookupdError(Exception):
    """A lookupd query that got no usable answer: refused, timed out, not JSON, or another status than 200 (and 404
    for an unknown topic, which is an empty answer). The text names the URL and the reason."""


@dataclass(frozen=True, slots=True)
class Peer:
    """One nsqd as a lookupd lists it (``/lookup``'s producers, ``/nodes``' nodes).

    Attributes:
        broadcast_address: The address the nsqd registered (``--broadcast-address``).
        tcp_port: Its TCP port.
        http_port: Its HTTP port.
        hostname: Its host's name.
        remote_address: The address lookupd sees its registration connection come from.
        version: Its version.
        topics: Its topics (``/nodes`` only).
        tombstones: Per topic, whether it is tombstoned on this nsqd (``/nodes`` only, parallel to ``topics``).
    """

    broadcast_address: str
    tcp_port: int
    http_port: int = 0
    hostname: str = ""
    remote_address: str = ""
    version: str = ""
    topics: tuple[str, ...] = ()  # /nodes only
    tombstones: tuple[bool, ...] = field(default=())  # /nodes only, parallel to topics

    @property
    def tcp_address(self) -> str:
        """``host:port`` for the TCP protocol (brackets around an IPv6 address, as Go's JoinHostPort)."""
        return _join(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        """``host:port`` for the HTTP API."""
        return _join(self.broadcast_address, self.http_port)


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- sans-IO: URLs and answers -------------------------------------------------------------------------------------


def lookup_url(lookupd_http_address: str, path: str, **query: str) -> str:
    """The URL of ``path`` on a lookupd given as ``host:port`` or as an ``http(s)://`` URL.

    A URL with a path of its own keeps it for ``/lookup`` (go-nsq lets a proxy path stand for the endpoint) and as a
    prefix of the other endpoints; the query parameters are added to whatever query it has.
    """
    text = lookupd_http_address.strip()
    if not text:
        raise LookupdError("empty nsqlookupd HTTP address")
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise LookupdError(f"bad nsqlookupd HTTP address {lookupd_http_address!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise LookupdError(f"bad nsqlookupd HTTP address {lookupd_http_address!r}")
    own_path = parts.path.rstrip("/")
    # a prefix before the endpoint stays; an endpoint given for /lookup does not
    full_path = (own_path or path) if path == "/lookup" else own_path.removesuffix("/lookup") + path
    params = [p for p in parts.query.split("&") if p]
    params += [f"{name}={quote(value, safe='')}" for name, value in query.items()]
    return urlunsplit((parts.scheme, parts.netloc, full_path, "&".join(params), ""))


def _unwrap(url: str, status: int, body: bytes) -> Any | None:
    """The answer's JSON object, ``None`` for an unknown topic; ``LookupdError`` for anything else."""
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "status_code" in doc and "data" in doc:  # NSQ 0.x's envelope
        status = doc.get("status_code") or status
        doc = doc["data"] if status == 200 else {"message": doc.get("status_txt", "")}
    if status == 404 or (isinstance(doc, dict) and doc.get("message") == "TOPIC_NOT_FOUND"):
        return None
    if status != 200:
        reason = (
            doc.get("message")
            if isinstance(doc, dict) and doc.get("message")
            else body[:200].decode("utf-8", "replace")
        )
        raise LookupdError(f"GET {url}: HTTP {status} {reason}".rstrip())
    if not isinstance(doc, dict):
        raise LookupdError(f"GET {url}: not a JSON object: {body[:200]!r}")
    return doc


def _peer(url: str, item: Any) -> Peer:
    if not isinstance(item, dict):
        raise LookupdError(f"GET {url}: a producer is not an object: {item!r}")
    address = item.get("broadcast_address") or item.get("address")
    tcp_port = item.get("tcp_port")
    if not isinstance(address, str) or not address or not isinstance(tcp_port, int) or isinstance(tcp_port, bool):
        raise LookupdError(f"GET {url}: a producer lacks broadcast_address or tcp_port: {item!r}")
    topics = item.get("topics") or ()
    tombstones = item.get("tombstones") or ()
    return Peer(
        broadcast_address=address,
        tcp_port=tcp_port,
        http_port=_int(item.get("http_port")),
        hostname=str(item.get("hostname") or ""),
        remote_address=str(item.get("remote_address") or ""),
        version=str(item.get("version") or ""),
        topics=tuple(str(t) for t in topics),
        tombstones=tuple(bool(t) for t in tombstones),
    )


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _producers(url: str, doc: dict[str, Any]) -> list[Peer]:
    items = doc.get("producers") or []
    if not isinstance(items, list):
        raise LookupdError(f"GET {url}: producers is not a list")
    return [_peer(url, item) for item in items]


def parse_lookup(url: str, status: int, body: bytes) -> list[Peer]:
    """``/lookup?topic=``'s producers (``[]`` for an unknown topic)."""
    doc = _unwrap(url, status, body)
    return [] if doc is None else _producers(url, doc)


def parse_nodes(url: str, status: int, body: bytes) -> list[Peer]:
    """``/nodes``' producers, with their topics and tombstones."""
    doc = _unwrap(url, status, body)
    return [] if doc is None else _producers(url, doc)


def parse_topics(url: str, status: int, body: bytes) -> list[str]:
    """``/topics``' names."""
    doc = _unwrap(url, status, body)
    names = [] if doc is None else doc.get("topics") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise LookupdError(f"GET {url}: topics is not a list of names")
    return names


# --- trio: one GET per call ----------------------------------------------------------------------------------------


async def _get(url: str, timeout: float, authorization: str | None = None) -> tuple[int, bytes]:
    # imported here so that the parsers above stay importable without trio (the blocking driver uses them)
    from runtime.http_client import HTTPClientError, fetch

    headers = [ACCEPT_V1]
    if authorization:  # go-nsq sends the consumer's auth_secret as a bearer token
        headers.append(("Authorization", f"Bearer {authorization}"))
    try:
        reply = await fetch(
            "GET", url, headers=headers, connect_timeout=timeout, request_timeout=timeout, max_bytes=MAX_BODY
        )
    except HTTPClientError as exc:
        raise LookupdError(str(exc)) from None
    return reply.status, reply.body


async def lookup_producers(
    lookupd_http_address: str, topic: str, *, timeout: float = DEFAULT_TIMEOUT, authorization: str | None = None
) -> list[Peer]:
    """The nsqd that a lookupd lists for ``topic`` (``[]`` when it knows no such topic); ``authorization``, a
    secret sent as ``Authorization: Bearer <secret>``."""
    url = lookup_url(lookupd_http_address, "/lookup", topic=topic)
    return parse_lookup(url, *await _get(url, timeout, authorization))


async def lookup(
    lookupd_http_address: str, topic: str, *, timeout: float = DEFAULT_TIMEOUT, authorization: str | None = None
) -> list[str]:
    """The ``broadcast_address:tcp_port`` of each nsqd that a lookupd lists for ``topic``, in its order.

    One ``GET /lookup?topic=``; NSQ 0.x's enveloped answers are read too.

    Args:
        lookupd_http_address: The lookupd's HTTP address, ``host:port`` or an ``http(s)://`` URL.
        topic: The topic.
        timeout: The bound on the whole query, in seconds.
        authorization: A secret sent as ``Authorization: Bearer <secret>``.

    Returns:
        The addresses, ``[]`` for a topic the lookupd does not know.

    Raises:
        LookupdError: The lookupd gave no usable answer.
    """
    peers = await lookup_producers(lookupd_http_address, topic, timeout=timeout, authorization=authorization)
    return [peer.tcp_address for peer in peers]


async def nodes(lookupd_http_address: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[Peer]:
    """Every nsqd registered with a lookupd (``/nodes``), with its topics."""
    url = lookup_url(lookupd_http_address, "/nodes")
    return parse_nodes(url, *await _get(url, timeout))


async def topics(lookupd_http_address: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Every topic a lookupd knows (``/topics``)."""
    url = lookup_url(lookupd_http_address, "/topics")
    return parse_topics(url, *await _get(url, timeout))
