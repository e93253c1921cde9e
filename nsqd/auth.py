"""AUTH: asking the ``--auth-http-address`` servers about a client's secret, and checking permissions.

The query (v1.3.0): ``GET http://<address>/auth?common_name=..&remote_ip=..&secret=..&tls=true|false``
with the keys in that (alphabetical) order and ``Accept: application/vnd.nsq; version=1.0``; an
address that contains ``://`` is the whole URL before the query. With several addresses, nsqd
starts at a random one and tries each in turn until one answers well. A 403 from a plain-HTTP URL
whose JSON body names ``https_port`` is retried once over HTTPS on that port (an auth server that
itself requires TLS). Any other failure (connect or request timeout, a status other than 200, a
body that is not the JSON below) fails the AUTH; the cause is logged and never sent to the client.

The answer (200, JSON; keys matched case-insensitively as Go does)::

    {"ttl": 3600, "identity": "..", "identity_url": "..",
     "authorizations": [{"topic": "<regex>", "channels": ["<regex>", ..], "permissions": ["subscribe", "publish"]}]}

It is refused when ``ttl`` is not above 0, a permission is neither ``subscribe`` nor ``publish``, or
a pattern does not compile. The connection keeps the answer until ``ttl`` seconds have passed;
the next SUB/PUB/MPUB/DPUB after that asks again with the same secret.

Permissions: SUB needs an authorization with ``subscribe`` whose topic pattern matches the topic
and one of whose channel patterns matches the channel; PUB/MPUB/DPUB need ``publish`` and match
the channel patterns against "" (so a publish-only entry with no channel pattern allows nothing).
Patterns are Go RE2 searched anywhere in the name (``orders`` matches ``xordersy``). They are
compiled with Python's ``re`` in ASCII mode after translating what RE2 spells differently
(``\\z``, ``\\Q..\\E``, ``[[:alpha:]]``-style classes); what RE2 cannot express (look-around,
back-references, atomic groups) is refused as it would be by nsqd.

The HTTP client is ``runtime.http_client``: one connection per query, the connect phase bounded by
``--http-client-connect-timeout`` and the whole exchange by ``--http-client-request-timeout``.
"""

from __future__ import annotations

import json
import logging
import random
import re
import ssl
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit, urlunsplit

import trio

from protocol.identify import _go_json_string  # Go's JSON string escaping, shared with IDENTIFY
from runtime.http_client import HTTPClientError, fetch

__all__ = [
    "AuthError",
    "AuthState",
    "Authenticator",
    "Authorization",
    "auth_url",
    "compile_go_regex",
    "http_get",
    "parse_auth_response",
]

log = logging.getLogger("nsqd")

ACCEPT_V1 = "application/vnd.nsq; version=1.0"
USER_AGENT = "Go-http-client/1.1"  # what nsqd's Go HTTP client sends; auth servers may log it
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
_INT64 = (-(1 << 63), (1 << 63) - 1)


class AuthError(Exception):
    """An auth query failed; the text is for the log only."""


# -- permissions -------------------------------------------------------------------------------------

_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7f",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}
_POSIX_CLASS = re.compile(r"\[:(\^?)([a-z]+):\]")
_UNSUPPORTED_GROUPS = ("(?=", "(?!", "(?<=", "(?<!", "(?>", "(?P=", "(?#")


def compile_go_regex(pattern: str) -> re.Pattern:
    """Compile an RE2 pattern as Go's ``regexp.Compile`` would accept it; ``re.error`` if not."""
    out: list[str] = []
    i = 0
    n = len(pattern)
    in_class = False
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            if i + 1 >= n:
                raise re.error("trailing backslash at end of expression")
            nxt = pattern[i + 1]
            if nxt == "Q" and not in_class:
                end = pattern.find("\\E", i + 2)
                literal = pattern[i + 2 :] if end < 0 else pattern[i + 2 : end]
                out.append(re.escape(literal))
                i = n if end < 0 else end + 2
                continue
            if nxt == "z" and not in_class:
                out.append("\\Z")
            elif nxt.isdigit() and nxt != "0" and not in_class:
                raise re.error(f"invalid escape sequence: \\{nxt}")
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if ch == "[" and pattern.startswith("[:", i):
                match = _POSIX_CLASS.match(pattern, i)
                if match is None or match.group(2) not in _POSIX_CLASSES:
                    raise re.error(f"invalid character class range: {pattern[i : i + 12]}")
                if match.group(1):
                    raise re.error("negated POSIX classes inside a class are not supported")
                out.append(_POSIX_CLASSES[match.group(2)])
                i = match.end()
                continue
            if ch == "]" and not _class_just_opened(out):
                in_class = False
            elif ch == "[":
                out.append("\\[")
                i += 1
                continue
            out.append(ch)
            i += 1
            continue
        if ch == "[":
            in_class = True
            out.append(ch)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":  # a leading ] is a literal
                out.append("\\]")
                i += 1
            out.append("")  # marks the class start for _class_just_opened
            continue
        if ch == "(" and pattern.startswith(_UNSUPPORTED_GROUPS, i):
            raise re.error(f"invalid or unsupported Perl syntax: {pattern[i : i + 3]}")
        out.append(ch)
        i += 1
    if in_class:
        raise re.error("missing closing ]")
    return re.compile("".join(out), re.ASCII)


def _class_just_opened(out: list[str]) -> bool:
    return bool(out) and out[-1] == ""


@dataclass(frozen=True)
class Authorization:
    topic: re.Pattern
    channels: tuple[re.Pattern, ...]
    permissions: frozenset[str]

    def allows(self, topic: str, channel: str) -> bool:
        needed = "subscribe" if channel else "publish"
        if needed not in self.permissions:
            return False
        if self.topic.search(topic) is None:
            return False
        return any(pattern.search(channel) is not None for pattern in self.channels)


@dataclass(frozen=True)
class AuthState:
    """One auth server answer; ``expires`` is on trio's clock."""

    identity: str
    identity_url: str
    ttl: int
    authorizations: tuple[Authorization, ...]
    expires: float = 0.0

    def expired(self, now: float) -> bool:
        return now >= self.expires

    def allows(self, topic: str, channel: str) -> bool:
        return any(a.allows(topic, channel) for a in self.authorizations)

    def response(self) -> bytes:
        """The body of the AUTH response frame."""
        return (
            f'{{"identity":{_go_json_string(self.identity)},'
            f'"identity_url":{_go_json_string(self.identity_url)},'
            f'"permission_count":{len(self.authorizations)}}}'
        ).encode()


def _fields(obj, names: dict[str, str], what: str) -> dict:
    """Go's case-insensitive struct decoding for the few fields we know; later duplicates win."""
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise AuthError(f"{what} is not a JSON object")
    found = {}
    for key, value in obj.items():
        field = names.get(key.lower())
        if field is not None and value is not None:
            found[field] = value
    return found


def _string(value, what: str) -> str:
    if not isinstance(value, str):
        raise AuthError(f"{what} is not a string")
    return value


def _strings(value, what: str) -> list[str]:
    if not isinstance(value, list):
        raise AuthError(f"{what} is not an array")
    return ["" if item is None else _string(item, what) for item in value]


def parse_auth_response(body: bytes, now: float) -> AuthState:
    """Decode and validate an auth server's 200 body; ``AuthError`` says why it is refused."""
    try:
        doc = json.loads(body.decode("utf-8", "replace"), parse_constant=_reject_constant)
    except ValueError as exc:
        raise AuthError(f"invalid JSON: {exc}") from None
    top = _fields(
        doc,
        {"ttl": "ttl", "identity": "identity", "identity_url": "identity_url", "authorizations": "authorizations"},
        "response",
    )
    ttl = top.get("ttl", 0)
    if type(ttl) is not int or not _INT64[0] <= ttl <= _INT64[1]:
        raise AuthError(f"ttl {ttl!r} is not an integer")
    identity = _string(top.get("identity", ""), "identity")
    identity_url = _string(top.get("identity_url", ""), "identity_url")
    raw_authorizations = top.get("authorizations", [])
    if not isinstance(raw_authorizations, list):
        raise AuthError("authorizations is not an array")
    authorizations = []
    for raw in raw_authorizations:
        entry = _fields(raw, {"topic": "topic", "channels": "channels", "permissions": "permissions"}, "authorization")
        topic = _string(entry.get("topic", ""), "topic")
        channels = _strings(entry.get("channels", []), "channels")
        permissions = _strings(entry.get("permissions", []), "permissions")
        for permission in permissions:
            if permission not in ("subscribe", "publish"):
                raise AuthError(f"unknown permission {permission}")
        try:
            topic_re = compile_go_regex(topic)
        except re.error as exc:
            raise AuthError(f"unable to compile topic {topic!r} {exc}") from None
        channel_res = []
        for channel in channels:
            try:
                channel_res.append(compile_go_regex(channel))
            except re.error as exc:
                raise AuthError(f"unable to compile channel {channel!r} {exc}") from None
        authorizations.append(Authorization(topic_re, tuple(channel_res), frozenset(permissions)))
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(identity, identity_url, ttl, tuple(authorizations), expires=now + ttl)


def _reject_constant(name: str):
    raise ValueError(f"not JSON: {name}")


# -- the query ---------------------------------------------------------------------------------------


def auth_url(address: str, *, remote_ip: str, tls: bool, common_name: str, secret: bytes) -> str:
    """The URL nsqd queries for one configured ``--auth-http-address``."""
    query = urlencode(
        [
            ("common_name", common_name),
            ("remote_ip", remote_ip),
            ("secret", secret),
            ("tls", "true" if tls else "false"),
        ]
    )
    base = address if "://" in address else f"http://{address}/auth"
    return f"{base}?{query}"


async def http_get(
    url: str,
    *,
    headers: list[tuple[str, str]],
    ssl_context: ssl.SSLContext | None,
    connect_timeout: float,
    request_timeout: float,
) -> tuple[int, bytes]:
    """GET ``url`` as nsqd's Go client does; returns (status, body). ``AuthError`` for anything that is not a
    whole response (``runtime.http_client``)."""
    try:
        reply = await fetch(
            "GET",
            url,
            headers=[("User-Agent", USER_AGENT), *headers],
            ssl_context=ssl_context,
            connect_timeout=connect_timeout,
            request_timeout=request_timeout,
            max_bytes=MAX_RESPONSE_BYTES,
        )
    except HTTPClientError as exc:
        raise AuthError(str(exc)) from None
    return reply.status, reply.body


def _https_retry_url(url: str, body: bytes) -> str:
    """The HTTPS URL a 403 ``{"https_port": N}`` answer points to (nsqd's one retry)."""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError as exc:
        raise AuthError(f"got response 403 and no https_port: {exc}") from None
    fields = _fields(doc, {"https_port": "https_port"}, "403 response")
    port = fields.get("https_port", 0)
    if type(port) is not int:
        raise AuthError("https_port is not an integer")
    parts = urlsplit(url)
    if parts.port is None:
        raise AuthError(f"address {parts.netloc} has no port to replace")
    host = parts.hostname or ""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(("https", netloc, parts.path, parts.query, parts.fragment))


class Authenticator:
    """Queries the configured auth servers for a connection (one instance per nsqd)."""

    def __init__(
        self,
        addresses: list[str],
        *,
        connect_timeout: float,
        request_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.addresses = list(addresses)
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._ssl_context = ssl_context  # for https:// auth servers; the system roots when None

    @classmethod
    def from_options(cls, opts) -> Authenticator:
        """Built at startup, so an unreadable ``--tls-root-ca-file`` stops nsqd (``TLSConfigError``)."""
        from .tls import client_ssl_context

        context = client_ssl_context(opts) if opts.auth_http_addresses else None
        return cls(
            opts.auth_http_addresses,
            connect_timeout=opts.http_client_connect_timeout,
            request_timeout=opts.http_client_request_timeout,
            ssl_context=context,
        )

    @property
    def enabled(self) -> bool:
        return bool(self.addresses)

    async def query(self, *, remote_ip: str, tls: bool, common_name: str, secret: bytes) -> AuthState:
        """Ask the servers (from a random one on) until one gives a valid answer; ``AuthError`` otherwise."""
        count = len(self.addresses)
        if not count:
            raise AuthError("no auth server configured")
        start = random.randrange(count)
        error: AuthError | None = None
        for i in range(count):
            address = self.addresses[(start + i) % count]
            url = auth_url(address, remote_ip=remote_ip, tls=tls, common_name=common_name, secret=secret)
            try:
                return await self._query_one(url)
            except AuthError as exc:
                log.warning("failed auth against %s %s", address, exc)
                error = exc
        assert error is not None
        raise error

    async def _query_one(self, url: str) -> AuthState:
        headers = [("Accept", ACCEPT_V1)]
        status, body = await http_get(
            url,
            headers=headers,
            ssl_context=self._context_for(url),
            connect_timeout=self.connect_timeout,
            request_timeout=self.request_timeout,
        )
        if status == 403 and not url.startswith("https"):
            url = _https_retry_url(url, body)
            status, body = await http_get(
                url,
                headers=headers,
                ssl_context=self._context_for(url),
                connect_timeout=self.connect_timeout,
                request_timeout=self.request_timeout,
            )
        if status != 200:
            raise AuthError(f"got response {status} {body[:200]!r}")
        return parse_auth_response(body, trio.current_time())

    def _context_for(self, url: str) -> ssl.SSLContext | None:
        if not url.startswith("https"):
            return None
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return self._ssl_context
