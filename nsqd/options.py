"""nsqd's options: every flag of nsqd v1.3.0 with its name, default and config-file key.

``parse_options`` reads the command line with Go's rules (``runtime.flags``), then the
``--config`` TOML file, and resolves each option as NSQ does: explicit flag > config key >
default. Config keys are the flag names with ``_``, except NSQ's renames ``node-id`` → ``id``,
``lookupd-tcp-address`` → ``nsqlookupd_tcp_addresses``, ``auth-http-address`` →
``auth_http_addresses`` and ``e2e-processing-latency-percentile`` →
``e2e_processing_latency_percentiles``. The same config names serve ``GET /config/<name>``
(``config_value``), which reports values as NSQ's JSON does: durations in nanoseconds, the log
level as 1..5, ``tls_required`` as 0 (false), 1 (tcp-https) or 2 (true), ``tls_min_version`` as
the TLS version number (769 for tls1.0).

Attributes are the flag names in snake_case, with the repeatable flags in the plural
(``lookupd_tcp_addresses``); durations are float seconds; ``tls_required`` is ``"false"``,
``"tcp-https"`` or ``"true"``; ``log_level`` is the lowercase word.

``--verbose`` and ``--worker-id`` are accepted and ignored, as NSQ 1.3.0 does (``is_go_only``);
the ones given are listed in ``Options.ignored_flags`` for the daemon to log. Three project flags
tune the channel actor scheduler: ``--actor-workers``, ``--actor-slice`` and ``--actor-interlude``.
"""

from __future__ import annotations

import hashlib
import socket
import zlib
from dataclasses import dataclass, field
from typing import Any

from runtime.flags import (
    NSQ_COMMON_FLAGS,
    ConfigSettings,
    FlagRow,
    FlagSet,
    OptionsError,
    check_log_level,
    flagset_from_table,
    go_format_float,
    go_quote,
    options_from_values,
    parse_go_bool,
    read_options,
)
from protocol.version import NSQ_VERSION, version_string

__all__ = [
    "GO_ONLY_FLAGS",
    "NSQ_VERSION",
    "Options",
    "OptionsError",
    "TLS_MIN_VERSIONS",
    "TLS_REQUIRED_VALUES",
    "build_flagset",
    "config_names",
    "config_value",
    "default_node_id",
    "is_go_only",
    "parse_options",
    "validate",
    "version_string",
]

#: NSQ's ``tls_required`` values, indexed by the integer ``GET /config/tls_required`` reports.
TLS_REQUIRED_VALUES = ("false", "tcp-https", "true")
#: ``--tls-min-version`` words and Go's ``tls.Version*`` numbers.
TLS_MIN_VERSIONS = {"ssl3.0": 0x0300, "tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304}
#: Flags of NSQ that only tuned or named Go internals: accepted, ignored, logged.
GO_ONLY_FLAGS = frozenset({"verbose", "worker-id"})


def default_node_id(hostname: str) -> int:
    """NSQ's default ``--node-id``: IEEE CRC-32 of the MD5 digest of the hostname, mod 1024."""
    return zlib.crc32(hashlib.md5(hostname.encode()).digest()) % 1024


def _hostname() -> str:
    return socket.gethostname()


@dataclass
class Options:
    """Every nsqd setting, with NSQ v1.3.0's defaults (durations in float seconds)."""

    # identity and logging
    node_id: int = field(default_factory=lambda: default_node_id(_hostname()))
    log_level: str = "info"
    log_prefix: str = "[nsqd] "
    # listeners and registration
    tcp_address: str = "0.0.0.0:4150"
    http_address: str = "0.0.0.0:4151"
    https_address: str = "0.0.0.0:4152"
    broadcast_address: str = field(default_factory=_hostname)
    broadcast_tcp_port: int = 0
    broadcast_http_port: int = 0
    lookupd_tcp_addresses: list[str] = field(default_factory=list)
    auth_http_addresses: list[str] = field(default_factory=list)
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    # disk queues
    data_path: str = ""
    mem_queue_size: int = 10000
    max_bytes_per_file: int = 104857600
    sync_every: int = 2500
    sync_timeout: float = 2.0
    queue_scan_worker_pool_max: int = 4
    queue_scan_selection_count: int = 20
    # messages and commands
    msg_timeout: float = 60.0
    max_msg_timeout: float = 900.0
    max_msg_size: int = 1048576
    max_body_size: int = 5242880
    max_req_timeout: float = 3600.0
    # limits on what clients may negotiate
    max_heartbeat_interval: float = 60.0
    max_rdy_count: int = 2500
    max_output_buffer_size: int = 65536
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25
    max_channel_consumers: int = 0
    # statsd
    statsd_address: str = ""
    statsd_prefix: str = "nsq.%s"
    statsd_interval: float = 60.0
    statsd_mem_stats: bool = True
    statsd_udp_packet_size: int = 508
    statsd_exclude_ephemeral: bool = False
    # end-to-end latency
    e2e_processing_latency_percentiles: list[float] = field(default_factory=list)
    e2e_processing_latency_window_time: float = 600.0
    # TLS
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_auth_policy: str = ""
    tls_root_ca_file: str = ""
    tls_required: str = "false"
    tls_min_version: str = "tls1.0"
    # compression
    deflate: bool = True
    max_deflate_level: int = 6
    snappy: bool = True
    # the channel actor scheduler (flags of this implementation)
    actor_workers: int = 1
    actor_slice: float = 0.0003
    actor_interlude: float = 0.00001
    # replication between trionsq nodes (flags of this implementation; nsqd/replication/)
    replicate_to: list[str] = field(default_factory=list)
    replication_acks: int = 0  # 0: every peer of --replicate-to
    replication_degraded: str = "refuse"
    replica_takeover_timeout: float = 30.0
    # fixed inside nsqd 1.3.0, not flags
    queue_scan_interval: float = 0.1
    queue_scan_refresh_interval: float = 5.0
    queue_scan_dirty_percent: float = 0.25
    client_timeout: float = 60.0
    # command line only
    config: str = ""
    version: bool = False
    ignored_flags: tuple[str, ...] = ()

    def effective_tls_required(self) -> str:
        """``tls_required`` after NSQ's rule that a client-auth policy implies ``true``."""
        if self.tls_client_auth_policy and self.tls_required == "false":
            return "true"
        return self.tls_required

    def tls_required_on_tcp(self) -> bool:
        """TCP clients must upgrade to TLS before anything but IDENTIFY (``true`` and ``tcp-https``)."""
        return self.effective_tls_required() != "false"

    def tls_required_on_http(self) -> bool:
        """Plain HTTP requests are refused with 403 (``true`` only)."""
        return self.effective_tls_required() == "true"


# --------------------------------------------------------------------------------------------
# custom flag values


def _parse_tls_required(text: str) -> str:
    word = text.lower()
    if word == "tcp-https":
        return "tcp-https"
    return "true" if parse_go_bool(word) else "false"


def _parse_tls_min_version(text: str) -> str:
    word = text.lower()
    if word == "":  # NSQ leaves the setting unchanged
        return "tls1.0"
    if word not in TLS_MIN_VERSIONS:
        raise ValueError(f"unknown tlsVersionOption {go_quote(word)}")
    return word


# (flag, kind, attribute or None for the name in snake_case, help, extra FlagSet.add arguments)
_FLAGS: tuple[FlagRow, ...] = NSQ_COMMON_FLAGS + (
    ("node-id", "int", None, "unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
     {"config_key": "id"}),
    ("worker-id", "bool", None, "[deprecated] use --node-id", {"in_config": False}),
    ("https-address", "str", None, "<addr>:<port> to listen on for HTTPS clients", {}),
    ("http-address", "str", None, "<addr>:<port> to listen on for HTTP clients", {}),
    ("tcp-address", "str", None, "<addr>:<port> to listen on for TCP clients", {}),
    ("auth-http-address", "str_list", "auth_http_addresses",
     "<addr>:<port> or a full url to query auth server (may be given multiple times)",
     {"config_key": "auth_http_addresses"}),
    ("broadcast-address", "str", None, "address that will be registered with lookupd (defaults to the OS hostname)",
     {}),
    ("broadcast-tcp-port", "int", None,
     "TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd is listening on)", {}),
    ("broadcast-http-port", "int", None,
     "HTTP port that will be registered with lookupd (defaults to the HTTP port that this nsqd is listening on)", {}),
    ("lookupd-tcp-address", "str_list", "lookupd_tcp_addresses", "lookupd TCP address (may be given multiple times)",
     {"config_key": "nsqlookupd_tcp_addresses"}),
    ("http-client-connect-timeout", "duration", None, "timeout for HTTP connect", {}),
    ("http-client-request-timeout", "duration", None, "timeout for HTTP request", {}),
    ("data-path", "str", None, "path to store disk-backed messages", {}),
    ("mem-queue-size", "int", None, "number of messages to keep in memory (per topic/channel)", {}),
    ("max-bytes-per-file", "int", None, "number of bytes per diskqueue file before rolling", {}),
    ("sync-every", "int", None, "number of messages per diskqueue fsync", {}),
    ("sync-timeout", "duration", None, "duration of time per diskqueue fsync", {}),
    ("queue-scan-worker-pool-max", "int", None,
     "max concurrency for checking in-flight and deferred message timeouts", {}),
    ("queue-scan-selection-count", "int", None,
     "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts", {}),
    ("msg-timeout", "duration", None, "default duration to wait before auto-requeing a message", {}),
    ("max-msg-timeout", "duration", None, "maximum duration before a message will timeout", {}),
    ("max-msg-size", "int", None, "maximum size of a single message in bytes", {}),
    ("max-req-timeout", "duration", None, "maximum requeuing timeout for a message", {}),
    ("max-body-size", "int", None, "maximum size of a single command body", {}),
    ("max-heartbeat-interval", "duration", None,
     "maximum client configurable duration of time between client heartbeats", {}),
    ("max-rdy-count", "int", None, "maximum RDY count for a client", {}),
    ("max-output-buffer-size", "int", None,
     "maximum client configurable size (in bytes) for a client output buffer", {}),
    ("max-output-buffer-timeout", "duration", None,
     "maximum client configurable duration of time between flushing to a client", {}),
    ("min-output-buffer-timeout", "duration", None,
     "minimum client configurable duration of time between flushing to a client", {}),
    ("output-buffer-timeout", "duration", None, "default duration of time between flushing data to clients", {}),
    ("max-channel-consumers", "int", None,
     "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)", {}),
    ("statsd-address", "str", None, "UDP <addr>:<port> of a statsd daemon for pushing stats", {}),
    ("statsd-interval", "duration", None, "duration between pushing to statsd", {}),
    ("statsd-mem-stats", "bool", None, "toggle sending memory and GC stats to statsd", {}),
    ("statsd-prefix", "str", None, "prefix used for keys sent to statsd (%s for host replacement)", {}),
    ("statsd-udp-packet-size", "int", None, "the size in bytes of statsd UDP packets", {}),
    ("statsd-exclude-ephemeral", "bool", None, "Skip ephemeral topics and channels when sending stats to statsd", {}),
    ("e2e-processing-latency-percentile", "float_list", "e2e_processing_latency_percentiles",
     "message processing time percentiles (as float (0, 1.0]) to track (can be specified multiple times or comma "
     "separated '1.0,0.99,0.95', default none)",
     {"config_key": "e2e_processing_latency_percentiles"}),
    ("e2e-processing-latency-window-time", "duration", None,
     "calculate end to end latency quantiles for this duration of time (ie: 60s would only show quantile "
     "calculations from the past 60 seconds)", {}),
    ("tls-cert", "str", None, "path to certificate file", {}),
    ("tls-key", "str", None, "path to key file", {}),
    ("tls-client-auth-policy", "str", None, "client certificate auth policy ('require' or 'require-verify')", {}),
    ("tls-root-ca-file", "str", None, "path to certificate authority file", {}),
    ("tls-required", "str", None, "require TLS for client connections (true, false, tcp-https)",
     {"convert": _parse_tls_required, "bool_like": True}),
    ("tls-min-version", "str", None,
     "minimum SSL/TLS version acceptable ('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')",
     {"convert": _parse_tls_min_version, "default_text": lambda word: str(TLS_MIN_VERSIONS[word])}),
    ("deflate", "bool", None, "enable deflate feature negotiation (client compression)", {}),
    ("max-deflate-level", "int", None,
     "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)", {}),
    ("snappy", "bool", None, "enable snappy feature negotiation (client compression)", {}),
    ("actor-workers", "int", None, "number of worker tasks running channel actors", {}),
    ("actor-slice", "duration", None, "time a channel actor may deliver before yielding to the others", {}),
    ("actor-interlude", "duration", None,
     "how often a channel actor's slice pauses to read connections that send little (0 to disable)", {}),
    ("replicate-to", "str_list", "replicate_to",
     "<addr>:<port> of a trionsq node that keeps copies of this node's messages (may be given multiple times)", {}),
    ("replication-acks", "int", None,
     "how many --replicate-to peers must hold a message before it is acknowledged (default: all of them)", {}),
    ("replication-degraded", "str", None,
     "with fewer peers reachable than --replication-acks: 'refuse' publishes or 'accept' them unreplicated", {}),
    ("replica-takeover-timeout", "duration", None,
     "adopt an origin's messages once its replication stream stayed closed this long (0: only on request)", {}),
)


def build_flagset(defaults: Options | None = None) -> FlagSet:
    """nsqd's flags, with defaults taken from ``defaults`` (``Options()`` when omitted)."""
    return flagset_from_table("nsqd", _FLAGS, defaults if defaults is not None else Options())


def parse_options(argv: list[str], *, exit_on_error: bool = True) -> Options:
    """nsqd's options from its command line (without the program name) and ``--config`` file.

    With ``exit_on_error`` (Go's ``ExitOnError``, the default) problems end the process as nsqd
    does: usage errors print the message and usage to stderr and exit 2, ``-h`` prints the usage
    and exits 0, ``--version`` prints ``version_string()`` to stdout and exits 0, config-file
    errors print a FATAL log line and exit 1. Otherwise ``FlagError`` is raised and ``--version``
    returns options with ``version=True`` (the config file is then not read).
    Startup validation is separate: call ``validate``.
    """
    flagset = build_flagset()
    values = read_options(flagset, argv, exit_on_error=exit_on_error)
    ignored = tuple(name for name in sorted(GO_ONLY_FLAGS) if name.replace("-", "_") in flagset.given)
    opts = options_from_values(Options, values, ignored_flags=ignored)
    opts.tls_required = opts.effective_tls_required()
    return opts


def validate(opts: Options) -> None:
    """nsqd's startup checks, in NSQ's order; ``OptionsError`` carries NSQ's message.

    (The data-path lock is taken, and checked, by the server when it opens the directory.)
    """
    if not 1 <= opts.max_deflate_level <= 9:
        raise OptionsError("--max-deflate-level must be [1,9]")
    if not 0 <= opts.node_id < 1024:
        raise OptionsError("--node-id must be [0,1024)")
    if opts.tls_required not in TLS_REQUIRED_VALUES:
        raise OptionsError(f"invalid --tls-required {opts.tls_required!r} (true, false, tcp-https)")
    if opts.tls_min_version not in TLS_MIN_VERSIONS:
        raise OptionsError(f"unknown tlsVersionOption {go_quote(opts.tls_min_version)}")
    check_log_level(opts.log_level)
    if bool(opts.tls_cert) != bool(opts.tls_key):
        raise OptionsError("failed to build TLS config - --tls-cert and --tls-key must be given together")
    if opts.effective_tls_required() != "false" and not (opts.tls_cert and opts.tls_key):
        raise OptionsError("cannot require TLS client connections without TLS key and cert")
    for percentile in opts.e2e_processing_latency_percentiles:
        if not 0 < percentile <= 1:
            raise OptionsError(f"invalid E2E processing latency percentile: {go_format_float(percentile)}")
    if opts.actor_workers < 1:
        raise OptionsError("--actor-workers must be at least 1")
    if opts.actor_slice <= 0:
        raise OptionsError("--actor-slice must be positive")
    if opts.actor_interlude < 0:
        raise OptionsError("--actor-interlude must not be negative")
    for peer in opts.replicate_to:
        host, _, port = peer.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionsError(f"--replicate-to {peer!r} is not HOST:PORT")
    if not 0 <= opts.replication_acks <= len(opts.replicate_to):
        raise OptionsError(f"--replication-acks must be [0,{len(opts.replicate_to)}] (the number of --replicate-to)")
    if opts.replication_degraded not in ("refuse", "accept"):
        raise OptionsError("--replication-degraded must be 'refuse' or 'accept'")
    if opts.replica_takeover_timeout < 0:
        raise OptionsError("--replica-takeover-timeout must not be negative")


def is_go_only(name: str) -> bool:
    """True for NSQ flags that are accepted and ignored here (``verbose``, ``worker-id``)."""
    return name.lstrip("-").replace("_", "-") in GO_ONLY_FLAGS


# hostname-independent defaults keep import cheap
_SETTINGS = ConfigSettings(build_flagset(Options(node_id=0, broadcast_address="")), Options)


def config_names() -> tuple[str, ...]:
    """The names ``GET /config/<name>`` knows (NSQ's config-file keys)."""
    return _SETTINGS.names()


def config_value(opts: Options, name: str) -> Any:
    """The JSON value NSQ reports for ``GET /config/<name>``; ``KeyError`` for unknown names."""
    if name == "tls_required":
        return TLS_REQUIRED_VALUES.index(opts.effective_tls_required())
    if name == "tls_min_version":
        return TLS_MIN_VERSIONS[opts.tls_min_version]
    return _SETTINGS.value(opts, name)
