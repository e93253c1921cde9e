"""Small synchronous HTTP helpers for the nsqd HTTP tests: a request over http.client, raw bytes over a socket,
and a bounded wait for a condition. Every call has a timeout."""

from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass


@dataclass
class Reply:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self):
        return json.loads(self.body)

    @property
    def message(self) -> str:
        return self.json()["message"]


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a unix socket (``Host: localhost``)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


def request(
    address, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None, timeout: float = 10.0
) -> Reply:
    """One request to ``(host, port)``, or to a unix socket's path."""
    if isinstance(body, str):
        body = body.encode()
    if isinstance(address, str):
        conn = UnixHTTPConnection(address, timeout)
    else:
        conn = http.client.HTTPConnection(address[0], address[1], timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
    finally:
        conn.close()


def get(address, path: str, **kwargs) -> Reply:
    return request(address, "GET", path, **kwargs)


def post(address, path: str, body: bytes | str | None = b"", **kwargs) -> Reply:
    return request(address, "POST", path, body=body, **kwargs)


def stats(address, query: str = "") -> dict:
    reply = get(address, "/stats?format=json" + (f"&{query}" if query else ""))
    assert reply.status == 200, reply
    return reply.json()


def raw_exchange(address, data: bytes, timeout: float = 10.0, *, shutdown: bool = False) -> bytes:
    """Send ``data`` and read until the server closes the connection (or ``timeout`` passes: then fail)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(data)
        if shutdown:
            sock.shutdown(socket.SHUT_WR)
        return read_until_closed(sock, timeout)


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    chunks = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"connection still open after {timeout}s; got {b''.join(chunks)[:200]!r}")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def read_responses(sock: socket.socket, count: int, timeout: float = 10.0) -> list[tuple[int, dict, bytes]]:
    """Read ``count`` complete responses (Content-Length framed) from a kept-alive connection."""
    deadline = time.monotonic() + timeout
    buffer = b""
    responses = []
    while len(responses) < count:
        head_end = buffer.find(b"\r\n\r\n")
        if head_end >= 0:
            head = buffer[:head_end].decode("latin-1")
            lines = head.split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if status < 200:  # 100 Continue: no body
                responses.append((status, headers, b""))
                buffer = buffer[head_end + 4 :]
                continue
            length = int(headers.get("content-length", "0"))
            if len(buffer) >= head_end + 4 + length:
                responses.append((status, headers, buffer[head_end + 4 : head_end + 4 + length]))
                buffer = buffer[head_end + 4 + length :]
                continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"only {len(responses)} of {count} responses within {timeout}s: {buffer[:200]!r}")
        sock.settimeout(remaining)
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed after {len(responses)} of {count} responses")
        buffer += chunk
    return responses


def wait_for(condition, timeout: float = 10.0, interval: float = 0.02, message: str = "condition"):
    """Poll ``condition()`` until it returns something truthy (returned) or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{message} not met within {timeout}s (last value {value!r})")
        time.sleep(interval)


class StaticPage:
    """One page served to every GET on ``127.0.0.1:<port>`` by a thread, until ``close``; ``url`` is its address."""

    def __init__(self, body: bytes, content_type: str = "text/html") -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # the standard library's name
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
