"""The stream codecs of the compression upgrades: snappy framing format and raw DEFLATE.

One table of payloads (each a list of flushes) feeds the encoders; what they produce is checked by
independent decoders (cramjam's framing-format decoder, zlib) and by ours, fed whole, one byte at a
time, and followed by the start of the next flush.
"""

from __future__ import annotations

import random
import struct
import zlib

import cramjam
import pytest
import snappy

from protocol.compression import (
    CompressionError,
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
    masked_crc32c,
)
from protocol.frames import OK_FRAME

IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
_rng = random.Random(7)
RANDOM = bytes(_rng.getrandbits(8) for _ in range(70000))
TEXT = b"".join(b"message %06d: the quick brown fox\n" % i for i in range(6000))

# each case: the flushes one connection writes, in order
CASES = [
    pytest.param([b""], id="empty-flush"),
    pytest.param([OK_FRAME], id="ok-frame"),
    pytest.param([b"a" * 16], id="16-bytes-never-compressed"),
    pytest.param([b"a" * 17], id="17-bytes-compressible"),
    pytest.param([TEXT[:1000]], id="text-1k"),
    pytest.param([RANDOM[:1000]], id="random-1k"),
    pytest.param([TEXT[:65536]], id="exactly-one-block"),
    pytest.param([TEXT[:65537]], id="one-block-and-a-byte"),
    pytest.param([TEXT, RANDOM], id="large-text-then-random"),
    pytest.param([OK_FRAME, b"", TEXT[:5000], OK_FRAME * 50, RANDOM[:300]], id="many-flushes"),
]

FEED_MODES = ["whole", "bytewise", "trailing"]


def _feed(decoder, stream: bytes, mode: str) -> bytes:
    out = []
    if mode == "bytewise":
        for i in range(len(stream)):
            out.append(decoder.decode(stream[i : i + 1]))
    else:
        out.append(decoder.decode(stream))
    while decoder.has_more:
        out.append(decoder.decode(b""))
    return b"".join(out)


def _round_trip(encoder, decoder, flushes: list[bytes], mode: str) -> None:
    """Encode the flushes, decode them in ``mode``; "trailing" adds half of one more flush to the
    same buffer, which must not disturb what precedes it and must complete with its other half."""
    stream = b"".join(_encode_all(encoder, flushes))
    expected = b"".join(flushes)
    if mode != "trailing":
        assert _feed(decoder, stream, mode) == expected
        return
    extra = b"next flush " * 10
    tail = encoder.encode(extra)
    cut = max(1, len(tail) // 2)
    decoded = _feed(decoder, stream + tail[:cut], "whole")
    assert decoded.startswith(expected)  # deflate may already hand out part of the next flush
    decoded += _feed(decoder, tail[cut:], "whole")
    assert decoded == expected + extra


def _encode_all(encoder, flushes: list[bytes]) -> list[bytes]:
    return [encoder.encode(flush) for flush in flushes]


# -- snappy ---------------------------------------------------------------------------------------------


def test_masked_crc_matches_an_independent_encoder():
    # cramjam writes its own framing-format chunks; the CRC field of its first data chunk is ours to match
    for data in (b"OK", b"123456789", TEXT[:4000], RANDOM[:333]):
        stream = bytes(cramjam.snappy.compress(data))
        assert stream.startswith(IDENTIFIER)
        (crc,) = struct.unpack_from("<I", stream, len(IDENTIFIER) + 4)
        assert masked_crc32c(data) == crc


def test_snappy_ok_as_nsqd_sends_it_after_the_upgrade():
    wire = SnappyEncoder().encode(OK_FRAME)
    crc = struct.pack("<I", masked_crc32c(OK_FRAME))
    assert wire == IDENTIFIER + b"\x01\x0e\x00\x00" + crc + b"\x00\x00\x00\x06\x00\x00\x00\x00OK"


def test_snappy_identifier_only_once():
    encoder = SnappyEncoder()
    assert encoder.encode(b"") == IDENTIFIER
    assert not encoder.encode(OK_FRAME).startswith(IDENTIFIER)


def test_snappy_compresses_text_and_stores_random():
    text = SnappyEncoder().encode(TEXT[:65536])
    assert text[len(IDENTIFIER)] == 0x00 and len(text) < 20000
    noise = SnappyEncoder().encode(RANDOM[:1000])
    assert noise[len(IDENTIFIER)] == 0x01 and len(noise) == len(IDENTIFIER) + 8 + 1000


@pytest.mark.parametrize("flushes", CASES)
def test_snappy_encoder_output_decodes_independently(flushes):
    stream = b"".join(_encode_all(SnappyEncoder(), flushes))
    assert bytes(cramjam.snappy.decompress(stream)) == b"".join(flushes)


@pytest.mark.parametrize("mode", FEED_MODES)
@pytest.mark.parametrize("flushes", CASES)
def test_snappy_round_trip(flushes, mode):
    decoder = SnappyDecoder()
    _round_trip(SnappyEncoder(), decoder, flushes, mode)
    assert decoder.buffered_size() == 0


def test_snappy_incomplete_chunk_waits():
    stream = SnappyEncoder().encode(TEXT[:3000])
    decoder = SnappyDecoder()
    assert decoder.decode(stream[:-1]) == b""
    assert decoder.buffered_size() > 0
    assert decoder.decode(stream[-1:]) == TEXT[:3000]


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_snappy_decoder_reads_other_encoders(mode):
    # cramjam's stream, then python-snappy's "new compressor per write" (pynsq), which repeats the identifier
    stream = bytes(cramjam.snappy.compress(TEXT[:70000]))
    stream += snappy.StreamCompressor().add_chunk(b"second write")
    stream += snappy.StreamCompressor().add_chunk(RANDOM[:500])
    assert _feed(SnappyDecoder(), stream, mode) == TEXT[:70000] + b"second write" + RANDOM[:500]


def test_snappy_skips_padding_and_skippable_chunks():
    body = SnappyEncoder().encode(b"payload")
    stream = body[:10] + b"\xfe\x03\x00\x00\x00\x00\x00" + b"\x80\x01\x00\x00z" + body[10:]
    assert SnappyDecoder().decode(stream) == b"payload"


def _chunk(kind: int, data: bytes) -> bytes:
    return bytes((kind, len(data) & 0xFF, (len(data) >> 8) & 0xFF, len(data) >> 16)) + data


def _uncompressed(data: bytes, crc: int | None = None) -> bytes:
    return _chunk(0x01, struct.pack("<I", masked_crc32c(data) if crc is None else crc) + data)


BAD_SNAPPY = [
    pytest.param(IDENTIFIER + _uncompressed(b"hello", crc=1), "checksum", id="bad-crc"),
    pytest.param(
        IDENTIFIER + _chunk(0x00, struct.pack("<I", masked_crc32c(b"hi")) + b"\x0a\x01\x00"),
        "does not decode",
        id="corrupt-block",
    ),
    pytest.param(
        IDENTIFIER + _chunk(0x00, struct.pack("<I", 0) + bytes(cramjam.snappy.compress_raw(b"x" * 100))),
        "checksum",
        id="compressed-bad-crc",
    ),
    pytest.param(IDENTIFIER + _chunk(0x02, b"xx"), "unskippable", id="reserved-unskippable"),
    pytest.param(IDENTIFIER + _chunk(0x7F, b""), "unskippable", id="reserved-unskippable-7f"),
    pytest.param(_uncompressed(b"no identifier first"), "stream identifier", id="no-identifier"),
    pytest.param(_chunk(0xFF, b"SnApPy"), "not sNaPpY", id="wrong-identifier"),
    pytest.param(_chunk(0xFF, b"sNaPpYx"), "identifier", id="identifier-length"),
    pytest.param(IDENTIFIER + _chunk(0x01, b"abc"), "invalid length", id="chunk-shorter-than-crc"),
    pytest.param(IDENTIFIER + b"\x01\x05\x00\x01", "invalid length", id="uncompressed-over-64k"),
    pytest.param(IDENTIFIER + b"\x00\xff\xff\xff", "invalid length", id="compressed-oversized"),
]


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
@pytest.mark.parametrize("stream, reason", BAD_SNAPPY)
def test_snappy_corrupt_input(stream, reason, mode):
    decoder = SnappyDecoder()
    with pytest.raises(CompressionError, match=reason):
        _feed(decoder, stream, mode)
    with pytest.raises(CompressionError):  # the stream cannot be resynchronised
        decoder.decode(SnappyEncoder().encode(b"more"))


def test_snappy_block_decoding_to_more_than_64k_is_refused():
    data = b"z" * 70000
    block = bytes(cramjam.snappy.compress_raw(data))
    stream = IDENTIFIER + _chunk(0x00, struct.pack("<I", masked_crc32c(data)) + block)
    with pytest.raises(CompressionError, match="65536"):
        SnappyDecoder().decode(stream)


# -- deflate --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", range(1, 10))
@pytest.mark.parametrize("flushes", CASES)
def test_deflate_encoder_output_inflates_independently(flushes, level):
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    for flush, piece in zip(flushes, _encode_all(DeflateEncoder(level), flushes), strict=True):
        assert piece.endswith(b"\x00\x00\xff\xff"), "every flush ends with a sync flush"
        assert inflater.decompress(piece) == flush, "each flush inflates completely on its own"
    assert not inflater.eof, "the stream is never finished by a flush"


def test_deflate_ok_after_the_upgrade():
    wire = DeflateEncoder(6).encode(OK_FRAME)
    assert wire.endswith(b"\x00\x00\xff\xff")
    assert zlib.decompressobj(-15).decompress(wire) == OK_FRAME


def test_deflate_levels_change_the_output():
    assert len(DeflateEncoder(1).encode(TEXT)) > len(DeflateEncoder(9).encode(TEXT))


@pytest.mark.parametrize("mode", FEED_MODES)
@pytest.mark.parametrize("flushes", CASES)
def test_deflate_round_trip(flushes, mode):
    _round_trip(DeflateEncoder(6), DeflateDecoder(), flushes, mode)


def test_deflate_output_is_bounded_per_call():
    bomb = DeflateEncoder(9).encode(b"\x00" * 5_000_000)
    assert len(bomb) < 10000
    decoder = DeflateDecoder(max_output=65536)
    first = decoder.decode(bomb)
    assert len(first) == 65536 and decoder.has_more
    total = len(first)
    while decoder.has_more:
        piece = decoder.decode(b"")
        assert len(piece) <= 65536
        total += len(piece)
    assert total == 5_000_000


@pytest.mark.parametrize(
    "garbage",
    [b"\xff" * 64, b"\x07\x00\x00", b"\x00\x05\x00\x05\x00"],
    ids=["ones", "reserved-block-type", "bad-stored-length"],
)
def test_deflate_garbage(garbage):
    decoder = DeflateDecoder()
    with pytest.raises(CompressionError, match="does not inflate"):
        decoder.decode(garbage)
    with pytest.raises(CompressionError):
        decoder.decode(DeflateEncoder().encode(b"more"))


def test_deflate_final_block_finishes_the_stream():
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    stream = compressor.compress(b"last words") + compressor.flush()
    decoder = DeflateDecoder()
    assert decoder.decode(stream + b"ignored") == b"last words"
    assert decoder.finished and not decoder.has_more
    assert decoder.decode(b"more") == b""
