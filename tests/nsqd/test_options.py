"""nsqd's flags, config file, validation and ``/config`` values."""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import socket
import zlib

import pytest

from nsqd.options import (
    Options,
    OptionsError,
    build_flagset,
    config_names,
    config_value,
    default_node_id,
    is_go_only,
    parse_options,
    replication_acks,
    validate,
    version_string,
)
from protocol.version import NSQ_VERSION
from runtime.flags import FlagError, HelpRequested


def parse(*argv: str) -> Options:
    return parse_options(list(argv), exit_on_error=False)


# Every flag of nsqd v1.3.0 (NSQ-FACTS 5.2) with the attribute and default it has here.
NSQ_DEFAULTS = {
    "log-level": ("log_level", "info"),
    "log-prefix": ("log_prefix", "[nsqd] "),
    "tcp-address": ("tcp_address", "0.0.0.0:4150"),
    "http-address": ("http_address", "0.0.0.0:4151"),
    "https-address": ("https_address", "0.0.0.0:4152"),
    "broadcast-tcp-port": ("broadcast_tcp_port", 0),
    "broadcast-http-port": ("broadcast_http_port", 0),
    "lookupd-tcp-address": ("lookupd_tcp_addresses", []),
    "auth-http-address": ("auth_http_addresses", []),
    "http-client-connect-timeout": ("http_client_connect_timeout", 2.0),
    "http-client-request-timeout": ("http_client_request_timeout", 5.0),
    "data-path": ("data_path", ""),
    "mem-queue-size": ("mem_queue_size", 10000),
    "max-bytes-per-file": ("max_bytes_per_file", 104857600),
    "sync-every": ("sync_every", 2500),
    "sync-timeout": ("sync_timeout", 2.0),
    "queue-scan-worker-pool-max": ("queue_scan_worker_pool_max", 4),
    "queue-scan-selection-count": ("queue_scan_selection_count", 20),
    "msg-timeout": ("msg_timeout", 60.0),
    "max-msg-timeout": ("max_msg_timeout", 900.0),
    "max-msg-size": ("max_msg_size", 1048576),
    "max-body-size": ("max_body_size", 5242880),
    "max-req-timeout": ("max_req_timeout", 3600.0),
    "max-heartbeat-interval": ("max_heartbeat_interval", 60.0),
    "max-rdy-count": ("max_rdy_count", 2500),
    "max-output-buffer-size": ("max_output_buffer_size", 65536),
    "max-output-buffer-timeout": ("max_output_buffer_timeout", 30.0),
    "min-output-buffer-timeout": ("min_output_buffer_timeout", 0.025),
    "output-buffer-timeout": ("output_buffer_timeout", 0.25),
    "max-channel-consumers": ("max_channel_consumers", 0),
    "statsd-address": ("statsd_address", ""),
    "statsd-prefix": ("statsd_prefix", "nsq.%s"),
    "statsd-interval": ("statsd_interval", 60.0),
    "statsd-mem-stats": ("statsd_mem_stats", True),
    "statsd-udp-packet-size": ("statsd_udp_packet_size", 508),
    "statsd-exclude-ephemeral": ("statsd_exclude_ephemeral", False),
    "e2e-processing-latency-percentile": ("e2e_processing_latency_percentiles", []),
    "e2e-processing-latency-window-time": ("e2e_processing_latency_window_time", 600.0),
    "tls-cert": ("tls_cert", ""),
    "tls-key": ("tls_key", ""),
    "tls-client-auth-policy": ("tls_client_auth_policy", ""),
    "tls-root-ca-file": ("tls_root_ca_file", ""),
    "tls-required": ("tls_required", "false"),
    "tls-min-version": ("tls_min_version", "tls1.0"),
    "deflate": ("deflate", True),
    "max-deflate-level": ("max_deflate_level", 6),
    "snappy": ("snappy", True),
    "actor-workers": ("actor_workers", 1),
    "actor-slice": ("actor_slice", 0.0003),
    "actor-interlude": ("actor_interlude", 0.00001),
    "workers": ("workers", 1),
    "replicate-to": ("replicate_to", []),
    "replication-acks": ("replication_acks", 0),
    "replication-min-insync": ("replication_min_insync", 0),
    "replication-candidates": ("replication_candidates", []),
    "replication-replace-after": ("replication_replace_after", 0.0),
    "replication-degraded": ("replication_degraded", "refuse"),
    "replica-takeover-timeout": ("replica_takeover_timeout", 30.0),
    "log-retention-time": ("log_retention_time", 0.0),
    "log-retention-bytes": ("log_retention_bytes", 0),
    "config": ("config", ""),
    "version": ("version", False),
}


def test_every_nsq_flag_exists_with_its_default():
    fs = build_flagset()
    opts = parse()
    expected_names = set(NSQ_DEFAULTS) | {"node-id", "broadcast-address", "verbose", "worker-id"}
    assert {flag.name for flag in fs.flags} == expected_names
    for name, (attr, default) in NSQ_DEFAULTS.items():
        assert fs.lookup(name).attr == attr, name
        assert getattr(opts, attr) == default, name
        assert getattr(Options(), attr) == default, name


def test_fixed_internal_values():
    opts = Options()
    assert (
        opts.queue_scan_interval,
        opts.queue_scan_refresh_interval,
        opts.queue_scan_dirty_percent,
        opts.client_timeout,
    ) == (0.1, 5.0, 0.25, 60.0)
    assert build_flagset().lookup("queue-scan-interval") is None


def test_hostname_defaults():
    hostname = socket.gethostname()
    opts = parse()
    assert opts.broadcast_address == hostname
    assert opts.node_id == default_node_id(hostname)


@pytest.mark.parametrize("hostname", ["localhost", "nsqd-1.example.com", "ünïcode"])
def test_default_node_id_is_crc32_of_md5(hostname):
    digest = hashlib.md5(hostname.encode()).digest()
    assert default_node_id(hostname) == zlib.crc32(digest) % 1024


def test_a_replicating_node_defaults_its_node_id_to_the_hash_of_its_address(tmp_path):
    # nodes sharing a host share the hostname's default, and adopted messages keep their IDs
    hostname = socket.gethostname()
    ids = {
        port: parse(
            "--broadcast-address=10.0.0.1", f"--tcp-address=0.0.0.0:{port}", "--replicate-to=10.0.0.2:4150"
        ).node_id
        for port in (4150, 4250, 4350)
    }
    assert ids == {port: default_node_id(f"10.0.0.1:{port}") for port in ids}
    assert len(set(ids.values())) == 3
    assert parse("--broadcast-address=10.0.0.1", "--tcp-address=0.0.0.0:4150").node_id == default_node_id(hostname)
    # given, it stays
    for given in (("--node-id=7",), ("-node-id", "7")):
        assert parse("--broadcast-address=10.0.0.1", "--replicate-to=10.0.0.2:4150", *given).node_id == 7
    path = tmp_path / "nsqd.toml"
    path.write_text("id = 9\n")
    assert parse(f"--config={path}", "--broadcast-address=10.0.0.1", "--replicate-to=10.0.0.2:4150").node_id == 9


def test_default_node_id_known_value():
    # md5("localhost") = 421aa90e079fa326b6494f812ad13e79, whose IEEE CRC-32 is 1762046992; mod 1024 = 16
    assert hashlib.md5(b"localhost").hexdigest() == "421aa90e079fa326b6494f812ad13e79"
    assert zlib.crc32(bytes.fromhex("421aa90e079fa326b6494f812ad13e79")) == 1762046992
    assert default_node_id("localhost") == 16
    assert default_node_id("nsqd-1.example.com") == 995


def test_command_line_values():
    opts = parse(
        "--node-id=12",
        "-mem-queue-size",
        "0",
        "--msg-timeout=90s",
        "-lookupd-tcp-address=a:4160",
        "--lookupd-tcp-address",
        "b:4160",
        "--auth-http-address=http://auth/x?a,b",
        "--deflate=false",
        "-snappy=0",
        "--e2e-processing-latency-percentile=0.5,0.99",
        "-e2e-processing-latency-percentile=1",
        "--log-level=DEBUG",
        "--actor-workers=2",
        "--actor-slice=1ms",
        "--actor-interlude=0",
        "--max-req-timeout=1.5h",
        "--workers=3",
    )
    assert opts.node_id == 12
    assert opts.mem_queue_size == 0
    assert opts.msg_timeout == 90.0
    assert opts.lookupd_tcp_addresses == ["a:4160", "b:4160"]
    assert opts.auth_http_addresses == ["http://auth/x?a,b"]
    assert (opts.deflate, opts.snappy) == (False, False)
    assert opts.e2e_processing_latency_percentiles == [1.0, 0.99, 0.5]
    assert opts.log_level == "debug"
    assert (opts.actor_workers, opts.actor_slice, opts.actor_interlude) == (2, 0.001, 0.0)
    assert opts.max_req_timeout == 5400.0
    assert opts.workers == 3


@pytest.mark.parametrize(
    "argv, tls_required, tcp_address",
    [
        (["--tls-required"], "true", "0.0.0.0:4150"),
        (["--tls-required=true"], "true", "0.0.0.0:4150"),
        (["--tls-required=TCP-HTTPS"], "tcp-https", "0.0.0.0:4150"),
        (["--tls-required=false", "--tcp-address=:1"], "false", ":1"),
        (["--tls-required=0"], "false", "0.0.0.0:4150"),
        # a bool-style flag: the next argument is positional and parsing stops there, as in Go
        (["--tls-required", "tcp-https", "--tcp-address=:1"], "true", "0.0.0.0:4150"),
    ],
)
def test_tls_required_forms(argv, tls_required, tcp_address):
    opts = parse(*argv)
    assert (opts.tls_required, opts.tcp_address) == (tls_required, tcp_address)


def test_tls_required_helpers():
    assert (Options().tls_required_on_tcp(), Options().tls_required_on_http()) == (False, False)
    opts = Options(tls_required="tcp-https")
    assert (opts.tls_required_on_tcp(), opts.tls_required_on_http()) == (True, False)
    opts = Options(tls_required="true")
    assert (opts.tls_required_on_tcp(), opts.tls_required_on_http()) == (True, True)
    opts = Options(tls_client_auth_policy="require")
    assert (opts.tls_required_on_tcp(), opts.tls_required_on_http()) == (True, True)


def test_client_auth_policy_forces_tls_required():
    opts = parse("--tls-client-auth-policy=require-verify", "--tls-cert=c.pem", "--tls-key=k.pem")
    assert opts.tls_required == "true"
    validate(opts)
    opts = parse("--tls-client-auth-policy=require", "--tls-required=tcp-https", "--tls-cert=c", "--tls-key=k")
    assert opts.tls_required == "tcp-https"
    with pytest.raises(OptionsError, match="cannot require TLS client connections without TLS key and cert"):
        validate(parse("--tls-client-auth-policy=require"))


def test_tls_min_version():
    assert parse("--tls-min-version=TLS1.2").tls_min_version == "tls1.2"
    assert parse("--tls-min-version=tls1.3").tls_min_version == "tls1.3"
    assert parse("--tls-min-version=").tls_min_version == "tls1.0"
    with pytest.raises(FlagError) as info:
        parse("--tls-min-version=tls9")
    assert info.value.message == 'invalid value "tls9" for flag -tls-min-version: unknown tlsVersionOption "tls9"'


def test_invalid_log_level_flag():
    with pytest.raises(FlagError) as info:
        parse("--log-level=loud")
    assert info.value.message == (
        "invalid value \"loud\" for flag -log-level: invalid log level 'loud' (debug, info, warn, error, fatal)"
    )


def test_go_only_flags_are_accepted_and_reported():
    opts = parse("--verbose", "--worker-id", "--mem-queue-size=5")
    assert opts.ignored_flags == ("verbose", "worker-id")
    assert opts.mem_queue_size == 5
    assert parse().ignored_flags == ()
    # --worker-id is a boolean in NSQ 1.3.0: a value after it stops the parsing
    opts = parse("--worker-id", "5", "--mem-queue-size=5")
    assert opts.mem_queue_size == 10000
    assert is_go_only("verbose") and is_go_only("--worker-id") and is_go_only("worker_id")
    assert not is_go_only("snappy") and not is_go_only("statsd-mem-stats")


# --------------------------------------------------------------------------------------------
# config file

CONFIG = """
id = 77
log_level = "warn"
tcp_address = "127.0.0.1:5150"
nsqlookupd_tcp_addresses = ["l1:4160", "l2:4160"]
auth_http_addresses = "a1:4181,a2:4181"
e2e_processing_latency_percentiles = [0.5, 1.0, 0.99]
msg_timeout = "2m"
sync_timeout = 1500
max_req_timeout = "1.5h"
mem_queue_size = 5
deflate = false
tls_required = "tcp-https"
tls_min_version = "tls1.1"
tls_cert = "c.pem"
tls_key = "k.pem"
# keys named after the flags instead of NSQ's config names are ignored, like nsqd does
node_id = 3
lookupd_tcp_address = ["ignored:1"]
actor_workers = 8
workers = 2
"""


def test_config_file(tmp_path):
    path = tmp_path / "nsqd.toml"
    path.write_text(CONFIG)
    opts = parse("--config", str(path), "--mem-queue-size=6")
    assert opts.node_id == 77
    assert opts.log_level == "warn"
    assert opts.tcp_address == "127.0.0.1:5150"
    assert opts.lookupd_tcp_addresses == ["l1:4160", "l2:4160"]
    assert opts.auth_http_addresses == ["a1:4181", "a2:4181"]
    assert opts.e2e_processing_latency_percentiles == [0.5, 1.0, 0.99]
    assert opts.msg_timeout == 120.0
    assert opts.sync_timeout == 1.5  # integer milliseconds
    assert opts.max_req_timeout == 5400.0
    assert opts.mem_queue_size == 6  # the flag wins over the file
    assert opts.deflate is False
    assert (opts.tls_required, opts.tls_min_version) == ("tcp-https", "tls1.1")
    assert opts.actor_workers == 8
    assert opts.workers == 2
    assert opts.http_address == "0.0.0.0:4151"  # default
    validate(opts)


@pytest.mark.parametrize(
    "line, attr, value",
    [
        ("tls_required = true", "tls_required", "true"),
        ("tls_required = false", "tls_required", "false"),
        ("tls_required = 1", "tls_required", "true"),
        ('tls_required = "TRUE"', "tls_required", "true"),
        ('log_level = "DEBUG"', "log_level", "debug"),
        ('statsd_mem_stats = "false"', "statsd_mem_stats", False),
        ("max_heartbeat_interval = 30000", "max_heartbeat_interval", 30.0),
    ],
)
def test_config_special_values(tmp_path, line, attr, value):
    path = tmp_path / "nsqd.toml"
    path.write_text(line + "\n")
    assert getattr(parse(f"--config={path}"), attr) == value


@pytest.mark.parametrize(
    "line",
    [
        'tls_required = "sometimes"',
        'tls_min_version = "tls0.9"',
        'log_level = "loud"',
        'msg_timeout = "60"',
        "mem_queue_size = 1.5",
        "nsqlookupd_tcp_addresses = 4160",
    ],
)
def test_config_bad_values(tmp_path, line):
    path = tmp_path / "nsqd.toml"
    path.write_text(line + "\n")
    with pytest.raises(FlagError) as info:
        parse(f"--config={path}")
    assert info.value.exit_code == 1
    assert line.split(" =")[0] in info.value.message


# --------------------------------------------------------------------------------------------
# process behaviour (Go's ExitOnError)


def test_unknown_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as exited:
        parse_options(["--mem-queue-size=1", "--no-such-flag"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("flag provided but not defined: -no-such-flag\nUsage of nsqd:\n")
    assert "  -tls-required\n    \trequire TLS for client connections (true, false, tcp-https)\n" in err


def test_help_exits_0(capsys):
    with pytest.raises(SystemExit) as exited:
        parse_options(["--help"])
    assert exited.value.code == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("Usage of nsqd:\n  -actor-interlude duration\n")
    node_id = default_node_id(socket.gethostname())
    if node_id:  # Go prints no "(default 0)"
        assert f"(default is hash of hostname) (default {node_id})\n" in captured.err
    with pytest.raises(HelpRequested):
        parse("-h")


def test_version(capsys, tmp_path):
    with pytest.raises(SystemExit) as exited:
        parse_options(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"nsqd v1.3.0 (built w/python{platform.python_version()})\n"
    # --version is honoured before the config file is read
    opts = parse("--version", f"--config={tmp_path / 'missing.toml'}")
    assert opts.version is True
    assert NSQ_VERSION == "1.3.0"
    assert version_string("nsqlookupd").startswith("nsqlookupd v1.3.0 (built w/python3.")


def test_config_error_exits_1_with_fatal_line(capsys, tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(SystemExit) as exited:
        parse_options([f"--config={missing}"])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("[nsqd] ")
    assert err.endswith(f" FATAL: failed to load config file {missing} - open {missing}: no such file or directory\n")


# --------------------------------------------------------------------------------------------
# validation

VALIDATION_CASES = [
    ({"max_deflate_level": 0}, "--max-deflate-level must be [1,9]"),
    ({"max_deflate_level": 10}, "--max-deflate-level must be [1,9]"),
    ({"node_id": -1}, "--node-id must be [0,1024)"),
    ({"node_id": 1024}, "--node-id must be [0,1024)"),
    ({"tls_required": "true"}, "cannot require TLS client connections without TLS key and cert"),
    (
        {"tls_required": "tcp-https", "tls_cert": "c"},
        "failed to build TLS config - --tls-cert and --tls-key must be given together",
    ),
    ({"tls_client_auth_policy": "require"}, "cannot require TLS client connections without TLS key and cert"),
    ({"e2e_processing_latency_percentiles": [0.5, 0.0]}, "invalid E2E processing latency percentile: 0"),
    ({"e2e_processing_latency_percentiles": [1.5]}, "invalid E2E processing latency percentile: 1.5"),
    ({"e2e_processing_latency_percentiles": [-0.1]}, "invalid E2E processing latency percentile: -0.1"),
    ({"tls_required": "maybe"}, "invalid --tls-required 'maybe' (true, false, tcp-https)"),
    ({"log_level": "loud"}, "invalid log level 'loud' (debug, info, warn, error, fatal)"),
    ({"queue_scan_worker_pool_max": 0}, "--queue-scan-worker-pool-max must be at least 1"),
    ({"queue_scan_selection_count": -1}, "--queue-scan-selection-count must be at least 1"),
    ({"actor_workers": 0}, "--actor-workers must be at least 1"),
    ({"actor_slice": 0.0}, "--actor-slice must be positive"),
    ({"actor_interlude": -0.001}, "--actor-interlude must not be negative"),
    ({"workers": 0}, "--workers must be at least 1"),
    ({"workers": -2}, "--workers must be at least 1"),
    ({"replicate_to": ["nohost"]}, "--replicate-to 'nohost' is not HOST:PORT"),
    (
        {"replicate_to": ["h:1"], "replication_acks": 2},
        "--replication-acks must be [0,1] (the number of --replicate-to)",
    ),
    ({"replicate_to": ["h:1", "g:2", "h:1"]}, "--replicate-to 'h:1' is given twice"),
    (
        {"replicate_to": ["h:1", "127.0.0.1:4150"], "tcp_address": "127.0.0.1:4150", "broadcast_address": "a"},
        "--replicate-to '127.0.0.1:4150' is this node itself",
    ),
    (
        {"replicate_to": ["h:1", "a:5150"], "broadcast_address": "a", "broadcast_tcp_port": 5150},
        "--replicate-to 'a:5150' is this node itself",
    ),
    (
        {"replicate_to": ["h:1", "g:2"], "replication_min_insync": 4},
        "--replication-min-insync must be [2,3] (this node and its 2 --replicate-to peer(s))",
    ),
    (
        {"replicate_to": ["h:1"], "replication_min_insync": 1},
        "--replication-min-insync must be [2,2] (this node and its 1 --replicate-to peer(s))",
    ),
    ({"replication_min_insync": 2}, "--replication-min-insync needs --replicate-to"),
    (
        {"replicate_to": ["h:1", "g:2"], "replication_min_insync": 3, "replication_acks": 1},
        "--replication-acks and --replication-min-insync disagree (acks = min-insync - 1)",
    ),
    (
        {"replicate_to": ["h:1"], "replication_candidates": ["g:2", "h:1"]},
        "--replication-candidates 'h:1' is given twice (or is a --replicate-to peer)",
    ),
    ({"replicate_to": ["h:1"], "replication_candidates": ["g"]}, "--replication-candidates 'g' is not HOST:PORT"),
    ({"replication_replace_after": -1.0}, "--replication-replace-after must not be negative"),
    ({"replication_degraded": "maybe"}, "--replication-degraded must be 'refuse' or 'accept'"),
    ({"replica_takeover_timeout": -1.0}, "--replica-takeover-timeout must not be negative"),
]


@pytest.mark.parametrize("changes, message", VALIDATION_CASES)
def test_validation_errors(changes, message):
    opts = dataclasses.replace(Options(node_id=1), **changes)
    with pytest.raises(OptionsError) as info:
        validate(opts)
    assert str(info.value) == message
    assert isinstance(info.value, ValueError) and info.value.exit_code == 1


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"max_deflate_level": 1},
        {"max_deflate_level": 9},
        {"node_id": 0},
        {"node_id": 1023},
        {"e2e_processing_latency_percentiles": [1.0, 0.001]},
        {"tls_required": "true", "tls_cert": "c", "tls_key": "k"},
    ],
)
def test_validation_accepts(changes):
    validate(dataclasses.replace(Options(node_id=1), **changes))


# --------------------------------------------------------------------------------------------
# GET /config/<name>


def test_config_values():
    opts = parse(
        "--node-id=42",
        "--lookupd-tcp-address=l:4160",
        "--log-level=warn",
        "--min-output-buffer-timeout=25ms",
        "--tls-required=tcp-https",
        "--tls-min-version=tls1.2",
    )
    assert config_value(opts, "id") == 42
    assert config_value(opts, "nsqlookupd_tcp_addresses") == ["l:4160"]
    assert config_value(opts, "auth_http_addresses") == []
    assert config_value(opts, "log_level") == 3
    assert config_value(opts, "msg_timeout") == 60_000_000_000
    assert config_value(opts, "min_output_buffer_timeout") == 25_000_000
    assert config_value(opts, "actor_slice") == 300_000
    assert config_value(opts, "actor_interlude") == 10_000
    assert config_value(opts, "tls_required") == 1
    assert config_value(opts, "tls_min_version") == 0x0303
    assert config_value(opts, "max_msg_size") == 1048576
    assert config_value(opts, "deflate") is True
    assert config_value(opts, "statsd_prefix") == "nsq.%s"
    assert config_value(Options(), "tls_min_version") == 769
    assert config_value(Options(), "tls_required") == 0
    assert config_value(Options(tls_required="true"), "tls_required") == 2
    opts.lookupd_tcp_addresses.append("other")
    assert config_value(opts, "nsqlookupd_tcp_addresses") == ["l:4160", "other"]


@pytest.mark.parametrize(
    "name",
    [
        "node_id",
        "lookupd_tcp_addresses",
        "queue_scan_interval",
        "client_timeout",
        "verbose",
        "version",
        "config",
        "nope",
    ],
)
def test_config_value_unknown_names(name):
    with pytest.raises(KeyError):
        config_value(Options(), name)


NSQ_CONFIG_RENAMES = {
    "lookupd-tcp-address": "nsqlookupd_tcp_addresses",
    "auth-http-address": "auth_http_addresses",
    "e2e-processing-latency-percentile": "e2e_processing_latency_percentiles",
}


def test_config_names_cover_every_configurable_flag():
    expected = {
        NSQ_CONFIG_RENAMES.get(flag, flag.replace("-", "_"))
        for flag in NSQ_DEFAULTS
        if flag not in ("config", "version")
    }
    assert set(config_names()) == expected | {"id", "broadcast_address"}
    for name in config_names():
        config_value(Options(), name)


@pytest.mark.parametrize(
    "peers, acks, min_insync, expected",
    [
        (1, 0, 0, 1),
        (2, 0, 0, 1),  # three copies, two in sync: either peer may die without a refused publish
        (2, 0, 3, 2),
        (2, 2, 0, 2),
        (2, 1, 2, 1),
        (0, 0, 0, 0),
    ],
)
def test_the_acknowledgement_rule_counts_the_origin(peers, acks, min_insync, expected):
    opts = dataclasses.replace(
        Options(node_id=1),
        replicate_to=[f"h{i}:1" for i in range(peers)],
        replication_acks=acks,
        replication_min_insync=min_insync,
    )
    validate(opts)
    assert replication_acks(opts) == expected
