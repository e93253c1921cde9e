"""The stream layers a V2 connection may add after IDENTIFY: TLS and compression.

``tcp.Connection`` reads with ``receive_some`` once per receive buffer and writes with one
``send_all`` per flush; these wrappers keep that shape, so compression runs once per flush and once
per receive buffer, never per message.

- ``PrefixedStream`` hands out bytes already read from the socket before reading it again: the
  parser may hold the start of the TLS handshake (or of the compressed stream) that arrived in the
  same receive buffer as IDENTIFY (``CommandParser.take_unparsed``).
- ``CompressedStream`` encodes each ``send_all`` with a ``protocol.compression`` encoder and decodes
  each receive buffer with its decoder; corrupt input raises ``CompressionError`` from
  ``receive_some`` (the connection is then closed).

TLS itself is ``trio.SSLStream`` over the raw (prefixed) socket stream; compression stacks on top.
Neither class is safe for two concurrent senders or two concurrent receivers (trio's rule for
streams); one sender and one receiver at a time is fine.
"""

from __future__ import annotations

import trio

from protocol.compression import CompressionError

__all__ = ["CompressedStream", "CompressionError", "PrefixedStream"]


class PrefixedStream(trio.abc.Stream):
    """``transport`` whose next reads first return ``prefix``."""

    def __init__(self, transport: trio.abc.Stream, prefix: bytes) -> None:
        self.transport = transport
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            if max_bytes is None or max_bytes >= len(self._prefix):
                data, self._prefix = self._prefix, b""
            else:
                data, self._prefix = self._prefix[:max_bytes], self._prefix[max_bytes:]
            return data
        return await self.transport.receive_some(max_bytes)

    async def send_all(self, data) -> None:
        await self.transport.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.transport.aclose()


class CompressedStream(trio.abc.Stream):
    """``transport`` with ``encoder`` applied to every write and ``decoder`` to every read.

    ``initial`` holds compressed bytes that were read before the switch. A read returns whatever
    one transport read decodes to (reads that complete no chunk are retried), so ``max_bytes``
    bounds the transport read, not the decoded size. End of the compressed stream (a DEFLATE final
    block) reads as end of file.
    """

    def __init__(self, transport: trio.abc.Stream, encoder, decoder, initial: bytes = b"") -> None:
        self.transport = transport
        self._encode = encoder.encode
        self._decoder = decoder
        self._initial = initial

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        decoder = self._decoder
        if self._initial:
            data: bytes | bytearray = self._initial
            self._initial = b""
            out = decoder.decode(data)
            if out:
                await trio.lowlevel.checkpoint()
                return out
        while True:
            if decoder.has_more:
                out = decoder.decode(b"")
                if out:
                    await trio.lowlevel.checkpoint()
                    return out
                continue
            if decoder.finished:
                await trio.lowlevel.checkpoint()
                return b""
            data = await self.transport.receive_some(max_bytes)
            if not data:
                return b""
            out = decoder.decode(data)
            if out:
                return out

    async def send_all(self, data) -> None:
        await self.transport.send_all(self._encode(data))

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.transport.aclose()
