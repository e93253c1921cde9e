"""Stream codecs for the compression upgrades of a V2 connection: snappy framing format and raw DEFLATE.

Both work on whatever bytes one write or one read carries: an encoder turns the bytes of a whole
flush into one piece of the compressed stream (the peer can decode everything sent so far), a
decoder takes one receive buffer and returns every byte it completes. Nothing here runs per message.

Snappy framing format (the stream NSQ clients speak after ``"snappy": true``)::

    chunk = [type: 1 byte][length: 3 bytes little-endian][data: length bytes]

- ``0xff`` stream identifier, data ``sNaPpY``: must be the first chunk; may be repeated later
  (clients that start a new compressor per write send it again).
- ``0x00`` compressed data: ``[masked CRC-32C: 4 bytes LE][snappy block]``;
  ``0x01`` uncompressed data: ``[masked CRC-32C: 4 bytes LE][bytes]``. Either carries at most
  65536 uncompressed bytes; the checksum covers the uncompressed bytes and is masked as
  ``rotate_right(crc, 15) + 0xa282ead8`` (mod 2**32).
- ``0x02``-``0x7f`` are reserved and unskippable (an error); ``0x80``-``0xfe`` (0xfe = padding)
  are skipped.

The encoder writes the stream identifier once, then one chunk per 64 KiB of input; a block is
sent compressed only when that saves at least an eighth of it (so short writes, such as the ``OK``
that confirms the upgrade, travel as uncompressed chunks), like the Go implementation NSQ uses.

Raw DEFLATE (``"deflate": true``): RFC 1951 without zlib or gzip framing (``wbits=-15``). Every
encoded write ends with a sync flush (``Z_SYNC_FLUSH``: an empty stored block, ``00 00 ff ff``),
so the peer can inflate all of it at once; a plain ``flush()`` would end the stream instead.
A decoder bounds what one call returns (``max_output``) so a small input that inflates enormously
is handed out in pieces: call ``decode(b"")`` while ``has_more`` is true.

Corrupt input (unknown unskippable chunk, bad checksum, oversized chunk, a block that does not
decode, a missing stream identifier, a DEFLATE stream that does not inflate) raises
``CompressionError``, and the decoder keeps raising it: the stream cannot be resynchronised.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import google_crc32c

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "CompressionError",
    "DeflateDecoder",
    "DeflateEncoder",
    "SnappyDecoder",
    "SnappyEncoder",
    "masked_crc32c",
]

SNAPPY_STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
_IDENTIFIER_DATA = b"sNaPpY"
_CHUNK_COMPRESSED = 0x00
_CHUNK_UNCOMPRESSED = 0x01
_CHUNK_IDENTIFIER = 0xFF
_MAX_BLOCK_SIZE = 65536
# The largest snappy encoding of a 64 KiB block (32 + n + n/6) plus the checksum.
_MAX_COMPRESSED_CHUNK = 32 + _MAX_BLOCK_SIZE + _MAX_BLOCK_SIZE // 6 + 4
_MIN_COMPRESSIBLE = 17  # shorter blocks are always sent uncompressed
_CRC_MASK_DELTA = 0xA282EAD8

DEFAULT_MAX_OUTPUT = 1 << 20

_pack_crc = struct.Struct("<I").pack
_unpack_crc = struct.Struct("<I").unpack_from
_crc32c = google_crc32c.value
_compress_block = cramjam.snappy.compress_raw
_decompress_block = cramjam.snappy.decompress_raw
_decompressed_length = cramjam.snappy.decompress_raw_len


class CompressionError(ValueError):
    """The compressed stream is corrupt; the connection carrying it must be closed."""


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C of ``data`` masked as the snappy framing format stores it."""
    crc: int = _crc32c(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _CRC_MASK_DELTA) & 0xFFFFFFFF


def _chunk_header(chunk_type: int, length: int) -> bytes:
    return bytes((chunk_type, length & 0xFF, (length >> 8) & 0xFF, length >> 16))


# -- snappy ----------------------------------------------------------------------------------------


class SnappyEncoder:
    """Bytes of one flush in, one piece of the framing-format stream out."""

    __slots__ = ("_started",)

    def __init__(self) -> None:
        self._started = False

    def encode(self, data: bytes) -> bytes:
        out: list[bytes] = []
        if not self._started:
            self._started = True
            out.append(SNAPPY_STREAM_IDENTIFIER)
        if type(data) is not bytes:
            data = bytes(data)
        for start in range(0, len(data), _MAX_BLOCK_SIZE):
            block = data if len(data) <= _MAX_BLOCK_SIZE else data[start : start + _MAX_BLOCK_SIZE]
            crc = _pack_crc(masked_crc32c(block))
            size = len(block)
            if size >= _MIN_COMPRESSIBLE:
                compressed = _compress_block(block)
                if len(compressed) < size - size // 8:
                    out.append(_chunk_header(_CHUNK_COMPRESSED, len(compressed) + 4))
                    out.append(crc)
                    out.append(bytes(compressed))
                    continue
            out.append(_chunk_header(_CHUNK_UNCOMPRESSED, size + 4))
            out.append(crc)
            out.append(bytes(block))
        return b"".join(out)


class SnappyDecoder:
    """One receive buffer of the framing-format stream in, the bytes of every completed chunk out.

    A chunk that is still incomplete stays buffered; while its length is known, arriving pieces
    are only queued and joined once it can be completed, so a chunk is not recopied per read.
    """

    __slots__ = ("_buf", "_pos", "_queued", "_queued_len", "_need", "_identified", "_error")

    has_more = False  # every completed chunk is returned at once (64 KiB each at most)
    finished = False  # the framing format has no end marker

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0
        self._queued: list[bytes] = []
        self._queued_len = 0
        self._need = 0
        self._identified = False
        self._error: CompressionError | None = None

    def buffered_size(self) -> int:
        """Bytes of an incomplete chunk held back (a stream cut here ends mid-chunk)."""
        return len(self._buf) - self._pos + self._queued_len

    def decode(self, data: bytes | bytearray) -> bytes:
        if self._error is not None:
            raise self._error
        if data:
            if self._need and self.buffered_size() + len(data) < self._need:
                self._queued.append(bytes(data))
                self._queued_len += len(data)
                return b""
            if self._queued or self._pos < len(self._buf):
                self._buf = b"".join([self._buf[self._pos :], *self._queued, data])
            else:
                self._buf = bytes(data)
            self._pos = 0
            self._queued.clear()
            self._queued_len = 0
            self._need = 0
        try:
            return self._decode_chunks()
        except CompressionError as error:
            self._error = error
            raise

    def _decode_chunks(self) -> bytes:
        buf = self._buf
        pos = self._pos
        end = len(buf)
        out: list[bytes] = []
        while end - pos >= 4:
            chunk_type = buf[pos]
            length = buf[pos + 1] | (buf[pos + 2] << 8) | (buf[pos + 3] << 16)
            if not self._identified and chunk_type != _CHUNK_IDENTIFIER:
                raise CompressionError(
                    f"snappy stream does not start with a stream identifier (chunk 0x{chunk_type:02x})"
                )
            if chunk_type <= _CHUNK_UNCOMPRESSED:
                limit = _MAX_COMPRESSED_CHUNK if chunk_type == _CHUNK_COMPRESSED else _MAX_BLOCK_SIZE + 4
                if length < 4 or length > limit:
                    raise CompressionError(f"snappy chunk 0x{chunk_type:02x} has an invalid length {length}")
            elif chunk_type < 0x80:
                raise CompressionError(f"snappy reserved unskippable chunk type 0x{chunk_type:02x}")
            elif chunk_type == _CHUNK_IDENTIFIER and length != len(_IDENTIFIER_DATA):
                raise CompressionError(f"snappy stream identifier chunk has length {length}")
            stop = pos + 4 + length
            if stop > end:
                self._need = 4 + length
                break
            if chunk_type == _CHUNK_COMPRESSED:
                block = buf[pos + 8 : stop]
                try:
                    if _decompressed_length(block) > _MAX_BLOCK_SIZE:
                        raise CompressionError("snappy chunk decodes to more than 65536 bytes")
                    decoded = bytes(_decompress_block(block))
                except cramjam.DecompressionError as exc:
                    raise CompressionError(f"snappy block does not decode: {exc}") from None
                self._check_crc(buf, pos, decoded)
                out.append(decoded)
            elif chunk_type == _CHUNK_UNCOMPRESSED:
                decoded = buf[pos + 8 : stop]
                self._check_crc(buf, pos, decoded)
                out.append(decoded)
            elif chunk_type == _CHUNK_IDENTIFIER:
                if buf[pos + 4 : stop] != _IDENTIFIER_DATA:
                    raise CompressionError("snappy stream identifier is not sNaPpY")
                self._identified = True
            pos = stop
        self._pos = pos
        if pos == end:
            self._buf = b""
            self._pos = 0
        if len(out) == 1:
            return out[0]
        return b"".join(out)

    @staticmethod
    def _check_crc(buf: bytes, pos: int, decoded: bytes | bytearray | memoryview) -> None:
        expected = _unpack_crc(buf, pos + 4)[0]
        if masked_crc32c(decoded) != expected:
            raise CompressionError("snappy chunk checksum mismatch")


# -- deflate ---------------------------------------------------------------------------------------


class DeflateEncoder:
    """Bytes of one flush in, raw DEFLATE ending in a sync flush out."""

    __slots__ = ("_compressor", "level")

    def __init__(self, level: int = 6) -> None:
        self.level = level
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)

    def encode(self, data: bytes) -> bytes:
        compressor = self._compressor
        return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)


class DeflateDecoder:
    """Raw DEFLATE in, at most ``max_output`` inflated bytes per call out.

    ``has_more`` tells that input is left over because of the bound: call ``decode(b"")``.
    ``finished`` becomes true at the end of the stream's final block; bytes after it are ignored.
    """

    __slots__ = ("_decompressor", "_tail", "_error", "max_output", "finished")

    def __init__(self, max_output: int = DEFAULT_MAX_OUTPUT) -> None:
        self._decompressor = zlib.decompressobj(-zlib.MAX_WBITS)
        self._tail = b""
        self._error: CompressionError | None = None
        self.max_output = max_output
        self.finished = False

    @property
    def has_more(self) -> bool:
        return bool(self._tail) and not self.finished

    def decode(self, data: bytes | bytearray) -> bytes:
        if self._error is not None:
            raise self._error
        if self.finished:
            return b""
        if self._tail:
            data = self._tail + data if data else self._tail
        decompressor = self._decompressor
        try:
            out = decompressor.decompress(data, self.max_output)
        except zlib.error as exc:
            self._error = CompressionError(f"deflate stream does not inflate: {exc}")
            raise self._error from None
        self._tail = decompressor.unconsumed_tail
        if decompressor.eof:
            self.finished = True
            self._tail = b""
        return out
