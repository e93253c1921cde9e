"""The real pynsq client with TLS, snappy, deflate and AUTH (pynsq_features.py runs it in a subprocess)."""

from __future__ import annotations

import json

import pytest

from tests.compat.client_runs import python_client, run_client, running_nsqd, scripted_auth, unique_topic
from tests.integration.harness import REPO_ROOT

pytestmark = [pytest.mark.compat, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def auth_server():
    with scripted_auth("pynsq-secret", identity="pynsq-user") as server:
        yield server


@pytest.fixture(scope="module")
def tls_nsqd(certs, tmp_path_factory):
    with running_nsqd(tmp_path_factory.mktemp("nsqd-pynsq-tls"), certs.daemon_args()) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def auth_nsqd(certs, auth_server, tmp_path_factory):
    with running_nsqd(
        tmp_path_factory.mktemp("nsqd-pynsq-auth"), certs.daemon_args(f"--auth-http-address={auth_server.address}")
    ) as daemon:
        yield daemon


def run(nsqd, options: dict) -> dict:
    result = run_client(
        python_client("pynsq_features", json.dumps(options), nsqd.tcp_address, unique_topic("pynsq")),
        cwd=REPO_ROOT,
        what=f"pynsq with {options}",
        logs=nsqd.log_text,
    )
    problems = [w for w in result["warnings"] if "E_" in w or "rror" in w]
    assert not problems, f"pynsq reported problems: {problems}"
    assert result["answers"] == ["OK"] * 6
    assert result["complete"], "pynsq did not get back every message it published"
    return result


def test_tls(tls_nsqd, certs):
    result = run(tls_nsqd, {"tls": str(certs.ca_file)})
    assert result["writer_identify"]["tls_v1"] is True
    assert result["writer_layers"] == ["SSLSocket"]


def test_snappy(tls_nsqd):
    result = run(tls_nsqd, {"snappy": True})
    assert (result["writer_identify"]["snappy"], result["writer_identify"]["tls_v1"]) == (True, False)
    assert result["writer_layers"] == ["SnappySocket", "socket"]
    assert result["reader_layers"] == [["SnappySocket", "socket"]]


@pytest.mark.parametrize("level", [1, 6])
def test_deflate(tls_nsqd, level):
    result = run(tls_nsqd, {"deflate": level})
    identify = result["writer_identify"]
    assert (identify["deflate"], identify["deflate_level"]) == (True, level)
    assert result["writer_layers"] == ["DeflateSocket", "socket"]


def test_tls_and_snappy(tls_nsqd, certs):
    result = run(tls_nsqd, {"tls": str(certs.ca_file), "snappy": True})
    assert result["writer_layers"] == ["SnappySocket", "SSLSocket"]


def test_tls_and_deflate(tls_nsqd, certs):
    result = run(tls_nsqd, {"tls": str(certs.ca_file), "deflate": 3})
    assert result["writer_layers"] == ["DeflateSocket", "SSLSocket"]


def test_auth_secret(auth_nsqd, auth_server, certs):
    result = run(auth_nsqd, {"auth_secret": "pynsq-secret", "tls": str(certs.ca_file), "snappy": True})
    assert result["writer_identify"]["auth_required"] is True
    assert result["writer_auth"] == {
        "identity": "pynsq-user",
        "identity_url": "https://example.invalid/ivy",
        "permission_count": 1,
    }
    secrets = [query["secret"] for _, query in auth_server.requests]
    assert secrets.count(["pynsq-secret"]) >= 2  # the Writer's connection and the Reader's
    assert all(query["tls"] == ["true"] for _, query in auth_server.requests)
