"""The real gnsq client (gevent) with TLS, snappy, deflate and AUTH; gnsq_features.py runs it in a subprocess
so that gevent never meets trio or pytest. gnsq 1.0.2 installs and runs on Python 3.11 (gevent ships wheels)."""

from __future__ import annotations

import json

import pytest

from tests.compat.client_runs import python_client, run_client, running_nsqd, scripted_auth, unique_topic
from tests.integration.harness import REPO_ROOT

pytestmark = [pytest.mark.compat, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def auth_server():
    with scripted_auth("gnsq-secret", identity="gnsq-user") as server:
        yield server


@pytest.fixture(scope="module")
def nsqd(certs, tmp_path_factory):
    with running_nsqd(tmp_path_factory.mktemp("nsqd-gnsq"), certs.daemon_args()) as daemon:
        yield daemon


def run(nsqd, options: dict) -> dict:
    result = run_client(
        python_client("gnsq_features", json.dumps(options), nsqd.tcp_address, unique_topic("gnsq")),
        cwd=REPO_ROOT,
        what=f"gnsq with {options}",
        logs=nsqd.log_text,
    )
    assert result["warnings"] == [], f"gnsq logged problems: {result['warnings']}"
    assert result["answers"] == ["OK"] * 6
    assert result["own"] == "to myself"  # answered, then delivered back on the publishing connection
    assert result["complete"], f"gnsq got {result['received']} messages, not all it published"
    return result


def test_gnsq_imports_on_this_python():
    import gnsq

    assert gnsq.__version__ == "1.0.2"


def test_tls(nsqd, certs):
    assert run(nsqd, {"tls": str(certs.ca_file)})["identify"]["tls_v1"] is True


def test_snappy(nsqd):
    identify = run(nsqd, {"snappy": True})["identify"]
    assert (identify["snappy"], identify["tls_v1"]) == (True, False)


def test_deflate(nsqd):
    identify = run(nsqd, {"deflate": 2})["identify"]
    assert (identify["deflate"], identify["deflate_level"]) == (True, 2)


def test_tls_and_snappy(nsqd, certs):
    identify = run(nsqd, {"tls": str(certs.ca_file), "snappy": True})["identify"]
    assert (identify["tls_v1"], identify["snappy"]) == (True, True)


def test_auth_secret(certs, auth_server, tmp_path_factory):
    with running_nsqd(
        tmp_path_factory.mktemp("nsqd-gnsq-auth"), certs.daemon_args(f"--auth-http-address={auth_server.address}")
    ) as daemon:
        result = run(daemon, {"auth_secret": "gnsq-secret", "tls": str(certs.ca_file)})
    assert result["identify"]["auth_required"] is True
    assert result["auth"] == {
        "identity": "gnsq-user",
        "identity_url": "https://example.invalid/ivy",
        "permission_count": 1,
    }
