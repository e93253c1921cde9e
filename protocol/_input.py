"""The input buffer shared by the incremental decoders (``CommandParser``, ``FrameDecoder``).

Unread bytes live in one immutable ``bytes`` (``_buf``) with a read offset (``_pos``), so a
parameter, a body or a frame is a single slice. While the decoder knows its pending step cannot
complete yet (``_need``: a byte count, or a decoder-specific marker), arriving data is only
queued in ``_chunks``; the queue is joined once the step can complete, so a large body is copied
a bounded number of times however the network splits it. The buffer is compacted only when data
arrives, never per decoded item.
"""

from __future__ import annotations

__all__ = ["InputBuffer"]


class InputBuffer:
    __slots__ = ("_buf", "_pos", "_chunks", "_chunks_len", "_need")

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0
        self._chunks: list[bytes] = []
        self._chunks_len = 0
        self._need = 0  # what the pending step needs (0: nothing known, every arrival is merged)

    def _still_incomplete(self, data: bytes, total: int) -> bool:
        """With ``data`` arrived (``total`` unread bytes in all), can the pending step still not complete?"""
        return total < self._need

    def receive_data(self, data: bytes | bytearray) -> None:
        if self._pos >= len(self._buf) and not self._chunks_len:
            # nothing unread (the common case: each read holds whole commands): the data becomes the buffer,
            # uncopied; ``_need`` counts from ``_pos`` and stays true
            if data:
                self._buf = bytes(data)
                self._pos = 0
            return
        if not data:
            return
        data = bytes(data)
        if self._need:
            total = len(self._buf) - self._pos + self._chunks_len + len(data)
            if self._still_incomplete(data, total):
                self._chunks.append(data)
                self._chunks_len += len(data)
                return
            self._chunks.append(data)
            self._buf = b"".join([self._buf[self._pos :], *self._chunks])
            self._chunks.clear()
            self._chunks_len = 0
            self._need = 0
        else:
            self._buf = self._buf[self._pos :] + data
        self._pos = 0

    def take_unparsed(self) -> bytes:
        """Remove and return the bytes not yet parsed: what follows the last decoded item belongs to
        whoever reads the stream next (a TLS or compression layer after IDENTIFY, or a serving loop
        that takes over from a handshake)."""
        rest = b"".join([self._buf[self._pos :], *self._chunks])
        self._buf = b""
        self._pos = 0
        self._chunks.clear()
        self._chunks_len = 0
        self._need = 0
        return rest
