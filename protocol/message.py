"""The message encoding, shared by message frames and diskqueue records.

::

    offset  size  field
       0      8   timestamp   int64, nanoseconds since the Unix epoch (publish time)
       8      2   attempts    uint16, deliveries so far
      10     16   id          16 ASCII bytes, lowercase hex from nsqd
      26      N   body        opaque

All integers big-endian. A message frame is ``[int32 size = 30 + N][int32 type = 2]`` + the above.
"""

from __future__ import annotations

import binascii
import struct

from .errors import E_BAD_MESSAGE, ProtocolError

__all__ = [
    "MESSAGE_HEADER_SIZE",
    "MESSAGE_ID_LENGTH",
    "Message",
    "decode_message",
    "encode_message",
    "encode_message_frame",
    "message_id_from_int",
    "message_id_to_int",
]

MESSAGE_ID_LENGTH = 16
MESSAGE_HEADER_SIZE = 26

_HEADER = struct.Struct(">qH16s")
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from
# size, frame type 2, then the message header: one pack call per delivered message.
_pack_frame_header = struct.Struct(">iiqH16s").pack
_FRAME_OVERHEAD = 4 + MESSAGE_HEADER_SIZE  # the frame type field plus the message header
_FRAME_TYPE_MESSAGE = 2


class Message:
    """One message's wire fields. ``id`` must be 16 bytes (shorter ids are zero-padded by the
    encoders, longer ones truncated; nsqd's ids are always 16)."""

    __slots__ = ("id", "body", "timestamp", "attempts")

    def __init__(self, id: bytes, body: bytes, timestamp: int, attempts: int = 0) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(id={self.id!r}, body=<{len(self.body)} bytes>, "
            f"timestamp={self.timestamp}, attempts={self.attempts})"
        )


def encode_message(msg: Message) -> bytes:
    return _pack_header(msg.timestamp, msg.attempts, msg.id) + msg.body


def decode_message(data: bytes) -> Message:
    if len(data) < MESSAGE_HEADER_SIZE:
        raise ProtocolError(E_BAD_MESSAGE, f"invalid message buffer size ({len(data)})")
    timestamp, attempts, msg_id = _unpack_header(data)
    return Message(msg_id, bytes(data[MESSAGE_HEADER_SIZE:]), timestamp, attempts)


def encode_message_frame(msg: Message) -> bytes:
    """The whole frame of one delivery (the hot path: one pack, one concatenation)."""
    body = msg.body
    return (
        _pack_frame_header(len(body) + _FRAME_OVERHEAD, _FRAME_TYPE_MESSAGE, msg.timestamp, msg.attempts, msg.id) + body
    )


def message_id_from_int(n: int) -> bytes:
    """The 16-byte id of a 64-bit value: its 8 big-endian bytes in lowercase hex."""
    if not 0 <= n < 1 << 64:
        raise ValueError(f"message id value out of range: {n}")
    return b"%016x" % n


def message_id_to_int(b: bytes) -> int:
    """Inverse of ``message_id_from_int``; ValueError unless ``b`` is 16 hex digits."""
    if len(b) != MESSAGE_ID_LENGTH:
        raise ValueError(f"message id must be {MESSAGE_ID_LENGTH} bytes, got {len(b)}")
    try:
        return int.from_bytes(binascii.unhexlify(b), "big")
    except (binascii.Error, TypeError) as exc:
        raise ValueError(f"message id is not hexadecimal: {b!r}") from exc
