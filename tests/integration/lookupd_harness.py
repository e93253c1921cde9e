"""End-to-end helpers for discovery: nsqlookupd subprocesses, a raw "  V1" peer, and cluster queries.

`LookupdProcess` runs ``python -m lookupd`` on ports picked at run time (or given, to restart on the
same address), waits for both ``listening on`` lines, and stops with SIGTERM insisting on exit 0,
like `NsqdProcess`. `RawPeer` speaks the lookupd protocol byte by byte on a blocking socket, as an
nsqd would, and returns every response (size-prefixed) to the test.
"""

from __future__ import annotations

import contextlib
import json
import struct
import sys
import time
from pathlib import Path

from protocol.lookup_v1 import MAGIC_V1, encode_identify
from tests.integration.harness import ConnectionClosed, NsqdProcess, open_stream_socket, stop_all
from tests.integration.http_helpers import get, wait_for

__all__ = ["Cluster", "LookupdProcess", "RawPeer", "lookup_producers", "wait_for", "wait_for_producers"]


class LookupdProcess(NsqdProcess):
    """One nsqlookupd subprocess; ``tcp``/``http`` are its addresses once started."""

    def __init__(
        self,
        work_dir: Path,
        args: list[str] | tuple[str, ...] = (),
        *,
        tcp_port: int = 0,
        http_port: int = 0,
        startup_timeout: float = 20.0,
    ) -> None:
        super().__init__(work_dir, args, startup_timeout)
        self.tcp_port = tcp_port
        self.http_port = http_port

    @property
    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "lookupd",
            f"--tcp-address=127.0.0.1:{self.tcp_port}",
            f"--http-address=127.0.0.1:{self.http_port}",
            "--broadcast-address=127.0.0.1",
            *self.args,
        ]

    def start(self) -> LookupdProcess:
        super().start()
        try:
            self.wait_for_log(r"HTTP: listening on ", self.startup_timeout)
        except AssertionError:
            self.kill()
            raise
        return self

    @property
    def http_address(self) -> tuple[str, int]:
        return self.listening["HTTP"]

    def restarted(self) -> LookupdProcess:
        """A new process on the same two ports (this one must be stopped first)."""
        return LookupdProcess(self.data_path, self.args, tcp_port=self.tcp[1], http_port=self.http_address[1])


def lookup_producers(lookupd: LookupdProcess, topic: str) -> list[dict]:
    """``/lookup``'s producers for the topic (``[]`` while the topic is unknown)."""
    reply = get(lookupd.http_address, f"/lookup?topic={topic}")
    if reply.status == 404:
        return []
    assert reply.status == 200, reply
    return reply.json()["producers"]


def wait_for_producers(lookupd: LookupdProcess, topic: str, tcp_ports: set[int], timeout: float = 20.0) -> list:
    """Wait until ``/lookup`` lists exactly the producers with these TCP ports; returns them."""

    def check():
        found = lookup_producers(lookupd, topic)
        return (found,) if {p["tcp_port"] for p in found} == set(tcp_ports) else None

    return wait_for(check, timeout, message=f"producers of {topic} on {lookupd.http_address} == {sorted(tcp_ports)}")[0]


class RawPeer:
    """A blocking "  V1" connection with explicit, bounded reads."""

    def __init__(self, address: tuple[str, int] | str, *, magic: bool = True, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self.sock = open_stream_socket(address, timeout)
        self._buffer = b""
        if magic:
            self.send(MAGIC_V1)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> RawPeer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def local_address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no response before the deadline")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no response before the deadline") from None
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise ConnectionClosed(f"connection reset: {exc}") from None
        if not chunk:
            raise ConnectionClosed("connection closed by lookupd")
        self._buffer += chunk

    def read_response(self, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self._buffer) < 4:
            self._fill(deadline)
        size = struct.unpack(">i", self._buffer[:4])[0]
        while len(self._buffer) < 4 + size:
            self._fill(deadline)
        data, self._buffer = self._buffer[4 : 4 + size], self._buffer[4 + size :]
        return data

    def command(self, data: bytes) -> bytes:
        self.send(data)
        return self.read_response()

    def identify(
        self,
        *,
        tcp_port: int = 4150,
        http_port: int = 4151,
        broadcast_address: str = "127.0.0.1",
        hostname: str = "raw-peer",
        version: str = "1.3.0",
    ) -> dict:
        response = self.command(
            encode_identify(
                broadcast_address=broadcast_address,
                hostname=hostname,
                http_port=http_port,
                tcp_port=tcp_port,
                version=version,
            )
        )
        return json.loads(response)

    def assert_closed(self, timeout: float = 5.0) -> None:
        """lookupd closes the connection within ``timeout`` without sending anything more."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._fill(deadline)
                raise AssertionError(f"expected the connection to close, got {self._buffer!r}")
        except ConnectionClosed:
            return
        except TimeoutError:
            raise AssertionError(f"connection still open {timeout}s after a fatal error") from None


class Cluster:
    """Some nsqlookupd and some nsqd registered with every one of them (``--broadcast-address=127.0.0.1``)."""

    def __init__(
        self,
        make_dir,
        *,
        lookupds: int = 2,
        nsqds: int = 2,
        lookupd_args: tuple[str, ...] = (),
        nsqd_args: tuple[str, ...] = (),
    ) -> None:
        self.make_dir = make_dir
        self.lookupd_args = lookupd_args
        self.nsqd_args = nsqd_args
        self.daemons: list[NsqdProcess] = []
        self.lookupds = [self.add(LookupdProcess(make_dir("lookupd"), lookupd_args)) for _ in range(lookupds)]
        self.nsqds = [self.start_nsqd() for _ in range(nsqds)]

    def add(self, daemon):
        self.daemons.append(daemon)
        return daemon.start()

    def nsqd_argv(self) -> list[str]:
        return [
            "--broadcast-address=127.0.0.1",
            *(f"--lookupd-tcp-address={lookupd.tcp_address}" for lookupd in self.lookupds),
            *self.nsqd_args,
        ]

    def start_nsqd(self, data_path: Path | None = None) -> NsqdProcess:
        return self.add(NsqdProcess(data_path or self.make_dir("nsqd"), self.nsqd_argv()))

    def restart(self, daemon):
        """Stop ``daemon`` (exit 0 required) and start it again: a lookupd on the same ports, an nsqd on the
        same data directory (new ports)."""
        assert daemon.stop() == 0, daemon.log_text()
        self.daemons.remove(daemon)
        if isinstance(daemon, LookupdProcess):
            fresh = self.add(daemon.restarted())
            self.lookupds[self.lookupds.index(daemon)] = fresh
        else:
            fresh = self.add(NsqdProcess(daemon.data_path, daemon.args))
            self.nsqds[self.nsqds.index(daemon)] = fresh
        return fresh

    def stop(self) -> None:
        stop_all(self.daemons)

    def logs(self) -> str:
        return "\n\n".join(daemon.log_text() for daemon in self.daemons)
