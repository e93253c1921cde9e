"""Every address flag of the three daemons, given malformed values: never a traceback.

Where NSQ refuses to start (a listen address it cannot parse or bind, an upstream nsqadmin cannot resolve, a URL
it cannot parse) the daemon logs one FATAL line in NSQ's words and exits 1; where Go's flag parsing refuses the
value (a port flag that is not a number) it prints the usage error and exits 2. Addresses that NSQ only dials
later (lookupd, auth server, statsd) do not stop it: each failed attempt is one ERROR line, as in NSQ.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .features import make_certificates
from .harness import REPO_ROOT, NsqdProcess, RawClient, assert_refused_start

pytestmark = pytest.mark.timeout(60)

LONG_PATH = "/tmp/" + "x" * 120  # longer than a unix socket's path may be

NSQD_REFUSALS = [
    ("--tcp-address", "127.0.0.1:abc", "listen tcp: lookup tcp/abc: unknown port"),
    ("--tcp-address", "127.0.0.1:99999", "listen tcp: address 99999: invalid port"),
    ("--tcp-address", "/nonexistent/nsqd.sock", "listen unix /nonexistent/nsqd.sock: bind: no such file or directory"),
    ("--http-address", "127.0.0.1:-1", "listen tcp: address -1: invalid port"),
    ("--http-address", "127.0.0.1:4151x", "listen tcp: lookup tcp/4151x: unknown port"),
    ("--http-address", LONG_PATH, f"listen unix {LONG_PATH}: bind: invalid argument"),
]


@pytest.mark.parametrize(("flag", "value", "reason"), NSQD_REFUSALS)
def test_nsqd_listen_addresses(tmp_path, flag, value, reason):
    args = {"--tcp-address": "127.0.0.1:0", "--http-address": "127.0.0.1:0", flag: value}
    assert_refused_start(
        "nsqd",
        [f"{name}={text}" for name, text in args.items()] + [f"--data-path={tmp_path}"],
        f"failed to instantiate nsqd - listen ({value}) failed - {reason}",
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("/tmp/https.sock", "listen tcp: address /tmp/https.sock: missing port in address"),  # HTTPS is TCP only
        ("127.0.0.1:abc", "listen tcp: lookup tcp/abc: unknown port"),
    ],
)
def test_nsqd_https_address(tmp_path, certs, value, reason):
    assert_refused_start(
        "nsqd",
        [
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={tmp_path}",
            *certs.daemon_args(),
            f"--https-address={value}",
        ],
        f"failed to instantiate nsqd - listen ({value}) failed - {reason}",
    )


@pytest.mark.parametrize(
    ("module", "flag", "value"),
    [
        ("nsqd", "--broadcast-tcp-port", "abc"),
        ("nsqd", "--broadcast-http-port", "4151.5"),
    ],
)
def test_port_flags_that_are_not_numbers_are_usage_errors(module, flag, value):
    done = subprocess.run(
        [sys.executable, "-m", module, f"{flag}={value}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2, done.stderr
    assert f'invalid value "{value}" for flag -{flag[2:]}: parse error' in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("flag", "value", "reason"),
    [
        ("--tcp-address", "127.0.0.1:abc", "listen tcp: lookup tcp/abc: unknown port"),
        (
            "--tcp-address",
            "/nonexistent/lookupd.sock",
            "listen unix /nonexistent/lookupd.sock: bind: no such file or directory",
        ),
        ("--http-address", "127.0.0.1:99999", "listen tcp: address 99999: invalid port"),
        # not host:port (Go's SplitHostPort refuses it), so a unix socket's path
        ("--http-address", "/nonexistent/[::1", "listen unix /nonexistent/[::1: bind: no such file or directory"),
    ],
)
def test_nsqlookupd_listen_addresses(tmp_path, flag, value, reason):
    args = {"--tcp-address": "127.0.0.1:0", "--http-address": "127.0.0.1:0", flag: value}
    assert_refused_start(
        "lookupd",
        [f"{name}={text}" for name, text in args.items()],
        f"failed to instantiate nsqlookupd - listen ({value}) failed - {reason}",
    )


ADMIN_REFUSALS = [
    # nsqadmin listens on TCP only
    (
        ["--http-address=/tmp/admin.sock"],
        "failed to instantiate nsqadmin - listen (/tmp/admin.sock) failed - listen tcp: address /tmp/admin.sock: "
        "missing port in address",
    ),
    (
        ["--http-address=127.0.0.1:99999"],
        "failed to instantiate nsqadmin - listen (127.0.0.1:99999) failed - listen tcp: address 99999: invalid port",
    ),
    (
        ["--nsqd-http-address=127.0.0.1:abc"],
        "failed to instantiate nsqadmin - failed to resolve --nsqd-http-address (127.0.0.1:abc) - "
        "lookup tcp/abc: unknown port",
    ),
    (
        ["--nsqd-http-address=nsqd"],
        "failed to instantiate nsqadmin - failed to resolve --nsqd-http-address (nsqd) - address nsqd: "
        "missing port in address",
    ),
    (
        ["--lookupd-http-address=[::1]:4161:1"],
        "failed to instantiate nsqadmin - failed to resolve --lookupd-http-address ([::1]:4161:1) - "
        "address [::1]:4161:1: too many colons in address",
    ),
    (
        ["--lookupd-http-address=http://[::1"],
        "failed to instantiate nsqadmin - failed to resolve --lookupd-http-address (http://[::1) - "
        "address http://[::1: missing port in address",
    ),
    (
        ["--graphite-url=graphite:8080"],
        "failed to instantiate nsqadmin - failed to parse --graphite-url (graphite:8080)",
    ),
    (["--graphite-url=http://[::1"], "failed to instantiate nsqadmin - failed to parse --graphite-url (http://[::1)"),
    (
        ["--notification-http-endpoint=http://"],
        "failed to instantiate nsqadmin - failed to parse --notification-http-endpoint (http://)",
    ),
]


@pytest.mark.parametrize(("args", "fatal"), ADMIN_REFUSALS)
def test_nsqadmin_addresses(args, fatal):
    base = {"--http-address": "127.0.0.1:0"}
    if not any(arg.startswith("--lookupd-http-address") for arg in args):
        base["--nsqd-http-address"] = "127.0.0.1:4151"
    given = {arg.partition("=")[0]: arg.partition("=")[2] for arg in args}
    assert_refused_start("admin", [f"{name}={value}" for name, value in {**base, **given}.items()], fatal)


def test_nsqd_keeps_running_with_addresses_it_dials_later(tmp_path):
    """A lookupd, auth server or statsd address NSQ cannot use is an ERROR line at each attempt, not a stop."""
    daemon = NsqdProcess(
        tmp_path,
        [
            "--lookupd-tcp-address=lookupd",
            "--lookupd-tcp-address=127.0.0.1:abc",
            "--statsd-address=statsd",
            "--statsd-interval=200ms",
            "--auth-http-address=http://[::1",
            "--broadcast-address=[not an address",
        ],
    ).start()
    try:
        daemon.wait_for_log(r"ERROR: LOOKUPD\(lookupd\): dial tcp: address lookupd: missing port in address", 10)
        daemon.wait_for_log(r"ERROR: LOOKUPD\(127\.0\.0\.1:abc\): dial tcp: lookup tcp/abc: unknown port", 10)
        daemon.wait_for_log(r"ERROR: STATSD: failed to push to statsd - address statsd: missing port in address", 10)
        with RawClient(daemon.tcp) as client:
            negotiated = json.loads(client.identify({"feature_negotiation": True}))
            assert negotiated["auth_required"] is True
            client.send(b"AUTH\n" + len(b"secret").to_bytes(4, "big") + b"secret")
            client.expect_error(b"E_AUTH_FAILED AUTH failed")
            client.assert_closed()
        daemon.assert_running()
    finally:
        text = daemon.log_text()
        assert daemon.stop() == 0
    assert "Traceback" not in text, text
