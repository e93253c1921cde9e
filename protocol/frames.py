"""Server-to-client framing.

Every frame is ``[int32 size][int32 frame type][data]`` (big-endian) where ``size`` counts the
frame type and the data, so ``size = 4 + len(data)``. Types: 0 response, 1 error, 2 message.

``FrameDecoder`` is the client side (tests, benchmarks, the Spark connector): bytes in, frames out.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from ._input import InputBuffer
from .errors import E_BAD_PROTOCOL, ProtocolError

__all__ = [
    "CLOSE_WAIT_FRAME",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "HEARTBEAT_FRAME",
    "OK_FRAME",
    "Frame",
    "FrameDecoder",
    "encode_error_frame",
    "encode_frame",
]

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

_HEADER = struct.Struct(">ii")
_pack_header = _HEADER.pack
_unpack_int = struct.Struct(">i").unpack_from


def encode_frame(frame_type: int, data: bytes) -> bytes:
    return _pack_header(len(data) + 4, frame_type) + data


def encode_error_frame(error: ProtocolError) -> bytes:
    return encode_frame(FRAME_TYPE_ERROR, error.payload())


OK_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"OK")
HEARTBEAT_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")
CLOSE_WAIT_FRAME = encode_frame(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")


class Frame(NamedTuple):
    frame_type: int
    data: bytes


class FrameDecoder(InputBuffer):
    """Incremental frame reader: ``receive_data(bytes)`` then ``next_frame()`` until it returns None.

    Buffering: unread bytes live in one immutable ``bytes`` with a read offset, so frame data is
    a single slice. While a frame is known to be incomplete, arriving data is only queued; the
    queue is joined once the frame can be completed, so a large frame is copied a bounded number
    of times however it is split.

    A size field below 4 or above ``max_frame_size`` raises ``ProtocolError(E_BAD_PROTOCOL)``;
    the stream cannot be resynchronised after that.
    """

    __slots__ = ("_max_frame_size",)

    def __init__(self, max_frame_size: int = 64 * 1024 * 1024) -> None:
        super().__init__()  # _need: bytes after _pos the pending frame needs; 0 = unknown
        self._max_frame_size = max_frame_size

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None when more data is needed."""
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < 8:
            self._need = 8
            return None
        size = _unpack_int(buf, pos)[0]
        if size < 4 or size > self._max_frame_size:
            raise ProtocolError(E_BAD_PROTOCOL, f"invalid frame size {size}")
        end = pos + 4 + size
        if end > len(buf):
            self._need = 4 + size
            return None
        self._pos = end
        self._need = 0
        return Frame(_unpack_int(buf, pos + 4)[0], buf[pos + 8 : end])

    def buffered_size(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos + self._chunks_len
