"""The real nsqjs client (Node.js) with TLS, snappy, deflate and AUTH: `node features.js` per run."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.integration.features import ScriptedAuthServer, grant, make_certificates
from tests.integration.harness import NsqdProcess, stop_all

pytestmark = [pytest.mark.compat, pytest.mark.timeout(120)]

NODE_DIR = Path(__file__).resolve().parent / "node"
NODE = shutil.which("node")


@pytest.fixture(autouse=True)
def require_nsqjs():
    if NODE is None:
        pytest.skip("node is not installed: install Node.js to run the nsqjs compatibility tests")
    if not (NODE_DIR / "node_modules" / "nsqjs").is_dir():
        pytest.skip("nsqjs is not installed: run `make node` (make test does it) to install tests/compat/node")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("nsqjs-certs"))


@pytest.fixture(scope="module")
def auth_server():
    server = ScriptedAuthServer()
    server.answers["nsqjs-secret"] = (200, grant(identity="nsqjs-user"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def nsqd(certs, tmp_path_factory):
    daemon = NsqdProcess(tmp_path_factory.mktemp("nsqd-nsqjs"), certs.daemon_args(f"--tls-root-ca-file={certs.ca_file}"))
    daemon.start()
    yield daemon
    stop_all([daemon])


def run(nsqd, options: dict) -> dict:
    topic = f"nsqjs_{uuid.uuid4().hex[:10]}"
    try:
        done = subprocess.run([NODE, "features.js", json.dumps(options), nsqd.tcp_address, topic],
                              cwd=NODE_DIR, capture_output=True, timeout=90, text=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"nsqjs with {options} hung; stderr:\n{exc.stderr}\nnsqd log:\n{nsqd.log_text()}")
    assert done.returncode == 0, f"nsqjs with {options} failed:\n{done.stderr}\nnsqd log:\n{nsqd.log_text()}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
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
    daemon = NsqdProcess(tmp_path_factory.mktemp("nsqd-nsqjs-auth"),
                         certs.daemon_args(f"--auth-http-address={auth_server.address}"))
    daemon.start()
    try:
        result = run(daemon, {"authSecret": "nsqjs-secret", "deflate": 6})
    finally:
        stop_all([daemon])
    assert result["identify"]["auth_required"] is True
    assert result["auth"] == {"identity": "nsqjs-user", "identity_url": "https://example.invalid/ivy",
                              "permission_count": 1}
