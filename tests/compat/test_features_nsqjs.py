"""The real nsqjs client (Node.js) with TLS, snappy, deflate and AUTH: `node features.js` per run."""

from __future__ import annotations

import json

import pytest

from tests.compat.client_runs import NODE, NODE_DIR, run_client, running_nsqd, scripted_auth, unique_topic

pytestmark = [pytest.mark.compat, pytest.mark.timeout(120), pytest.mark.usefixtures("require_nsqjs")]


@pytest.fixture(scope="module")
def auth_server():
    with scripted_auth("nsqjs-secret", identity="nsqjs-user") as server:
        yield server


@pytest.fixture(scope="module")
def nsqd(certs, tmp_path_factory):
    with running_nsqd(
        tmp_path_factory.mktemp("nsqd-nsqjs"), certs.daemon_args(f"--tls-root-ca-file={certs.ca_file}")
    ) as daemon:
        yield daemon


def run(nsqd, options: dict) -> dict:
    result = run_client(
        [NODE, "features.js", json.dumps(options), nsqd.tcp_address, unique_topic("nsqjs")],
        cwd=NODE_DIR,
        what=f"nsqjs with {options}",
        logs=nsqd.log_text,
    )
    assert result["errors"] == [], f"nsqjs reported errors: {result['errors']}"
    assert result["answers"] == ["OK"] * 6
    assert result["complete"], f"nsqjs got {result['received']} messages, not all it published"
    return result


def test_tls(nsqd, certs):
    identify = run(nsqd, {"tls": str(certs.ca_file)})["identify"]
    assert (identify["tls_v1"], identify["snappy"], identify["deflate"]) == (True, False, False)


def test_tls_with_client_certificate(nsqd, certs):
    assert run(nsqd, {"tls": str(certs.ca_file), "cert": str(certs.client_pem)})["identify"]["tls_v1"] is True


def test_snappy(nsqd):
    identify = run(nsqd, {"snappy": True})["identify"]
    assert (identify["tls_v1"], identify["snappy"]) == (False, True)


@pytest.mark.parametrize("level", [1, 6])
def test_deflate(nsqd, level):
    identify = run(nsqd, {"deflate": level})["identify"]
    assert (identify["deflate"], identify["deflate_level"]) == (True, level)


def test_tls_and_snappy(nsqd, certs):
    identify = run(nsqd, {"tls": str(certs.ca_file), "snappy": True})["identify"]
    assert (identify["tls_v1"], identify["snappy"]) == (True, True)


def test_tls_and_deflate(nsqd, certs):
    identify = run(nsqd, {"tls": str(certs.ca_file), "deflate": 4})["identify"]
    assert (identify["tls_v1"], identify["deflate"], identify["deflate_level"]) == (True, True, 4)


def test_auth_secret(certs, auth_server, tmp_path_factory):
    with running_nsqd(
        tmp_path_factory.mktemp("nsqd-nsqjs-auth"), certs.daemon_args(f"--auth-http-address={auth_server.address}")
    ) as daemon:
        result = run(daemon, {"authSecret": "nsqjs-secret", "deflate": 6})
    assert result["identify"]["auth_required"] is True
    assert result["auth"] == {
        "identity": "nsqjs-user",
        "identity_url": "https://example.invalid/ivy",
        "permission_count": 1,
    }
