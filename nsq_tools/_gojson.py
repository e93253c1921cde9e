"""JSON read and written as Go's ``encoding/json`` does, for nsq_to_nsq's ``--whitelist-json-field`` and
``--require-json-field``/``--require-json-value``.

NSQ's tool decodes a body into a ``map[string]interface{}`` and, when it filters, writes the kept fields back
with ``json.Marshal``. Consumers downstream see those bytes, so they are reproduced here:

- Decoding: the body must be a JSON object (or ``null``, which reads as an empty object); every number becomes
  a float64 (so ``1`` and ``1.0`` are the same value, and a number beyond float64's range is an error); ``NaN``
  and ``Infinity`` are not JSON; invalid UTF-8 in strings reads as U+FFFD.
- Encoding: object keys sorted, no spaces; ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as ``\\u003c`` ...;
  other non-ASCII text kept as UTF-8; numbers as Go prints a float64 (``1`` not ``1.0``; exponent form only
  below 1e-6 or from 1e21 up, as ``1e-7``/``1e+21``).

The tool turns each kept top-level float that holds a whole int64 back into an integer before writing it
(``int_if_whole``), so ``{"id": 12}`` stays ``{"id":12}``.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

__all__ = ["decode_object", "encode", "int_if_whole"]

_INT64_MIN = -(2**63)
_INT64_MAX_EXCLUSIVE = 2**63
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text} out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"invalid character in {name}")


def decode_object(body: bytes) -> dict[str, Any]:
    """The object in ``body``; ``ValueError`` when the body is not one (Go's ``json.Unmarshal`` error)."""
    value = json.loads(
        body.decode("utf-8", errors="replace"), parse_float=_finite, parse_int=_finite, parse_constant=_no_constant
    )
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"cannot unmarshal {type(value).__name__} into an object")
    return value


def int_if_whole(value: Any) -> Any:
    """A float that converts to int64 and back unchanged, as an int (the tool's "avoid printing int as float")."""
    if type(value) is float and value.is_integer() and _INT64_MIN <= value < _INT64_MAX_EXCLUSIVE:
        return int(value)
    return value


def _float(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"unsupported value: {value!r}")
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        # Python's repr already uses the exponent form in this range, with Go's shortest digits.
        text = repr(value)
        mantissa, _, exponent = text.partition("e")
        sign, digits = exponent[0], exponent[1:].lstrip("0") or "0"
        if sign == "-" and len(digits) == 1:
            return f"{mantissa}e-{digits}"  # Go writes e-7, not e-07
        return f"{mantissa}e{sign}{digits.zfill(2)}"
    return format(Decimal(repr(value)).normalize(), "f")


def _string(text: str) -> str:
    encoded = json.dumps(text, ensure_ascii=False)
    for char, escape in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        if char in encoded:
            encoded = encoded.replace(char, escape)
    return encoded


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif type(value) is int:
        out.append(str(value))
    elif type(value) is float:
        out.append(_float(value))
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out)
        out.append("]")
    elif isinstance(value, dict):
        out.append("{")
        for index, key in enumerate(sorted(value)):
            if index:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _encode(value[key], out)
        out.append("}")
    else:
        raise ValueError(f"unsupported type: {type(value).__name__}")


def encode(value: Any) -> bytes:
    """``value`` as Go's ``json.Marshal`` writes it."""
    out: list[str] = []
    _encode(value, out)
    text = "".join(out)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # a lone surrogate escape (``"\\ud800"``) in the input: Go decodes it as U+FFFD
        return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")
