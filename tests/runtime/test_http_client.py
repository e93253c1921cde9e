"""The daemons' one HTTP client (``runtime.http_client``) against real sockets on 127.0.0.1: whole answers come
back, and every way an exchange can fail is one ``HTTPClientError`` naming the method, the URL and the reason."""

from __future__ import annotations

import pytest
import trio

from runtime.http_client import HTTPClientError, fetch

LIMITS = {"connect_timeout": 2.0, "request_timeout": 5.0, "max_bytes": 1000}


async def serve_once(nursery, answer: bytes) -> int:
    """A server on a free port that reads one request head, writes ``answer`` and closes; returns the port."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    seen: list[bytes] = []

    async def handle(stream):
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        seen.append(data)
        await stream.send_all(answer)
        await stream.aclose()

    nursery.start_soon(trio.serve_listeners, handle, listeners)
    return listeners[0].socket.getsockname()[1], seen


async def test_a_whole_answer():
    async with trio.open_nursery() as nursery:
        port, seen = await serve_once(
            nursery, b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nnope"
        )
        reply = await fetch("GET", f"http://127.0.0.1:{port}/a?b=1", headers=[("Accept", "x/y")], **LIMITS)
        assert (reply.status, reply.headers["content-type"], reply.body) == (404, "text/plain", b"nope")
        head = seen[0].decode()
        assert head.startswith("GET /a?b=1 HTTP/1.1\r\n") and "Accept: x/y\r\n" in head
        assert "Content-Length" not in head  # a GET without a body, as Go's client sends it
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            "peer closed connection without sending complete message body",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n" + b"x" * 2000, "response body over 1000 bytes"),
        (b"garbage\r\n\r\n", "illegal status line"),
        (b"", ": EOF"),
    ],
)
async def test_answers_that_fail(answer, reason):
    async with trio.open_nursery() as nursery:
        port, _ = await serve_once(nursery, answer)
        url = f"http://127.0.0.1:{port}/x"
        with pytest.raises(HTTPClientError) as info:
            await fetch("POST", url, body=b"{}", **LIMITS)
        assert str(info.value).startswith(f"POST {url}: ") and reason in str(info.value), info.value
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://[::1/x", "Invalid IPv6 URL"),
        ("http://127.0.0.1:99999/x", "Port out of range"),
        ("ftp://127.0.0.1/x", "unsupported URL"),
        ("127.0.0.1:4151", "unsupported URL"),
    ],
)
async def test_urls_that_cannot_be_used(url, reason):
    with pytest.raises(HTTPClientError) as info:
        await fetch("GET", url, **LIMITS)
    assert str(info.value).startswith(f"GET {url}: ") and reason in str(info.value), info.value


async def test_refused_and_slow():
    with trio.socket.socket() as placeholder:
        await placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    with pytest.raises(
        HTTPClientError, match=f"GET http://127.0.0.1:{port}/: dial tcp 127.0.0.1:{port}: connect: connection refused"
    ):
        await fetch("GET", f"http://127.0.0.1:{port}/", **LIMITS)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")  # accepted by the kernel, never answered
    url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/"
    with pytest.raises(HTTPClientError, match=r"request timeout after 0\.2s"):
        await fetch("GET", url, **{**LIMITS, "request_timeout": 0.2})
    await listeners[0].aclose()
