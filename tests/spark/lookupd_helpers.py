"""lookupd for the connector tests: the daemon as a subprocess, and producer registrations made
over lookupd's V1 TCP protocol on behalf of an nsqd (so the test controls exactly which nsqd
lookupd lists, and under which address)."""

from __future__ import annotations

import socket
import struct
import sys

from protocol.lookup_v1 import encode_identify, encode_register
from tests.integration.harness import NsqdProcess


class LookupdProcess(NsqdProcess):
    """``python -m lookupd`` on loopback ports; same start/stop/log handling as nsqd's."""

    @property
    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "lookupd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--broadcast-address=127.0.0.1",
        ]

    @property
    def http_address(self) -> str:
        host, port = self.http()
        return f"{host}:{port}"


def _read_response(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("lookupd closed the connection")
            data += chunk
        return data

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def register_producer(lookupd: LookupdProcess, nsqd: NsqdProcess, topic: str, channel: str = "spark") -> socket.socket:
    """Register ``nsqd`` as a producer of ``topic``; the registration lasts while the returned
    socket stays open."""
    sock = socket.create_connection(lookupd.tcp, timeout=10)
    host, tcp_port = nsqd.tcp
    _, http_port = nsqd.http()
    sock.sendall(
        b"  V1"
        + encode_identify(
            broadcast_address=host, hostname="localhost", http_port=http_port, tcp_port=tcp_port, version="1.3.0"
        )
    )
    _read_response(sock)
    sock.sendall(encode_register(topic, channel))
    answer = _read_response(sock)
    assert answer == b"OK", answer
    return sock
