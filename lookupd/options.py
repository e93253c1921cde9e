"""nsqlookupd's options: its flags of NSQ v1.3.0 with their names, defaults and config-file keys.

Parsing follows Go's ``flag`` rules (``protocol.flags``), then the ``--config`` TOML file; each
option resolves as explicit flag > config key (the flag name with ``_``) > default. Durations are
float seconds here. ``--verbose`` is accepted and ignored, as in NSQ 1.3.0.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass, field, fields
from typing import Any

from protocol.flags import FlagError, FlagSet, load_config
from protocol.logfmt import log_level_word, parse_log_level
from protocol.version import version_string

__all__ = ["Options", "OptionsError", "build_flagset", "listen_failure", "parse_options", "validate"]

_LOG_PREFIX_FOR_FATAL = "[nsqlookupd] "  # NSQ reports config-file failures with this fixed prefix


class OptionsError(FlagError, ValueError):
    """A startup validation failure; the daemon logs it as FATAL and exits 1."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=1)


@dataclass
class Options:
    """Every nsqlookupd setting, with NSQ v1.3.0's defaults (durations in float seconds)."""

    log_level: str = "info"
    log_prefix: str = "[nsqlookupd] "
    tcp_address: str = "0.0.0.0:4160"
    http_address: str = "0.0.0.0:4161"
    broadcast_address: str = field(default_factory=socket.gethostname)
    inactive_producer_timeout: float = 300.0
    tombstone_lifetime: float = 45.0
    # command line only
    config: str = ""
    version: bool = False
    verbose: bool = False


# (flag, kind, help, extra FlagSet.add arguments)
_FLAGS: tuple[tuple[str, str, str, dict[str, Any]], ...] = (
    ("config", "str", "path to config file", {"in_config": False}),
    ("version", "bool", "print version string", {"in_config": False}),
    ("log-level", "str", "set log verbosity: debug, info, warn, error, or fatal",
     {"convert": log_level_word, "default_text": "INFO"}),
    ("log-prefix", "str", "log message prefix", {}),
    ("verbose", "bool", "[deprecated] has no effect, use --log-level", {"in_config": False}),
    ("tcp-address", "str", "<addr>:<port> to listen on for TCP clients", {}),
    ("http-address", "str", "<addr>:<port> to listen on for HTTP clients", {}),
    ("broadcast-address", "str", "address of this lookupd node, (default to the OS hostname)", {}),
    ("inactive-producer-timeout", "duration",
     "duration of time a producer will remain in the active list since its last ping", {}),
    ("tombstone-lifetime", "duration",
     "duration of time a producer will remain tombstoned if registration remains", {}),
)

_OPTION_FIELDS = frozenset(f.name for f in fields(Options))


def build_flagset(defaults: Options | None = None) -> FlagSet:
    """nsqlookupd's flags, with defaults taken from ``defaults`` (``Options()`` when omitted)."""
    base = defaults if defaults is not None else Options()
    flagset = FlagSet("nsqlookupd")
    for name, kind, help_text, extra in _FLAGS:
        attribute = name.replace("-", "_")
        flagset.add(name, kind, getattr(base, attribute), help_text, attr=attribute, **extra)
    return flagset


def parse_options(argv: list[str], *, exit_on_error: bool = True) -> Options:
    """nsqlookupd's options from its command line (without the program name) and ``--config`` file.

    With ``exit_on_error`` problems end the process as nsqlookupd does: usage errors exit 2 with the
    usage, ``-h`` exits 0, ``--version`` prints the version and exits 0, config-file errors print a
    FATAL line and exit 1. Otherwise ``FlagError`` is raised.
    """
    flagset = build_flagset()
    try:
        values = flagset.parse(argv)
        if values["version"]:
            if exit_on_error:
                sys.stdout.write(version_string("nsqlookupd") + "\n")
                sys.stdout.flush()
                raise SystemExit(0)
        elif values["config"]:
            values = flagset.resolve(load_config(values["config"]))
    except FlagError as exc:
        if exit_on_error:
            exc.exit(log_prefix=_LOG_PREFIX_FOR_FATAL)
        raise
    return Options(**{key: value for key, value in values.items() if key in _OPTION_FIELDS})


def validate(opts: Options) -> None:
    """Startup checks; ``OptionsError`` carries the message the daemon logs as FATAL."""
    try:
        parse_log_level(opts.log_level)
    except ValueError as exc:
        raise OptionsError(str(exc)) from None
    for name in ("tcp_address", "http_address"):
        address = getattr(opts, name)
        _host, sep, port = address.rpartition(":")
        if not sep:
            raise OptionsError(listen_failure(address, f"address {address}: missing port in address"))
        if not port.isdigit() or int(port) > 65535:
            raise OptionsError(listen_failure(address, f"address {port}: invalid port"))


def listen_failure(address: str, reason: str) -> str:
    """The FATAL text for a listener nsqlookupd cannot open."""
    return f"failed to instantiate nsqlookupd - listen ({address}) failed - listen tcp {address}: {reason}"
