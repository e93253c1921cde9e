"""The load generator: one process, one epoll loop, many raw non-blocking sockets.

Everything here is built so that the generator costs as little CPU as possible per message and is
never what a figure measures:

- frames are encoded once before the run (``PUB``/``MPUB`` commands, HTTP requests) and a reply
  is answered by sending the same bytes again, several frames in one ``send`` when several
  replies arrived in one read;
- a read takes everything the socket holds (up to 1 MiB) and parses every complete frame in one
  pass; a consumer answers all the messages of one read with one joined write of ``FIN`` lines;
- replies that are all ``OK`` frames are counted with ``bytes.count`` instead of being parsed;
- no threads, no asyncio, no per-message objects: ``select.epoll`` and plain counters.

This is deliberately not the project's client (``trionsq``): the generators measure nsqd, so nothing
may stand between the wire and the counters, and their cost must stay far below nsqd's. What the
client costs on top of this floor is measured by the ``client`` scenario, which runs the trio and
blocking clients against these generators in one run.

A *role* owns one connection and reacts to readiness (``Publisher``, ``Consumer``,
``PacedPublisher``, ``HttpPublisher``). ``run_roles`` drives them until a deadline or until every
role says it is done; counters are snapshot at the start of the measurement window (after the
warm-up) and at its end, on ``time.monotonic``, which is one clock for every process of the
machine, so figures from several generator processes add up.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time
from collections import deque

from protocol.commands import MAGIC_V2, encode_identify, encode_mpub, encode_pub, encode_rdy, encode_sub

__all__ = [
    "Consumer",
    "HttpPublisher",
    "LoadError",
    "PacedPublisher",
    "Publisher",
    "build_roles",
    "connect",
    "run_roles",
    "stamped_body",
]

OK_FRAME = struct.pack(">ii", 6, 0) + b"OK"
HEARTBEAT = b"_heartbeat_"
NOP = b"NOP\n"
RECV_SIZE = 1 << 20
#: one receive buffer per generator process (its loop is single-threaded); what a read brings is copied
#: out. ``sock.recv(RECV_SIZE)`` would allocate (and map) a fresh 1 MiB object per call: 14 us more per
#: read here, which made the generator, not the server, the limit near 40,000 round trips/s
_receive_buffer = bytearray(RECV_SIZE)
_receive_view = memoryview(_receive_buffer)
#: the most messages ``PacedPublisher`` puts in one MPUB
MAX_BATCH = 1000

_unpack_header = struct.Struct(">ii").unpack_from
_unpack_q = struct.Struct(">q").unpack_from
_pack_q = struct.Struct(">q").pack_into
_monotonic = time.monotonic
_monotonic_ns = time.monotonic_ns


class LoadError(Exception):
    """The server answered with an error frame or closed a connection during a run."""


def connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def receive(sock: socket.socket) -> bytes:
    """What one read of ``sock`` brings (b"" at EOF), up to ``RECV_SIZE`` bytes."""
    return bytes(_receive_view[: sock.recv_into(_receive_buffer)])


def _read_frame_blocking(sock: socket.socket, buffer: bytearray) -> tuple[int, bytes]:
    """One frame read with blocking calls (connection setup only)."""
    while True:
        if len(buffer) >= 8:
            size, frame_type = _unpack_header(buffer)
            if len(buffer) >= 4 + size:
                data = bytes(buffer[8 : 4 + size])
                del buffer[: 4 + size]
                if frame_type == 0 and data == HEARTBEAT:
                    sock.sendall(NOP)
                    continue
                return frame_type, data
        chunk = receive(sock)
        if not chunk:
            raise LoadError("connection closed during setup")
        buffer += chunk


class Role:
    """One connection's behaviour. ``counter`` is what the role measures (messages acknowledged or
    received); ``done`` tells the loop it has nothing more to do."""

    sock: socket.socket
    counter = 0
    done = False

    def __init__(self) -> None:
        self._pending = b""
        self._loop: _Loop | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def start(self, now: float) -> None:
        """Called once when the run starts (send the first frames)."""

    def on_readable(self) -> None:
        raise NotImplementedError

    def on_timer(self, now: float) -> float | None:
        """For roles that act on time: act, and return when to be called again (None: never)."""
        return None

    def stop_sending(self) -> None:
        """The window is over: send nothing new (replies to what is in flight still count)."""

    # -- non-blocking writes ------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        if self._pending:
            self._pending += data
            return
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            self._pending = data[sent:]
            self._loop.want_write(self, True)

    def on_writable(self) -> None:
        data = self._pending
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            return
        self._pending = data[sent:]
        if not self._pending:
            self._loop.want_write(self, False)

    def receive_into(self) -> int:
        """One read into the process's receive buffer: its size, or -1 when there was nothing to read. End of
        input and a lost connection raise ``LoadError``."""
        try:
            size = self.sock.recv_into(_receive_buffer)
        except BlockingIOError:
            return -1
        except ConnectionError as exc:
            raise LoadError(f"connection lost: {exc}") from None
        if not size:
            raise LoadError("connection closed by the server")
        return size

    def receive(self) -> bytes:
        """What one read brings, copied out of the receive buffer (b"": nothing to read)."""
        size = self.receive_into()
        return bytes(_receive_view[:size]) if size > 0 else b""


def _parse_replies(data: bytes, role: Role) -> tuple[int, bytes]:
    """Count the OK frames in ``data`` (answering heartbeats); returns (count, unparsed tail)."""
    n = len(data)
    if n % 10 == 0 and data.count(OK_FRAME) * 10 == n:
        return n // 10, b""
    pos = 0
    oks = 0
    while n - pos >= 8:
        size, frame_type = _unpack_header(data, pos)
        end = pos + 4 + size
        if end > n:
            break
        payload = data[pos + 8 : end]
        if frame_type == 0:
            if payload == b"OK":
                oks += 1
            elif payload == HEARTBEAT:
                role.send(NOP)
        else:
            raise LoadError(f"unexpected frame type {frame_type}: {payload[:200]!r}")
        pos = end
    return oks, data[pos:]


class Publisher(Role):
    """Keeps ``outstanding`` copies of one pre-encoded frame in flight on one connection.

    Each OK is answered with the next frame; ``counter`` counts acknowledged messages
    (``messages_per_frame`` per OK). ``frames`` bounds the number of frames sent (None: until the
    window ends)."""

    def __init__(
        self, address, frame: bytes, messages_per_frame: int = 1, outstanding: int = 1, frames: int | None = None
    ) -> None:
        super().__init__()
        self.sock = connect(address)
        self.sock.sendall(MAGIC_V2)
        self.frame = frame
        self.messages_per_frame = messages_per_frame
        self.outstanding = outstanding
        self.remaining = frames
        self.in_flight = 0
        self.sending = True
        self._tail = b""
        self._batches = {k: frame * k for k in range(1, outstanding + 1)}

    def _send_frames(self, k: int) -> None:
        if self.remaining is not None:
            k = min(k, self.remaining)
            self.remaining -= k
            if self.remaining == 0:
                self.sending = False
        if k > 0:
            self.in_flight += k
            self.send(self._batches.get(k) or self.frame * k)

    def start(self, now: float) -> None:
        self._send_frames(self.outstanding)

    def stop_sending(self) -> None:
        self.sending = False

    def on_readable(self) -> None:
        if not self._tail and not self._pending and self.sending and self.remaining is None:
            # the round trip of one PUB at a time: a read of one OK frame, answered with the next frame, with no
            # copy of the read and no parse (about 0.5 us less of this process's CPU per round trip)
            size = self.receive_into()
            if size < 0:
                return
            if size == 10 and _receive_buffer.startswith(OK_FRAME):
                self.counter += self.messages_per_frame
                self.send(self.frame)
                return
            data = bytes(_receive_view[:size])
        else:
            data = self.receive()
            if not data:
                return
            if self._tail:
                data = self._tail + data
        oks, self._tail = _parse_replies(data, self)
        if oks:
            self.in_flight -= oks
            self.counter += oks * self.messages_per_frame
            if self.sending:
                self._send_frames(oks)
            elif self.in_flight <= 0:
                self.done = True


def stamped_body(size: int) -> bytearray:
    """A body whose first 8 bytes will hold the send time (``time.monotonic_ns``)."""
    return bytearray(b"\0" * 8 + b"l" * max(size - 8, 0))


class PacedPublisher(Role):
    """Publishes at a fixed rate: every ``tick`` seconds, the messages due so far as one MPUB (or
    one PUB), each body stamped with ``time.monotonic_ns()`` just before the send. Replies are
    only counted (publishing is pipelined, never waits for them). With ``ok_latency``, the time from each
    frame's send to its OK is recorded (``latencies``, ns, while ``recording`` is on): publish-to-OK latency."""

    def __init__(
        self, address, topic: str, rate: float, body_size: int = 200, tick: float = 0.001, ok_latency: bool = False
    ) -> None:
        super().__init__()
        self.latency = ok_latency
        self.latencies: list[int] = []
        self.recording = False
        self._sent_at: deque[int] = deque()  # send time of each frame not yet answered (ok_latency)
        self.sock = connect(address)
        self.sock.sendall(MAGIC_V2)
        self.topic = topic
        self.rate = rate
        self.tick = tick
        self.body = stamped_body(body_size)
        self.sent = 0
        self.sending = True
        self._start = 0.0
        self._tail = b""
        self.acked = 0

    def start(self, now: float) -> None:
        self._start = now

    def stop_sending(self) -> None:
        self.sending = False

    def on_timer(self, now: float) -> float | None:
        if not self.sending:
            return None
        due = int((now - self._start) * self.rate) - self.sent
        if due > 0:
            body = self.body
            stamp = _monotonic_ns()
            _pack_q(body, 0, stamp)
            frozen = bytes(body)
            if due == 1:
                self.send(encode_pub(self.topic, frozen))
                frame_count = 1
            else:
                # after a stall of this process the backlog may be large: MPUBs of at most
                # MAX_BATCH messages keep each one far below nsqd's --max-body-size
                frames = []
                for start in range(0, due, MAX_BATCH):
                    frames.append(encode_mpub(self.topic, [frozen] * min(MAX_BATCH, due - start)))
                self.send(b"".join(frames))
                frame_count = len(frames)
            if self.latency:
                self._sent_at.extend([stamp] * frame_count)
            self.sent += due
            self.counter = self.sent
        return now + self.tick

    def on_readable(self) -> None:
        data = self.receive()
        if not data:
            return
        if self._tail:
            data = self._tail + data
        oks, self._tail = _parse_replies(data, self)
        self.acked += oks
        if self.latency and oks:
            now_ns = _monotonic_ns()
            sent_at = self._sent_at
            for _ in range(min(oks, len(sent_at))):
                stamp = sent_at.popleft()
                if self.recording:
                    self.latencies.append(now_ns - stamp)


class Consumer(Role):
    """A subscribed connection that FINs every message of a read with one write.

    ``counter`` counts messages received. With ``latency`` set, each body's first 8 bytes are
    read as the ``time.monotonic_ns()`` of its publication and the delay to the read is recorded
    (in ``latencies``, nanoseconds) while ``recording`` is on. ``idle_stop`` ends the role when no
    message arrived for that many seconds after the first one (draining a backlog)."""

    def __init__(
        self,
        address,
        topic: str,
        channel: str,
        rdy: int,
        *,
        identify: dict | None = None,
        latency: bool = False,
        idle_stop: float | None = None,
        fin: bool = True,
    ) -> None:
        super().__init__()
        self.sock = connect(address)
        self.topic = topic
        self.channel = channel
        self.rdy = rdy
        self.latency = latency
        self.idle_stop = idle_stop
        self.fin = fin
        self.latencies: list[int] = []
        self.recording = False
        self.first_at = 0.0
        self.last_at = 0.0
        self.bytes = 0
        self._tail = b""
        buffer = bytearray()
        setup = MAGIC_V2
        if identify is not None:
            self.sock.sendall(setup + encode_identify(identify))
            setup = b""
            frame_type, data = _read_frame_blocking(self.sock, buffer)
            if frame_type != 0:
                raise LoadError(f"IDENTIFY failed: {data!r}")
        self.sock.sendall(setup + encode_sub(topic, channel))
        frame_type, data = _read_frame_blocking(self.sock, buffer)
        if frame_type != 0 or data != b"OK":
            raise LoadError(f"SUB failed: {data!r}")
        self._tail = bytes(buffer)

    def start(self, now: float) -> None:
        if self.rdy:
            self.send(encode_rdy(self.rdy))

    def set_ready(self, count: int) -> None:
        self.rdy = count
        self.send(encode_rdy(count))

    def on_readable(self) -> None:
        data = self.receive()
        if not data:
            return
        now_ns = _monotonic_ns() if self.latency else 0
        if self._tail:
            data = self._tail + data
        n = len(data)
        pos = 0
        ids = []
        append = ids.append
        record = self.latency and self.recording
        latencies = self.latencies
        while n - pos >= 8:
            size, frame_type = _unpack_header(data, pos)
            end = pos + 4 + size
            if end > n:
                break
            if frame_type == 2:
                append(data[pos + 18 : pos + 34])
                if record:
                    latencies.append(now_ns - _unpack_q(data, pos + 34)[0])
            elif frame_type == 0:
                if data[pos + 8 : end] == HEARTBEAT:
                    self.send(NOP)
            else:
                raise LoadError(f"error frame: {data[pos + 8 : end][:200]!r}")
            pos = end
        self._tail = data[pos:]
        if ids:
            now = _monotonic()
            if not self.counter:
                self.first_at = now
            self.last_at = now
            self.counter += len(ids)
            self.bytes += n - len(self._tail)
            if self.fin:
                self.send(b"FIN " + b"\nFIN ".join(ids) + b"\n")

    def on_timer(self, now: float) -> float | None:
        if self.idle_stop is None:
            return None
        if self.counter and now - self.last_at >= self.idle_stop:
            self.done = True
            return None
        return now + self.idle_stop / 4


class HttpPublisher(Role):
    """Keeps ``outstanding`` copies of one pre-encoded HTTP/1.1 keep-alive request in flight and
    counts the 200 responses (``messages_per_request`` messages each)."""

    def __init__(self, address, request: bytes, messages_per_request: int = 1, outstanding: int = 1) -> None:
        super().__init__()
        self.sock = connect(address)
        self.request = request
        self.messages_per_request = messages_per_request
        self.outstanding = outstanding
        self.in_flight = 0
        self.sending = True
        self._buffer = b""

    def start(self, now: float) -> None:
        self.in_flight = self.outstanding
        self.send(self.request * self.outstanding)

    def stop_sending(self) -> None:
        self.sending = False

    def on_readable(self) -> None:
        data = self.receive()
        if not data:
            return
        buf = self._buffer + data if self._buffer else data
        pos = 0
        done = 0
        while True:
            head_end = buf.find(b"\r\n\r\n", pos)
            if head_end < 0:
                break
            if not buf.startswith(b"HTTP/1.1 200", pos):
                raise LoadError(f"HTTP error: {buf[pos : pos + 300]!r}")
            start = buf.find(b"\r\ncontent-length:", pos, head_end)
            if start < 0:
                start = buf.find(b"\r\nContent-Length:", pos, head_end)
            length = 0
            if start >= 0:
                line_end = buf.find(b"\r\n", start + 2)
                length = int(buf[start + 17 : line_end])
            end = head_end + 4 + length
            if end > len(buf):
                break
            pos = end
            done += 1
        self._buffer = buf[pos:]
        if done:
            self.in_flight -= done
            self.counter += done * self.messages_per_request
            if self.sending:
                self.in_flight += done
                self.send(self.request * done)
            elif self.in_flight <= 0:
                self.done = True


class _Loop:
    def __init__(self, roles: list[Role]) -> None:
        self.epoll = select.epoll()
        self.roles = {role.fileno(): role for role in roles}
        for role in roles:
            role.sock.setblocking(False)
            role._loop = self
            self.epoll.register(role.fileno(), select.EPOLLIN)

    def want_write(self, role: Role, on: bool) -> None:
        mask = select.EPOLLIN | (select.EPOLLOUT if on else 0)
        self.epoll.modify(role.fileno(), mask)


def run_roles(
    roles: list[Role],
    *,
    start_at: float,
    warm_at: float,
    end_at: float,
    hard_end_at: float | None = None,
    until_done: bool = False,
) -> dict:
    """Drive ``roles`` from ``start_at`` (sleeping until then) and return the counters.

    The window is [warm_at, end_at] (``time.monotonic``): ``window_counts`` are the counters'
    increase over it. At ``end_at`` roles stop sending; with ``until_done`` the loop then goes on
    until every role is done or ``hard_end_at``, otherwise it waits at most 1 s for the replies in
    flight. ``cpu_seconds`` is this process's user + system time over the window.
    """
    loop = _Loop(roles)
    delay = start_at - _monotonic()
    if delay > 0:
        time.sleep(delay)
    now = _monotonic()
    timers: dict[Role, float] = {}
    for role in roles:
        role.start(now)
        when = role.on_timer(now)
        if when is not None:
            timers[role] = when
    poll = loop.epoll.poll
    by_fd = loop.roles
    warm_counts = None
    end_counts = None
    cpu_start = cpu_end = None
    stop_at = hard_end_at if hard_end_at is not None else end_at + 1.0
    while True:
        now = _monotonic()
        if warm_counts is None and now >= warm_at:
            warm_counts = [role.counter for role in roles]
            cpu_start = os.times()
            for role in roles:
                if hasattr(role, "recording"):
                    role.recording = True
        if end_counts is None and now >= end_at:
            end_counts = [role.counter for role in roles]
            cpu_end = os.times()
            if warm_counts is None:
                warm_counts = [0] * len(roles)
                cpu_start = cpu_end
            for role in roles:
                role.stop_sending()
                if hasattr(role, "recording"):
                    role.recording = False
            if not until_done:
                stop_at = min(stop_at, now + 1.0)
        if now >= stop_at or all(role.done for role in roles):
            break
        timeout = stop_at - now
        if end_counts is None:
            timeout = min(timeout, end_at - now)
        if warm_counts is None:
            timeout = min(timeout, warm_at - now)
        if timers:
            next_timer = min(timers.values())
            if next_timer <= now:
                for role, when in list(timers.items()):
                    if when <= now:
                        again = role.on_timer(now)
                        if again is None:
                            del timers[role]
                        else:
                            timers[role] = again
                continue
            timeout = min(timeout, next_timer - now)
        try:
            events = poll(max(timeout, 0.0))
        except InterruptedError:
            continue
        for fd, mask in events:
            role = by_fd[fd]
            if mask & select.EPOLLOUT:
                role.on_writable()
            if mask & (select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP):
                role.on_readable()
    if end_counts is None:
        end_counts = [role.counter for role in roles]
        cpu_end = os.times()
        if warm_counts is None:
            warm_counts = [0] * len(roles)
            cpu_start = cpu_end
    loop.epoll.close()
    cpu = (cpu_end.user + cpu_end.system) - (cpu_start.user + cpu_start.system)
    return {
        "window_counts": [b - a for a, b in zip(warm_counts, end_counts, strict=True)],
        "final_counts": [role.counter for role in roles],
        "cpu_seconds": cpu,
    }


def close_all(roles: list[Role]) -> None:
    for role in roles:
        try:
            role.sock.close()
        except OSError as exc:  # pragma: no cover - closing never matters here
            if exc.errno != errno.EBADF:
                raise


_ROLE_KINDS = {"pub": Publisher, "sub": Consumer, "paced": PacedPublisher, "http": HttpPublisher}


def build_roles(specs: list[tuple[str, int, dict]]) -> list[Role]:
    """Roles from ``(kind, count, kwargs)`` triples; kinds: ``pub``, ``sub``, ``paced``, ``http``.
    (Module level so generator processes can be given it by name.)"""
    roles: list[Role] = []
    for kind, count, kwargs in specs:
        cls = _ROLE_KINDS[kind]
        roles.extend(cls(**kwargs) for _ in range(count))
    return roles
