"""nsqadmin's options: NSQ v1.3.0's nsqadmin flags with their names, defaults and config-file keys, plus two
of this implementation (``--history-interval``, ``--history-duration``) for the built-in graphs.

Parsing follows Go's ``flag`` rules (``runtime.flags``), then the ``--config`` TOML file; each option resolves
as explicit flag > config key > default. Durations are float seconds. The repeatable address flags have the
config keys ``nsqlookupd_http_addresses`` and ``nsqd_http_addresses``, ``--admin-user`` has ``admin_users``.

Startup checks (``validate``) follow nsqadmin's: exactly one kind of upstream address, the client certificate
and key together, a parseable CIDR and notification URL. ``--base-path`` is normalised to one leading slash
and no trailing one, so ``admin``, ``/admin/`` and ``//admin`` all mount the UI at ``/admin``.
"""

from __future__ import annotations

import ipaddress
import posixpath
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from runtime.flags import (
    ConfigSettings,
    FlagRow,
    FlagSet,
    OptionsError,
    check_log_level,
    flagset_from_table,
    options_from_values,
    read_options,
)
from runtime.logfmt import log_level_word
from runtime.startup import resolve_port, split_host_port

__all__ = ["Options", "OptionsError", "build_flagset", "config_names", "config_value", "normalize_base_path",
           "parse_options", "upstream_url", "validate"]


@dataclass
class Options:
    """Every nsqadmin setting (durations in float seconds)."""

    log_level: str = "info"
    log_prefix: str = "[nsqadmin] "
    http_address: str = "0.0.0.0:4171"
    base_path: str = "/"
    dev_static_dir: str = ""
    graphite_url: str = ""
    proxy_graphite: bool = False
    statsd_prefix: str = "nsq.%s"
    statsd_counter_format: str = "stats.counters.%s.count"
    statsd_gauge_format: str = "stats.gauges.%s"
    statsd_interval: float = 60.0
    notification_http_endpoint: str = ""
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    http_client_tls_insecure_skip_verify: bool = False
    http_client_tls_root_ca_file: str = ""
    http_client_tls_cert: str = ""
    http_client_tls_key: str = ""
    allow_config_from_cidr: str = "127.0.0.1/8"
    acl_http_header: str = "X-Forwarded-User"
    admin_users: list[str] = field(default_factory=list)
    lookupd_http_addresses: list[str] = field(default_factory=list)
    nsqd_http_addresses: list[str] = field(default_factory=list)
    # graphs without Graphite: how often the cluster is sampled, and how much history is kept
    history_interval: float = 5.0
    history_duration: float = 3600.0
    # command line only
    config: str = ""
    version: bool = False
    verbose: bool = False


# (flag, kind, attribute or None, help, extra FlagSet.add arguments)
_FLAGS: tuple[FlagRow, ...] = (
    ("config", "str", None, "read options from this TOML file", {"in_config": False}),
    ("version", "bool", None, "show the version and exit", {"in_config": False}),
    ("log-level", "str", None, "lowest level logged: debug, info, warn, error or fatal",
     {"convert": log_level_word, "default_text": "INFO"}),
    ("log-prefix", "str", None, "text at the start of every log line", {}),
    ("verbose", "bool", None, "[deprecated] ignored; use --log-level", {"in_config": False}),
    ("http-address", "str", None, "<addr>:<port> the web UI and its API listen on", {}),
    ("base-path", "str", None, "URL path prefix under which every page and endpoint is served", {}),
    ("dev-static-dir", "str", None, "serve static files from this directory instead (development only)", {}),
    ("graphite-url", "str", None, "Graphite HTTP address, for the /api/graphite rate endpoint", {}),
    ("proxy-graphite", "bool", None, "also serve <base-path>/render as a proxy to Graphite", {}),
    ("statsd-prefix", "str", None, "key prefix nsqd uses for statsd (%s is the host; must match nsqd)", {}),
    ("statsd-counter-format", "str", None,
     "how statsd names counter keys (%s is the key); empty when it adds nothing", {}),
    ("statsd-gauge-format", "str", None, "how statsd names gauge keys (%s is the key); empty when it adds nothing",
     {}),
    ("statsd-interval", "duration", None, "how often nsqd pushes to statsd (must match nsqd)", {}),
    ("notification-http-endpoint", "str", None, "URL that receives a JSON POST for every admin action", {}),
    ("http-client-connect-timeout", "duration", None, "connect timeout for requests to nsqd and nsqlookupd", {}),
    ("http-client-request-timeout", "duration", None, "whole-request timeout for requests to nsqd and nsqlookupd",
     {}),
    ("http-client-tls-insecure-skip-verify", "bool", None, "do not verify the certificates of HTTPS upstreams", {}),
    ("http-client-tls-root-ca-file", "str", None, "CA bundle for verifying HTTPS upstreams", {}),
    ("http-client-tls-cert", "str", None, "client certificate presented to HTTPS upstreams", {}),
    ("http-client-tls-key", "str", None, "key of the client certificate", {}),
    ("allow-config-from-cidr", "str", None, "only addresses in this CIDR may use /config", {}),
    ("acl-http-header", "str", None, "request header naming the authenticated user (set by your proxy)", {}),
    ("admin-user", "str_list", "admin_users",
     "user allowed to run actions (repeatable); when none is given every user may", {"config_key": "admin_users"}),
    ("lookupd-http-address", "str_list", "lookupd_http_addresses", "nsqlookupd HTTP address (repeatable)",
     {"config_key": "nsqlookupd_http_addresses"}),
    ("nsqd-http-address", "str_list", "nsqd_http_addresses", "nsqd HTTP address (repeatable)",
     {"config_key": "nsqd_http_addresses"}),
    ("history-interval", "duration", None, "how often the cluster is sampled for the graphs", {}),
    ("history-duration", "duration", None, "how much sampled history the graphs keep", {}),
)

def build_flagset(defaults: Options | None = None) -> FlagSet:
    return flagset_from_table("nsqadmin", _FLAGS, defaults if defaults is not None else Options())


def parse_options(argv: list[str], *, exit_on_error: bool = True) -> Options:
    """nsqadmin's options from its command line (without the program name) and ``--config`` file.

    With ``exit_on_error``: usage errors exit 2 with the usage, ``-h`` exits 0, ``--version`` prints the
    version and exits 0, config-file errors print a FATAL line and exit 1. Otherwise ``FlagError`` is raised.
    """
    opts = options_from_values(Options, read_options(build_flagset(), argv, exit_on_error=exit_on_error))
    opts.base_path = normalize_base_path(opts.base_path)
    return opts


def normalize_base_path(path: str) -> str:
    """One leading slash, cleaned, no trailing slash except for the root: ``admin/`` → ``/admin``."""
    cleaned = posixpath.normpath("/" + path.strip())
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    return cleaned


def upstream_url(address: str) -> str:
    """``host:port`` → ``http://host:port``; a full ``http(s)://`` URL stays (without a trailing slash)."""
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    return "http://" + address


def _check_address(flag: str, address: str) -> None:
    """nsqadmin resolves each upstream ``host:port`` at start-up; a full ``http(s)://`` URL needs a host and port."""
    if address.startswith(("http://", "https://")):
        try:
            parts = urlsplit(address)
            port = parts.port
        except ValueError:
            parts, port = urlsplit(""), None
        if not parts.hostname or port is None or parts.path not in ("", "/"):
            raise OptionsError(f"failed to resolve --{flag} ({address}) - address {address}: missing port in address")
        return
    try:
        resolve_port(split_host_port(address)[1])
    except ValueError as exc:
        raise OptionsError(f"failed to resolve --{flag} ({address}) - {exc}") from None


def _is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket
        return False
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def validate(opts: Options) -> None:
    """Startup checks; ``OptionsError`` carries the message the daemon logs as FATAL."""
    check_log_level(opts.log_level)
    if not opts.lookupd_http_addresses and not opts.nsqd_http_addresses:
        raise OptionsError("--nsqd-http-address or --lookupd-http-address required")
    if opts.lookupd_http_addresses and opts.nsqd_http_addresses:
        raise OptionsError("use --nsqd-http-address or --lookupd-http-address not both")
    for address in opts.lookupd_http_addresses:
        _check_address("lookupd-http-address", address)
    for address in opts.nsqd_http_addresses:
        _check_address("nsqd-http-address", address)
    if bool(opts.http_client_tls_cert) != bool(opts.http_client_tls_key):
        raise OptionsError("--http-client-tls-cert and --http-client-tls-key must be specified together")
    try:
        ipaddress.ip_network(opts.allow_config_from_cidr, strict=False)
    except ValueError:
        raise OptionsError(f"failed to parse --allow-config-from-cidr ({opts.allow_config_from_cidr})") from None
    for flag, url in (("notification-http-endpoint", opts.notification_http_endpoint),
                      ("graphite-url", opts.graphite_url)):
        if url and not _is_http_url(url):
            raise OptionsError(f"failed to parse --{flag} ({url})")
    if opts.history_interval <= 0:
        raise OptionsError("--history-interval must be positive")
    if opts.history_duration < opts.history_interval:
        raise OptionsError("--history-duration must be at least --history-interval")


_SETTINGS = ConfigSettings(build_flagset(), Options)


def config_names() -> tuple[str, ...]:
    return _SETTINGS.names()


def config_value(opts: Options, name: str) -> Any:
    """The JSON value of ``GET /config/<name>``; ``KeyError`` for unknown names. Durations are nanoseconds and
    the log level NSQ's integer, as the Go daemons report them."""
    return _SETTINGS.value(opts, name)
