"""HTTP/1.1 for the three daemons, without I/O: requests, responses, NSQ's response conventions, the router
and an incremental request parser. The trio driver that owns sockets and clocks is ``runtime.http_server``.

Response conventions are nsqd's ``http_api.RespondV1`` (FACTS 4.1): text and empty bodies for success, compact
JSON for objects, ``{"message":"<CODE>"}`` for errors, and the ``X-Nsq-Content-Type`` header (Go canonicalises
``X-NSQ-Content-Type`` to this spelling on the wire; header names are case-insensitive anyway).

The router reproduces julienschmidt/httprouter as nsqd configures it: exact paths with ``:param`` segments,
405 with an ``Allow`` list (the route's methods plus OPTIONS, sorted), automatic OPTIONS, a redirect when only
the trailing slash differs or when the cleaned, case-insensitive path names a route (301 for GET, 307 otherwise),
and 404 otherwise. One extension: HEAD is answered by a GET route, without the body.

Request parsing uses llhttp (Node's parser, through httptools), several times faster than h11 here; the server
writes its own response bytes. ``RequestParser`` notes how llhttp is driven.
"""

from __future__ import annotations

import collections
import dataclasses
import html
import json
import logging
import re
import types
from collections.abc import Awaitable, Callable, Iterator, Sequence
from decimal import Decimal
from http import HTTPStatus
from typing import Any, overload
from urllib.parse import quote, unquote_to_bytes

import httptools

__all__ = [
    "CONNECTION_CLOSED",
    "END_OF_BODY",
    "NEED_DATA",
    "BadRequest",
    "Headers",
    "HTTPError",
    "Match",
    "Request",
    "RequestHead",
    "RequestParser",
    "Response",
    "Route",
    "Router",
    "empty_response",
    "encode_response",
    "encoded_json_response",
    "error_response",
    "go_json",
    "go_json_text",
    "go_string",
    "json_response",
    "parse_query",
    "refusal_bytes",
    "run_deferred",
    "text_response",
]

TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
JSON_CONTENT_TYPE = "application/json; charset=utf-8"
NSQ_CONTENT_TYPE_HEADER = ("X-Nsq-Content-Type", "nsq; version=1.0")

Handler = Callable[..., Awaitable["Response"]]


# -- responses ----------------------------------------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class Response:
    """A complete response. ``Content-Length``, ``Date`` and ``Connection`` are added by the server."""

    status: int = 200
    headers: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


class HTTPError(Exception):
    """Raised by a handler; the router answers ``status`` with ``{"message":"<message>"}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message


_HTML_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
_HTML_CHARS = re.compile("[<>&\u2028\u2029]")
_encode_string = json.encoder.encode_basestring  # the C encoder of one string, UTF-8 kept (ensure_ascii=False)
# A JSON string (skipped as is) or a number; only numbers with a fraction or an exponent (floats) change.
_JSON_NUMBER = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?')
# A value starting like a float: finding none (the usual case) skips the slower rewrite.
_FLOAT_HINT = re.compile(r"[:,\[]-?\d+[.eE]")


def _go_float(text: str) -> str:
    """Rewrite a float the way Go's encoding/json does: shortest digits, no exponent for 1e-6 <= |f| < 1e21,
    no ``.0`` suffix on whole numbers, a one-digit negative exponent not padded (``1e-7``)."""
    value = float(text)
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        text = repr(value)
        if len(text) >= 4 and text[-4] == "e" and text[-3] == "-" and text[-2] == "0":
            text = text[:-2] + text[-1]
        return text
    text = repr(value)
    if "e" in text:
        text = format(Decimal(text), "f")
    if text.endswith(".0"):
        text = text[:-2]
    return text


def _fix_floats(match: re.Match[str]) -> str:
    token: str = match.group()
    if token[0] == '"' or ("." not in token and "e" not in token and "E" not in token):
        return token
    return _go_float(token)


def go_json(obj: Any) -> bytes:
    """Compact JSON as Go's ``json.Marshal`` writes it: no spaces, UTF-8 kept as is, ``<``, ``>``, ``&``,
    U+2028 and U+2029 escaped, floats in Go's notation, no trailing newline. Key order is the dict's order."""
    return go_json_text(obj).encode("utf-8", "replace")


def go_json_text(obj: Any) -> str:
    """``go_json`` before its encoding to UTF-8 (a part of a larger document built by hand)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if _HTML_CHARS.search(text) is not None:
        text = text.translate(_HTML_ESCAPES)
    if _FLOAT_HINT.search(text) is not None:
        text = _JSON_NUMBER.sub(_fix_floats, text)
    return text


def go_string(value: str) -> str:
    """One JSON string as ``go_json`` writes it, quotes included (for documents built by hand)."""
    text = _encode_string(value)
    if _HTML_CHARS.search(text) is not None:
        text = text.translate(_HTML_ESCAPES)
    return text


def text_response(text: str | bytes, status: int = 200, *, nsq_header: bool = False) -> Response:
    """A text body (``text/plain; charset=utf-8``). nsqd's /ping has no NSQ header; V1 endpoints answering a
    string (``/pub`` → ``OK``) pass ``nsq_header=True``."""
    body = text.encode("utf-8") if isinstance(text, str) else text
    headers = [("Content-Type", TEXT_CONTENT_TYPE)]
    if nsq_header:
        headers.append(NSQ_CONTENT_TYPE_HEADER)
    return Response(status, headers, body)


def json_response(obj: Any, status: int = 200) -> Response:
    return encoded_json_response(go_json(obj), status)


def encoded_json_response(body: bytes, status: int = 200) -> Response:
    """``json_response`` for a document already encoded."""
    return Response(status, [("Content-Type", JSON_CONTENT_TYPE), NSQ_CONTENT_TYPE_HEADER], body)


def empty_response() -> Response:
    """200 with an empty body and no content type, as a V1 handler returning nil."""
    return Response(200, [NSQ_CONTENT_TYPE_HEADER], b"")


def error_response(status: int, code_text: str) -> Response:
    return json_response({"message": code_text}, status)


#: the headers of net/http's own answer to a request it refuses (no Content-Length, no Date: it closes after)
_REFUSAL_HEADERS = b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"


def refusal_bytes(refused: BadRequest) -> bytes:
    """What Go's net/http writes by itself before closing a connection whose request it cannot serve, byte for
    byte: ``400 Bad Request`` as status line and text; the words it shows (``refused.shown``) after both, as in
    ``400 Bad Request: missing required Host header``; ``Unsupported transfer encoding`` as the text of a 501."""
    status = refused.status
    line = f"{status} {_reason(status)}" + (f": {refused.shown}" if refused.shown else "")
    text = "Unsupported transfer encoding" if status == 501 else line
    return b"HTTP/1.1 " + line.encode() + _REFUSAL_HEADERS + text.encode()


_REASONS: dict[int, str] = {status.value: status.phrase for status in HTTPStatus}


def _reason(status: int) -> str:
    return _REASONS.get(status) or f"status code {status}"


_STATUS_LINES: dict[int, bytes] = {}
_NO_BODY_STATUSES = frozenset({204, 304})


def encode_response(
    response: Response, *, date: str, head_only: bool = False, close: bool = False, keep_alive_header: bool = False
) -> bytes:
    """Serialise ``response`` with ``Content-Length`` and ``Date``; ``close`` adds ``Connection: close`` and
    ``keep_alive_header`` the ``Connection: keep-alive`` an HTTP/1.0 client needs to keep its connection.
    Raises ``ValueError`` for a header that would break the head (a line break, or a character beyond latin-1)."""
    status = response.status
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {_reason(status)}\r\n".encode()
    headers = response.headers
    block = "".join([f"{name}: {value}\r\n" for name, value in headers])
    if block.count("\n") != len(headers) or block.count("\r") != len(headers):
        raise ValueError("line break in a response header")
    body = response.body
    if status in _NO_BODY_STATUSES:
        body = b""
        block += f"Date: {date}\r\n"
    else:
        block += f"Content-Length: {len(body)}\r\nDate: {date}\r\n"
    if close:
        block += "Connection: close\r\n"
    elif keep_alive_header:
        block += "Connection: keep-alive\r\n"
    head = line + (block + "\r\n").encode("latin-1")
    if head_only or not body:
        return head
    return head + body


# -- requests -----------------------------------------------------------------------------------------------------
class Headers:
    """Request headers: case-insensitive lookup, values as ``str`` (latin-1), original order kept.
    The index is built on the first lookup; most requests never look at a header."""

    __slots__ = ("_items", "_index")

    def __init__(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        # items: pairs of lower-case name bytes and value bytes, as RequestParser produces them
        self._items = items
        self._index: dict[str, list[str]] | None = None

    def _lookup(self, name: str) -> list[str] | None:
        index = self._index
        if index is None:
            index = self._index = {}
            for key, value in self._items:
                index.setdefault(key.decode("latin-1"), []).append(value.decode("latin-1"))
        return index.get(name.lower())

    @overload
    def get(self, name: str, default: str) -> str: ...
    @overload
    def get(self, name: str, default: None = None) -> str | None: ...
    def get(self, name: str, default: str | None = None) -> str | None:
        """The first value of ``name``."""
        values = self._lookup(name)
        return values[0] if values else default

    def get_all(self, name: str) -> list[str]:
        return list(self._lookup(name) or ())

    def __getitem__(self, name: str) -> str:
        values = self._lookup(name)
        if not values:
            raise KeyError(name)
        return values[0]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._lookup(name) is not None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for name, value in self._items:
            yield name.decode("latin-1"), value.decode("latin-1")

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Headers({list(self)!r})"


_BAD_PERCENT = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def _query_unescape(raw: bytes) -> str:
    """Go's ``url.QueryUnescape`` (``+`` is a space, ``%XX`` strict) plus strict UTF-8."""
    if b"%" in raw:
        if _BAD_PERCENT.search(raw) is not None:
            raise ValueError("invalid URL escape")
        raw = unquote_to_bytes(raw.replace(b"+", b" "))
    elif b"+" in raw:
        raw = raw.replace(b"+", b" ")
    return raw.decode("utf-8")


def parse_query(raw_query: bytes) -> dict[str, list[str]]:
    """Parse a query string as Go's ``url.ParseQuery``: pairs split on ``&``, a ``;`` is an error, empty pairs
    are skipped, repeated keys keep every value in order. Raises ``ValueError`` on a bad escape or bad UTF-8."""
    result: dict[str, list[str]] = {}
    if not raw_query:
        return result
    for pair in raw_query.split(b"&"):
        if not pair:
            continue
        if b";" in pair:
            raise ValueError("invalid semicolon separator in query")
        key, _, value = pair.partition(b"=")
        result.setdefault(_query_unescape(key), []).append(_query_unescape(value))
    return result


class Request:
    """One request as handlers see it. ``query`` is parsed on first use; a bad encoding raises
    ``HTTPError(400, "INVALID_REQUEST")``, which the router answers (so, as in nsqd, only endpoints that read
    parameters reject a bad query string). ``after_answer(fn)``: ``fn()`` runs once the answer is written (see
    ``after_answer``)."""

    __slots__ = (
        "method",
        "target",
        "path",
        "raw_query",
        "headers",
        "body",
        "remote_address",
        "tls",
        "http_version",
        "_query",
        "deferred",
    )

    def __init__(
        self,
        method: str,
        path: str,
        raw_query: bytes = b"",
        headers: Headers | None = None,
        body: bytes = b"",
        remote_address: str = "",
        tls: bool = False,
        *,
        target: str | None = None,
        http_version: str = "1.1",
    ) -> None:
        self.method = method
        self.path = path
        self.raw_query = raw_query
        self.headers = headers if headers is not None else Headers(())
        self.body = body
        self.remote_address = remote_address
        self.tls = tls
        if target is None:
            target = path + ("?" + raw_query.decode("latin-1") if raw_query else "")
        self.target = target  # the request-target as sent (Go's RequestURI), for logs and redirects
        self.http_version = http_version
        self._query: dict[str, list[str]] | None = None
        self.deferred: list[Callable[[], object]] | None = None

    def after_answer(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` once the answer has been handed to the client's socket, before the server does anything
        else: before it reads or answers another request of any connection (so a client that got the answer and
        sends anything anywhere finds ``fn`` done) and before it reads a pipelined request after this one. Work a
        request causes that its answer need not wait for goes here (nsqd does such work in a goroutine after
        answering). ``fn`` must not raise; the ``deferred`` calls run in order (``run_deferred``)."""
        if self.deferred is None:
            self.deferred = [fn]
        else:
            self.deferred.append(fn)

    @property
    def query(self) -> dict[str, list[str]]:
        query = self._query
        if query is None:
            try:
                query = self._query = parse_query(self.raw_query)
            except ValueError:
                raise HTTPError(400, "INVALID_REQUEST") from None
        return query

    def query_value(self, name: str, default: str | None = None) -> str | None:
        """The first value of a query parameter (Go's ``url.Values.Get``), ``default`` when absent."""
        values = self.query.get(name)
        return values[0] if values else default

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.target} from {self.remote_address}>"


# -- router -------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class Route:
    methods: tuple[str, ...]
    path: str
    handler: Handler
    access_log: bool = True
    # int, or a callable returning the current limit; None means the server's default
    max_body_bytes: int | Callable[[], int] | None = None
    # sent, and the connection closed, when the body is over the limit; None means 413 BODY_TOO_BIG
    body_too_big: Response | None = None
    segments: tuple[str, ...] = ()


@dataclasses.dataclass(slots=True)
class Match:
    """The router's decision for one method and path: a route with its parameters, or the router's own answer
    (404, 405, OPTIONS, redirect) in ``response``."""

    route: Route | None
    params: dict[str, str]
    response: Response | None = None
    access_log: bool = True


def _split(path: str) -> tuple[str, ...]:
    return tuple(path.split("/")[1:])


def clean_path(path: str) -> str:
    """httprouter's CleanPath: one leading slash, no ``.``/``..``/empty segments, trailing slash kept."""
    if not path:
        return "/"
    parts: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if parts:
                parts.pop()
        elif segment and segment != ".":
            parts.append(segment)
    cleaned = "/" + "/".join(parts)
    if path.endswith("/") and cleaned != "/":
        cleaned += "/"
    return cleaned


class Router:
    """Maps method and path to handlers: ``async def handler(request, **params) -> Response``."""

    def __init__(self, *, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("protocol.http")
        self._static: dict[str, dict[str, Route]] = {}
        self._dynamic: dict[tuple[str, ...], dict[str, Route]] = {}

    def add(
        self,
        methods: list[str] | tuple[str, ...],
        path: str,
        handler: Handler,
        *,
        access_log: bool = True,
        max_body_bytes: int | Callable[[], int] | None = None,
        body_too_big: Response | None = None,
    ) -> Route:
        if not path.startswith("/"):
            raise ValueError(f"route path must start with '/': {path!r}")
        segments = _split(path)
        names = [segment[1:] for segment in segments if segment.startswith(":")]
        if any(not name.isidentifier() for name in names) or len(set(names)) != len(names):
            raise ValueError(f"bad parameter names in route {path!r}")
        methods = tuple(method.upper() for method in methods)
        route = Route(methods, path, handler, access_log, max_body_bytes, body_too_big, segments)
        table = self._dynamic.setdefault(segments, {}) if names else self._static.setdefault(path, {})
        for method in methods:
            if method in table:
                raise ValueError(f"route {method} {path} registered twice")
            table[method] = route
        return route

    def _lookup(self, method: str, path: str) -> tuple[Route | None, dict[str, str]]:
        table = self._static.get(path)
        if table is not None:
            route = table.get(method)
            if route is not None:
                return route, {}
        if self._dynamic:
            segments = _split(path)
            for pattern, table in self._dynamic.items():
                route = table.get(method)
                if route is not None and len(pattern) == len(segments):
                    params = _bind(pattern, segments)
                    if params is not None:
                        return route, params
        return None, {}

    def _allowed(self, path: str) -> list[str]:
        methods: set[str] = set(self._static.get(path, ()))
        if self._dynamic:
            segments = _split(path)
            for pattern, table in self._dynamic.items():
                if len(pattern) == len(segments) and _bind(pattern, segments) is not None:
                    methods.update(table)
        return sorted(methods)

    def _fixed_path(self, method: str, path: str) -> str | None:
        """httprouter's findCaseInsensitivePath on the cleaned path, with a trailing slash added or removed."""
        candidates = [clean_path(path)]
        alternate = candidates[0][:-1] if candidates[0].endswith("/") else candidates[0] + "/"
        if alternate:
            candidates.append(alternate)
        for candidate in candidates:
            lowered = candidate.lower()
            for static_path, table in self._static.items():
                if method in table and static_path.lower() == lowered:
                    return static_path
            segments = _split(candidate)
            for pattern, table in self._dynamic.items():
                if method in table and len(pattern) == len(segments):
                    fixed = []
                    for want, got in zip(pattern, segments, strict=True):
                        if want.startswith(":"):
                            if not got:
                                break
                            fixed.append(got)
                        elif want.lower() == got.lower():
                            fixed.append(want)
                        else:
                            break
                    else:
                        return "/" + "/".join(fixed)
        return None

    def match(self, method: str, path: str, raw_query: bytes = b"") -> Match:
        route, params = self._lookup(method, path)
        if route is None and method == "HEAD":
            route, params = self._lookup("GET", path)
        if route is not None:
            return Match(route, params, None, route.access_log)
        if path == "*":  # "OPTIONS *" asks about the server itself, as Go's net/http answers it
            return Match(None, {}, Response(200) if method == "OPTIONS" else error_response(404, "NOT_FOUND"))
        if path != "/" and method != "CONNECT":
            code = 301 if method == "GET" else 307
            alternate = path[:-1] if path.endswith("/") else path + "/"
            target = None
            if alternate and self._lookup(method, alternate)[0] is not None:
                target = alternate
            else:
                target = self._fixed_path(method, path)
            if target is not None:
                target = quote(target.encode("utf-8", "surrogateescape"), safe="/!$&'()*+,;=:@-._~")
                if raw_query:
                    target += "?" + raw_query.decode("latin-1")
                return Match(None, {}, _redirect(target, code, method))
        allowed = self._allowed(path)
        if method == "OPTIONS":
            if allowed:
                return Match(None, {}, Response(200, [("Allow", _allow_header(allowed))], b""))
        elif allowed:
            response = error_response(405, "METHOD_NOT_ALLOWED")
            response.headers.insert(0, ("Allow", _allow_header(allowed)))
            return Match(None, {}, response)
        return Match(None, {}, error_response(404, "NOT_FOUND"))

    async def call(self, match: Match, request: Request) -> Response:
        """Run the matched handler; ``HTTPError`` becomes its error response, any other exception a logged 500."""
        if match.response is not None:
            return match.response
        assert match.route is not None  # the router answers itself when it matched no route
        try:
            response = await match.route.handler(request, **match.params)
            if not isinstance(response, Response):
                raise TypeError(f"handler returned {type(response).__name__}, not Response")
            return response
        except HTTPError as exc:
            return error_response(exc.status, exc.message)
        except Exception as exc:
            self.logger.error("panic in HTTP handler - %r (%s %s)", exc, request.method, request.target, exc_info=True)
            return error_response(500, "INTERNAL_ERROR")

    async def handle(self, request: Request) -> Response:
        """Match and call in one step (tests, and callers that already hold the whole request); the request's
        ``after_answer`` work is done before this returns."""
        response = await self.call(self.match(request.method, request.path, request.raw_query), request)
        if request.deferred is not None:
            run_deferred(request, self.logger)
        return response


def run_deferred(request: Request, logger: logging.Logger) -> None:
    """Run and clear what the handler of ``request`` left for after its answer, in order; one that raises is
    logged and the others still run."""
    deferred, request.deferred = request.deferred, None
    for fn in deferred or ():
        try:
            fn()
        except Exception as exc:
            logger.error("panic after answering %s %s - %r", request.method, request.target, exc, exc_info=True)


def _bind(pattern: tuple[str, ...], segments: tuple[str, ...]) -> dict[str, str] | None:
    params = {}
    for want, got in zip(pattern, segments, strict=True):
        if want.startswith(":"):
            if not got:
                return None
            params[want[1:]] = got
        elif want != got:
            return None
    return params


def _allow_header(methods: list[str]) -> str:
    return ", ".join(sorted({*methods, "OPTIONS"}))


def _redirect(location: str, code: int, method: str) -> Response:
    """Go's ``http.Redirect``: HTML body for GET (content type for GET and HEAD)."""
    headers = [("Location", location)]
    body = b""
    if method in ("GET", "HEAD"):
        headers.append(("Content-Type", "text/html; charset=utf-8"))
        if method == "GET":
            body = f'<a href="{html.escape(location)}">{_reason(code)}</a>.\n\n'.encode()
    return Response(code, headers, body)


# -- request parser -----------------------------------------------------------------------------------------------
class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


NEED_DATA = _Sentinel("NEED_DATA")
END_OF_BODY = _Sentinel("END_OF_BODY")
CONNECTION_CLOSED = _Sentinel("CONNECTION_CLOSED")


class BadRequest(Exception):
    """The client sent something that is not HTTP/1.1; answer ``status`` (400, 431, 501 or 505) and close."""

    def __init__(self, status: int, reason: str, *, shown: str = "") -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason  # for the log
        self.shown = shown  # the words Go's answer shows after the status (most refusals show none)


@dataclasses.dataclass(slots=True)
class RequestHead:
    method: str
    target: str
    path: str
    raw_query: bytes
    http_version: str
    headers: list[tuple[bytes, bytes]]  # (lower-case name, value) byte pairs
    content_length: int | None
    chunked: bool
    keep_alive: bool
    expect_continue: bool

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)


def _decode_path(raw: bytes) -> str:
    """Percent-decode a path strictly (a bad escape is a 400 as in Go); bytes that are not UTF-8 survive as
    surrogate escapes, so such a path simply matches no route."""
    if b"%" in raw:
        if _BAD_PERCENT.search(raw) is not None:
            raise BadRequest(400, "invalid URL escape in path")
        raw = unquote_to_bytes(raw)
    return raw.decode("utf-8", "surrogateescape")


_METHODS: dict[bytes, str] = {}  # llhttp's method names, decoded once each


def _make_head(
    method: bytes, url: bytes, version: str, headers: list[tuple[bytes, bytes]], keep_alive: bool
) -> RequestHead:
    """Check what llhttp leaves to its caller (version, target form, Host, transfer coding) and build the head."""
    if version != "1.1" and version != "1.0":
        if version.startswith("1."):
            version = "1.1"  # Go serves every HTTP/1.x, the minor versions above 1 as 1.1
        elif version == "0.9":
            # llhttp reads a request line without a version as HTTP/0.9: malformed, as Go sees it
            raise BadRequest(400, "missing HTTP version")
        else:
            raise BadRequest(505, f"unsupported HTTP version {version}", shown="unsupported protocol version")
    path_bytes, question, raw_query = url.partition(b"?")
    if not path_bytes.startswith(b"/"):
        if path_bytes == b"*" and not question:
            pass
        elif path_bytes.startswith((b"http://", b"https://")):
            # absolute-form: keep the path of the URL
            slash = path_bytes.find(b"/", path_bytes.index(b"//") + 2)
            path_bytes = path_bytes[slash:] if slash >= 0 else b"/"
        else:
            raise BadRequest(400, "invalid request target")
    content_length = None
    chunked = False
    expect_continue = False
    hosts = 0
    for name, value in headers:
        if name == b"host":
            hosts += 1
        elif name == b"content-length":
            content_length = int(value)  # llhttp accepts digits only, and one Content-Length
        elif name == b"transfer-encoding":
            # llhttp insists on chunked last; like Go, accept nothing but chunked alone
            if chunked or value.lower() != b"chunked":
                raise BadRequest(501, "unsupported transfer encoding")
            chunked = True
        elif name == b"expect":
            expect_continue = version == "1.1" and value.lower() == b"100-continue"
    if hosts != 1 and (hosts or version == "1.1"):
        words = "too many Host headers" if hosts else "missing required Host header"
        raise BadRequest(400, words, shown=words)
    method_name = _METHODS.get(method)
    if method_name is None:
        method_name = _METHODS[method] = method.decode("ascii")
    return RequestHead(
        method_name,
        url.decode("ascii"),
        _decode_path(path_bytes),
        raw_query,
        version,
        headers,
        content_length,
        chunked,
        keep_alive,
        expect_continue,
    )


class RequestParser:
    """Incremental parser for the requests of one connection.

    ``receive_data(data)`` (``b""`` at end of input), then ``next_event()`` returns a ``RequestHead``, body bytes,
    ``END_OF_BODY`` (after every request, with or without a body), ``NEED_DATA`` or ``CONNECTION_CLOSED``.
    Raises ``BadRequest`` for anything malformed, including a head over ``max_header_bytes`` (431) and input
    ending inside a request. The caller decides whether to read the body; once it skips one, the parser is done.

    llhttp (through httptools) does the parsing: ``receive_data`` hands it the whole input in one call, and its
    callbacks queue the events that ``next_event`` then hands out, so a pipelined batch costs one call into C
    however many requests it holds, and nothing is buffered here but those events. An error is raised by
    ``next_event`` only after the events before it, so the requests that came first are still answered. Input
    after a request that closes the connection (``Connection: close``, HTTP/1.0 without keep-alive, an upgrade
    or ``CONNECT``, whose heads say they close) is ignored, as llhttp stops there.

    llhttp does not bound a head, so its size is counted here: the request line and each header as the
    callbacks report them, plus the whole of any input that ended inside a request and reported nothing (one
    long header trickling in, which httptools holds until the header ends). The count is checked when the head
    is complete, when the trailers are, and after each ``receive_data``: past ``max_header_bytes`` the request
    is refused with 431, so an unfinished head holds at most the limit plus one ``receive_data``. Trailers of
    chunked bodies (and chunk extensions, which llhttp skips) count with the head; trailers are then dropped.
    """

    def __init__(self, max_header_bytes: int = 65536) -> None:
        self.max_header_bytes = max_header_bytes
        self._events: collections.deque[RequestHead | bytes | _Sentinel] = collections.deque()
        self._error: BadRequest | None = None  # raised once the events before it are out
        self._eof = False
        self._finished = False  # a request that closes the connection is complete: the rest is ignored
        self._keep_alive = True
        self._in_message = False
        self._begun = 0  # requests begun, to tell whether a receive_data reported anything
        self._head_bytes = 0  # of the current request's head and trailers, as reported by the callbacks
        self._unreported = 0  # of receive_data calls that ended inside a request and reported nothing
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []  # of the current head, then a list that takes its trailers
        self._parser = httptools.HttpRequestParser(
            types.SimpleNamespace(
                on_message_begin=self._on_message_begin,
                on_url=self._on_url,
                on_header=self._on_header,
                on_headers_complete=self._on_headers_complete,
                on_body=self._events.append,
                on_message_complete=self._on_message_complete,
            )
        )
        # llhttp refuses the versions it does not know as malformed; Go parses any HTTP/<digit>.<digit> and
        # answers 505 to those it does not serve, so the version is checked here (``_make_head``)
        self._parser.set_dangerous_leniencies(lenient_version=True)

    def receive_data(self, data: bytes) -> None:
        if not data:
            self._eof = True
            return
        if self._finished or self._error is not None:
            return
        events = len(self._events)
        head_bytes = self._head_bytes
        begun = self._begun
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            # past a closing request llhttp refuses more input (or, after an upgrade, stops): not an error here
            if self._error is None and not self._finished:
                self._error = BadRequest(400, str(exc) or type(exc).__name__)
            return
        if self._in_message:
            if len(self._events) == events and self._head_bytes == head_bytes and self._begun == begun:
                self._unreported += len(data)
            else:
                self._unreported = 0
            if self._head_bytes + self._unreported > self.max_header_bytes:
                self._error = BadRequest(431, "request head too long")

    @property
    def has_partial_request(self) -> bool:
        """True when part of a request is buffered or being read (the header timer should be running)."""
        return self._in_message or bool(self._events)

    def next_event(self) -> RequestHead | bytes | _Sentinel:
        events = self._events
        if events:
            return events.popleft()
        if self._error is not None:
            raise self._error
        if self._eof or self._finished:
            if self._in_message:
                raise BadRequest(400, "peer closed the connection inside a request")
            return CONNECTION_CLOSED
        return NEED_DATA

    # llhttp's callbacks. An exception raised in one makes feed_data fail; self._error says why.
    def _on_message_begin(self) -> None:
        self._in_message = True
        self._begun += 1
        self._head_bytes = 16  # method, version, spaces and line ends, roughly
        self._url = b""
        self._headers = []

    def _on_url(self, part: bytes) -> None:
        # called once for each receive_data that holds part of the target
        self._url += part
        self._head_bytes += len(part)

    def _on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        self._headers.append((name.lower(), value))

    def _on_headers_complete(self) -> None:
        headers = self._headers
        self._headers = []
        try:
            if self._head_bytes > self.max_header_bytes:
                raise BadRequest(431, "request head too long")
            parser = self._parser
            keep_alive = self._keep_alive = parser.should_keep_alive() and not parser.should_upgrade()
            head = _make_head(parser.get_method(), self._url, parser.get_http_version(), headers, keep_alive)
        except BadRequest as exc:
            self._error = exc
            raise
        except (ValueError, UnicodeDecodeError) as exc:
            self._error = BadRequest(400, f"bad request head: {exc}")
            raise
        self._events.append(head)

    def _on_message_complete(self) -> None:
        if self._head_bytes > self.max_header_bytes:  # trailers
            self._error = BadRequest(431, "request head too long")
            raise self._error
        self._in_message = False
        self._events.append(END_OF_BODY)
        if not self._keep_alive:
            self._finished = True
