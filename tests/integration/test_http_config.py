"""Configuration as nsqd exposes it: GET/PUT /config/:opt, the --config TOML file, --version, ignored Go-only
flags, the listening log lines with the real ports, --http-address="" and --tls-required=true over plain HTTP
(shared NSQ-FACTS 4.2 and 5)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from tests.integration.harness import REPO_ROOT, RawClient
from tests.integration.http_helpers import get, raw_exchange, request

pytestmark = pytest.mark.timeout(60)


def put(address, path: str, body: bytes | str):
    return request(address, "PUT", path, body=body)


def expect_error(reply, status: int, code: str) -> None:
    assert (reply.status, reply.body) == (status, b'{"message":"%s"}' % code.encode()), reply


@pytest.mark.parametrize(
    "option, expected",
    [
        ("msg_timeout", 60_000_000_000),
        ("max_msg_timeout", 900_000_000_000),
        ("max_req_timeout", 3_600_000_000_000),
        ("log_level", 2),
        ("mem_queue_size", 10000),
        ("max_msg_size", 1048576),
        ("max_body_size", 5242880),
        ("max_rdy_count", 2500),
        ("nsqlookupd_tcp_addresses", []),
        ("auth_http_addresses", []),
        ("e2e_processing_latency_percentiles", []),
        ("e2e_processing_latency_window_time", 600_000_000_000),
        ("statsd_mem_stats", True),
        ("statsd_udp_packet_size", 508),
        ("tls_required", 0),
        ("tls_min_version", 769),
        ("deflate", True),
        ("max_deflate_level", 6),
        ("sync_every", 2500),
    ],
)
def test_get_config_values_as_json(module_nsqd, option, expected):
    reply = get(module_nsqd.http(), f"/config/{option}")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json; charset=utf-8"
    assert reply.headers["x-nsq-content-type"] == "nsq; version=1.0"
    assert reply.json() == expected


@pytest.mark.parametrize(
    "option, expected",
    [
        ("statsd_prefix", b"nsq.%s"),
        ("log_prefix", b"[nsqd] "),
        ("tcp_address", b"127.0.0.1:0"),
        ("statsd_address", b""),
    ],
)
def test_get_config_string_values_are_bare_text(module_nsqd, option, expected):
    reply = get(module_nsqd.http(), f"/config/{option}")
    assert (reply.status, reply.body) == (200, expected)


def test_get_config_node_id(module_nsqd):
    value = get(module_nsqd.http(), "/config/id").json()
    assert isinstance(value, int) and 0 <= value < 1024


@pytest.mark.parametrize("option", ["bogus", "node_id", "lookupd_tcp_address", "MSG_TIMEOUT"])
def test_get_unknown_option(module_nsqd, option):
    expect_error(get(module_nsqd.http(), f"/config/{option}"), 400, "INVALID_OPTION")


def test_put_log_level_changes_logging_at_run_time(nsqd_factory):
    daemon = nsqd_factory("--max-msg-size=64")
    web = daemon.http()
    reply = put(web, "/config/log_level", "debug")
    assert (reply.status, reply.json()) == (200, 1)
    assert get(web, "/config/log_level").json() == 1
    raw_exchange(web, b"NONSENSE\r\n\r\n")  # the HTTP server logs bad requests at debug level
    daemon.wait_for_log(r" DEBUG: HTTP: bad request", 5)
    assert put(web, "/config/log_level", "WARN").json() == 3
    start = len(daemon.lines)
    assert get(web, "/ping").status == 200  # the access log is INFO: no longer printed
    assert put(web, "/config/log_level", "info").json() == 2
    assert get(web, "/info").status == 200
    daemon.wait_for_log(r"INFO: 200 GET /info", 5, start)
    assert not [line for line in daemon.lines[start:] if "GET /ping" in line]

    expect_error(put(web, "/config/log_level", "loud"), 400, "INVALID_VALUE")
    expect_error(put(web, "/config/log_level", b"\xff\xfe"), 400, "INVALID_VALUE")
    expect_error(put(web, "/config/log_level", ""), 413, "INVALID_VALUE")
    expect_error(put(web, "/config/log_level", "d" * 65), 413, "INVALID_VALUE")  # over --max-msg-size
    expect_error(put(web, "/config/msg_timeout", "5s"), 400, "INVALID_OPTION")
    expect_error(put(web, "/config/bogus", "x"), 400, "INVALID_OPTION")
    expect_error(put(web, "/config/bogus", ""), 413, "INVALID_VALUE")  # the body is checked first
    assert get(web, "/config/log_level").json() == 2


def test_put_lookupd_addresses(nsqd_factory):
    daemon = nsqd_factory()
    web = daemon.http()
    # a closed port: nsqd may try to connect and log the failure, nothing more
    reply = put(web, "/config/nsqlookupd_tcp_addresses", '["127.0.0.1:1"]')
    assert (reply.status, reply.json()) == (200, ["127.0.0.1:1"])
    assert get(web, "/config/nsqlookupd_tcp_addresses").json() == ["127.0.0.1:1"]
    for bad in ['"127.0.0.1:1"', "[1]", "{}", "not json", '["a"']:
        expect_error(put(web, "/config/nsqlookupd_tcp_addresses", bad), 400, "INVALID_VALUE")
    assert get(web, "/config/nsqlookupd_tcp_addresses").json() == ["127.0.0.1:1"]
    assert put(web, "/config/nsqlookupd_tcp_addresses", "null").json() == []
    assert put(web, "/config/nsqlookupd_tcp_addresses", "[]").json() == []
    daemon.assert_running()


def test_config_file_with_flag_precedence(nsqd_factory, tmp_path):
    config = tmp_path / "nsqd.toml"
    config.write_text(
        "mem_queue_size = 7\n"
        'msg_timeout = "5s"\n'
        "max_req_timeout = 30000\n"  # a bare integer duration is milliseconds
        "e2e_processing_latency_percentiles = [0.9, 0.5]\n"
        "max_rdy_count = 100\n"
        'statsd_prefix = "custom.%s"\n'
    )
    daemon = nsqd_factory(f"--config={config}", "--max-rdy-count=200")
    web = daemon.http()
    assert get(web, "/config/mem_queue_size").json() == 7
    assert get(web, "/config/msg_timeout").json() == 5_000_000_000
    assert get(web, "/config/max_req_timeout").json() == 30_000_000_000
    assert get(web, "/config/e2e_processing_latency_percentiles").json() == [0.9, 0.5]
    assert get(web, "/config/max_rdy_count").json() == 200  # the flag wins
    assert get(web, "/config/statsd_prefix").body == b"custom.%s"


def test_version_flag():
    result = subprocess.run([sys.executable, "-m", "nsqd", "--version"], cwd=REPO_ROOT, capture_output=True, timeout=30)
    assert result.returncode == 0
    assert re.fullmatch(rb"nsqd v1\.3\.0 \(built w/python3\.\d+\.\d+\S*\)\n", result.stdout), result.stdout


def test_listening_lines_show_the_real_ports_and_go_only_flags_are_logged(nsqd_factory):
    daemon = nsqd_factory("--verbose", "--worker-id")
    log = daemon.log_text()
    daemon.http()
    tcp = re.search(r"INFO: TCP: listening on (127\.0\.0\.1):(\d+)$", daemon.log_text(), re.M)
    http = re.search(r"INFO: HTTP: listening on (127\.0\.0\.1):(\d+)$", daemon.log_text(), re.M)
    assert tcp and http and int(tcp.group(2)) > 0 and int(http.group(2)) > 0
    info = get(daemon.http(), "/info").json()
    assert (info["tcp_port"], info["http_port"]) == (int(tcp.group(2)), int(http.group(2)))
    assert re.search(r"flag --verbose .*no effect", log) and re.search(r"flag --worker-id .*no effect", log)


def test_start_up_logs_the_version_and_the_node_id_before_listening(nsqd_factory):
    daemon = nsqd_factory("--node-id=77")
    lines = [line.split(" INFO: ", 1)[1] for line in daemon.log_text().splitlines() if " INFO: " in line]
    version = next(i for i, line in enumerate(lines) if re.fullmatch(r"nsqd v1\.3\.0 \(built w/python\S+\)", line))
    assert lines[version + 1] == "ID: 77"
    assert version + 1 < next(i for i, line in enumerate(lines) if line.startswith("TCP: listening on "))


def test_empty_http_address_disables_http(nsqd_factory):
    daemon = nsqd_factory("--http-address=")
    with RawClient(daemon.tcp) as client:
        client.publish("no_http", b"x")  # nsqd is up and serving TCP; HTTP would have logged before this
    assert "HTTP: listening" not in daemon.log_text()
    assert "HTTP" not in daemon.listening


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a certificate")
def test_tls_required_refuses_plain_http(nsqd_factory, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    daemon = nsqd_factory(
        f"--tls-cert={cert}", f"--tls-key={key}", "--tls-required=true", "--https-address=127.0.0.1:0"
    )
    web = daemon.http()
    https_port = int(daemon.wait_for_log(r"HTTPS: listening on \S+:(\d+)", 10).group(1))
    for method, path in [("GET", "/ping"), ("POST", "/pub?topic=t"), ("GET", "/nope")]:
        reply = request(web, method, path, body=b"m" if method == "POST" else None)
        assert reply.status == 403, reply
        match = re.fullmatch(rb'\{"message": "TLS_REQUIRED", "https_port": (\d+)\}', reply.body)
        assert match, reply.body
        assert reply.headers["content-type"] == "application/json; charset=utf-8"
        assert reply.headers["x-nsq-content-type"] == "nsq; version=1.0"
        assert int(match.group(1)) == https_port
    assert json.loads(get(web, "/ping").body)["message"] == "TLS_REQUIRED"
