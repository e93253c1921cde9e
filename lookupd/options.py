"""nsqlookupd's options: its flags of NSQ v1.3.0 with their names, defaults and config-file keys.

Parsing follows Go's ``flag`` rules (``runtime.flags``), then the ``--config`` TOML file; each
option resolves as explicit flag > config key (the flag name with ``_``) > default. Durations are
float seconds here. ``--verbose`` is accepted and ignored, as in NSQ 1.3.0.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from runtime.flags import DaemonOptions, FlagSet, OptionsError, check_log_level, setting

__all__ = ["Options", "OptionsError", "build_flagset", "parse_options", "validate"]


@dataclass
class Options(DaemonOptions):
    """Every nsqlookupd setting, with NSQ v1.3.0's defaults (durations in float seconds)."""

    program = "nsqlookupd"

    log_prefix: str = setting("[nsqlookupd] ", "log message prefix")
    tcp_address: str = setting("0.0.0.0:4160", "<addr>:<port> to listen on for TCP clients")
    http_address: str = setting("0.0.0.0:4161", "<addr>:<port> to listen on for HTTP clients")
    broadcast_address: str = setting(
        default_factory=socket.gethostname, help="address of this lookupd node, (default to the OS hostname)"
    )
    inactive_producer_timeout: float = setting(
        300.0, "duration of time a producer will remain in the active list since its last ping"
    )
    tombstone_lifetime: float = setting(
        45.0, "duration of time a producer will remain tombstoned if registration remains"
    )


def build_flagset(defaults: Options | None = None) -> FlagSet:
    """nsqlookupd's flags, with defaults taken from ``defaults`` (``Options()`` when omitted)."""
    return Options.flagset(defaults)


def parse_options(argv: list[str], *, exit_on_error: bool = True) -> Options:
    """nsqlookupd's options from its command line (without the program name) and ``--config`` file.

    With ``exit_on_error`` problems end the process as nsqlookupd does: usage errors exit 2 with the
    usage, ``-h`` exits 0, ``--version`` prints the version and exits 0, config-file errors print a
    FATAL line and exit 1. Otherwise ``FlagError`` is raised.
    """
    return Options.from_argv(argv, exit_on_error=exit_on_error)


def validate(opts: Options) -> None:
    """Startup checks; ``OptionsError`` carries the message the daemon logs as FATAL. (A listen address is
    checked when it is bound: a path is a unix socket's, ``runtime.startup.bind_address``.)"""
    check_log_level(opts.log_level)
