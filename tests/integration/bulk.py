"""Load helpers for the volume and fairness tests: a pipelined MPUB publisher and fast trio consumers.

The consumers are built so that the test process is never the bottleneck: each read parses every complete frame
in the receive buffer and answers all of that read's messages with one joined write of FIN lines.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from tests.integration.harness import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    NOP,
    RawClient,
    identify,
    mpub,
    rdy,
    sub,
)


def publish_bulk(address, topic: str, bodies: list[bytes], batch_size: int = 1000, window: int = 8) -> None:
    """MPUB `bodies` in batches with up to `window` batches awaiting their OK (synchronous; run it in a thread)."""
    with RawClient(address, timeout=60) as client:
        outstanding = 0
        for start in range(0, len(bodies), batch_size):
            client.send(mpub(topic, bodies[start : start + batch_size]))
            outstanding += 1
            if outstanding >= window:
                client.expect_ok(60)
                outstanding -= 1
        for _ in range(outstanding):
            client.expect_ok(60)


@dataclass
class FastConsumer:
    """One subscribed connection that FINs every message as soon as a read delivers it.

    `on_message(consumer, body)` is called for every message; `errors` collects error frames (never expected).
    """

    address: tuple[str, int]
    topic: str
    channel: str
    on_message: Callable[[FastConsumer, bytes], None]
    identify_fields: dict | None = None
    received: int = 0
    errors: list[bytes] = field(default_factory=list)
    last_message_at: float = 0.0
    stream: trio.SocketStream | None = None
    _buffer: bytearray = field(default_factory=bytearray)
    _send_lock: trio.Lock = field(default_factory=trio.Lock)

    async def connect(self) -> None:
        """Connect, IDENTIFY (if asked) and SUB with RDY 0; `set_ready` starts the flow."""
        self.stream = await trio.open_tcp_stream(*self.address)
        await self.stream.send_all(MAGIC_V2)
        if self.identify_fields is not None:
            await self.stream.send_all(identify(self.identify_fields))
            await self._expect_response()
        await self.stream.send_all(sub(self.topic, self.channel))
        response = await self._expect_response()
        assert response == b"OK", f"SUB {self.topic} {self.channel} answered {response!r}"

    async def _expect_response(self) -> bytes:
        with trio.fail_after(20):
            while True:
                frame = self._next_frame()
                if frame is None:
                    chunk = await self.stream.receive_some(65536)
                    if not chunk:
                        raise AssertionError("connection closed during the handshake")
                    self._buffer += chunk
                    continue
                frame_type, data = frame
                if frame_type == FRAME_TYPE_RESPONSE and data == HEARTBEAT:
                    await self.stream.send_all(NOP)
                    continue
                assert frame_type == FRAME_TYPE_RESPONSE, f"handshake got frame type {frame_type}: {data!r}"
                return data

    def _next_frame(self) -> tuple[int, bytes] | None:
        buffer = self._buffer
        if len(buffer) < 8:
            return None
        (size,) = struct.unpack_from(">i", buffer)
        if len(buffer) < 4 + size:
            return None
        (frame_type,) = struct.unpack_from(">i", buffer, 4)
        data = bytes(buffer[8 : 4 + size])
        del buffer[: 4 + size]
        return frame_type, data

    async def set_ready(self, count: int) -> None:
        async with self._send_lock:  # `run` may be sending FINs on the same stream
            await self.stream.send_all(rdy(count))

    async def run(self) -> None:
        """Receive, record and FIN until cancelled or the server closes the connection."""
        stream = self.stream
        buffer = self._buffer
        unpack_from = struct.unpack_from
        while True:
            chunk = await stream.receive_some(262144)
            if not chunk:
                raise AssertionError(f"nsqd closed consumer {self.topic}/{self.channel}; errors: {self.errors}")
            buffer += chunk
            replies = []
            offset = 0
            end = len(buffer)
            while end - offset >= 8:
                size, frame_type = unpack_from(">ii", buffer, offset)
                if end - offset - 4 < size:
                    break
                start = offset + 8
                stop = offset + 4 + size
                if frame_type == FRAME_TYPE_MESSAGE:
                    replies.append(b"FIN " + bytes(buffer[start + 10 : start + 26]) + b"\n")
                    self.received += 1
                    self.on_message(self, bytes(buffer[start + 26 : stop]))
                elif frame_type == FRAME_TYPE_RESPONSE:
                    if buffer[start:stop] == HEARTBEAT:
                        replies.append(NOP)
                elif frame_type == FRAME_TYPE_ERROR:
                    self.errors.append(bytes(buffer[start:stop]))
                offset = stop
            del buffer[:offset]
            if replies:
                self.last_message_at = trio.current_time()
                async with self._send_lock:
                    await stream.send_all(b"".join(replies))

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


async def stats_json(http_address, topic: str) -> dict | None:
    """GET /stats?format=json for one topic over a raw trio connection; None if the endpoint is not there (yet)."""
    if http_address is None:
        return None
    stream = await trio.open_tcp_stream(*http_address)
    async with stream:
        request = (f"GET /stats?format=json&topic={topic} HTTP/1.1\r\nHost: nsqd\r\nConnection: close\r\n\r\n").encode()
        await stream.send_all(request)
        chunks = []
        with trio.fail_after(20):
            while chunk := await stream.receive_some(65536):
                chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status != 200:
        return None
    if b"chunked" in head.lower():
        body = _dechunk(body)
    return json.loads(body)


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        line, _, rest = body.partition(b"\r\n")
        length = int(line.split(b";")[0], 16)
        if length == 0:
            break
        out += rest[:length]
        body = rest[length + 2 :]
    return bytes(out)
