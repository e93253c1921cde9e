"""Feeding helpers shared by the codec tests: every case is fed whole, one byte at a time, and
followed by more bytes, as h11's tests do."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

WHOLE = "whole"
BYTEWISE = "bytewise"
MODES = (WHOLE, BYTEWISE)


def pieces(data: bytes, mode: str) -> Iterator[bytes]:
    if mode == WHOLE:
        yield data
    else:
        for i in range(len(data)):
            yield data[i : i + 1]


def run(decoder: Any, next_item: Callable[[], Any], data: bytes, mode: str) -> list[Any]:
    """Feed ``data`` in the given mode, draining ``next_item`` after every piece."""
    out: list[Any] = []
    for piece in pieces(data, mode):
        decoder.receive_data(piece)
        while (item := next_item()) is not None:
            out.append(item)
    return out
