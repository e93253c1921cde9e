"""Command-line flags with Go's ``flag`` semantics, and NSQ's TOML config-file resolution.

NSQ's daemons parse their command line with Go's standard ``flag`` package, then resolve every
option from three sources (mreiferson/go-options): a flag given on the command line wins, then the
``--config`` TOML file, then the built-in default. Operators swap binaries without touching their
scripts, so the Go rules are reproduced exactly:

* ``-name value``, ``-name=value``, ``--name value`` and ``--name=value`` are the same flag.
* Boolean flags never consume the next argument: ``-snappy``, ``-snappy=false``. In
  ``-snappy false`` the ``false`` is a positional argument. Parsing stops at the first positional
  argument or after ``--``; NSQ ignores positional arguments, so whatever follows is ignored too
  (it is kept in ``FlagSet.args``).
* An unknown flag is ``flag provided but not defined: -name`` followed by the usage, exit code 2;
  ``-h``, ``-help`` and ``--help`` print the usage (to stderr, like Go) and exit 0.
* Integers use Go's base-0 syntax (``0x1f``, ``0o17``, ``0b101``, ``1_000``; a leading ``0`` means
  octal). Durations use Go's syntax (``300ms``, ``1.5h``, ``2h45m``, ``1µs``, ``0``) and are kept as
  float seconds; ``format_duration`` prints Go's ``Duration.String`` form (``1m0s``, ``250ms``).
* Repeatable flags (Go's ``StringArray``) append one value per occurrence; float lists
  (``FloatArray``) also split each value on commas and keep the whole list sorted descending.
* A value a flag cannot parse is ``invalid value "x" for flag -name: parse error`` (booleans:
  ``invalid boolean value "x" for -name: parse error``), exit code 2.

Config files (``load_config`` then ``FlagSet.resolve``): keys are flag names with ``-`` turned into
``_`` unless the flag declares its own ``config_key``; unknown keys are ignored. Durations are Go
strings or bare integers meaning milliseconds; lists are TOML arrays or comma-separated strings;
flags with a custom ``convert`` receive the value printed as Go's ``%v`` would (``true``, ``1``), so
``tls_required = true`` and ``tls_required = "tcp-https"`` both work. Problems are ``FlagError`` with
exit code 1, which the daemons report as a FATAL log line, as NSQ does.

The three daemons share the rest: each declares its settings once, as the fields of an options dataclass
(``DaemonOptions`` and ``setting``: name, type, default, help, config key), gets its flags from them
(``flagset_from_options``), reads them with ``read_options`` into that dataclass (``options_from_values``), raises
``OptionsError`` from its startup checks, and reports its settings at ``GET /config/<name>`` through
``ConfigSettings``.

Nothing here touches the network or a clock. ``load_config`` reads the one file it is given,
``FlagError.exit`` writes to stderr and ``read_options`` prints ``--version`` to stdout, each only when called.
"""

from __future__ import annotations

import math
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, Self, TextIO, TypeVar

from protocol.version import version_string

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from .logfmt import log_level_word, parse_log_level

__all__ = [
    "ConfigSettings",
    "DaemonOptions",
    "Flag",
    "FlagError",
    "FlagSet",
    "HelpRequested",
    "OptionsError",
    "check_log_level",
    "duration_to_ns",
    "flagset_from_options",
    "format_duration",
    "format_duration_ns",
    "go_format_float",
    "go_quote",
    "load_config",
    "merge",
    "options_from_values",
    "parse_duration",
    "parse_duration_ns",
    "parse_go_bool",
    "parse_go_float",
    "parse_go_int",
    "read_options",
    "setting",
]

KINDS = ("str", "int", "float", "bool", "duration", "str_list", "float_list")
_KIND_ALIASES: dict[Any, str] = {str: "str", int: "int", float: "float", bool: "bool"}
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


# --------------------------------------------------------------------------------------------
# errors


class FlagError(Exception):
    """A command line or config file that cannot be used.

    ``exit_code`` is what NSQ exits with: 2 for command-line syntax (``usage`` is then set and is
    printed after the message), 1 for config-file and startup problems (printed as a FATAL log
    line), 0 for a help request.
    """

    def __init__(self, message: str, *, exit_code: int = 2, usage: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.usage = usage

    def render(self, log_prefix: str | None = None) -> str:
        """The text NSQ writes to stderr for this error, newline included.

        With ``log_prefix``, errors without usage become NSQ's FATAL log line
        (``[nsqd] 2026/11/21 12:00:00.123456 FATAL: failed to load config file ...``).
        """
        if self.usage is not None:
            head = f"{self.message}\n" if self.message else ""
            return head + self.usage
        if log_prefix is not None:
            from .logfmt import format_line

            return format_line(log_prefix, "FATAL", self.message) + "\n"
        return self.message + "\n"

    def exit(self, stream: TextIO | None = None, *, log_prefix: str | None = None) -> NoReturn:
        """Write ``render()`` to ``stream`` (stderr by default) and exit with ``exit_code``."""
        out = sys.stderr if stream is None else stream
        try:
            out.write(self.render(log_prefix))
            out.flush()
        except (OSError, ValueError):
            pass
        raise SystemExit(self.exit_code)


class HelpRequested(FlagError):
    """``-h``/``-help``/``--help``: print the usage and exit 0."""

    def __init__(self, usage: str) -> None:
        super().__init__("", exit_code=0, usage=usage)


class _RangeError(ValueError):
    """A number that parses but does not fit: Go's ``value out of range``."""


# --------------------------------------------------------------------------------------------
# Go value syntax


def go_quote(text: str) -> str:
    """``text`` as Go's ``%q`` prints it (printable characters kept, the rest escaped)."""
    out = ['"']
    for ch in text:
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x80:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


_GO_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_go_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``: 1 t T TRUE true True / 0 f F FALSE false False."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"strconv.ParseBool: parsing {go_quote(text)}: invalid syntax")


def _underscore_ok(text: str) -> bool:
    """Go's rule: ``_`` only between digits, or between a base prefix and a digit."""
    saw = "^"
    i = 0
    if text[:1] in ("+", "-"):
        text = text[1:]
    hexadecimal = False
    if len(text) >= 2 and text[0] == "0" and text[1].lower() in "box":
        i = 2
        saw = "0"
        hexadecimal = text[1].lower() == "x"
    while i < len(text):
        ch = text[i]
        i += 1
        if "0" <= ch <= "9" or (hexadecimal and "a" <= ch.lower() <= "f"):
            saw = "0"
            continue
        if ch == "_":
            if saw != "0":
                return False
            saw = "_"
            continue
        if saw == "_":
            return False
        saw = "!"
    return saw != "_"


def parse_go_int(text: str) -> int:
    """Go's ``strconv.ParseInt(text, 0, 64)``, as the ``flag`` package parses ``int`` flags."""
    body = text
    negative = False
    if body[:1] in ("+", "-"):
        negative = body[0] == "-"
        body = body[1:]
    if not body:
        raise ValueError("parse error")
    base = 10
    if body[0] == "0":
        prefix = body[1:2].lower()
        if len(body) >= 3 and prefix in ("b", "o", "x"):
            base = {"b": 2, "o": 8, "x": 16}[prefix]
            body = body[2:]
        else:
            base = 8
            body = body[1:]
    digits = []
    underscores = False
    for ch in body:
        if ch == "_":
            underscores = True
            continue
        if "0" <= ch <= "9":
            value = ord(ch) - 48
        elif "a" <= ch.lower() <= "z":
            value = ord(ch.lower()) - 87
        else:
            raise ValueError("parse error")
        if value >= base:
            raise ValueError("parse error")
        digits.append(ch)
    if underscores and not _underscore_ok(text):
        raise ValueError("parse error")
    number = int("".join(digits), base) if digits else 0
    if negative:
        number = -number
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise _RangeError("value out of range")
    return number


_DECIMAL_FLOAT = re.compile(r"[+-]?(?:[0-9_]+\.?[0-9_]*|\.[0-9_]+)(?:[eE][+-]?[0-9_]+)?")
_HEX_FLOAT = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F_]+\.?[0-9a-fA-F_]*|\.[0-9a-fA-F_]+)[pP][+-]?[0-9_]+")
_SPECIAL_FLOATS = {
    "inf": math.inf,
    "+inf": math.inf,
    "-inf": -math.inf,
    "infinity": math.inf,
    "+infinity": math.inf,
    "-infinity": -math.inf,
    "nan": math.nan,
}


def parse_go_float(text: str) -> float:
    """Go's ``strconv.ParseFloat(text, 64)``: decimal, hex (``0x1p-2``), ``inf``/``nan``, ``_``."""
    special = _SPECIAL_FLOATS.get(text.lower())
    if special is not None:
        return special
    if _DECIMAL_FLOAT.fullmatch(text):
        mantissa = re.split(r"[eE]", text)[0]
        if not any("0" <= ch <= "9" for ch in mantissa):
            raise ValueError("parse error")
        convert: Callable[[str], float] = float
    elif _HEX_FLOAT.fullmatch(text):
        convert = float.fromhex
    else:
        raise ValueError("parse error")
    if "_" in text and not _underscore_ok(text):
        raise ValueError("parse error")
    try:
        value = convert(text.replace("_", ""))
    except OverflowError:
        raise _RangeError("value out of range") from None
    except ValueError:
        raise ValueError("parse error") from None
    if math.isinf(value):
        raise _RangeError("value out of range")
    return value


def go_format_float(value: float) -> str:
    """``value`` as Go's ``%v`` / ``strconv.FormatFloat(v, 'g', -1, 64)`` prints it (``1``, ``0.99``, ``1e-05``)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign = "-" if value < 0 else ""
    _, digit_tuple, exponent_field = Decimal(repr(abs(value))).as_tuple()
    exponent = int(exponent_field)  # a finite value's (infinities and NaN are answered above)
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    exponent += len("".join(map(str, digit_tuple))) - len(digits)
    point = len(digits) + int(exponent)  # digits[:point] are before the decimal point
    exp10 = point - 1
    if exp10 < -4 or exp10 >= 6:  # Go uses precision 6 for the %e decision when shortest
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


# --------------------------------------------------------------------------------------------
# Go durations

_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC Greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}


def _is_digit(ch: str) -> bool:
    return "0" <= ch <= "9"


def parse_duration_ns(text: str) -> int:
    """Go's ``time.ParseDuration`` in integer nanoseconds; ``ValueError`` with Go's message.

    A duration is an optionally signed sequence of decimal numbers, each with an optional
    fraction and a unit (ns, us/µs, ms, s, m, h): ``300ms``, ``-1.5h``, ``2h45m``. A bare ``0``
    needs no unit. Fractions are scaled with float64 arithmetic and truncated, as Go does.
    """
    invalid = ValueError(f"time: invalid duration {go_quote(text)}")
    rest = text
    negative = False
    if rest[:1] in ("+", "-"):
        negative = rest[0] == "-"
        rest = rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise invalid
    total = 0
    while rest:
        if not (rest[0] == "." or _is_digit(rest[0])):
            raise invalid
        i = 0
        while i < len(rest) and _is_digit(rest[i]):
            i += 1
        whole_digits, rest = rest[:i], rest[i:]
        whole = int(whole_digits) if whole_digits else 0
        if whole > 1 << 63:
            raise invalid
        fraction, scale, fraction_digits = 0, 1.0, ""
        if rest[:1] == ".":
            rest = rest[1:]
            i = 0
            while i < len(rest) and _is_digit(rest[i]):
                i += 1
            fraction_digits, rest = rest[:i], rest[i:]
            overflow = False
            for ch in fraction_digits:  # Go stops accumulating once more digits cannot count
                if overflow:
                    continue
                if fraction > _INT64_MAX // 10:
                    overflow = True
                    continue
                candidate = fraction * 10 + ord(ch) - 48
                if candidate > 1 << 63:
                    overflow = True
                    continue
                fraction = candidate
                scale *= 10
        if not whole_digits and not fraction_digits:
            raise invalid
        i = 0
        while i < len(rest) and not (rest[i] == "." or _is_digit(rest[i])):
            i += 1
        if i == 0:
            raise ValueError(f"time: missing unit in duration {go_quote(text)}")
        unit_name, rest = rest[:i], rest[i:]
        unit = _NS_PER_UNIT.get(unit_name)
        if unit is None:
            raise ValueError(f"time: unknown unit {go_quote(unit_name)} in duration {go_quote(text)}")
        if whole > (1 << 63) // unit:
            raise invalid
        value = whole * unit
        if fraction > 0:
            value += int(float(fraction) * (float(unit) / scale))
            if value > 1 << 63:
                raise invalid
        total += value
        if total > 1 << 63:
            raise invalid
    if negative:
        return -total
    if total > _INT64_MAX:
        raise invalid
    return total


def parse_duration(text: str) -> float:
    """Go duration syntax to float seconds (``"300ms"`` → 0.3)."""
    return parse_duration_ns(text) / 1e9


def duration_to_ns(seconds: float) -> int:
    """Float seconds to integer nanoseconds, rounded (0.025 → 25000000), as NSQ's JSON reports them."""
    return int(round(seconds * 1e9))


def _fraction(value: int, precision: int) -> tuple[str, int]:
    """Go's fmtFrac: the fractional digits of value/10**precision without trailing zeros."""
    digits: list[str] = []
    printing = False
    for _ in range(precision):
        digit = value % 10
        printing = printing or digit != 0
        if printing:
            digits.append(chr(48 + digit))
        value //= 10
    text = "." + "".join(reversed(digits)) if printing else ""
    return text, value


def format_duration_ns(ns: int) -> str:
    """Go's ``Duration.String``: ``0s``, ``1ns``, ``1.5µs``, ``250ms``, ``1.5s``, ``1m0s``, ``2h45m0s``."""
    negative = ns < 0
    u = -ns if negative else ns
    if u < 1_000_000_000:
        if u == 0:
            return "0s"
        if u < 1_000:
            precision, unit = 0, "ns"
        elif u < 1_000_000:
            precision, unit = 3, "µs"
        else:
            precision, unit = 6, "ms"
        fraction, u = _fraction(u, precision)
        text = f"{u}{fraction}{unit}"
    else:
        fraction, u = _fraction(u, 9)
        text = f"{u % 60}{fraction}s"
        u //= 60
        if u:
            text = f"{u % 60}m{text}"
            u //= 60
            if u:
                text = f"{u}h{text}"
    return "-" + text if negative else text


def format_duration(seconds: float) -> str:
    """Float seconds in Go's ``Duration.String`` form (60.0 → ``1m0s``, 0.25 → ``250ms``)."""
    return format_duration_ns(duration_to_ns(seconds))


# --------------------------------------------------------------------------------------------
# flags


_PARSERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": parse_go_int,
    "float": parse_go_float,
    "bool": parse_go_bool,
    "duration": parse_duration,
}
_PLACEHOLDERS = {"str": "string", "int": "int", "float": "float", "duration": "duration", "bool": ""}


def _go_v(value: Any) -> str:
    """A TOML value printed as Go's ``%v`` prints the decoded value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_format_float(value)
    if isinstance(value, list):
        return "[" + " ".join(_go_v(item) for item in value) + "]"
    return str(value)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def _coerce_scalar(kind: str, raw: Any) -> Any:
    """One config-file value for a flag of ``kind`` (go-options' coercion rules)."""
    if kind == "str":
        if isinstance(raw, str):
            return raw
        raise ValueError(f"expected a string, got {_type_name(raw)}")
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            return parse_go_bool(raw)
        raise ValueError(f"expected true or false, got {_type_name(raw)}")
    if isinstance(raw, bool):
        raise ValueError(f"expected a number, got {_type_name(raw)}")
    if kind == "int":
        if isinstance(raw, str) and re.fullmatch(r"[+-]?[0-9]+", raw):
            raw = int(raw)
        if isinstance(raw, int):
            if not _INT64_MIN <= raw <= _INT64_MAX:
                raise ValueError("value out of range")
            return raw
        raise ValueError(f"expected an integer, got {_type_name(raw)}")
    if kind == "float":
        if isinstance(raw, (int, float)):
            return float(raw)
        if isinstance(raw, str):
            return parse_go_float(raw)
        raise ValueError(f"expected a number, got {_type_name(raw)}")
    if kind == "duration":
        if isinstance(raw, int):  # bare integers are milliseconds
            return raw / 1000
        if isinstance(raw, str):
            return parse_duration(raw)
        raise ValueError(f'expected a duration such as "2s" or integer milliseconds, got {_type_name(raw)}')
    raise AssertionError(kind)


@dataclass(frozen=True)
class Flag:
    """One flag's definition. ``kind`` is the kind of one value; ``repeatable`` makes a list."""

    name: str
    kind: str
    default: Any
    help: str
    attr: str
    config_key: str | None  # None: not settable from a config file
    repeatable: bool = False
    comma_separated: bool = False
    sort_descending: bool = False
    convert: Callable[[str], Any] | None = None
    bool_like: bool = False
    default_text: str | None = None

    @property
    def is_bool(self) -> bool:
        """Takes no separate argument: ``-name`` alone means ``true``."""
        return self.kind == "bool" or self.bool_like

    def parse_text(self, text: str) -> Any:
        """One command-line occurrence's value (a list for repeatable flags); ``ValueError`` has Go's reason."""
        if self.convert is not None:
            value = self.convert(text)
            return [value] if self.repeatable else value
        parser = _PARSERS[self.kind]
        pieces = [text]
        if self.repeatable and self.comma_separated:
            pieces = [piece.strip() for piece in text.split(",") if piece.strip()]
        values = []
        for piece in pieces:
            try:
                values.append(parser(piece))
            except _RangeError:
                raise ValueError("value out of range") from None
            except ValueError:
                raise ValueError("parse error") from None
        return values if self.repeatable else values[0]

    def coerce_config_value(self, raw: Any) -> Any:
        """A config-file value for this flag; ``ValueError`` says what is wrong with it."""
        if self.repeatable:
            if isinstance(raw, str):
                items: list[Any] = [piece.strip() for piece in raw.split(",") if piece.strip()]
            elif isinstance(raw, list):
                items = raw
            else:
                raise ValueError(f"expected an array or a comma-separated string, got {_type_name(raw)}")
            if self.convert is not None:
                return [self.convert(_go_v(item)) for item in items]
            return [_coerce_scalar(self.kind, item) for item in items]
        if self.convert is not None:
            return self.convert(_go_v(raw))
        return _coerce_scalar(self.kind, raw)

    def usage_parts(self) -> tuple[str, str]:
        """Go's ``UnquoteUsage``: the argument placeholder and the help text."""
        first = self.help.find("`")
        if first >= 0:
            second = self.help.find("`", first + 1)
            if second >= 0:
                name = self.help[first + 1 : second]
                return name, self.help[:first] + name + self.help[second + 1 :]
        if self.is_bool:
            return "", self.help
        if self.repeatable or self.convert is not None:
            return "value", self.help
        return _PLACEHOLDERS[self.kind], self.help

    def default_for_usage(self) -> str | None:
        """What Go prints as ``(default ...)``, or None when the default is the zero value."""
        if self.default_text is not None:
            return self.default_text or None
        if self.convert is not None:
            return None
        if self.repeatable:
            return ",".join(str(v) for v in self.default) or None
        if self.kind == "bool":
            return "true" if self.default else None
        if self.kind == "str":
            return go_quote(self.default) if self.default else None
        if self.kind == "duration":
            return format_duration(self.default) if self.default else None
        if self.kind == "float":
            return go_format_float(self.default) if self.default else None
        return str(self.default) if self.default else None


def _copy_value(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


def merge(flags_given: Mapping[str, Any], config: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """NSQ's precedence over values keyed by attribute: explicit flag > config file > default.

    ``config`` holds already coerced values (``FlagSet.coerce_config``); lists are copied so the
    result never shares them with its inputs.
    """
    result = {key: _copy_value(value) for key, value in defaults.items()}
    for source in (config, flags_given):
        for key, value in source.items():
            result[key] = _copy_value(value)
    return result


class FlagSet:
    """A named set of flags parsed with Go's rules (see the module notes).

    After ``parse``, ``given`` holds the flags set explicitly on the command line (keyed by
    attribute) and ``args`` the positional arguments where parsing stopped.
    """

    def __init__(self, program: str) -> None:
        self.program = program
        self._flags: dict[str, Flag] = {}
        self._attrs: set[str] = set()
        self._config_keys: set[str] = set()
        self.given: dict[str, Any] = {}
        self.args: list[str] = []

    def add(
        self,
        name: str,
        kind: Any,
        default: Any,
        help: str,
        *,
        config_key: str | None = None,
        repeatable: bool = False,
        attr: str | None = None,
        comma_separated: bool | None = None,
        convert: Callable[[str], Any] | None = None,
        bool_like: bool = False,
        in_config: bool = True,
        default_text: str | Callable[[Any], str] | None = None,
    ) -> Flag:
        """Define a flag.

        ``kind``: str, int, float, bool, duration (float seconds), str_list (repeatable strings,
        comma splitting only with ``comma_separated=True``) or float_list (repeatable, comma
        separated, sorted descending like Go's FloatArray). ``repeatable=True`` turns any scalar
        kind but bool into a list. ``attr`` is the key in parse results (default: name with
        ``-`` → ``_``); ``config_key`` is the config-file key (default: the same), ``in_config=False``
        keeps the flag out of config files. ``convert`` parses a custom value (raise ``ValueError``
        with the reason); ``bool_like`` makes such a flag take no separate argument, like a Go
        ``Value`` with ``IsBoolFlag``. ``default_text`` overrides the ``(default ...)`` in the usage; a
        callable receives the default and returns the text.
        """
        if not name or name.startswith("-") or "=" in name:
            raise ValueError(f"bad flag name {name!r}")
        if name in self._flags:
            raise ValueError(f"{self.program} flag redefined: {name}")
        kind = _KIND_ALIASES.get(kind, kind)
        if kind not in KINDS:
            raise ValueError(f"unknown flag kind {kind!r}")
        sort_descending = False
        if kind == "str_list":
            kind, repeatable = "str", True
        elif kind == "float_list":
            kind, repeatable, sort_descending = "float", True, True
            if comma_separated is None:
                comma_separated = True
        if repeatable and (kind == "bool" or bool_like):
            raise ValueError(f"boolean flag {name} cannot be repeatable")
        attr = attr or name.replace("-", "_")
        if attr in self._attrs:
            raise ValueError(f"attribute {attr!r} used twice")
        key = (config_key or name.replace("-", "_")) if in_config else None
        if key is not None and key in self._config_keys:
            raise ValueError(f"config key {key!r} used twice")
        if callable(default_text):
            default_text = default_text(default)
        if repeatable:
            default = list(default or [])
        elif kind == "duration" and convert is None:
            default = float(default)
        flag = Flag(
            name=name,
            kind=kind,
            default=default,
            help=help,
            attr=attr,
            config_key=key,
            repeatable=repeatable,
            comma_separated=bool(comma_separated),
            sort_descending=sort_descending,
            convert=convert,
            bool_like=bool_like,
            default_text=default_text,
        )
        self._flags[name] = flag
        self._attrs.add(attr)
        if key is not None:
            self._config_keys.add(key)
        return flag

    def lookup(self, name: str) -> Flag | None:
        return self._flags.get(name)

    @property
    def flags(self) -> tuple[Flag, ...]:
        """Every flag, sorted by name like Go's ``VisitAll``."""
        return tuple(self._flags[name] for name in sorted(self._flags))

    def defaults(self) -> dict[str, Any]:
        return {flag.attr: _copy_value(flag.default) for flag in self._flags.values()}

    def usage(self) -> str:
        """Go's default usage text: ``Usage of <program>:`` then ``PrintDefaults``."""
        lines = [f"Usage of {self.program}:"]
        for flag in self.flags:
            placeholder, text = flag.usage_parts()
            line = f"  -{flag.name}" + (f" {placeholder}" if placeholder else "")
            # Go keeps one-letter boolean flags on one line; everything else wraps under a tab.
            line += "\t" if len(line) <= 4 else "\n    \t"
            line += text.replace("\n", "\n    \t")
            default = flag.default_for_usage()
            if default is not None:
                line += f" (default {default})"
            lines.append(line)
        return "\n".join(lines) + "\n"

    def _fail(self, message: str) -> FlagError:
        return FlagError(message, exit_code=2, usage=self.usage())

    def parse(self, argv: list[str], env_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Parse ``argv`` (without the program name) and return every flag's value by attribute.

        ``env_config`` is a decoded config file (``load_config``); when given, its values sit
        between the command line and the defaults. Raises ``FlagError`` (exit code 2, usage
        attached) on bad syntax and ``HelpRequested`` (exit code 0) for ``-h``/``-help``.
        """
        given: dict[str, Any] = {}
        i = 0
        while i < len(argv):
            arg = argv[i]
            if len(arg) < 2 or arg[0] != "-":
                break
            dashes = 1
            if arg[1] == "-":
                dashes = 2
                if len(arg) == 2:  # "--" ends the flags
                    i += 1
                    break
            name = arg[dashes:]
            if not name or name[0] in "-=":
                raise self._fail(f"bad flag syntax: {arg}")
            i += 1
            has_value, value = False, ""
            equals = name.find("=", 1)
            if equals > 0:
                name, value, has_value = name[:equals], name[equals + 1 :], True
            flag = self._flags.get(name)
            if flag is None:
                if name in ("help", "h"):
                    raise HelpRequested(self.usage())
                raise self._fail(f"flag provided but not defined: -{name}")
            if flag.is_bool:
                try:
                    parsed = flag.parse_text(value if has_value else "true")
                except ValueError as exc:
                    if has_value:
                        raise self._fail(f"invalid boolean value {go_quote(value)} for -{name}: {exc}") from None
                    raise self._fail(f"invalid boolean flag {name}: {exc}") from None
            else:
                if not has_value:
                    if i >= len(argv):
                        raise self._fail(f"flag needs an argument: -{name}")
                    value = argv[i]
                    i += 1
                try:
                    parsed = flag.parse_text(value)
                except ValueError as exc:
                    raise self._fail(f"invalid value {go_quote(value)} for flag -{name}: {exc}") from None
            if flag.repeatable:
                collected = given.get(flag.attr, []) + parsed
                if flag.sort_descending:
                    collected.sort(reverse=True)
                given[flag.attr] = collected
            else:
                given[flag.attr] = parsed
        self.given = given
        self.args = list(argv[i:])
        return self.resolve(env_config)

    def coerce_config(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Config-file values for this set's flags, coerced and keyed by attribute.

        Keys that name no flag are ignored, like NSQ. Raises ``FlagError`` (exit code 1).
        """
        values: dict[str, Any] = {}
        for flag in self._flags.values():
            if flag.config_key is None or flag.config_key not in config:
                continue
            raw = config[flag.config_key]
            try:
                values[flag.attr] = flag.coerce_config_value(raw)
            except ValueError as exc:
                raise FlagError(
                    f"failed parsing {flag.config_key} {_go_v(raw)!r} in config file - {exc}", exit_code=1
                ) from None
        return values

    def resolve(self, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Every flag's value: the last parse's explicit flags > ``config`` (raw, from the file) > defaults."""
        coerced = self.coerce_config(config) if config else {}
        return merge(self.given, coerced, self.defaults())


def load_config(path: str) -> dict[str, Any]:
    """Decode a TOML config file; ``FlagError`` (exit code 1) with NSQ's wording on failure."""
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise FlagError(
            f"failed to load config file {path} - open {path}: {reason[:1].lower()}{reason[1:]}", exit_code=1
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise FlagError(f"failed to load config file {path} - {exc}", exit_code=1) from None


# --------------------------------------------------------------------------------------------
# a daemon's options: its flag table, command line and config file, startup checks, GET /config

_Options = TypeVar("_Options", bound="DataclassInstance")


class OptionsError(FlagError, ValueError):
    """A startup validation failure; the daemon logs it as FATAL and exits 1."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=1)


#: One row of a daemon's flag table: the flag's name, kind, attribute (None for the name in snake_case), help
#: text and further ``FlagSet.add`` arguments.
#: the metadata key under which ``setting`` keeps a field's flag
_FLAG_METADATA = "nsq_flag"
#: a field's flag kind, from its type, unless ``setting`` names another
_KINDS_BY_TYPE: dict[Any, str] = {
    "str": "str",
    "int": "int",
    "bool": "bool",
    "float": "duration",
    "list[str]": "str_list",
    "list[float]": "float_list",
}


def setting(
    default: Any = MISSING,
    help: str = "",
    *,
    default_factory: Any = MISSING,
    kind: str | None = None,
    flag: str | None = None,
    **extra: Any,
) -> Any:
    """A field of a daemon's options dataclass that is also a command-line flag and a config-file key.

    The flag is named after the field (``_`` → ``-``) unless ``flag`` names it, and so is its config-file key
    (the field's name) unless ``config_key`` names it; its kind follows the field's type (``float`` fields are
    durations, lists are repeatable) unless ``kind`` names another; ``extra`` goes to
    ``FlagSet.add`` (``config_key``, ``in_config``, ``convert``, ``default_text``, ``bool_like``). Fields made
    otherwise are settings that no flag sets."""
    return field(default=default, default_factory=default_factory, metadata={_FLAG_METADATA: (flag, kind, help, extra)})


@dataclass
class DaemonOptions:
    """What the options of every daemon have: NSQ's ``--log-level``, ``--log-prefix`` (each daemon sets its own
    default), ``--config``, ``--version`` and the deprecated ``--verbose`` (accepted, no effect); and the way from
    a command line to options (``from_argv``). A daemon's subclass names its ``program`` and adds its settings."""

    #: the name in usage and error texts
    program: ClassVar[str] = ""
    #: NSQ flags that are accepted and ignored, and logged when given (``ignored_flags``)
    logged_ignored_flags: ClassVar[frozenset[str]] = frozenset()

    log_level: str = setting(
        "info", "set log verbosity: debug, info, warn, error, or fatal", convert=log_level_word, default_text="INFO"
    )
    log_prefix: str = setting("", "log message prefix")
    config: str = setting("", "path to config file", in_config=False)
    version: bool = setting(False, "print version string", in_config=False)
    verbose: bool = setting(False, "[deprecated] has no effect, use --log-level", in_config=False)
    #: the ``logged_ignored_flags`` given, for the daemon to log
    ignored_flags: tuple[str, ...] = ()

    @classmethod
    def flagset(cls, defaults: Any = None) -> FlagSet:
        """The daemon's flags, with defaults taken from ``defaults`` (``cls()`` when omitted)."""
        return flagset_from_options(cls.program, cls, defaults if defaults is not None else cls())

    @classmethod
    def from_argv(cls, argv: list[str], *, exit_on_error: bool = True) -> Self:
        """The options from a command line (without the program name) and its ``--config`` file (``read_options``:
        with ``exit_on_error`` usage errors exit 2, ``-h`` and ``--version`` exit 0, config-file errors exit 1 with
        a FATAL line; otherwise ``FlagError`` is raised)."""
        flagset = cls.flagset()
        values = read_options(flagset, argv, exit_on_error=exit_on_error)
        ignored = tuple(sorted(name for name in cls.logged_ignored_flags if name.replace("-", "_") in flagset.given))
        return options_from_values(cls, values, ignored_flags=ignored)


def flagset_from_options(program: str, options_type: type, defaults: Any) -> FlagSet:
    """``program``'s flags: one per ``setting`` field of ``options_type``, defaulting to that field of
    ``defaults`` (an instance, so a default that depends on the host can be left out)."""
    flagset = FlagSet(program)
    for item in fields(options_type):
        spec = item.metadata.get(_FLAG_METADATA)
        if spec is None:
            continue
        name, kind, help_text, extra = spec
        flagset.add(
            name or item.name.replace("_", "-"),
            kind or _KINDS_BY_TYPE[item.type],
            getattr(defaults, item.name),
            help_text,
            attr=item.name,
            **{"config_key": item.name, **extra},
        )
    return flagset


def read_options(flagset: FlagSet, argv: list[str], *, exit_on_error: bool = True) -> dict[str, Any]:
    """Every flag's value by attribute, from ``argv`` (without the program name) and the ``--config`` file, as
    NSQ's daemons resolve them: explicit flag > config file > default.

    With ``exit_on_error`` (Go's ``ExitOnError``) problems end the process as NSQ's daemons do: usage errors
    print the message and usage to stderr and exit 2, ``-h`` prints the usage and exits 0, ``--version`` prints
    the version string to stdout and exits 0, config-file errors print a FATAL log line (with the prefix
    ``[<program>] ``, whatever ``--log-prefix`` says) and exit 1. Otherwise ``FlagError`` is raised, and
    ``--version`` returns the command line's values without reading the config file.
    """
    try:
        values = flagset.parse(argv)
        if values["version"]:
            if exit_on_error:
                sys.stdout.write(version_string(flagset.program) + "\n")
                sys.stdout.flush()
                raise SystemExit(0)
        elif values["config"]:
            values = flagset.resolve(load_config(values["config"]))
    except FlagError as exc:
        if exit_on_error:
            exc.exit(log_prefix=f"[{flagset.program}] ")
        raise
    return values


def options_from_values(options_type: type[_Options], values: Mapping[str, Any], **extra: Any) -> _Options:
    """An options dataclass from ``read_options``' values; values that name no field (ignored flags') are left out."""
    names = {field.name for field in fields(options_type)}
    return options_type(**{key: value for key, value in values.items() if key in names}, **extra)


def check_log_level(level: str | int) -> None:
    """The startup check of ``--log-level``: ``OptionsError`` with NSQ's message when it is not a level."""
    try:
        parse_log_level(level)
    except ValueError as exc:
        raise OptionsError(str(exc)) from None


class ConfigSettings:
    """The settings a daemon reports at ``GET /config/<name>``, named by their config-file keys, with the values
    NSQ's JSON gives: durations in integer nanoseconds, the log level as NSQ's integer 1..5, lists copied.

    ``flagset`` names the settings: every flag with a config key that sets a field of ``options_type``."""

    def __init__(self, flagset: FlagSet, options_type: type) -> None:
        names = {field.name for field in fields(options_type)}
        self._settings = {
            flag.config_key: (flag.attr, flag.kind)
            for flag in flagset.flags
            if flag.config_key is not None and flag.attr in names
        }

    def names(self) -> tuple[str, ...]:
        return tuple(self._settings)

    def value(self, opts: Any, name: str) -> Any:
        """The JSON value of the setting ``name`` of ``opts``; ``KeyError`` for unknown names."""
        try:
            attr, kind = self._settings[name]
        except KeyError:
            raise KeyError(name) from None
        value = getattr(opts, attr)
        if name == "log_level":
            return parse_log_level(value)
        if kind == "duration":
            return duration_to_ns(value)
        if isinstance(value, list):
            return list(value)
        return value
