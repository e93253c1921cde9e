"""End-to-end helpers: run a real nsqd subprocess and talk to it over raw sockets.

`NsqdProcess` starts ``python -m nsqd`` on port 0 with its own data directory, waits (bounded) for the
``TCP: listening on <addr>`` log line, keeps draining the merged stdout/stderr pipe on a thread so the daemon
can never block on a full pipe, and stops it with SIGTERM, insisting on exit code 0 (kill -9 as a last resort).
Its base, `DaemonProcess`, does the same for any of the three daemons (lookupd and admin harnesses build on it).

`FrameClient` holds the frame checks (``expect_ok``, ``read_message``, ``assert_closed``...) shared by the test
clients here and in features.py.

`RawClient` is a deliberately small synchronous V2 client on a blocking socket. Tests use it to send exact
bytes (well formed or not) and to read frames with a timeout. It never hides an error frame: every frame is
returned to the test, except ``_heartbeat_`` responses when the caller asks to skip them.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from protocol.commands import (  # shared client-side encoders, re-exported for the tests
    CLS,
    MAGIC_V2,
    NOP,
)
from protocol.commands import (
    encode_dpub as dpub,
)
from protocol.commands import (
    encode_fin as fin,
)
from protocol.commands import (
    encode_identify as identify,
)
from protocol.commands import (
    encode_mpub as mpub,
)
from protocol.commands import (
    encode_pub as pub,
)
from protocol.commands import (
    encode_rdy as rdy,
)
from protocol.commands import (
    encode_req as req,
)
from protocol.commands import (
    encode_sub as sub,
)
from protocol.commands import (
    encode_touch as touch,
)
from protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, FrameDecoder
from protocol.message import decode_message

__all__ = [
    "CLS",
    "MAGIC_V2",
    "NOP",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "decode_message",
    "dpub",
    "fin",
    "identify",
    "mpub",
    "pub",
    "rdy",
    "req",
    "sub",
    "touch",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT = b"_heartbeat_"

# NSQ's defaults (NSQ-FACTS section 10), used to build expected error texts.
MAX_MSG_SIZE = 1048576
MAX_BODY_SIZE = 5242880
MAX_RDY_COUNT = 2500
MAX_REQ_TIMEOUT_MS = 3600000
MAX_MSG_TIMEOUT_MS = 900000

DEFAULT_IDENTIFY_RESPONSE = (
    b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
    b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
    b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,"output_buffer_timeout":250}'
)

_LISTENING = re.compile(r"(TCP|HTTP|HTTPS): listening on (\S+)")


# --------------------------------------------------------------------------------------------------------------
# Wire encoders: the shared `protocol.commands` ones above, plus raw builders for malformed input.


def command(name: bytes | str, *params: bytes | str | int, body: bytes | None = None) -> bytes:
    """One command line (``NAME p1 p2\\n``) plus an optional size-prefixed body."""
    parts = [_b(name), *(_b(p) for p in params)]
    line = b" ".join(parts) + b"\n"
    if body is None:
        return line
    return line + struct.pack(">i", len(body)) + body


def _b(value: bytes | str | int) -> bytes:
    if isinstance(value, bytes):
        return value
    return str(value).encode()


def mpub_body(bodies: list[bytes]) -> bytes:
    """The MPUB payload after the body-size prefix: ``[num][size][bytes]...``."""
    chunks = [struct.pack(">i", len(bodies))]
    for body in bodies:
        chunks.append(struct.pack(">i", len(body)))
        chunks.append(body)
    return b"".join(chunks)


# --------------------------------------------------------------------------------------------------------------
# Frames and messages


@dataclass(frozen=True)
class Frame:
    frame_type: int
    data: bytes

    @property
    def is_heartbeat(self) -> bool:
        return self.frame_type == FRAME_TYPE_RESPONSE and self.data == HEARTBEAT


class ConnectionClosed(Exception):
    """The server closed the connection (EOF or reset) while a frame was expected."""


class FrameClient:
    """The checks a test client makes on the frames it reads, built on two reads a client provides:
    ``read_frame`` (the next frame) and ``read_reply`` (the next response or error frame; the next frame unless a
    client sets message frames aside)."""

    def read_frame(self, timeout: float | None = None, *, skip_heartbeats: bool = True) -> Frame:
        raise NotImplementedError

    def read_reply(self, timeout: float | None = None) -> Frame:
        return self.read_frame(timeout)

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read_response(self, timeout: float | None = None) -> bytes:
        frame = self.read_reply(timeout)
        assert frame.frame_type == FRAME_TYPE_RESPONSE, f"expected a response frame, got {frame}"
        return frame.data

    def expect_ok(self, timeout: float | None = None) -> None:
        frame = self.read_reply(timeout)
        assert frame == Frame(FRAME_TYPE_RESPONSE, b"OK"), f"expected OK, got {frame}"

    def expect_error(self, text: bytes, timeout: float | None = None) -> None:
        frame = self.read_reply(timeout)
        assert frame == Frame(FRAME_TYPE_ERROR, text), f"expected error frame {text!r}, got {frame}"

    def read_message(self, timeout: float | None = None):
        frame = self.read_frame(timeout)
        assert frame.frame_type == FRAME_TYPE_MESSAGE, f"expected a message frame, got {frame}"
        return decode_message(frame.data)

    def assert_closed(self, timeout: float = 5.0) -> None:
        """The server closes the connection within `timeout`, sending nothing but heartbeats first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                frame = self.read_frame(max(deadline - time.monotonic(), 0.001))
            except ConnectionClosed:
                return
            except TimeoutError:
                raise AssertionError(f"connection still open {timeout}s after a fatal error") from None
            raise AssertionError(f"expected the connection to close, got another frame {frame}")


# --------------------------------------------------------------------------------------------------------------
# Raw synchronous client


def open_stream_socket(address: tuple[str, int] | str, timeout: float) -> socket.socket:
    """A connected blocking socket: TCP to ``(host, port)`` (without Nagle's delay), or a unix socket's path."""
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        return sock
    sock = socket.create_connection(address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class RawClient(FrameClient):
    """A blocking V2 connection with explicit, bounded reads.

    Heartbeats are skipped (and answered with NOP) by the read helpers unless a caller passes
    ``skip_heartbeats=False``.
    """

    def __init__(self, address: tuple[str, int] | str, *, magic: bool = True, timeout: float = 10.0):
        self.address = address
        self.timeout = timeout
        self.sock = open_stream_socket(address, timeout)
        self._decoder = FrameDecoder()
        self._pending: list[Frame] = []
        self.eof = False
        if magic:
            self.send(MAGIC_V2)

    # -- sending
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _answer_heartbeat(self) -> None:
        with contextlib.suppress(OSError):  # the server may already have closed; the next read reports it
            self.send(NOP)

    def shutdown_write(self) -> None:
        """Half-close: the server sees EOF on its reads but can still answer."""
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    # -- receiving
    def _fill(self, deadline: float) -> None:
        """Read once from the socket, waiting at most until `deadline`; raise on timeout or EOF."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame before the deadline")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            raise TimeoutError("no frame before the deadline") from None
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as exc:
            self.eof = True
            raise ConnectionClosed(f"connection reset: {exc}") from None
        if not chunk:
            self.eof = True
            raise ConnectionClosed("connection closed by server")
        self._decoder.receive_data(chunk)
        while (frame := self._decoder.next_frame()) is not None:
            self._pending.append(Frame(frame.frame_type, bytes(frame.data)))

    def read_frame(self, timeout: float | None = None, *, skip_heartbeats: bool = True) -> Frame:
        """Next frame; raises TimeoutError or ConnectionClosed."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            while self._pending:
                frame = self._pending.pop(0)
                if skip_heartbeats and frame.is_heartbeat:
                    self._answer_heartbeat()
                    continue
                return frame
            self._fill(deadline)

    def poll_frame(self, timeout: float, *, skip_heartbeats: bool = True) -> Frame | None:
        """Next frame, or None if none arrives within `timeout` (used to prove that nothing is sent)."""
        try:
            return self.read_frame(timeout, skip_heartbeats=skip_heartbeats)
        except TimeoutError:
            return None

    def read_reply(self, timeout: float | None = None) -> Frame:
        """Next response or error frame. Message frames that arrive first stay queued, in order, for
        `read_message` (nsqd may flush a delivery before the OK of a PUB sent on the same connection)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            index = 0
            while index < len(self._pending):
                frame = self._pending[index]
                if frame.frame_type == FRAME_TYPE_MESSAGE:
                    index += 1
                    continue
                del self._pending[index]
                if frame.is_heartbeat:
                    self._answer_heartbeat()
                    continue
                return frame
            self._fill(deadline)

    def closed_by_server(self) -> bool:
        """Whether the server already closed this connection (its end of stream or a reset is waiting), read without
        blocking: what a client that reads its connection all along, as a producer library does, knows before it
        sends on it. Frames read meanwhile stay queued for the next read."""
        if self.eof:
            return True
        timeout = self.sock.gettimeout()
        self.sock.settimeout(0)
        try:
            while True:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    self.eof = True
                    return True
                self._decoder.receive_data(chunk)
                while (frame := self._decoder.next_frame()) is not None:
                    self._pending.append(Frame(frame.frame_type, bytes(frame.data)))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:  # a reset
            self.eof = True
            return True
        finally:
            self.sock.settimeout(timeout)

    def assert_open(self) -> None:
        """The connection still works: a PUB is answered with OK."""
        self.send(pub("probe_open", b"still here"))
        self.expect_ok()

    # -- conveniences
    def identify(self, fields: dict) -> bytes:
        """IDENTIFY and return the response body (``OK`` or the negotiation JSON)."""
        self.send(identify(fields))
        return self.read_response()

    def publish(self, topic: str, body: bytes) -> None:
        self.send(pub(topic, body))
        self.expect_ok()

    def publish_many(self, topic: str, bodies: list[bytes]) -> None:
        self.send(mpub(topic, bodies))
        self.expect_ok()

    def subscribe(self, topic: str, channel: str, ready: int | None = None) -> None:
        self.send(sub(topic, channel))
        self.expect_ok()
        if ready is not None:
            self.send(rdy(ready))


def consumer(address, topic: str, channel: str, ready: int = 1, identify_fields: dict | None = None) -> RawClient:
    client = RawClient(address)
    if identify_fields is not None:
        client.identify(identify_fields)
    client.subscribe(topic, channel, ready)
    return client


# --------------------------------------------------------------------------------------------------------------
# The daemon under test


class DaemonProcess:
    """One daemon subprocess (``python -m <module> <args>`` from the checkout), its merged stdout/stderr drained
    by a thread so it never blocks on a full pipe.

    ``env`` is added to the environment and ``cwd`` (the checkout unless set) is where it starts. ``start`` waits
    (bounded) for the ``<ready>: listening on <addr>`` line. Every ``listening on`` line is
    recorded by listener name (TCP, HTTP, HTTPS): in ``addresses`` as logged, in ``listening`` as (host, port)
    with an unspecified host replaced by 127.0.0.1. ``stop`` sends SIGTERM and returns the exit code (kill -9
    and fail when it does not exit in time).
    """

    module = "nsqd"
    ready = "TCP"

    def __init__(self, args: list[str] | tuple[str, ...] = (), startup_timeout: float = 20.0):
        self.args = list(args)
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.addresses: dict[str, str] = {}
        self.listening: dict[str, tuple[str, int]] = {}
        self._cond = threading.Condition()
        self._drainer: threading.Thread | None = None
        self._drained = False
        self.env: dict[str, str] = {}  # added to the environment of each start
        self.cwd: Path = REPO_ROOT

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.module, *self.args]

    def start(self, ready_line: str | None = None):
        """Start, and wait for the ``<ready>: listening on`` line (or one matching ``ready_line``)."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.proc = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._drainer = threading.Thread(target=self._drain, name=f"{self.module}-log", daemon=True)
        self._drainer.start()
        try:
            self.wait_for_log(ready_line or rf"{self.ready}: listening on ", self.startup_timeout)
        except AssertionError:
            self.kill()
            raise
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._cond:
                self.lines.append(line)
                match = _LISTENING.search(line)
                if match:
                    self.addresses.setdefault(match.group(1), match.group(2))
                    self.listening.setdefault(match.group(1), _parse_address(match.group(2)))
                self._cond.notify_all()
        with self._cond:
            self._drained = True
            self._cond.notify_all()

    def log_text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def wait_for_log(self, pattern: str, timeout: float, start: int = 0) -> re.Match:
        """Wait until a log line at index >= `start` matches `pattern`; fail with the whole log otherwise."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        index = start
        with self._cond:
            while True:
                while index < len(self.lines):
                    match = regex.search(self.lines[index])
                    index += 1
                    if match:
                        return match
                if self._drained:
                    raise AssertionError(
                        f"{self.module} exited (code {self.proc.poll()}) before logging /{pattern}/; log:\n"
                        f"{self.log_text_locked()}"
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{self.module} did not log /{pattern}/ within {timeout}s; log:\n{self.log_text_locked()}"
                    )
                self._cond.wait(remaining)

    def log_text_locked(self) -> str:
        return "\n".join(self.lines)

    @property
    def tcp(self) -> tuple[str, int]:
        return self.listening["TCP"]

    @property
    def tcp_address(self) -> str:
        host, port = self.tcp
        return f"{host}:{port}"

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def assert_running(self) -> None:
        assert self.is_running(), f"{self.module} died (exit code {self.proc.poll()}); log:\n{self.log_text()}"

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; kill -9 and fail if it does not exit in time. Returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"{self.module} did not exit within {timeout}s of SIGTERM (killed); log:\n{self.log_text()}"
                ) from None
        self._join_drainer()
        return self.proc.returncode

    def kill(self) -> None:
        """kill -9 of the daemon and of its child processes (nsqd's ``--workers``) at once: every one is stopped
        first, so that none sees another die and stops gracefully (as workers do when their parent dies)."""
        if self.proc is not None and self.proc.poll() is None:
            pids = [self.proc.pid, *self.children()]
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            self.proc.wait(10)
        self._join_drainer()

    def signal_all(self, sig: int) -> None:
        """``sig`` to the daemon and to each of its child processes (nsqd's ``--workers``): a SIGSTOP to the parent
        alone would leave the workers serving."""
        assert self.proc is not None
        for pid in [self.proc.pid, *self.children()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def children(self) -> list[int]:
        """The pids of the daemon's child processes (nsqd's workers), in the order they started."""
        assert self.proc is not None
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as handle:
                return [int(pid) for pid in handle.read().split()]
        except FileNotFoundError:
            return []

    def _join_drainer(self) -> None:
        if self._drainer is not None:
            self._drainer.join(5)


#: ``--workers`` for every nsqd the suites start whose arguments name none (``pytest --nsqd-workers=N`` sets it)
WORKERS_ENV = "TRIONSQ_TEST_WORKERS"


class NsqdProcess(DaemonProcess):
    """One nsqd subprocess on port 0 with its own data directory. Use `start()` / `stop()` or the fixtures in
    tests/conftest.py. With ``TRIONSQ_TEST_WORKERS`` set, it runs that many workers unless ``args`` name
    ``--workers``."""

    def __init__(self, data_path: Path, args: list[str] | tuple[str, ...] = (), startup_timeout: float = 20.0):
        super().__init__(args, startup_timeout)
        self.data_path = Path(data_path)

    @property
    def argv(self) -> list[str]:
        base = [
            sys.executable,
            "-m",
            "nsqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={self.data_path}",
        ]
        workers = os.environ.get(WORKERS_ENV)
        if workers and not any(arg.startswith("--workers") for arg in self.args):
            base.append(f"--workers={workers}")
        return base + self.args

    def start(self, ready_line: str | None = None) -> NsqdProcess:
        """``DaemonProcess.start``; with ``--workers`` above 1, until every worker listens (each logs it)."""
        self.data_path.mkdir(parents=True, exist_ok=True)
        super().start(ready_line)
        workers = max((int(arg.partition("=")[2]) for arg in self.argv if arg.startswith("--workers=")), default=1)
        if ready_line is None and workers > 1:
            line = 0
            for _ in range(workers):
                found = self.wait_for_log(rf"{self.ready}: listening on ", self.startup_timeout, line)
                line = self.lines.index(found.string, line) + 1
        return self

    def http(self, timeout: float = 5.0) -> tuple[str, int] | None:
        """The HTTP address once the daemon logged it, or None if it does not within `timeout`."""
        try:
            self.wait_for_log(r"HTTP: listening on ", timeout)
        except AssertionError:
            return None
        return self.listening.get("HTTP")


def stop_all(daemons: list[NsqdProcess]) -> None:
    """Stop every daemon; raise AssertionError (with logs) if one did not exit 0 on SIGTERM."""
    failures = []
    for daemon in daemons:
        try:
            code = daemon.stop()
        except AssertionError as exc:
            failures.append(str(exc))
            continue
        if code != 0:
            failures.append(f"nsqd exited with code {code} after SIGTERM; log:\n{daemon.log_text()}")
    if failures:
        raise AssertionError("\n\n".join(failures))


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out by itself (to ``bind(0)`` and to an outgoing connection)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set[int] = set()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, for a daemon that must keep its address across restarts.

    It lies below the kernel's ephemeral range: while the daemon is down between a kill and its restart, no
    outgoing connection (a replica dialling its peers, a client) and no ``bind(0)`` can be given the same port, so
    the restart never finds its own address taken. Within one run a port is handed out once."""
    low = _ephemeral_low()
    first = max(1024, low - 12000) if low > 2048 else 20000
    last = low - 1 if low > 2048 else 30000
    rng = random.Random()
    for _ in range(200):
        port = rng.randint(first, last)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise AssertionError(f"no free port in {first}-{last} after 200 tries")


@contextmanager
def taken_address() -> Iterator[str]:
    """``127.0.0.1:<port>`` with a socket listening there until the block ends, so no daemon can bind it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


_PROGRAMS = {"nsqd": "nsqd", "lookupd": "nsqlookupd", "admin": "nsqadmin"}


def assert_refused_start(module: str, args: list[str], fatal: str, timeout: float = 30.0) -> None:
    """``python -m <module> <args>`` refuses to start: exit code 1, and its last line on stderr is the daemon's
    one FATAL log line, ``[<program>] <date> <time> FATAL: <fatal>`` (no traceback)."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 1, f"{module} exited with {done.returncode}:\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    line = re.escape(f"[{_PROGRAMS[module]}] ") + r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} FATAL: " + re.escape(fatal)
    assert lines and re.fullmatch(line, lines[-1]), done.stderr
    assert sum(" FATAL: " in text for text in lines) == 1, done.stderr


def _parse_address(text: str) -> tuple[str, int] | str:
    """``(host, port)`` to connect to a logged ``listening on`` address; a unix socket's path stays as it is."""
    if text.startswith(("/", "@")):
        return text
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return host, int(port)


def http_get(address: tuple[str, int], path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """Minimal HTTP GET (status, body) without third-party libraries."""
    import http.client

    conn = http.client.HTTPConnection(address[0], address[1], timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()
