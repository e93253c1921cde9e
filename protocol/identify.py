"""IDENTIFY: decoding the client's JSON like Go's encoding/json, validating it, negotiating features.

Decoding follows Go's rules for NSQ's fixed set of fields, because clients see the difference:
keys match case-insensitively (Go folds ``ſ`` to S, the Kelvin sign to K, ``ı``/``İ`` to I);
unknown keys are ignored whatever their value; ``null`` leaves a field as it was; a later
duplicate key wins; a known field with the wrong JSON type (a string or ``1.0`` for an integer,
a number for a boolean, out of the integer's range) fails the whole body. A top-level ``null``
is an empty identification; any other non-object fails.

Validation (0 always keeps the server default; failures are ``E_BAD_BODY IDENTIFY <text>``),
in NSQ's order:

- heartbeat_interval: -1 disables heartbeats, else 1000..max_heartbeat_interval_ms
- output_buffer_timeout: -1 disables the flush timer, else min..max_output_buffer_timeout_ms
- output_buffer_size: -1 means size 1 and no flush timer, else 64..max_output_buffer_size
- sample_rate: 0..99
- msg_timeout: 1000..max_msg_timeout_ms

Negotiation happens only with ``feature_negotiation``: TLS, snappy and deflate each need the
server's support and the client's request; snappy and deflate together fail with
``E_IDENTIFY_FAILED``. The deflate level is the requested one when deflate is negotiated and the
request is above 0, else 6, and is capped at max_deflate_level.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .errors import E_BAD_BODY, E_IDENTIFY_FAILED, ProtocolError

__all__ = ["IdentifyLimits", "IdentifyResult", "negotiate"]


@dataclass(frozen=True)
class IdentifyLimits:
    """The server options IDENTIFY depends on (defaults are nsqd's)."""

    max_rdy_count: int = 2500
    max_msg_timeout_ms: int = 900000
    msg_timeout_ms: int = 60000
    max_heartbeat_interval_ms: int = 60000
    heartbeat_interval_ms: int = 30000
    output_buffer_size: int = 16384
    output_buffer_timeout_ms: int = 250
    min_output_buffer_timeout_ms: int = 25
    max_output_buffer_timeout_ms: int = 30000
    max_output_buffer_size: int = 65536
    tls_available: bool = False
    snappy_enabled: bool = True
    deflate_enabled: bool = True
    max_deflate_level: int = 6
    auth_required: bool = False
    version: str = "1.3.0"


@dataclass(frozen=True)
class IdentifyResult:
    """The connection's settings after IDENTIFY.

    ``client_id``, ``hostname`` and ``user_agent`` are None when the client did not send them (or
    sent null); NSQ then stores "". Timing values are effective: ``heartbeat_interval_ms`` is -1
    when heartbeats are disabled, ``output_buffer_timeout_ms`` 0 when the flush timer is.
    ``tls``/``snappy``/``deflate`` are the upgrades to perform (all false without negotiation).
    """

    client_id: str | None
    hostname: str | None
    user_agent: str | None
    feature_negotiation: bool
    heartbeat_interval_ms: int
    output_buffer_size: int
    output_buffer_timeout_ms: int
    tls: bool
    snappy: bool
    deflate: bool
    deflate_level: int
    sample_rate: int
    msg_timeout_ms: int

    def response(self, limits: IdentifyLimits) -> bytes:
        """The response frame's data: ``OK`` without feature negotiation, else NSQ's JSON."""
        if not self.feature_negotiation:
            return b"OK"
        b = _json_bool
        return (
            f'{{"max_rdy_count":{limits.max_rdy_count},'
            f'"version":{_go_json_string(limits.version)},'
            f'"max_msg_timeout":{limits.max_msg_timeout_ms},'
            f'"msg_timeout":{self.msg_timeout_ms},'
            f'"tls_v1":{b(self.tls)},'
            f'"deflate":{b(self.deflate)},'
            f'"deflate_level":{self.deflate_level},'
            f'"max_deflate_level":{limits.max_deflate_level},'
            f'"snappy":{b(self.snappy)},'
            f'"sample_rate":{self.sample_rate},'
            f'"auth_required":{b(limits.auth_required)},'
            f'"output_buffer_size":{self.output_buffer_size},'
            f'"output_buffer_timeout":{self.output_buffer_timeout_ms}}}'
        ).encode()


def _json_bool(v: bool) -> str:
    return "true" if v else "false"


def _go_json_string(s: str) -> str:
    # Go escapes <, >, & and the two JSON-hostile line separators, and writes other text raw.
    out = json.dumps(s, ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        out = out.replace(ch, esc)
    return out


# -- decoding ------------------------------------------------------------------------------

_STR, _BOOL, _INT, _INT32 = "string", "bool", "int", "int32"

# Field name as Go folds it -> (field, JSON type).
_FIELDS = {
    "CLIENT_ID": ("client_id", _STR),
    "HOSTNAME": ("hostname", _STR),
    "HEARTBEAT_INTERVAL": ("heartbeat_interval", _INT),
    "OUTPUT_BUFFER_SIZE": ("output_buffer_size", _INT),
    "OUTPUT_BUFFER_TIMEOUT": ("output_buffer_timeout", _INT),
    "FEATURE_NEGOTIATION": ("feature_negotiation", _BOOL),
    "TLS_V1": ("tls_v1", _BOOL),
    "DEFLATE": ("deflate", _BOOL),
    "DEFLATE_LEVEL": ("deflate_level", _INT),
    "SNAPPY": ("snappy", _BOOL),
    "SAMPLE_RATE": ("sample_rate", _INT32),
    "USER_AGENT": ("user_agent", _STR),
    "MSG_TIMEOUT": ("msg_timeout", _INT),
}

# The only non-ASCII runes whose Go fold (upper of lower) is an ASCII letter. Any other
# non-ASCII rune keeps the key from matching a field, all of which are ASCII.
_NON_ASCII_FOLDS = {"\u0130": "I", "\u0131": "I", "\u017f": "S", "\u212a": "K"}

_INT_RANGES = {_INT: (-(1 << 63), (1 << 63) - 1), _INT32: (-(1 << 31), (1 << 31) - 1)}

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _fold_key(key: str) -> str | None:
    if key.isascii():
        return key.upper()
    out = []
    for ch in key:
        if ch.isascii():
            out.append(ch.upper())
        elif ch in _NON_ASCII_FOLDS:
            out.append(_NON_ASCII_FOLDS[ch])
        else:
            return None
    return "".join(out)


class _Object(list[tuple[str, Any]]):
    """A JSON object as its (key, value) pairs in document order."""


class _Number(str):
    """A JSON number with a fraction or an exponent (never a valid Go integer)."""


class _DecodeError(Exception):
    pass


def _reject_constant(name: str) -> None:
    raise _DecodeError(f"not JSON: {name}")  # NaN, Infinity: Python accepts them, Go does not


def _decode(body: bytes) -> dict[str, Any]:
    # Go replaces invalid UTF-8 in strings with U+FFFD; elsewhere it is a syntax error either way.
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text, object_pairs_hook=_Object, parse_float=_Number, parse_constant=_reject_constant)
    except (ValueError, RecursionError, _DecodeError) as exc:
        raise _DecodeError(str(exc)) from exc
    fields: dict[str, Any] = {}
    if doc is None:
        return fields
    if not isinstance(doc, _Object):
        raise _DecodeError("not an object")
    for key, value in doc:
        folded = _fold_key(key)
        spec = _FIELDS.get(folded) if folded is not None else None
        if spec is None or value is None:
            continue
        field, kind = spec
        if kind is _STR:
            if type(value) is not str:
                raise _DecodeError(f"{field}: not a string")
            if _LONE_SURROGATE.search(value):  # from \ud800-style escapes; Go substitutes U+FFFD
                value = _LONE_SURROGATE.sub("\ufffd", value)
        elif kind is _BOOL:
            if type(value) is not bool:
                raise _DecodeError(f"{field}: not a boolean")
        else:
            if type(value) is not int:
                raise _DecodeError(f"{field}: not an integer")
            low, high = _INT_RANGES[kind]
            if not low <= value <= high:
                raise _DecodeError(f"{field}: out of range")
        fields[field] = value
    return fields


# -- validation and negotiation ------------------------------------------------------------


def _invalid(text: str, value: int) -> ProtocolError:
    return ProtocolError(E_BAD_BODY, f"IDENTIFY {text} ({value}) is invalid")


def negotiate(body: bytes, limits: IdentifyLimits) -> IdentifyResult:
    """Decode, validate and negotiate an IDENTIFY body; raises ``ProtocolError`` with NSQ's texts."""
    try:
        req = _decode(body)
    except _DecodeError as exc:
        raise ProtocolError(E_BAD_BODY, "IDENTIFY failed to decode JSON body") from exc

    heartbeat = req.get("heartbeat_interval", 0)
    if heartbeat == -1:
        heartbeat_ms = -1
    elif heartbeat == 0:
        heartbeat_ms = limits.heartbeat_interval_ms
    elif 1000 <= heartbeat <= limits.max_heartbeat_interval_ms:
        heartbeat_ms = heartbeat
    else:
        raise _invalid("heartbeat interval", heartbeat)

    timeout = req.get("output_buffer_timeout", 0)
    if timeout == -1:
        timeout_ms = 0
    elif timeout == 0:
        timeout_ms = limits.output_buffer_timeout_ms
    elif limits.min_output_buffer_timeout_ms <= timeout <= limits.max_output_buffer_timeout_ms:
        timeout_ms = timeout
    else:
        raise _invalid("output buffer timeout", timeout)

    size = req.get("output_buffer_size", 0)
    if size == -1:
        buffer_size = 1
        timeout_ms = 0
    elif size == 0:
        buffer_size = limits.output_buffer_size
    elif 64 <= size <= limits.max_output_buffer_size:
        buffer_size = size
    else:
        raise _invalid("output buffer size", size)

    sample_rate = req.get("sample_rate", 0)
    if not 0 <= sample_rate <= 99:
        raise _invalid("sample rate", sample_rate)

    msg_timeout = req.get("msg_timeout", 0)
    if msg_timeout == 0:
        msg_timeout_ms = limits.msg_timeout_ms
    elif 1000 <= msg_timeout <= limits.max_msg_timeout_ms:
        msg_timeout_ms = msg_timeout
    else:
        raise _invalid("msg timeout", msg_timeout)

    feature_negotiation = bool(req.get("feature_negotiation", False))
    tls = snappy = deflate = False
    if feature_negotiation:
        tls = limits.tls_available and bool(req.get("tls_v1", False))
        deflate = limits.deflate_enabled and bool(req.get("deflate", False))
        snappy = limits.snappy_enabled and bool(req.get("snappy", False))
    requested_level = req.get("deflate_level", 0)
    deflate_level = requested_level if deflate and requested_level > 0 else 6
    deflate_level = min(deflate_level, limits.max_deflate_level)
    if deflate and snappy:
        raise ProtocolError(E_IDENTIFY_FAILED, "cannot enable both deflate and snappy compression")

    return IdentifyResult(
        client_id=req.get("client_id"),
        hostname=req.get("hostname"),
        user_agent=req.get("user_agent"),
        feature_negotiation=feature_negotiation,
        heartbeat_interval_ms=heartbeat_ms,
        output_buffer_size=buffer_size,
        output_buffer_timeout_ms=timeout_ms,
        tls=tls,
        snappy=snappy,
        deflate=deflate,
        deflate_level=deflate_level,
        sample_rate=sample_rate,
        msg_timeout_ms=msg_timeout_ms,
    )
