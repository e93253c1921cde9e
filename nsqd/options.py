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
from dataclasses import dataclass
from typing import Any

from protocol.version import NSQ_VERSION, version_string
from runtime.flags import (
    ConfigSettings,
    DaemonOptions,
    FlagSet,
    OptionsError,
    check_log_level,
    go_format_float,
    go_quote,
    load_config,
    parse_go_bool,
    setting,
)

__all__ = [
    "GO_ONLY_FLAGS",
    "NSQ_VERSION",
    "Options",
    "replication_node_id",
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


@dataclass
class Options(DaemonOptions):
    """Every nsqd setting, with NSQ v1.3.0's defaults (durations in float seconds)."""

    program = "nsqd"
    logged_ignored_flags = GO_ONLY_FLAGS

    # identity and logging
    node_id: int = setting(
        default_factory=lambda: default_node_id(_hostname()),
        help="unique part for message IDs, (int) in range [0,1024) (default is hash of hostname)",
        config_key="id",
    )
    log_prefix: str = setting("[nsqd] ", "log message prefix")
    worker_id: bool = setting(False, "[deprecated] use --node-id", in_config=False)
    # listeners and registration
    tcp_address: str = setting("0.0.0.0:4150", "<addr>:<port> to listen on for TCP clients")
    http_address: str = setting("0.0.0.0:4151", "<addr>:<port> to listen on for HTTP clients")
    https_address: str = setting("0.0.0.0:4152", "<addr>:<port> to listen on for HTTPS clients")
    broadcast_address: str = setting(
        default_factory=_hostname, help="address that will be registered with lookupd (defaults to the OS hostname)"
    )
    broadcast_tcp_port: int = setting(
        0, "TCP port that will be registered with lookupd (defaults to the TCP port that this nsqd is listening on)"
    )
    broadcast_http_port: int = setting(
        0, "HTTP port that will be registered with lookupd (defaults to the HTTP port that this nsqd is listening on)"
    )
    lookupd_tcp_addresses: list[str] = setting(
        default_factory=list,
        help="lookupd TCP address (may be given multiple times)",
        flag="lookupd-tcp-address",
        config_key="nsqlookupd_tcp_addresses",
    )
    auth_http_addresses: list[str] = setting(
        default_factory=list,
        help="<addr>:<port> or a full url to query auth server (may be given multiple times)",
        flag="auth-http-address",
    )
    http_client_connect_timeout: float = setting(2.0, "timeout for HTTP connect")
    http_client_request_timeout: float = setting(5.0, "timeout for HTTP request")
    # disk queues
    data_path: str = setting("", "path to store disk-backed messages")
    mem_queue_size: int = setting(10000, "number of messages to keep in memory (per topic/channel)")
    max_bytes_per_file: int = setting(104857600, "number of bytes per diskqueue file before rolling")
    sync_every: int = setting(2500, "number of messages per diskqueue fsync")
    sync_timeout: float = setting(2.0, "duration of time per diskqueue fsync")
    queue_scan_worker_pool_max: int = setting(4, "max concurrency for checking in-flight and deferred message timeouts")
    queue_scan_selection_count: int = setting(
        20, "number of channels to check per cycle (every 100ms) for in-flight and deferred timeouts"
    )
    # messages and commands
    msg_timeout: float = setting(60.0, "default duration to wait before auto-requeing a message")
    max_msg_timeout: float = setting(900.0, "maximum duration before a message will timeout")
    max_msg_size: int = setting(1048576, "maximum size of a single message in bytes")
    max_body_size: int = setting(5242880, "maximum size of a single command body")
    max_req_timeout: float = setting(3600.0, "maximum requeuing timeout for a message")
    # limits on what clients may negotiate
    max_heartbeat_interval: float = setting(
        60.0, "maximum client configurable duration of time between client heartbeats"
    )
    max_rdy_count: int = setting(2500, "maximum RDY count for a client")
    max_output_buffer_size: int = setting(
        65536, "maximum client configurable size (in bytes) for a client output buffer"
    )
    max_output_buffer_timeout: float = setting(
        30.0, "maximum client configurable duration of time between flushing to a client"
    )
    min_output_buffer_timeout: float = setting(
        0.025, "minimum client configurable duration of time between flushing to a client"
    )
    output_buffer_timeout: float = setting(0.25, "default duration of time between flushing data to clients")
    max_channel_consumers: int = setting(
        0, "maximum channel consumer connection count per nsqd instance (default 0, i.e., unlimited)"
    )
    # statsd
    statsd_address: str = setting("", "UDP <addr>:<port> of a statsd daemon for pushing stats")
    statsd_prefix: str = setting("nsq.%s", "prefix used for keys sent to statsd (%s for host replacement)")
    statsd_interval: float = setting(60.0, "duration between pushing to statsd")
    statsd_mem_stats: bool = setting(True, "toggle sending memory and GC stats to statsd")
    statsd_udp_packet_size: int = setting(508, "the size in bytes of statsd UDP packets")
    statsd_exclude_ephemeral: bool = setting(False, "Skip ephemeral topics and channels when sending stats to statsd")
    # end-to-end latency
    e2e_processing_latency_percentiles: list[float] = setting(
        default_factory=list,
        help="message processing time percentiles (as float (0, 1.0]) to track (can be specified multiple times or "
        "comma separated '1.0,0.99,0.95', default none)",
        flag="e2e-processing-latency-percentile",
    )
    e2e_processing_latency_window_time: float = setting(
        600.0,
        "calculate end to end latency quantiles for this duration of time (ie: 60s would only show quantile "
        "calculations from the past 60 seconds)",
    )
    # TLS
    tls_cert: str = setting("", "path to certificate file")
    tls_key: str = setting("", "path to key file")
    tls_client_auth_policy: str = setting("", "client certificate auth policy ('require' or 'require-verify')")
    tls_root_ca_file: str = setting("", "path to certificate authority file")
    tls_required: str = setting(
        "false",
        "require TLS for client connections (true, false, tcp-https)",
        convert=_parse_tls_required,
        bool_like=True,
    )
    tls_min_version: str = setting(
        "tls1.0",
        "minimum SSL/TLS version acceptable ('ssl3.0', 'tls1.0', 'tls1.1', 'tls1.2' or 'tls1.3')",
        convert=_parse_tls_min_version,
        default_text=lambda word: str(TLS_MIN_VERSIONS[word]),
    )
    # compression
    deflate: bool = setting(True, "enable deflate feature negotiation (client compression)")
    max_deflate_level: int = setting(
        6, "max deflate compression level a client can negotiate (> values == > nsqd CPU usage)"
    )
    snappy: bool = setting(True, "enable snappy feature negotiation (client compression)")
    # the channel actor scheduler (flags of this implementation)
    actor_workers: int = setting(1, "number of worker tasks running channel actors")
    actor_slice: float = setting(0.0003, "time a channel actor may deliver before yielding to the others")
    actor_interlude: float = setting(
        0.00001, "how often a channel actor's slice pauses to read connections that send little (0 to disable)"
    )
    # processes serving one node (a flag of this implementation; bench/MULTICORE.md)
    workers: int = setting(1, "number of processes serving this node's clients (1: one process, as nsqd 1.3.0)")
    # replication between trionsq nodes (flags of this implementation; nsqd/replication/)
    replicate_to: list[str] = setting(
        default_factory=list,
        help="<addr>:<port> of a trionsq node that keeps copies of this node's messages (may be given multiple times)",
    )
    replication_min_insync: int = setting(
        0,
        "how many copies, this node's included, must hold a message before it is acknowledged, as Kafka's "
        "min.insync.replicas (default: 2; with --replicate-to)",
    )
    replication_acks: int = setting(
        0, "how many --replicate-to peers must hold a message before it is acknowledged (--replication-min-insync - 1)"
    )
    replication_candidates: list[str] = setting(
        default_factory=list,
        help="<addr>:<port> of a trionsq node that may take the place of a --replicate-to peer gone for good "
        "(may be given multiple times; see --replication-replace-after)",
    )
    replication_replace_after: float = setting(
        0.0,
        "replace a --replicate-to peer that has not streamed for this long by the first --replication-candidates "
        "node that is up (0: never)",
    )
    replication_degraded: str = setting(
        "refuse", "with fewer peers reachable than --replication-acks: 'refuse' publishes or 'accept' them unreplicated"
    )
    replica_takeover_timeout: float = setting(
        30.0,
        "adopt an origin's messages once its replication stream stayed closed this long and its address refuses "
        "connections (0: only on request)",
    )
    # log channels read by offset (flags of this implementation; nsqd/LOG-PROTOCOL.md)
    log_retention_time: float = setting(
        0.0, "keep the committed messages of log channels this long (0: removed once committed)"
    )
    log_retention_bytes: int = setting(
        0, "keep at most this many bytes of committed messages per log channel (0: removed once committed)"
    )
    # fixed inside nsqd 1.3.0, not flags
    queue_scan_interval: float = 0.1
    queue_scan_refresh_interval: float = 5.0
    queue_scan_dirty_percent: float = 0.25
    client_timeout: float = 60.0

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


def build_flagset(defaults: Options | None = None) -> FlagSet:
    """nsqd's flags, with defaults taken from ``defaults`` (``Options()`` when omitted)."""
    return Options.flagset(defaults)


def parse_options(argv: list[str], *, exit_on_error: bool = True) -> Options:
    """nsqd's options from its command line (without the program name) and ``--config`` file.

    With ``exit_on_error`` (Go's ``ExitOnError``, the default) problems end the process as nsqd
    does: usage errors print the message and usage to stderr and exit 2, ``-h`` prints the usage
    and exits 0, ``--version`` prints ``version_string()`` to stdout and exits 0, config-file
    errors print a FATAL log line and exit 1. Otherwise ``FlagError`` is raised and ``--version``
    returns options with ``version=True`` (the config file is then not read).
    Startup validation is separate: call ``validate``.
    """
    opts = Options.from_argv(argv, exit_on_error=exit_on_error)
    opts.tls_required = opts.effective_tls_required()
    if opts.replicate_to and not _node_id_given(argv, opts.config):
        opts.node_id = replication_node_id(opts.broadcast_address, opts.tcp_address)
    return opts


def replication_node_id(broadcast_address: str, tcp_address: str) -> int:
    """The default ``--node-id`` of a node that replicates: the hash of its name as its peers know it (broadcast
    address and TCP port) instead of its hostname's. Adopted messages keep their IDs, so replicating nodes need
    distinct node IDs, and nodes sharing a host share the hostname's."""
    return default_node_id(f"{broadcast_address}:{tcp_address.rpartition(':')[2]}")


def _node_id_given(argv: list[str], config_path: str) -> bool:
    """Whether ``--node-id`` is on the command line (``-node-id``, ``--node-id=N``...) or ``id`` in the config."""
    for token in argv:
        if token == "--":
            break
        if token.startswith("-") and token.lstrip("-").split("=", 1)[0] == "node-id":
            return True
    return bool(config_path) and "id" in load_config(config_path)


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
    # nsqd 1.3.0 takes these and then stalls its queue scan (or panics once there are channels)
    for flag, value in (
        ("queue-scan-worker-pool-max", opts.queue_scan_worker_pool_max),
        ("queue-scan-selection-count", opts.queue_scan_selection_count),
    ):
        if value < 1:
            raise OptionsError(f"--{flag} must be at least 1")
    if opts.actor_workers < 1:
        raise OptionsError("--actor-workers must be at least 1")
    if opts.actor_slice <= 0:
        raise OptionsError("--actor-slice must be positive")
    if opts.actor_interlude < 0:
        raise OptionsError("--actor-interlude must not be negative")
    if opts.workers < 1:
        raise OptionsError("--workers must be at least 1")
    if opts.workers > 4096:  # each worker issues its share of a millisecond's 4096 message IDs (guid.py)
        raise OptionsError("--workers must be at most 4096")
    _check_replication(opts)
    if opts.replication_degraded not in ("refuse", "accept"):
        raise OptionsError("--replication-degraded must be 'refuse' or 'accept'")
    if opts.replica_takeover_timeout < 0:
        raise OptionsError("--replica-takeover-timeout must not be negative")


def _check_replication(opts: Options) -> None:
    """The peers are distinct HOST:PORTs other than this node, and the acknowledgement rule can be met."""
    own = _own_addresses(opts)
    for number, peer in enumerate(opts.replicate_to):
        if not _is_host_port(peer):
            raise OptionsError(f"--replicate-to {peer!r} is not HOST:PORT")
        if peer in opts.replicate_to[:number]:
            raise OptionsError(f"--replicate-to {peer!r} is given twice")
        if peer in own:
            raise OptionsError(f"--replicate-to {peer!r} is this node itself")
    for number, candidate in enumerate(opts.replication_candidates):
        if not _is_host_port(candidate):
            raise OptionsError(f"--replication-candidates {candidate!r} is not HOST:PORT")
        if candidate in opts.replicate_to or candidate in opts.replication_candidates[:number]:
            raise OptionsError(f"--replication-candidates {candidate!r} is given twice (or is a --replicate-to peer)")
        if candidate in own:
            raise OptionsError(f"--replication-candidates {candidate!r} is this node itself")
    if opts.replication_replace_after < 0:
        raise OptionsError("--replication-replace-after must not be negative")
    copies = 1 + len(opts.replicate_to)
    if not 0 <= opts.replication_acks <= len(opts.replicate_to):
        raise OptionsError(f"--replication-acks must be [0,{len(opts.replicate_to)}] (the number of --replicate-to)")
    if opts.replication_min_insync:
        if not 2 <= opts.replication_min_insync <= copies:
            raise OptionsError(
                f"--replication-min-insync must be [2,{copies}] (this node and its {len(opts.replicate_to)} "
                "--replicate-to peer(s))"
                if opts.replicate_to
                else "--replication-min-insync needs --replicate-to"
            )
        if opts.replication_acks and opts.replication_acks != opts.replication_min_insync - 1:
            raise OptionsError("--replication-acks and --replication-min-insync disagree (acks = min-insync - 1)")


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _own_addresses(opts: Options) -> set[str]:
    """The names this node is known by (``--broadcast-address`` or ``--tcp-address`` with its TCP port), as far as
    the flags say (a port 0 is known only once bound: ``NSQD`` checks again then)."""
    host, _, port = opts.tcp_address.rpartition(":")
    ports = {p for p in (port, str(opts.broadcast_tcp_port or "")) if p.isdigit() and int(p)}
    hosts = {h for h in (opts.broadcast_address, host.strip("[]")) if h and h not in ("0.0.0.0", "::")}
    return {f"{h}:{p}" for h in hosts for p in ports}


def replication_acks(opts: Options) -> int:
    """How many peers must hold a message before its ``OK``: ``--replication-acks``, or
    ``--replication-min-insync`` less this node's copy; by default one (two copies in sync, Kafka's usual
    ``min.insync.replicas=2``), which with two peers lets either one die without refusing a publish."""
    if opts.replication_acks:
        return opts.replication_acks
    if opts.replication_min_insync:
        return opts.replication_min_insync - 1
    return min(1, len(opts.replicate_to))


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
