"""protocol.http (pure part) and runtime.http_server (trio driver), the latter over real sockets on 127.0.0.1."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import ssl
import struct

import pytest
import trio

from protocol.http import (
    CONNECTION_CLOSED,
    END_OF_BODY,
    NEED_DATA,
    BadRequest,
    Headers,
    HTTPError,
    Request,
    RequestHead,
    RequestParser,
    Response,
    Router,
    empty_response,
    error_response,
    go_json,
    json_response,
    parse_query,
    text_response,
)
from runtime.http_server import HTTPServer, go_duration, serve_http

LOGGER = "tests.protocol.http"
DATE = re.compile(rb"Date: [A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT\r\n")


# -- pure parts ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"message": "NOT_FOUND"}, b'{"message":"NOT_FOUND"}'),
        ({"b": 1, "a": [True, None, "x"]}, b'{"b":1,"a":[true,null,"x"]}'),
        ({"s": "<a&b>"}, b'{"s":"\\u003ca\\u0026b\\u003e"}'),
        ({"s": "caf\u00e9 \u2028"}, '{"s":"caf\u00e9 \\u2028"}'.encode()),
        ({"f": 1.0, "g": 0.5, "h": -0.0}, b'{"f":1,"g":0.5,"h":-0}'),
        ([1e16, 1e20, 1e21, 1.5e21], b"[10000000000000000,100000000000000000000,1e+21,1.5e+21]"),
        ([0.0001, 0.00001, 0.0000015, 1e-7, 1.5e-10], b"[0.0001,0.00001,0.0000015,1e-7,1.5e-10]"),
        ([1234567.0, 1234567.25, 99.99], b"[1234567,1234567.25,99.99]"),
        # number-like text inside strings stays as it is
        ({"addr": "h:1.0,x", "v": "1.3.0", "k": [2.0]}, b'{"addr":"h:1.0,x","v":"1.3.0","k":[2]}'),
    ],
)
def test_go_json(value, expected):
    assert go_json(value) == expected


def test_response_helpers():
    assert text_response("OK") == Response(200, [("Content-Type", "text/plain; charset=utf-8")], b"OK")
    assert text_response("NOK - disk", 500).status == 500
    assert text_response("OK", nsq_header=True).header("x-nsq-content-type") == "nsq; version=1.0"
    assert empty_response() == Response(200, [("X-Nsq-Content-Type", "nsq; version=1.0")], b"")
    assert empty_response().header("Content-Type") is None
    assert error_response(400, "MISSING_ARG_TOPIC") == Response(
        400,
        [("Content-Type", "application/json; charset=utf-8"), ("X-Nsq-Content-Type", "nsq; version=1.0")],
        b'{"message":"MISSING_ARG_TOPIC"}',
    )
    assert json_response([1], 201).status == 201


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", {}),
        (b"topic=t&channel=c", {"topic": ["t"], "channel": ["c"]}),
        (b"a=1&a=2&b=&a=3", {"a": ["1", "2", "3"], "b": [""]}),
        (b"flag&&x=1&", {"flag": [""], "x": ["1"]}),
        (b"=v", {"": ["v"]}),
        (b"q=a+b%20c%2B%26", {"q": ["a b c+&"]}),
        (b"k%C3%A9=%E2%9C%93", {"k\u00e9": ["\u2713"]}),
        (b"a=b=c", {"a": ["b=c"]}),
    ],
)
def test_parse_query(raw, expected):
    assert parse_query(raw) == expected


@pytest.mark.parametrize("raw", [b"a=%zz", b"a=%4", b"a=%", b"%g0=1", b"a=%ff", b"a=%C3", b"a=1;b=2"])
def test_parse_query_rejects(raw):
    with pytest.raises(ValueError):
        parse_query(raw)
    request = Request("GET", "/stats", raw)
    with pytest.raises(HTTPError) as info:
        _ = request.query
    assert (info.value.status, info.value.message) == (400, "INVALID_REQUEST")


def test_request_and_headers():
    headers = Headers([(b"content-type", b"text/plain"), (b"x-a", b"1"), (b"x-a", b"2")])
    request = Request("GET", "/stats", b"format=json&topic=t", headers, remote_address="127.0.0.1:5")
    assert request.query_value("format") == "json"
    assert request.query_value("missing", "dflt") == "dflt"
    assert request.target == "/stats?format=json&topic=t"
    assert headers["Content-Type"] == headers.get("CONTENT-TYPE") == "text/plain"
    assert headers.get_all("X-A") == ["1", "2"] and headers.get("x-a") == "1"
    assert "x-A" in headers and "nope" not in headers and headers.get("nope") is None
    assert list(headers) == [("content-type", "text/plain"), ("x-a", "1"), ("x-a", "2")] and len(headers) == 3
    with pytest.raises(KeyError):
        headers["nope"]


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (999, "999ns"),
        (1500, "1.5µs"),
        (523100, "523.1µs"),
        (1234567, "1.234567ms"),
        (2_000_000_000, "2s"),
        (62_500_000_000, "1m2.5s"),
        (3_600_000_000_000, "1h0m0s"),
        (-1500, "-1.5µs"),
    ],
)
def test_go_duration(ns, text):
    assert go_duration(ns) == text


async def _noop(request, **params):
    return empty_response()


def test_router_rejects_bad_routes():
    router = Router()
    router.add(["GET"], "/a/:x", _noop)
    with pytest.raises(ValueError):
        router.add(["GET"], "/a/:x", _noop)
    with pytest.raises(ValueError):
        router.add(["GET"], "no-slash", _noop)
    with pytest.raises(ValueError):
        router.add(["GET"], "/b/:x/:x", _noop)


async def test_router_without_sockets(caplog):
    async def boom(request):
        raise KeyError("oops")

    async def not_a_response(request):
        return "OK"

    router = Router(logger=logging.getLogger(LOGGER))
    router.add(["GET"], "/boom", boom)
    router.add(["GET"], "/str", not_a_response)
    router.add(["POST"], "/a/:x", _noop)
    assert (await router.handle(Request("POST", "/a/1"))).status == 200
    assert (await router.handle(Request("GET", "/nope"))).body == b'{"message":"NOT_FOUND"}'
    with caplog.at_level(logging.ERROR, LOGGER):
        for path in ("/boom", "/str"):
            response = await router.handle(Request("GET", path))
            assert (response.status, response.body) == (500, b'{"message":"INTERNAL_ERROR"}')
    assert len([r for r in caplog.records if "panic in HTTP handler" in r.getMessage()]) == 2


# -- the request parser, fed whole, byte by byte and with trailing bytes ------------------------------------------
PARSER_CASES = [
    (b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n", ("GET", "/ping", b"", None, False, True), b""),
    (
        b"GET /a%20b/c?x=1&y=%zz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ("GET", "/a b/c", b"x=1&y=%zz", None, False, False),
        b"",
    ),
    (
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        ("POST", "/pub", b"topic=t", 5, False, True),
        b"hello",
    ),
    (
        b"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\n\r\n",
        ("PUT", "/c", b"", None, True, True),
        b"abcdefg",
    ),
    (b"GET /old HTTP/1.0\r\n\r\n", ("GET", "/old", b"", None, False, False), b""),
    (b"GET /old HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", ("GET", "/old", b"", None, False, True), b""),
    (b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", ("OPTIONS", "*", b"", None, False, True), b""),
    # Go serves every HTTP/1.x
    (b"GET /next HTTP/1.2\r\nHost: x\r\n\r\n", ("GET", "/next", b"", None, False, True), b""),
    (b"GET http://example.com/ping?a=1 HTTP/1.1\r\nHost: x\r\n\r\n", ("GET", "/ping", b"a=1", None, False, True), b""),
]


def _drain(parser: RequestParser) -> list:
    events = []
    while True:
        event = parser.next_event()
        if event is NEED_DATA or event is CONNECTION_CLOSED:
            return events
        events.append(event)


def _summarise(events: list) -> list:
    """Heads as tuples, adjacent body pieces joined, END_OF_BODY kept."""
    out: list = []
    for event in events:
        if isinstance(event, RequestHead):
            out.append(
                (event.method, event.path, event.raw_query, event.content_length, event.chunked, event.keep_alive)
            )
        elif event is END_OF_BODY:
            out.append(event)
        elif out and isinstance(out[-1], bytes):
            out[-1] += bytes(event)
        else:
            out.append(bytes(event))
    return out


def _expected(head, body) -> list:
    return [head, body, END_OF_BODY] if body else [head, END_OF_BODY]


@pytest.mark.parametrize(("raw", "head", "body"), PARSER_CASES)
@pytest.mark.parametrize("mode", ["whole", "bytewise", "trailing"])
def test_request_parser(raw, head, body, mode):
    parser = RequestParser()
    events: list = []
    if mode == "bytewise":
        for i in range(len(raw)):
            parser.receive_data(raw[i : i + 1])
            events += _drain(parser)
    else:
        parser.receive_data(raw + (b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n" if mode == "trailing" else b""))
        events += _drain(parser)
    expected = _expected(head, body)
    if mode == "trailing" and head[-1]:
        expected += _expected(("GET", "/next", b"", None, False, True), b"")
    if not head[-1]:
        events = events[: len(expected)]  # after a closing request the caller stops reading
    assert _summarise(events) == expected
    parser.receive_data(b"")
    assert parser.next_event() is CONNECTION_CLOSED or not head[-1]


def test_request_parser_pipeline_and_eof():
    parser = RequestParser()
    open_cases = [case for case in PARSER_CASES if case[1][-1]]
    parser.receive_data(b"".join(case[0] for case in open_cases) * 50)
    events = _summarise(_drain(parser))
    assert events == [item for case in open_cases for item in _expected(case[1], case[2])] * 50
    assert not parser.has_partial_request
    parser.receive_data(b"GET /half")
    assert parser.next_event() is NEED_DATA and parser.has_partial_request
    parser.receive_data(b"")
    with pytest.raises(BadRequest):
        parser.next_event()


@pytest.mark.parametrize(
    "closing",
    [case[0] for case in PARSER_CASES if not case[1][-1]]
    + [
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        b"CONNECT /x HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
@pytest.mark.parametrize("split", [False, True])
def test_request_parser_stops_after_a_closing_request(closing, split):
    """What follows a request that closes the connection is never parsed, whether it arrives with it or later."""
    parser = RequestParser()
    rest = b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n\x00not http\r\n\r\n"
    if split:
        parser.receive_data(closing)
        events = _drain(parser)
        parser.receive_data(rest)
    else:
        parser.receive_data(closing + rest)
        events = _drain(parser)
    events += _drain(parser)
    assert isinstance(events[0], RequestHead) and not events[0].keep_alive
    assert events[-1] is END_OF_BODY and sum(isinstance(event, RequestHead) for event in events) == 1
    assert parser.next_event() is CONNECTION_CLOSED and not parser.has_partial_request


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"\x00\x01\x02garbage\r\n\r\n", 400),
        (b"GET /ping\r\n\r\n", 400),
        (b"GET /ping HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
        (b"GET /a%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET ping HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 5000 + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-" + b"a" * 5000 + b": 1\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: 1\r\n" * 1000 + b"\r\n", 431),
        (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 431),
        (b"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"T: 1\r\n" * 1000 + b"\r\n", 431),
        (b"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: " + b"1" * 5000 + b"\r\n\r\n", 431),
        (b"GET /\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", 505),
        (b"GET / HTTP/3.1\r\nHost: x\r\n\r\n", 505),
        (b"GET / HTTP/10.0\r\nHost: x\r\n\r\n", 400),
        (b"GET / HTTP/1.10\r\nHost: x\r\n\r\n", 400),
        (b"GET / HTTP/x.1\r\nHost: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\nHost: x\n\n", 400),
        (b"get / HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
        (b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na", 400),
        (b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400),
    ],
)
@pytest.mark.parametrize("bytewise", [False, True])
def test_request_parser_rejects(raw, status, bytewise):
    parser = RequestParser(max_header_bytes=4096)
    with pytest.raises(BadRequest) as info:
        for piece in [raw[i : i + 1] for i in range(len(raw))] if bytewise else [raw]:
            parser.receive_data(piece)
            _drain(parser)
    assert info.value.status == status
    with pytest.raises(BadRequest):  # and it stays refused
        parser.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        _drain(parser)


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /ping HTT",
        b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab",
        b"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
    ],
)
def test_request_parser_input_ending_inside_a_request(raw):
    parser = RequestParser()
    parser.receive_data(raw)
    _drain(parser)
    assert parser.has_partial_request
    parser.receive_data(b"")
    with pytest.raises(BadRequest) as info:
        _drain(parser)
    assert info.value.status == 400


@pytest.mark.parametrize(
    "start",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\nX: ",
        b"GET / HTTP/1.1\r\nHost: x\r\nX-",
        b"GET /",
        b"PUT / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: ",
    ],
)
def test_request_parser_refuses_an_unfinished_head_in_time(start):
    """A head that never ends is refused once it passes the limit, not when (if ever) it ends."""
    parser = RequestParser(max_header_bytes=4096)
    fed = 0
    with pytest.raises(BadRequest) as info:
        for data in [start] + [b"a" * 100] * 1000:
            parser.receive_data(data)
            fed += len(data)
            _drain(parser)
    assert info.value.status == 431 and fed <= 4096 + 200


def test_request_parser_head_limit_counts_each_request_alone():
    """A long pipeline of heads, each under the limit, split anywhere, is never refused for their total size."""
    one = b"GET /ping HTTP/1.1\r\nHost: x\r\nUser-Agent: " + b"u" * 300 + b"\r\n\r\n"
    data = one * 200
    for size in (1, 7, 100, 1000, 65536):
        parser = RequestParser(max_header_bytes=len(one) + 16)
        heads = 0
        for start in range(0, len(data), size):
            parser.receive_data(data[start : start + size])
            heads += sum(isinstance(event, RequestHead) for event in _drain(parser))
        assert heads == 200


# -- the server over sockets --------------------------------------------------------------------------------------
async def ping(request):
    return text_response("OK")


async def echo_params(request, **params):
    return json_response(params)


async def config(request, opt):
    return json_response({"opt": opt, "method": request.method, "body": request.body.decode()})


async def query(request):
    return json_response(request.query)


async def pub(request):
    return text_response("OK", nsq_header=True)


async def boom(request):
    raise RuntimeError("handler failure")


async def missing_arg(request):
    raise HTTPError(400, "MISSING_ARG_TOPIC")


async def who(request):
    return json_response(
        {
            "remote": request.remote_address,
            "tls": request.tls,
            "x": request.headers.get("X-Test"),
            "version": request.http_version,
        }
    )


async def big(request):
    return text_response(b"x" * 200_000)


async def slow(request):
    await trio.sleep(0.8)  # longer than every timeout of the test server
    return text_response("late")


#: what ``/later``'s after-answer work saw: the bytes its client had received by then (``later_client`` peeks)
LATER: list = []


async def later(request):
    """Answers at once; after the answer, records what the client (``LATER[0]``, a socket) has already received."""

    def after() -> None:
        client = LATER[0]
        try:
            received = client.recv(65536, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            received = b""
        LATER.append(received)
        logging.getLogger(LOGGER).info("later: done")

    request.after_answer(after)
    return text_response("answered")


async def later_seen(request):
    return json_response(len(LATER) - 1)


async def later_failing(request):
    request.after_answer(lambda: 1 / 0)
    request.after_answer(lambda: LATER.append(b"second"))
    return text_response("answered")


def make_router() -> Router:
    router = Router(logger=logging.getLogger(LOGGER))
    router.add(["GET"], "/later", later)
    router.add(["GET"], "/later/seen", later_seen)
    router.add(["GET"], "/later/failing", later_failing)
    router.add(["GET"], "/ping", ping)
    router.add(["GET"], "/json", lambda request: _json_value())
    router.add(["POST"], "/topic/create", lambda request: _empty())
    router.add(["GET", "PUT"], "/config/:opt", config)
    router.add(["GET"], "/topics/:topic/:channel", echo_params)
    router.add(["GET"], "/query", query)
    router.add(
        ["POST"], "/pub", pub, access_log=False, max_body_bytes=10, body_too_big=error_response(413, "MSG_TOO_BIG")
    )
    router.add(["GET"], "/boom", boom)
    router.add(["GET"], "/missing", missing_arg)
    router.add(["GET"], "/who", who)
    router.add(["GET"], "/big", big)
    router.add(["GET"], "/slow", slow)
    return router


async def _json_value():
    return json_response({"topics": ["a", "b"], "n": 1, "s": "<&>"})


async def _empty():
    return empty_response()


@pytest.fixture
async def server(nursery):
    http = HTTPServer(
        make_router(),
        logger=logging.getLogger(LOGGER),
        address="127.0.0.1:0",
        max_header_bytes=8192,
        max_body_bytes=lambda: 1000,
        idle_timeout=0.5,
        header_timeout=0.5,
        body_timeout=0.5,
    )
    address = await nursery.start(http.run)
    assert address == f"127.0.0.1:{http.port}"
    return http


class Client:
    """A raw HTTP client: sends bytes as given, parses responses one by one."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    @classmethod
    async def connect(cls, server: HTTPServer) -> Client:
        return cls(await trio.open_tcp_stream("127.0.0.1", server.port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def _fill(self) -> None:
        data = await self.stream.receive_some(65536)
        if not data:
            raise EOFError(self.buffer)
        self.buffer += data

    async def raw_response(self, *, head_only: bool = False) -> bytes:
        with trio.fail_after(5):
            while b"\r\n\r\n" not in self.buffer:
                await self._fill()
            head, _, _ = self.buffer.partition(b"\r\n\r\n")
            length = 0
            match = re.search(rb"\r\nContent-Length: (\d+)", head)
            if match and not head_only:
                length = int(match.group(1))
            elif not match and b"\r\nConnection: close" in head:  # a refusal: its text runs to the close
                try:
                    while True:
                        await self._fill()
                except EOFError:
                    pass
                length = len(self.buffer) - len(head) - 4
            size = len(head) + 4 + length
            while len(self.buffer) < size:
                await self._fill()
            raw, self.buffer = self.buffer[:size], self.buffer[size:]
            return raw

    async def response(self, **kwargs) -> tuple[int, dict[str, str], bytes]:
        raw = await self.raw_response(**kwargs)
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(": ")
            headers[name.lower()] = value
        return status, headers, body

    async def is_closed(self) -> bool:
        """Read to the end; True when the server closed without sending anything more."""
        with trio.fail_after(5):
            try:
                while True:
                    await self._fill()
            except EOFError:
                pass
            except trio.BrokenResourceError:
                pass
        return self.buffer == b""

    async def aclose(self) -> None:
        await self.stream.aclose()


def get(path: str, *extra: str) -> bytes:
    return "\r\n".join([f"GET {path} HTTP/1.1", "Host: test", *extra, "", ""]).encode()


def without_date(raw: bytes) -> bytes:
    assert len(DATE.findall(raw)) == 1, raw
    return DATE.sub(b"", raw)


async def test_conventions_byte_exact(server):
    client = await Client.connect(server)
    await client.send(
        get("/ping") + get("/json") + b"POST /topic/create HTTP/1.1\r\nHost: t\r\n\r\n" + get("/missing") + get("/nope")
    )
    assert without_date(await client.raw_response()) == (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 2\r\n\r\nOK"
    )
    assert without_date(await client.raw_response()) == (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
        b"X-Nsq-Content-Type: nsq; version=1.0\r\nContent-Length: 51\r\n\r\n"
        b'{"topics":["a","b"],"n":1,"s":"\\u003c\\u0026\\u003e"}'
    )
    assert without_date(await client.raw_response()) == (
        b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nContent-Length: 0\r\n\r\n"
    )
    assert without_date(await client.raw_response()) == (
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json; charset=utf-8\r\n"
        b"X-Nsq-Content-Type: nsq; version=1.0\r\nContent-Length: 31\r\n\r\n"
        b'{"message":"MISSING_ARG_TOPIC"}'
    )
    assert without_date(await client.raw_response()) == (
        b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json; charset=utf-8\r\n"
        b"X-Nsq-Content-Type: nsq; version=1.0\r\nContent-Length: 23\r\n\r\n"
        b'{"message":"NOT_FOUND"}'
    )
    await client.aclose()


async def test_routing(server):
    client = await Client.connect(server)
    await client.send(get("/topics/t1/ch%231") + get("/config/log_level"))
    status, headers, body = await client.response()
    assert (status, body) == (200, b'{"topic":"t1","channel":"ch#1"}')
    status, headers, body = await client.response()
    assert (status, body) == (200, b'{"opt":"log_level","method":"GET","body":""}')

    # wrong method: 405 with Allow listing the route's methods plus OPTIONS, sorted
    await client.send(
        b"POST /ping HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"
        + b"DELETE /config/x HTTP/1.1\r\nHost: t\r\n\r\n"
        + b"GET /topic/create HTTP/1.1\r\nHost: t\r\n\r\n"
    )
    for allow in ("GET, OPTIONS", "GET, OPTIONS, PUT", "OPTIONS, POST"):
        status, headers, body = await client.response()
        assert (status, headers["allow"], body) == (405, allow, b'{"message":"METHOD_NOT_ALLOWED"}')

    # OPTIONS on a known path: 200, empty, Allow; on an unknown one: 404
    await client.send(b"OPTIONS /config/x HTTP/1.1\r\nHost: t\r\n\r\nOPTIONS /zzz HTTP/1.1\r\nHost: t\r\n\r\n")
    status, headers, body = await client.response()
    assert (status, headers["allow"], headers["content-length"], body) == (200, "GET, OPTIONS, PUT", "0", b"")
    assert "content-type" not in headers
    assert (await client.response())[0] == 404

    # empty parameter, extra segment: 404
    await client.send(get("/topics/t1/") + get("/topics/t1/c/extra"))
    assert (await client.response())[0] == 404
    assert (await client.response())[0] == 404
    await client.aclose()


async def test_head_and_redirects(server):
    client = await Client.connect(server)
    await client.send(b"HEAD /json HTTP/1.1\r\nHost: t\r\n\r\n" + get("/ping"))
    status, headers, body = await client.response(head_only=True)
    assert (status, headers["content-length"], headers["content-type"], body) == (
        200,
        "51",
        "application/json; charset=utf-8",
        b"",
    )
    assert (await client.response())[2] == b"OK"  # the HEAD answer carried no body

    # a trailing-slash mismatch or a mis-cased path redirects as httprouter does: 301 for GET, 307 otherwise
    await client.send(
        get("/ping/?a=1") + get("/PING") + get("/config/x/") + b"POST /topic/create/ HTTP/1.1\r\nHost: t\r\n\r\n"
    )
    status, headers, body = await client.response()
    assert (status, headers["location"], body) == (301, "/ping?a=1", b'<a href="/ping?a=1">Moved Permanently</a>.\n\n')
    assert headers["content-type"] == "text/html; charset=utf-8"
    status, headers, _ = await client.response()
    assert (status, headers["location"]) == (301, "/ping")
    status, headers, _ = await client.response()
    assert (status, headers["location"]) == (301, "/config/x")
    status, headers, body = await client.response()
    assert (status, headers["location"], body) == (307, "/topic/create", b"")
    await client.aclose()


async def test_query_strictness(server):
    client = await Client.connect(server)
    await client.send(
        get("/query?topic=a&topic=b+c&ch=%23x&empty=")
        + get("/query?topic=%zz")
        + get("/query?topic=%ff")
        + get("/query?a=1;b=2")
        + get("/ping?topic=%zz")
    )
    assert (await client.response())[2] == b'{"topic":["a","b c"],"ch":["#x"],"empty":[""]}'
    for _ in range(3):
        status, headers, body = await client.response()
        assert (status, body) == (400, b'{"message":"INVALID_REQUEST"}')
        assert headers["x-nsq-content-type"] == "nsq; version=1.0"
    # like nsqd, an endpoint that reads no parameter does not care
    assert (await client.response())[:1] == (200,)
    await client.aclose()


async def test_keep_alive_and_pipelining(server):
    client = await Client.connect(server)
    batch = b"".join(get(f"/topics/t{i}/c{i}") for i in range(50))
    await client.send(batch + b"PUT /config/a HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc" + get("/ping"))
    for i in range(50):
        assert (await client.response())[2] == f'{{"topic":"t{i}","channel":"c{i}"}}'.encode()
    assert (await client.response())[2] == b'{"opt":"a","method":"PUT","body":"abc"}'
    assert (await client.response())[2] == b"OK"
    # the same connection serves requests written later, and one dribbled a byte at a time
    for byte in get("/ping"):
        await client.send(bytes([byte]))
    assert (await client.response())[2] == b"OK"
    # responses bigger than the socket buffers, pipelined, still come in order
    await client.send(get("/big") + get("/ping") + get("/big"))
    assert len((await client.response())[2]) == 200_000
    assert (await client.response())[2] == b"OK"
    assert len((await client.response())[2]) == 200_000
    await client.send(get("/ping", "Connection: close"))
    status, headers, body = await client.response()
    assert (status, headers["connection"], body) == (200, "close", b"OK")
    assert await client.is_closed()


async def test_after_answer_work_runs_once_the_answer_is_out_and_before_the_next_request(server, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    client = await Client.connect(server)
    peek = socket.socket(fileno=os.dup(client.stream.socket.fileno()))
    LATER[:] = [peek]
    try:
        await client.send(get("/later"))
        assert (await client.response())[2] == b"answered"
        # the client held the whole answer when the work ran
        assert LATER[1].startswith(b"HTTP/1.1 200 OK\r\n") and LATER[1].endswith(b"answered")
        # a pipelined request after it finds it done; so does one on another connection
        await client.send(get("/later") + get("/later/seen"))
        assert (await client.response())[2] == b"answered"
        assert (await client.response())[2] == b"2"
        other = await Client.connect(server)
        await other.send(get("/later/seen"))
        assert (await other.response())[2] == b"2"
        # the request's access line follows what its work logged, as a handler's own lines precede it
        lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        done = lines.index("later: done")
        assert re.match(r"200 GET /later \(", lines[done + 1]), lines
        # work that raises is logged; the rest still runs, and the connection goes on
        await client.send(get("/later/failing"))
        assert (await client.response())[2] == b"answered"
        assert LATER[-1] == b"second"
        assert any("panic after answering GET /later/failing" in r.getMessage() for r in caplog.records)
        await client.send(get("/later/seen", "Connection: close"))
        assert (await client.response())[2] == b"3"
        await other.aclose()
    finally:
        peek.close()
        LATER.clear()
    await client.aclose()


async def test_after_answer_work_runs_when_the_client_is_gone_before_its_answer(nursery):
    gone: list = []

    async def reset_then_answer(request):
        # the client resets the connection while its request is handled: the answer cannot be written
        client.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.stream.socket.close()
        request.after_answer(lambda: gone.append("done"))
        return text_response("answered")

    router = Router(logger=logging.getLogger(LOGGER))
    router.add(["GET"], "/reset", reset_then_answer)
    http = HTTPServer(router, logger=logging.getLogger(LOGGER), address="127.0.0.1:0")
    await nursery.start(http.run)
    client = await Client.connect(http)
    await client.send(get("/reset"))
    with trio.fail_after(5):
        while not gone:
            await trio.sleep(0.01)
    assert gone == ["done"]


async def test_router_runs_after_answer_work_before_handle_returns():
    mine, theirs = socket.socketpair()
    LATER[:] = [mine]
    try:
        response = await make_router().handle(Request("GET", "/later"))
        assert response.body == b"answered" and LATER[1:] == [b""]  # ran (nothing is sent without a socket)
    finally:
        mine.close()
        theirs.close()
        LATER.clear()


async def test_http_1_0(server):
    client = await Client.connect(server)
    await client.send(b"GET /who HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    status, headers, body = await client.response()
    assert headers["connection"] == "keep-alive" and b'"version":"1.0"' in body
    await client.send(b"GET /ping HTTP/1.0\r\n\r\n")
    status, headers, body = await client.response()
    assert (status, headers["connection"], body) == (200, "close", b"OK")
    assert await client.is_closed()


async def test_request_fields(server):
    client = await Client.connect(server)
    await client.send(get("/who", "X-Test: hello"))
    local = client.stream.socket.getsockname()
    assert (await client.response())[2] == (
        f'{{"remote":"127.0.0.1:{local[1]}","tls":false,"x":"hello","version":"1.1"}}'.encode()
    )
    await client.aclose()


async def test_expect_100_continue(server):
    client = await Client.connect(server)
    await client.send(b"PUT /config/x HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    with trio.fail_after(5):
        while len(client.buffer) < 25:
            await client._fill()
    assert client.buffer == b"HTTP/1.1 100 Continue\r\n\r\n"
    client.buffer = b""
    await client.send(b"hello")
    assert (await client.response())[2] == b'{"opt":"x","method":"PUT","body":"hello"}'

    # a body that will not be accepted gets its final answer at once, and no 100
    await client.send(b"POST /pub HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\nExpect: 100-continue\r\n\r\n")
    status, headers, body = await client.response()
    assert (status, headers["connection"], body) == (413, "close", b'{"message":"MSG_TOO_BIG"}')
    assert await client.is_closed()

    client = await Client.connect(server)
    await client.send(b"POST /nope HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    status, headers, body = await client.response()
    assert (status, body) == (404, b'{"message":"NOT_FOUND"}')
    assert await client.is_closed()


async def test_chunked_bodies(server):
    client = await Client.connect(server)
    await client.send(
        b"PUT /config/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n1;name=v\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\n" + get("/ping")
    )
    assert (await client.response())[2] == b'{"opt":"x","method":"PUT","body":"hello world"}'
    assert (await client.response())[2] == b"OK"
    # over the route's limit: cut off as soon as it passes it
    await client.send(b"POST /pub HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n")
    await client.send(b"6\r\nghijkl\r\n")
    status, headers, body = await client.response()
    assert (status, body) == (413, b'{"message":"MSG_TOO_BIG"}')
    assert await client.is_closed()


async def test_body_limits(server):
    # a 2 GB Content-Length is answered at once, nothing read; the route decides the answer
    for path, code in (("/pub", "MSG_TOO_BIG"), ("/config/x", "BODY_TOO_BIG")):
        client = await Client.connect(server)
        method = "POST" if path == "/pub" else "PUT"
        await client.send(f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 2147483648\r\n\r\n".encode())
        status, headers, body = await client.response()
        assert (status, headers["connection"], body) == (413, "close", f'{{"message":"{code}"}}'.encode())
        assert await client.is_closed()
    # at the limit is fine; the server-wide limit (a callable here) applies to routes without their own
    client = await Client.connect(server)
    await client.send(
        b"POST /pub HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n0123456789"
        + b"PUT /config/x HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n"
        + b"a" * 1000
    )
    assert (await client.response())[2] == b"OK"
    assert (await client.response())[0] == 200
    # a body sent at once with a too-big Content-Length: the answer still reaches the client
    await client.send(b"PUT /config/x HTTP/1.1\r\nHost: t\r\nContent-Length: 300000\r\n\r\n" + b"a" * 300000)
    assert (await client.response())[0] == 413
    assert await client.is_closed()


async def test_header_flood(server):
    # many headers (the limit is 8 KiB here): 431 once the limit is passed, then the connection closes
    client = await Client.connect(server)
    flood = b"".join(f"X-Flood-{i}: {'v' * 50}\r\n".encode() for i in range(5000))

    async def send_flood():
        with contextlib.suppress(trio.BrokenResourceError):  # the server may reset once it has stopped reading
            await client.send(b"GET /ping HTTP/1.1\r\nHost: t\r\n" + flood + b"\r\n")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_flood)
        status, headers, body = await client.response()
        assert (status, headers["connection"], body) == (431, "close", b"431 Request Header Fields Too Large")
        assert await client.is_closed()
    # one header too long, sent whole
    client = await Client.connect(server)
    await client.send(b"GET /ping HTTP/1.1\r\nHost: t\r\n" + b"X-Big: " + b"v" * 9000 + b"\r\n\r\n")
    assert (await client.response())[0] == 431
    assert await client.is_closed()


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)) + b"\r\n\r\n",  # a TLS hello
        b"GET /ping\r\n\r\n",
        b"GET /a b HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /%zz HTTP/1.1\r\nHost: t\r\n\r\n",
        b"HELLO\r\n\r\n",
    ],
)
async def test_garbage_gets_400(server, garbage):
    client = await Client.connect(server)
    await client.send(get("/ping") + garbage)
    assert (await client.response())[2] == b"OK"  # answers before the bad request still go out
    status, headers, body = await client.response()
    assert (status, headers["connection"], body) == (400, "close", b"400 Bad Request")
    assert await client.is_closed()


_REFUSAL_HEADERS = b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "answer"),
    [
        (
            b"GET /ping HTTP/1.1\r\nHost: t\r\nX: \x01\r\n\r\n",
            b"HTTP/1.1 400 Bad Request" + _REFUSAL_HEADERS + b"400 Bad Request",
        ),
        (
            b"GET /ping HTTP/1.1\r\n\r\n",
            b"HTTP/1.1 400 Bad Request: missing required Host header"
            + _REFUSAL_HEADERS
            + b"400 Bad Request: missing required Host header",
        ),
        (
            b"GET /ping HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            b"HTTP/1.1 400 Bad Request: too many Host headers"
            + _REFUSAL_HEADERS
            + b"400 Bad Request: too many Host headers",
        ),
        (
            b"GET /ping HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
            b"HTTP/1.1 400 Bad Request: too many Host headers"
            + _REFUSAL_HEADERS
            + b"400 Bad Request: too many Host headers",
        ),
        (
            b"GET /ping HTTP/2.0\r\nHost: t\r\n\r\n",
            b"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version"
            + _REFUSAL_HEADERS
            + b"505 HTTP Version Not Supported: unsupported protocol version",
        ),
        (
            b"GET /ping HTTP/9.9\r\nHost: t\r\n\r\n",
            b"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version"
            + _REFUSAL_HEADERS
            + b"505 HTTP Version Not Supported: unsupported protocol version",
        ),
        (
            b"POST /pub HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            b"HTTP/1.1 501 Not Implemented" + _REFUSAL_HEADERS + b"Unsupported transfer encoding",
        ),
    ],
)
async def test_refusals_are_go_net_https_bytes_then_close(server, request_bytes, answer):
    # Go's net/http writes these itself: no Content-Length and no Date, the text runs to the close
    client = await Client.connect(server)
    await client.send(request_bytes)
    with trio.fail_after(5):
        try:
            while True:
                await client._fill()
        except EOFError:
            pass
    assert client.buffer == answer


async def test_an_upgrade_is_answered_as_any_request_then_closed(server):
    client = await Client.connect(server)
    await client.send(
        b"GET /ping HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n" + get("/ping")
    )
    answer_status, headers, answer_body = await client.response()
    assert (answer_status, headers["connection"], answer_body) == (200, "close", b"OK")
    assert await client.is_closed()


async def test_slow_clients_are_closed(server):
    # slowloris: a head dribbled slower than header_timeout (0.5 s) in total is cut off, unanswered
    client = await Client.connect(server)

    async def dribble():
        try:
            await client.send(b"GET /ping HTTP/1.1\r\n")
            while True:
                await client.send(b"X-Slow: 1\r\n")
                await trio.sleep(0.05)
        except trio.BrokenResourceError:
            pass

    async with trio.open_nursery() as nursery:
        nursery.start_soon(dribble)
        assert await client.is_closed()
        nursery.cancel_scope.cancel()
    # an idle keep-alive connection is closed after idle_timeout
    client = await Client.connect(server)
    await client.send(get("/ping"))
    assert (await client.response())[2] == b"OK"
    assert await client.is_closed()
    # a body that stops coming
    client = await Client.connect(server)
    await client.send(b"PUT /config/x HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
    assert await client.is_closed()


async def test_handler_errors(server, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    first = await Client.connect(server)
    other = await Client.connect(server)
    await first.send(get("/boom") + get("/ping"))
    status, headers, body = await first.response()
    assert (status, body) == (500, b'{"message":"INTERNAL_ERROR"}')
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert (await first.response())[2] == b"OK"  # the same connection goes on
    await other.send(get("/ping"))
    assert (await other.response())[2] == b"OK"
    assert any("panic in HTTP handler" in r.getMessage() and r.exc_info for r in caplog.records)
    await first.aclose()
    await other.aclose()


async def test_access_log(server, caplog):
    caplog.set_level(logging.INFO, LOGGER)
    client = await Client.connect(server)
    await client.send(
        get("/ping?x=1") + b"POST /pub?topic=t HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi" + get("/nope")
    )
    for _ in range(3):
        await client.response()
    port = client.stream.socket.getsockname()[1]
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER and "(127.0.0.1:" in r.getMessage()]
    assert len(lines) == 2, lines  # /pub writes none
    assert re.fullmatch(rf"200 GET /ping\?x=1 \(127\.0\.0\.1:{port}\) [\d.]+(ns|µs|ms|s)", lines[0])
    assert lines[1].startswith(f"404 GET /nope (127.0.0.1:{port}) ")
    await client.aclose()


async def test_one_connection_never_disturbs_another(server):
    """Many misbehaving connections at once; a well-behaved one on the side keeps being served."""
    good = await Client.connect(server)

    async def misbehave(kind: int) -> None:
        client = await Client.connect(server)
        if kind == 0:
            await client.send(b"\xff" * 100 + b"\r\n\r\n")
        elif kind == 1:
            await client.send(get("/boom"))
        elif kind == 2:
            await client.send(b"PUT /config/x HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nab")
        # abort with a reset, mid-request for some
        client.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await client.aclose()

    async with trio.open_nursery() as nursery:
        for i in range(30):
            nursery.start_soon(misbehave, i % 3)
    for _ in range(5):
        await good.send(get("/ping"))
        assert (await good.response())[2] == b"OK"
    with trio.fail_after(5):  # every misbehaving connection is closed, only the good one is left
        while server.connections != 1:
            await trio.sleep(0.01)
    await good.aclose()


async def test_serve_http_on_given_listeners(nursery):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    router = Router()
    router.add(["GET"], "/ping", ping)
    started = await nursery.start(
        lambda task_status: serve_http(
            listeners, router, logger=logging.getLogger(LOGGER), idle_timeout=1, task_status=task_status
        )
    )
    assert started == listeners
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    client = Client(stream)
    await client.send(get("/ping") + b"OPTIONS * HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (await client.response())[2] == b"OK"
    assert (await client.response())[:1] == (200,)
    await client.aclose()


async def test_handlers_are_not_timed_out(server):
    client = await Client.connect(server)
    await client.send(get("/slow") + get("/ping"))
    assert (await client.response())[2] == b"late"
    assert (await client.response())[2] == b"OK"
    await client.aclose()


async def test_tls(nursery, certs):
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(certs.server_cert, certs.server_key)
    http = HTTPServer(
        make_router(), logger=logging.getLogger(LOGGER), address="127.0.0.1:0", ssl_context=server_context, name="HTTPS"
    )
    await nursery.start(http.run)
    client_context = certs.client_context()
    stream = trio.SSLStream(
        await trio.open_tcp_stream("127.0.0.1", http.port),
        client_context,
        server_hostname="127.0.0.1",
        https_compatible=True,
    )
    client = Client(stream)
    await client.send(get("/who") + get("/ping"))
    assert b'"tls":true' in (await client.response())[2]
    assert (await client.response())[2] == b"OK"
    # through TLS the answer goes out by the stream, which may let other tasks run: the work comes before it
    mine, theirs = socket.socketpair()
    LATER[:] = [mine]
    try:
        await client.send(get("/later") + get("/later/seen"))
        assert (await client.response())[2] == b"answered"
        assert (await client.response())[2] == b"1"
        assert LATER[1] == b""
    finally:
        mine.close()
        theirs.close()
        LATER.clear()
    await client.send(b"\x00garbage\r\n\r\n")
    assert (await client.response())[2] == b"400 Bad Request"
    assert await client.is_closed()
