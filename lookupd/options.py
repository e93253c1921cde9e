"""nsqlookupd's options: its flags of NSQ v1.3.0 with their names, defaults and config-file keys.

Parsing follows Go's ``flag`` rules (``runtime.flags``), then the ``--config`` TOML file; each
option resolves as explicit flag > config key (the flag name with ``_``) > default. Durations are
float seconds here. ``--verbose`` is accepted and ignored, as in NSQ 1.3.0.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from runtime.flags import (
    NSQ_COMMON_FLAGS,
    FlagRow,
    FlagSet,
    OptionsError,
    check_log_level,
    flagset_from_table,
    options_from_values,
    read_options,
)

__all__ = ["Options", "OptionsError", "build_flagset", "parse_options", "validate"]


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


# (flag, kind, attribute or None for the name in snake_case, help, extra FlagSet.add arguments)
_FLAGS: tuple[FlagRow, ...] = NSQ_COMMON_FLAGS + (
    ("tcp-address", "str", None, "<addr>:<port> to listen on for TCP clients", {}),
    ("http-address", "str", None, "<addr>:<port> to listen on for HTTP clients", {}),
    ("broadcast-address", "str", None, "address of this lookupd node, (default to the OS hostname)", {}),
    ("inactive-producer-timeout", "duration", None,
     "duration of time a producer will remain in the active list since its last ping", {}),
    ("tombstone-lifetime", "duration", None,
     "duration of time a producer will remain tombstoned if registration remains", {}),
)


def build_flagset(defaults: Options | None = None) -> FlagSet:
    """nsqlookupd's flags, with defaults taken from ``defaults`` (``Options()`` when omitted)."""
    return flagset_from_table("nsqlookupd", _FLAGS, defaults if defaults is not None else Options())


def parse_options(argv: list[str], *, exit_on_error: bool = True) -> Options:
    """nsqlookupd's options from its command line (without the program name) and ``--config`` file.

    With ``exit_on_error`` problems end the process as nsqlookupd does: usage errors exit 2 with the
    usage, ``-h`` exits 0, ``--version`` prints the version and exits 0, config-file errors print a
    FATAL line and exit 1. Otherwise ``FlagError`` is raised.
    """
    return options_from_values(Options, read_options(build_flagset(), argv, exit_on_error=exit_on_error))


def validate(opts: Options) -> None:
    """Startup checks; ``OptionsError`` carries the message the daemon logs as FATAL. (A listen address is
    checked when it is bound: a path is a unix socket's, ``runtime.startup.bind_address``.)"""
    check_log_level(opts.log_level)
