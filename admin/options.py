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
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from runtime.flags import ConfigSettings, DaemonOptions, FlagSet, OptionsError, check_log_level, setting
from runtime.startup import resolve_port, split_host_port

__all__ = [
    "Options",
    "OptionsError",
    "build_flagset",
    "config_names",
    "config_value",
    "normalize_base_path",
    "parse_options",
    "upstream_url",
    "validate",
]


@dataclass
class Options(DaemonOptions):
    """Every nsqadmin setting (durations in float seconds)."""

    program = "nsqadmin"

    log_prefix: str = setting("[nsqadmin] ", "log message prefix")
    http_address: str = setting("0.0.0.0:4171", "<addr>:<port> the web UI and its API listen on")
    base_path: str = setting("/", "URL path prefix under which every page and endpoint is served")
    dev_static_dir: str = setting("", "serve static files from this directory instead (development only)")
    graphite_url: str = setting("", "Graphite HTTP address, for the /api/graphite rate endpoint")
    proxy_graphite: bool = setting(False, "also serve <base-path>/render as a proxy to Graphite")
    statsd_prefix: str = setting("nsq.%s", "key prefix nsqd uses for statsd (%s is the host; must match nsqd)")
    statsd_counter_format: str = setting(
        "stats.counters.%s.count", "how statsd names counter keys (%s is the key); empty when it adds nothing"
    )
    statsd_gauge_format: str = setting(
        "stats.gauges.%s", "how statsd names gauge keys (%s is the key); empty when it adds nothing"
    )
    statsd_interval: float = setting(60.0, "how often nsqd pushes to statsd (must match nsqd)")
    notification_http_endpoint: str = setting("", "URL that receives a JSON POST for every admin action")
    http_client_connect_timeout: float = setting(2.0, "connect timeout for requests to nsqd and nsqlookupd")
    http_client_request_timeout: float = setting(5.0, "whole-request timeout for requests to nsqd and nsqlookupd")
    http_client_tls_insecure_skip_verify: bool = setting(False, "do not verify the certificates of HTTPS upstreams")
    http_client_tls_root_ca_file: str = setting("", "CA bundle for verifying HTTPS upstreams")
    http_client_tls_cert: str = setting("", "client certificate presented to HTTPS upstreams")
    http_client_tls_key: str = setting("", "key of the client certificate")
    allow_config_from_cidr: str = setting("127.0.0.1/8", "only addresses in this CIDR may use /config")
    acl_http_header: str = setting(
        "X-Forwarded-User", "request header naming the authenticated user (set by your proxy)"
    )
    admin_users: list[str] = setting(
        default_factory=list,
        help="user allowed to run actions (repeatable); when none is given every user may",
        flag="admin-user",
    )
    lookupd_http_addresses: list[str] = setting(
        default_factory=list,
        help="nsqlookupd HTTP address (repeatable)",
        flag="lookupd-http-address",
        config_key="nsqlookupd_http_addresses",
    )
    nsqd_http_addresses: list[str] = setting(
        default_factory=list, help="nsqd HTTP address (repeatable)", flag="nsqd-http-address"
    )
    # graphs without Graphite: how often the cluster is sampled, and how much history is kept
    history_interval: float = setting(5.0, "how often the cluster is sampled for the graphs")
    history_duration: float = setting(3600.0, "how much sampled history the graphs keep")


def build_flagset(defaults: Options | None = None) -> FlagSet:
    return Options.flagset(defaults)


def parse_options(argv: list[str], *, exit_on_error: bool = True) -> Options:
    """nsqadmin's options from its command line (without the program name) and ``--config`` file.

    With ``exit_on_error``: usage errors exit 2 with the usage, ``-h`` exits 0, ``--version`` prints the
    version and exits 0, config-file errors print a FATAL line and exit 1. Otherwise ``FlagError`` is raised.
    """
    opts = Options.from_argv(argv, exit_on_error=exit_on_error)
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
    for flag, url in (
        ("notification-http-endpoint", opts.notification_http_endpoint),
        ("graphite-url", opts.graphite_url),
    ):
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
