"""Topic and channel names.

Rule (the same for both): 1 to 64 bytes matching ``[.a-zA-Z0-9_-]+`` with an optional
``#ephemeral`` suffix, which counts toward the length. ``#`` anywhere else is invalid.

Names arrive on the wire as bytes. They become ``str`` through ``decode_name`` (UTF-8 with
``surrogateescape``), so any byte sequence round-trips through ``encode_name`` and an odd byte
shows up in error texts as ``\\xNN``, the way Go's ``%q`` shows it.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = [
    "EPHEMERAL_SUFFIX",
    "MAX_NAME_LENGTH",
    "decode_name",
    "encode_name",
    "go_quote",
    "is_ephemeral",
    "is_valid_channel_name",
    "is_valid_name_bytes",
    "is_valid_topic_name",
]

MAX_NAME_LENGTH = 64
EPHEMERAL_SUFFIX = "#ephemeral"

# fullmatch, not ``$``: Python's ``$`` would also accept a name ending in "\n".
_NAME_STR = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral)?")
_NAME_BYTES = re.compile(rb"[.a-zA-Z0-9_-]+(?:#ephemeral)?")


def is_valid_topic_name(name: str) -> bool:
    return _is_valid(name)


def is_valid_channel_name(name: str) -> bool:
    return _is_valid(name)


def _is_valid(name: str) -> bool:
    # Any non-ASCII character is invalid, and for ASCII the length in characters is the length in bytes.
    return 0 < len(name) <= MAX_NAME_LENGTH and name.isascii() and _NAME_STR.fullmatch(name) is not None


def is_valid_name_bytes(name: bytes) -> bool:
    """The same rule on the raw wire bytes (used by the command parser without decoding)."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _NAME_BYTES.fullmatch(name) is not None


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL_SUFFIX)


def decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def encode_name(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


_SIMPLE_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
    '"': '\\"',
}


def _is_go_printable(ch: str) -> bool:
    # Go's unicode.IsPrint: letters, marks, numbers, punctuation, symbols, and the ASCII space only.
    return ch == " " or unicodedata.category(ch)[0] in "LMNPS"


def go_quote(s: str) -> str:
    """Quote like Go's ``%q`` of a string: double quotes, backslash escapes for the
    non-printable, ``\\xNN`` for bytes that are not valid UTF-8 (surrogate-escaped here)."""
    out = ['"']
    for ch in s:
        if ch in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[ch])
            continue
        cp = ord(ch)
        if 0xDC80 <= cp <= 0xDCFF:  # a raw byte kept by surrogateescape
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif 0xD800 <= cp <= 0xDFFF:  # any other lone surrogate is not a valid rune: Go writes U+FFFD
            out.append("\\ufffd")
        elif _is_go_printable(ch):
            out.append(ch)
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)
