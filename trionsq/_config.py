"""Client configuration with go-nsq's option names, so the same ``name,value`` strings work everywhere.

``Config`` is a plain dataclass: build it with keywords (``Config(max_in_flight=200)``) or fill it
from text with ``set(name, value)`` / ``set_option_text("name,value")``, the form the utilities
take in ``--consumer-opt`` and ``--producer-opt``. Text values follow go-nsq's ``Config.Set`` for
string input: durations in Go's syntax (``"30s"``, ``"250ms"``; a bare number has no unit and is
refused, as ``time.ParseDuration`` refuses it), booleans as ``strconv.ParseBool`` reads them,
integers in base 10, floats as ``strconv.ParseFloat``. Dashes in names become underscores. Values
outside go-nsq's ranges are refused with go-nsq's wording (``invalid read_timeout ! 50ms < 100ms``).
A bare ``name`` in ``set_option_text`` means true, and only boolean options accept it.

The names are all of go-nsq v1.1.0's ``Config`` options, with its defaults and ranges:
connection (``dial_timeout``, ``read_timeout``, ``write_timeout``, ``local_addr``, ``heartbeat_interval``,
``client_id``, ``hostname``, ``user_agent``, ``output_buffer_size``, ``output_buffer_timeout``, ``sample_rate``,
``msg_timeout``, ``snappy``, ``deflate``, ``deflate_level``, ``auth_secret``, ``tls_*``), consumer
(``max_in_flight``, ``max_attempts``, ``default_requeue_delay``, ``max_requeue_delay``, ``backoff_strategy``
``exponential``/``full_jitter``, ``backoff_multiplier``, ``max_backoff_duration``, ``low_rdy_idle_timeout``,
``low_rdy_timeout``, ``rdy_redistribute_interval``) and lookupd (``lookupd_poll_interval``,
``lookupd_poll_jitter``, ``lookupd_poll_timeout``, ``skip_lookupd_authorization``: despite its name, true, the
default, sends ``auth_secret`` to nsqlookupd as a bearer token, as go-nsq does). None is accepted and ignored.
``tls_config`` (a ``*tls.Config`` in Go, which its ``Set`` cannot take from text) is refused; give
``tls_context`` instead. ``local_addr`` binds the connections' local address (``host:port``; trio picks the
port, so a port other than 0 is checked but not used).

Durations are float seconds in Python. The IDENTIFY fields derived from them (milliseconds, -1 for
"disabled", 0 for "the server's default") are computed by ``trionsq._core``.

TLS: ``tls_context`` (an ``ssl.SSLContext``) is used as given. Without it and with ``tls_v1``,
``ssl_context()`` builds one from ``tls_root_ca_file`` (else the system's CAs),
``tls_insecure_skip_verify``, ``tls_cert``/``tls_key`` and ``tls_min_version`` (go-nsq's ``ssl3.0`` ..
``tls1.2``, and ``tls1.3``; anything else is refused as go-nsq refuses it), once, and keeps it.

Imports only the standard library, ``protocol`` and ``runtime.flags`` (which has no trio), so the
blocking driver can use it in processes without trio.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

from runtime.flags import format_duration, go_quote, parse_duration, parse_go_bool, parse_go_float

from ._version import __version__

__all__ = ["Config"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# kind, min, max (None: unbounded), as go-nsq's struct tags declare them
_DURATION, _INT, _UINT, _FLOAT, _BOOL, _STR, _OPT_DURATION = (
    "duration",
    "int",
    "uint",
    "float",
    "bool",
    "str",
    "optduration",
)
_ADDR, _STRATEGY, _TLS_VERSION = "addr", "strategy", "tlsversion"
_OPTIONS: dict[str, tuple[str, float | None, float | None]] = {
    "client_id": (_STR, None, None),
    "hostname": (_STR, None, None),
    "user_agent": (_STR, None, None),
    "heartbeat_interval": (_DURATION, None, None),
    "read_timeout": (_DURATION, 0.1, 300.0),
    "write_timeout": (_DURATION, 0.1, 300.0),
    "dial_timeout": (_DURATION, None, None),
    "local_addr": (_ADDR, None, None),
    "output_buffer_size": (_INT, None, None),
    "output_buffer_timeout": (_DURATION, None, None),
    "tls_v1": (_BOOL, None, None),
    "tls_insecure_skip_verify": (_BOOL, None, None),
    "tls_root_ca_file": (_STR, None, None),
    "tls_cert": (_STR, None, None),
    "tls_key": (_STR, None, None),
    "tls_min_version": (_TLS_VERSION, None, None),
    "snappy": (_BOOL, None, None),
    "deflate": (_BOOL, None, None),
    "deflate_level": (_INT, 1, 9),
    "sample_rate": (_INT, 0, 99),
    "msg_timeout": (_OPT_DURATION, 0.0, None),
    "auth_secret": (_STR, None, None),
    "max_in_flight": (_INT, 0, None),
    "max_attempts": (_UINT, 0, 65535),
    "default_requeue_delay": (_DURATION, 0.0, 3600.0),
    "max_requeue_delay": (_DURATION, 0.0, 3600.0),
    "backoff_strategy": (_STRATEGY, None, None),
    "backoff_multiplier": (_DURATION, 0.0, 3600.0),
    "max_backoff_duration": (_DURATION, 0.0, 3600.0),
    "lookupd_poll_interval": (_DURATION, 0.01, 300.0),
    "lookupd_poll_jitter": (_FLOAT, 0.0, 1.0),
    "lookupd_poll_timeout": (_DURATION, None, None),
    "low_rdy_idle_timeout": (_DURATION, 1.0, 300.0),
    "low_rdy_timeout": (_DURATION, 1.0, 300.0),
    "rdy_redistribute_interval": (_DURATION, 0.001, 5.0),
    "skip_lookupd_authorization": (_BOOL, None, None),
}
# go-nsq's tls_config is a *tls.Config: Set with text panics there; here it is refused with a pointer to the
# Python equivalent
_NOT_FROM_TEXT = {"tls_config": "tls_config takes an ssl.SSLContext (Config.tls_context), not text"}
_BACKOFF_STRATEGIES = {"": "exponential", "exponential": "exponential", "full_jitter": "full_jitter"}

_TLS_VERSIONS = {
    "ssl3.0": ssl.TLSVersion.SSLv3,
    "tls1.0": ssl.TLSVersion.TLSv1,
    "tls1.1": ssl.TLSVersion.TLSv1_1,
    "tls1.2": ssl.TLSVersion.TLSv1_2,
    "tls1.3": ssl.TLSVersion.TLSv1_3,
}


def _parse_base10(text: str) -> int:
    """Go's ``strconv.ParseInt(text, 10, 64)``: an optional sign and ASCII digits."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(text)}: invalid syntax")
    value = int(text)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"strconv.ParseInt: parsing {go_quote(text)}: value out of range")
    return value


def _parse_uint(text: str) -> int:
    """Go's ``strconv.ParseUint(text, 10, 64)``: ASCII digits only, no sign."""
    if not text or not text.isascii() or not text.isdigit():
        raise ValueError(f"strconv.ParseUint: parsing {go_quote(text)}: invalid syntax")
    value = int(text)
    if value >= 1 << 64:
        raise ValueError(f"strconv.ParseUint: parsing {go_quote(text)}: value out of range")
    return value


def _parse_tcp_addr(text: str) -> str:
    """``host:port`` as Go's ``net.ResolveTCPAddr("tcp", text)`` reads it (an empty host or port 0 is allowed);
    kept as text, the connection binds to it."""
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError(f"address {text}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"address {text}: invalid port")
    if host:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise ValueError(f"lookup {host}: no such host") from None
    return text


def _parse_float(text: str) -> float:
    try:
        return parse_go_float(text)
    except ValueError:
        raise ValueError(f"strconv.ParseFloat: parsing {go_quote(text)}: invalid syntax") from None


def _shown(value: str | bool) -> str:
    """A value given to ``Config.set`` as Go's text shows it (a boolean as ``true`` or ``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _show(kind: str, value: Any) -> str:
    """A value as go-nsq's ``%v`` prints it in range errors."""
    if kind in (_DURATION, _OPT_DURATION):
        return format_duration(value)
    if kind == _FLOAT:
        return repr(float(value)).removesuffix(".0")
    return str(value)


@dataclass
class Config:
    """A client's settings, with go-nsq's option names, defaults and ranges.

    Build it with keywords (``Config(max_in_flight=200, snappy=True)``) or fill it from text with `set` and
    `set_option_text`, the form the tools take in ``--consumer-opt`` and ``--producer-opt``. Durations are float
    seconds here and Go durations in text (``"30s"``, ``"250ms"``). Every option of go-nsq v1.1.0's ``Config`` is
    taken, none accepted and ignored; ``tls_config`` (a Go ``*tls.Config``) is refused as text: give
    ``tls_context``.

    TLS: ``tls_context`` is used as given; otherwise `ssl_context` builds one from ``tls_root_ca_file`` (else the
    system's CAs), ``tls_insecure_skip_verify``, ``tls_cert``/``tls_key`` and ``tls_min_version``. The certificate
    is checked against the host of the nsqd address. Unlike go-nsq, with ``tls_v1`` set an nsqd that offers no TLS
    is refused instead of being used in the clear.

    Attributes:
        client_id: IDENTIFY's ``client_id``; None: the short hostname (up to the first dot).
        hostname: IDENTIFY's ``hostname``; None: ``socket.gethostname()``.
        user_agent: IDENTIFY's ``user_agent``.
        heartbeat_interval: How often nsqd sends a heartbeat when idle; ``<= 0`` disables them.
        read_timeout: A connection that receives nothing this long is closed (0.1 to 300 s); also bounds the
            handshake.
        write_timeout: A write that takes longer closes the connection (0.1 to 300 s).
        dial_timeout: The TCP connect's bound.
        local_addr: ``host:port`` the connections are made from (the system picks the port); None: any.
        output_buffer_size: The output buffer nsqd keeps for this client, in bytes.
        output_buffer_timeout: How often nsqd flushes that buffer.
        tls_v1: Upgrade to TLS after IDENTIFY.
        tls_context: An ``ssl.SSLContext`` used as given for the upgrade.
        tls_insecure_skip_verify: Do not verify nsqd's certificate.
        tls_root_ca_file: The CA file that nsqd's certificate must chain to (default: the system's CAs).
        tls_cert: A client certificate, with ``tls_key``.
        tls_key: The client certificate's key.
        tls_min_version: The lowest TLS version, ``ssl3.0``, ``tls1.0`` ... ``tls1.3``.
        snappy: Ask for snappy compression.
        deflate: Ask for deflate compression, at ``deflate_level`` (1 to 9).
        deflate_level: The deflate level asked for.
        sample_rate: Ask nsqd to deliver only this percentage of messages (0 to 99; 0: all).
        msg_timeout: The message timeout nsqd applies to this client; None: nsqd's ``--msg-timeout``.
        auth_secret: The secret sent with AUTH when nsqd requires it (and to nsqlookupd, see
            ``skip_lookupd_authorization``).
        max_in_flight: A consumer's bound on messages delivered and not yet answered, over all its connections.
        max_attempts: A consumer FINs a message delivered more often than this without the handler; 0: no limit.
        default_requeue_delay: The delay of a REQ without one: ``default_requeue_delay * attempts``...
        max_requeue_delay: ... at most this.
        backoff_strategy: ``exponential`` (``backoff_multiplier * 2**level``) or ``full_jitter`` (a random time
            below that).
        backoff_multiplier: The unit of a backoff; 0 disables backoff.
        max_backoff_duration: The longest backoff; the level stops where the next step would pass it.
        lookupd_poll_interval: How often a consumer asks nsqlookupd for the topic's nsqd.
        lookupd_poll_jitter: The share of that interval, at random, before the first poll.
        lookupd_poll_timeout: The bound on one nsqlookupd query.
        low_rdy_idle_timeout: With more connections than ``max_in_flight``, RDY moves from a connection idle this
            long...
        low_rdy_timeout: ... or holding it this long ...
        rdy_redistribute_interval: ... checked this often.
        skip_lookupd_authorization: Despite go-nsq's name, true (the default) sends ``auth_secret`` to nsqlookupd
            as ``Authorization: Bearer <secret>``, as go-nsq does.
    """

    client_id: str | None = None  # None: the short hostname (up to the first dot)
    hostname: str | None = None  # None: socket.gethostname()
    user_agent: str = f"trionsq/{__version__}"
    heartbeat_interval: float = 30.0  # <= 0: heartbeats disabled
    read_timeout: float = 60.0
    write_timeout: float = 1.0
    dial_timeout: float = 1.0
    local_addr: str | None = None  # "host:port" the connections are made from (None: the system's choice)
    output_buffer_size: int = 16384
    output_buffer_timeout: float = 0.25
    tls_v1: bool = False
    tls_context: ssl.SSLContext | None = None
    tls_insecure_skip_verify: bool = False
    tls_root_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_min_version: str | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    sample_rate: int = 0
    msg_timeout: float | None = None  # None: the server's --msg-timeout
    auth_secret: str | None = None
    max_in_flight: int = 1
    max_attempts: int = 5  # 0: unlimited
    default_requeue_delay: float = 90.0
    max_requeue_delay: float = 900.0
    backoff_strategy: str = "exponential"  # or "full_jitter"
    backoff_multiplier: float = 1.0
    max_backoff_duration: float = 120.0
    lookupd_poll_interval: float = 60.0
    lookupd_poll_jitter: float = 0.3
    lookupd_poll_timeout: float = 60.0
    low_rdy_idle_timeout: float = 10.0
    low_rdy_timeout: float = 30.0
    rdy_redistribute_interval: float = 5.0
    skip_lookupd_authorization: bool = True  # despite go-nsq's name: True sends auth_secret to lookupd
    _built_context: ssl.SSLContext | None = field(default=None, init=False, repr=False, compare=False)

    # -- text form ------------------------------------------------------------------------------

    def set(self, name: str, value: str | bool) -> None:
        """Set one option from go-nsq's name and Go's text syntax, as go-nsq's ``Config.Set`` reads text.

        Durations in Go's syntax (a bare number has no unit and is refused), booleans as Go's
        ``strconv.ParseBool`` reads them, integers in base 10. Dashes in names become underscores.
        Setting a ``tls_*`` option drops the TLS context built before.

        Args:
            name: go-nsq's option name (``max_in_flight``, ``read_timeout``...).
            value: The value as text; ``True`` (a bare name in `set_option_text`) or ``False`` for boolean options
                only.

        Raises:
            ValueError: The name is unknown, or the value does not parse or is out of range, with go-nsq's wording
                (``invalid option nope``, ``invalid read_timeout ! 50ms < 100ms``).
        """
        option = name.replace("-", "_")
        if option in _NOT_FROM_TEXT:
            raise ValueError(_NOT_FROM_TEXT[option])
        spec = _OPTIONS.get(option)
        if spec is None:
            raise ValueError(f"invalid option {option}")
        kind, low, high = spec
        if kind == _TLS_VERSION and value not in _TLS_VERSIONS:
            raise ValueError(f"ERROR: {_shown(value)} is not a tls version")
        try:
            parsed = self._coerce(kind, value)
        except ValueError as exc:
            raise ValueError(f"failed to coerce option {option} ({_shown(value)}) - {exc}") from None
        if parsed is not None and low is not None and parsed < low:
            raise ValueError(f"invalid {option} ! {_show(kind, parsed)} < {_show(kind, low)}")
        if parsed is not None and high is not None and parsed > high:
            raise ValueError(f"invalid {option} ! {_show(kind, parsed)} > {_show(kind, high)}")
        if option == "tls_root_ca_file" and not os.path.isfile(parsed):
            raise ValueError(f"ERROR: failed to read custom Certificate Authority file open {parsed}: no such file")
        if option.startswith("tls_"):
            self._built_context = None
        setattr(self, option, parsed)

    def set_option_text(self, text: str) -> None:
        """Set one option from ``"name,value"``, as the tools' ``--consumer-opt``/``--producer-opt`` take it.

        A bare ``"name"`` sets a boolean option to true. The value may itself contain commas.

        Raises:
            ValueError: As `set`.
        """
        name, comma, value = text.partition(",")
        self.set(name, value if comma else True)

    @staticmethod
    def _coerce(kind: str, value: str | bool) -> Any:
        if isinstance(value, bool):
            if kind != _BOOL:
                raise ValueError("invalid value type")
            return value
        if kind == _BOOL:
            return parse_go_bool(value)
        if kind == _STR:
            return value
        if kind == _INT:
            return _parse_base10(value)
        if kind == _UINT:
            return _parse_uint(value)
        if kind == _ADDR:
            return _parse_tcp_addr(value)
        if kind == _STRATEGY:
            if value not in _BACKOFF_STRATEGIES:
                raise ValueError("invalid value type")
            return _BACKOFF_STRATEGIES[value]
        if kind == _TLS_VERSION:
            return value
        if kind == _FLOAT:
            return _parse_float(value)
        if kind == _OPT_DURATION and value == "":
            return None
        return parse_duration(value)

    def copy(self, **changes: Any) -> Config:
        """A copy with some fields changed (the built TLS context is not carried over)."""
        return dataclasses.replace(self, **changes)

    # -- derived values -------------------------------------------------------------------------

    def effective_client_id(self) -> str:
        """The ``client_id`` sent in IDENTIFY: ``client_id``, else the short hostname."""
        if self.client_id is not None:
            return self.client_id
        return self.effective_hostname().split(".", 1)[0]

    def effective_hostname(self) -> str:
        """The ``hostname`` sent in IDENTIFY: ``hostname``, else ``socket.gethostname()``."""
        return self.hostname if self.hostname is not None else socket.gethostname()

    def ssl_context(self) -> ssl.SSLContext:
        """The context for the TLS upgrade: ``tls_context`` if set, else one built from the ``tls_*`` options.

        The built context is kept; `set` of a ``tls_*`` option makes the next call build it again.

        Raises:
            ValueError: A certificate or key file cannot be read, only one of ``tls_cert`` and ``tls_key`` is
                given, or ``tls_min_version`` is not a TLS version.
        """
        if self.tls_context is not None:
            return self.tls_context
        if self._built_context is None:
            self._built_context = self._build_context()
        return self._built_context

    def _build_context(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=self.tls_root_ca_file)
            if self.tls_insecure_skip_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if self.tls_cert or self.tls_key:
                if not (self.tls_cert and self.tls_key):
                    raise ValueError("tls_cert and tls_key must be given together")
                context.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot set up TLS: {exc}") from None
        if self.tls_min_version:
            version = _TLS_VERSIONS.get(self.tls_min_version.lower())
            if version is None:
                raise ValueError(
                    f"invalid tls_min_version {self.tls_min_version!r} (one of {', '.join(_TLS_VERSIONS)})"
                )
            context.minimum_version = version
        return context
