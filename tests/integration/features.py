"""Helpers for the connection-feature tests (TLS, snappy, deflate, AUTH) on raw sockets.

`FeatureClient` is a blocking V2 client that can switch its socket to TLS (the standard `ssl` module) and to
snappy or deflate, using codecs that are not nsqd's own: python-snappy's framing-format stream classes (on
cramjam) and `zlib`. In clear text it reads exactly the bytes of each frame, so nothing that belongs to the
next layer is ever consumed by the previous one.

`ScriptedAuthServer` is a real HTTP auth server (standard library, on a thread) whose answers each test sets.

`Certificates` makes a throw-away CA with trustme at test time: a server certificate for 127.0.0.1, client
certificates signed by that CA, and a second CA nsqd does not trust.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import snappy
import trustme

from protocol.commands import MAGIC_V2, NOP, encode_identify

from .harness import ConnectionClosed, Frame, FrameClient


@dataclass
class Certificates:
    ca_file: Path
    server_cert: Path
    server_key: Path
    client_pem: Path  # key + chain, CN "client-one", signed by the CA
    foreign_client_pem: Path  # signed by a CA nsqd does not trust
    ca: trustme.CA

    def daemon_args(self, *extra: str) -> list[str]:
        """nsqd's TLS flags; HTTPS on a port picked at run time (the default 4152 may be taken)."""
        return [f"--tls-cert={self.server_cert}", f"--tls-key={self.server_key}", "--https-address=127.0.0.1:0", *extra]

    def client_context(
        self, *, with_cert: bool = False, foreign: bool = False, maximum: ssl.TLSVersion | None = None
    ) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if with_cert:
            context.load_cert_chain(str(self.foreign_client_pem if foreign else self.client_pem))
        if maximum is not None:
            context.maximum_version = maximum
        return context


def make_certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client-one.example", common_name="client-one")
    foreign = trustme.CA().issue_cert("intruder.example", common_name="intruder")
    paths = Certificates(
        ca_file=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_pem=directory / "client.pem",
        foreign_client_pem=directory / "foreign.pem",
        ca=ca,
    )
    ca.cert_pem.write_to_path(str(paths.ca_file))
    server.cert_chain_pems[0].write_to_path(str(paths.server_cert))
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(str(paths.server_cert), append=True)
    server.private_key_pem.write_to_path(str(paths.server_key))
    client.private_key_and_cert_chain_pem.write_to_path(str(paths.client_pem))
    foreign.private_key_and_cert_chain_pem.write_to_path(str(paths.foreign_client_pem))
    return paths


class _CompressedIO:
    """A socket-like object that compresses what is sent and decompresses what is received."""

    def __init__(self, inner, encode, decode):
        self.inner = inner
        self._encode = encode
        self._decode = decode
        self._decoded = bytearray()

    def sendall(self, data: bytes) -> None:
        self.inner.sendall(self._encode(data))

    def recv(self, size: int) -> bytes:
        while not self._decoded:
            chunk = self.inner.recv(65536)
            if not chunk:
                return b""
            self._decoded += self._decode(chunk)
        out = bytes(self._decoded[:size])
        del self._decoded[:size]
        return out

    def settimeout(self, timeout) -> None:
        self.inner.settimeout(timeout)

    def close(self) -> None:
        self.inner.close()


def snappy_io(inner) -> _CompressedIO:
    decompressor = snappy.StreamDecompressor()
    # a new compressor per write, as pynsq does: every write starts with a stream identifier
    return _CompressedIO(inner, lambda data: snappy.StreamCompressor().add_chunk(data), decompressor.decompress)


def deflate_io(inner, level: int) -> _CompressedIO:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
    return _CompressedIO(
        inner, lambda data: compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH), decompressor.decompress
    )


class FeatureClient(FrameClient):
    """A V2 connection whose layers (TLS, snappy, deflate) are switched on by the test."""

    def __init__(self, address: tuple[str, int], *, timeout: float = 10.0, magic: bool = True):
        self.address = address
        self.timeout = timeout
        self.raw = socket.create_connection(address, timeout=timeout)
        self.raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.io = self.raw
        self._buf = bytearray()
        if magic:
            self.send(MAGIC_V2)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.io.close()
        with contextlib.suppress(OSError):
            self.raw.close()

    # -- bytes
    def send(self, data: bytes) -> None:
        self.io.sendall(data)

    def _read_exact(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame before the deadline")
            self.io.settimeout(remaining)
            try:
                chunk = self.io.recv(n - len(self._buf))  # never past this frame: the next layer may follow
            except TimeoutError:
                raise TimeoutError("no frame before the deadline") from None
            except (ConnectionResetError, BrokenPipeError, ssl.SSLError) as exc:
                raise ConnectionClosed(f"connection reset: {exc}") from None
            if not chunk:
                raise ConnectionClosed("connection closed by server")
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def read_frame(self, timeout: float | None = None, *, skip_heartbeats: bool = True) -> Frame:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            size = struct.unpack(">i", self._read_exact(4, deadline))[0]
            body = self._read_exact(size, deadline)
            frame = Frame(struct.unpack(">i", body[:4])[0], body[4:])
            if skip_heartbeats and frame.is_heartbeat:
                self.send(NOP)
                continue
            return frame

    # -- negotiation
    def identify(self, fields: dict):
        """IDENTIFY; returns the parsed JSON (feature negotiation) or the raw response."""
        self.send(encode_identify(fields))
        data = self.read_response()
        return json.loads(data) if data.startswith(b"{") else data

    def start_tls(self, context: ssl.SSLContext, server_hostname: str = "127.0.0.1") -> ssl.SSLSocket:
        assert not self._buf, "clear-text bytes left over before TLS"
        self.io = context.wrap_socket(self.raw, server_hostname=server_hostname)
        self.expect_ok()
        return self.io

    def start_snappy(self) -> None:
        assert not self._buf
        self.io = snappy_io(self.io)
        self.expect_ok()

    def start_deflate(self, level: int) -> None:
        assert not self._buf
        self.io = deflate_io(self.io, level)
        self.expect_ok()


def grant(
    ttl=3600,
    identity="ivy",
    identity_url="https://example.invalid/ivy",
    topic=".*",
    channels=(".*",),
    permissions=("subscribe", "publish"),
) -> dict:
    return {
        "ttl": ttl,
        "identity": identity,
        "identity_url": identity_url,
        "authorizations": [{"topic": topic, "channels": list(channels), "permissions": list(permissions)}],
    }


class ScriptedAuthServer:
    """GET <any path>: answers ``answers[secret]`` = (status, JSON-able body); records every request.
    ``hang`` makes it accept and never answer (a request timeout)."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None):
        self.answers: dict[str, tuple[int, object]] = {}
        self.requests: list[tuple[str, dict]] = []
        self.hang = False
        self._cond = threading.Condition()
        self._release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                url = urlsplit(self.path)
                query = parse_qs(url.query, keep_blank_values=True)
                with server._cond:
                    server.requests.append((url.path, query))
                    server._cond.notify_all()
                if server.hang:
                    server._release.wait(30)
                    return
                status, body = server.answers.get(query.get("secret", [""])[0], (403, {"message": "no"}))
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if ssl_context is not None:
            self.httpd.socket = ssl_context.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> list:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.requests) >= count, timeout), (
                f"auth server saw {len(self.requests)} requests, expected {count}"
            )
            return list(self.requests)

    def close(self) -> None:
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
