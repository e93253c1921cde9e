"""The stream layers of an upgraded connection, over trio's in-memory stream pairs."""

from __future__ import annotations

import zlib

import pytest
import snappy
import trio
import trio.testing

from nsqd.streams import CompressedStream, CompressionError, PrefixedStream
from protocol.compression import DeflateDecoder, DeflateEncoder, SnappyDecoder, SnappyEncoder


async def read_all(stream, size: int) -> bytes:
    data = b""
    with trio.fail_after(5):
        while len(data) < size:
            chunk = await stream.receive_some(65536)
            assert chunk, "unexpected end of stream"
            data += chunk
    return data


async def test_prefixed_stream_returns_the_prefix_first():
    left, right = trio.testing.memory_stream_pair()
    stream = PrefixedStream(right, b"early bytes ")
    await left.send_all(b"later bytes")
    assert await stream.receive_some(5) == b"early"
    assert await read_all(stream, len(b" bytes later bytes")) == b" bytes later bytes"
    await stream.send_all(b"reply")
    assert await left.receive_some(100) == b"reply"


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
async def test_compressed_stream_both_ways(codec):
    left, right = trio.testing.memory_stream_pair()
    if codec == "snappy":
        server = CompressedStream(right, SnappyEncoder(), SnappyDecoder())
        peer_encode = lambda data: snappy.StreamCompressor().add_chunk(data)  # noqa: E731
        peer_decoder = snappy.StreamDecompressor()
    else:
        server = CompressedStream(right, DeflateEncoder(6), DeflateDecoder())
        compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
        peer_encode = lambda data: compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)  # noqa: E731
        peer_decoder = zlib.decompressobj(-15)
    payload = b"".join(b"command %05d\n" % i for i in range(5000))
    wire = peer_encode(payload)
    for i in range(0, len(wire), 777):  # the peer's bytes arrive in arbitrary pieces
        await left.send_all(wire[i : i + 777])
    assert await read_all(server, len(payload)) == payload
    await server.send_all(b"answer one")
    await server.send_all(b"answer two")
    received = b""
    with trio.fail_after(5):
        while len(received) < 20:
            received += peer_decoder.decompress(await left.receive_some(65536))
    assert received == b"answer oneanswer two"


async def test_initial_bytes_belong_to_the_compressed_layer():
    left, right = trio.testing.memory_stream_pair()
    wire = snappy.StreamCompressor().add_chunk(b"PUB t\n")
    server = CompressedStream(right, SnappyEncoder(), SnappyDecoder(), initial=wire[:9])
    await left.send_all(wire[9:])
    assert await read_all(server, 6) == b"PUB t\n"


async def test_inflation_is_handed_out_in_bounded_reads():
    left, right = trio.testing.memory_stream_pair()
    server = CompressedStream(right, DeflateEncoder(), DeflateDecoder(max_output=65536))
    await left.send_all(DeflateEncoder(9).encode(b"\x00" * 1_000_000))
    sizes = []
    with trio.fail_after(5):
        while sum(sizes) < 1_000_000:
            sizes.append(len(await server.receive_some(65536)))
    assert max(sizes) <= 65536 and sum(sizes) == 1_000_000


async def test_corrupt_input_raises_compression_error():
    left, right = trio.testing.memory_stream_pair()
    server = CompressedStream(right, SnappyEncoder(), SnappyDecoder())
    await left.send_all(b"not snappy at all")
    with pytest.raises(CompressionError):
        with trio.fail_after(5):
            await server.receive_some(65536)


async def test_end_of_stream():
    left, right = trio.testing.memory_stream_pair()
    server = CompressedStream(right, DeflateEncoder(), DeflateDecoder())
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    await left.send_all(compressor.compress(b"bye") + compressor.flush())  # a final block ends the stream
    assert await server.receive_some(100) == b"bye"
    assert await server.receive_some(100) == b""
    await left.aclose()
    other = CompressedStream(trio.testing.memory_stream_pair()[1], SnappyEncoder(), SnappyDecoder())
    await other.transport.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await other.receive_some(100)
