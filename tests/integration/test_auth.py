"""AUTH against a local auth HTTP server (`--auth-http-address`), with NSQ's error texts (NSQ-FACTS 1.7, 3)."""

from __future__ import annotations

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.integration.harness import NsqdProcess, RawClient, command, dpub, mpub, pub, stop_all, sub

pytestmark = pytest.mark.timeout(60)

GRANTS = {
    "everything": {
        "ttl": 3600,
        "identity": "alice",
        "identity_url": "https://example.invalid/alice",
        "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}],
    },
    "publish-orders": {
        "ttl": 3600,
        "identity": "bob",
        "identity_url": "",
        "authorizations": [
            {"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]},
            {"topic": "^orders$", "channels": ["^billing$"], "permissions": ["subscribe"]},
        ],
    },
    "publish-no-channels": {
        "ttl": 3600,
        "identity": "carol",
        "identity_url": "",
        "authorizations": [{"topic": ".*", "channels": [], "permissions": ["publish"]}],
    },
    "nothing": {"ttl": 3600, "identity": "dave", "identity_url": "", "authorizations": []},
    "bad-permission": {
        "ttl": 3600,
        "identity": "eve",
        "identity_url": "",
        "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["admin"]}],
    },
    "zero-ttl": {
        "ttl": 0,
        "identity": "frank",
        "identity_url": "",
        "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["publish"]}],
    },
}


class AuthServer:
    """Answers GET /auth from GRANTS by the `secret` query parameter; 500 or garbage for some secrets."""

    def __init__(self):
        self.requests: list[tuple[str, dict, dict]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # http.server naming
                url = urlsplit(self.path)
                query = parse_qs(url.query, keep_blank_values=True)
                server.requests.append((url.path, query, dict(self.headers)))
                secret = query.get("secret", [""])[0]
                if secret == "server-error":
                    self._reply(500, b'{"message":"boom"}')
                elif secret == "not-json":
                    self._reply(200, b"<html>nope</html>")
                elif secret in GRANTS:
                    self._reply(200, json.dumps(GRANTS[secret]).encode())
                else:
                    self._reply(403, b'{"message":"unknown secret"}')

            def _reply(self, status, body):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"{host}:{port}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def auth_server():
    with AuthServer() as server:
        yield server


@pytest.fixture(scope="module")
def daemon(auth_server, tmp_path_factory):
    process = NsqdProcess(tmp_path_factory.mktemp("nsqd-auth"), [f"--auth-http-address={auth_server.address}"])
    process.start()
    yield process
    stop_all([process])


def authed(daemon, secret: str) -> RawClient:
    client = RawClient(daemon.tcp)
    client.send(command("AUTH", body=secret.encode()))
    return client


def fresh_name() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def test_identify_reports_auth_required(daemon):
    with RawClient(daemon.tcp) as client:
        response = json.loads(client.identify({"feature_negotiation": True}))
        assert response["auth_required"] is True


@pytest.mark.parametrize(
    "payload,verb",
    [(pub("t", b"x"), "PUB"), (mpub("t", [b"x"]), "MPUB"), (dpub("t", 10, b"x"), "DPUB"), (sub("t", "c"), "SUB")],
    ids=["PUB", "MPUB", "DPUB", "SUB"],
)
def test_commands_before_auth_are_refused(daemon, payload, verb):
    with RawClient(daemon.tcp) as client:
        client.send(payload)
        client.expect_error(f"E_AUTH_FIRST AUTH required before {verb}".encode())
        client.assert_closed()


def test_nop_and_identify_need_no_auth(daemon):
    with RawClient(daemon.tcp) as client:
        assert client.identify({}) == b"OK"
        client.send(b"NOP\n")
        client.send(command("AUTH", body=b"everything"))
        assert client.read_response().startswith(b"{")


def test_successful_auth_response_and_request(daemon, auth_server):
    before = len(auth_server.requests)
    with authed(daemon, "everything") as client:
        assert client.read_response() == (
            b'{"identity":"alice","identity_url":"https://example.invalid/alice","permission_count":1}'
        )
        name = fresh_name()
        client.publish(name, b"allowed")
        client.subscribe(name, "any", ready=1)
        assert client.read_message().body == b"allowed"
    path, query, headers = auth_server.requests[before]
    assert path == "/auth"
    assert query == {"common_name": [""], "remote_ip": ["127.0.0.1"], "secret": ["everything"], "tls": ["false"]}
    assert headers.get("Accept") == "application/vnd.nsq; version=1.0"


def test_second_auth_is_refused(daemon):
    with authed(daemon, "everything") as client:
        client.read_response()
        client.send(command("AUTH", body=b"everything"))
        client.expect_error(b"E_INVALID AUTH already set")
        client.assert_closed()


@pytest.mark.parametrize("secret", ["server-error", "not-json", "unknown-secret", "bad-permission", "zero-ttl"])
def test_auth_server_failures(daemon, secret):
    with authed(daemon, secret) as client:
        client.expect_error(b"E_AUTH_FAILED AUTH failed")
        client.assert_closed()


def test_no_authorizations(daemon):
    with authed(daemon, "nothing") as client:
        client.expect_error(b"E_UNAUTHORIZED AUTH no authorizations found")
        client.assert_closed()


def test_auth_with_a_parameter_is_refused(daemon):
    with RawClient(daemon.tcp) as client:
        client.send(b"AUTH a b\n")
        client.expect_error(b"E_INVALID AUTH invalid number of parameters")
        client.assert_closed()


@pytest.mark.parametrize(
    "secret,payload,expected",
    [
        ("publish-orders", pub("orders", b"ok"), None),
        ("publish-orders", pub("xordersx", b"no"), b'E_UNAUTHORIZED AUTH failed for PUB on "xordersx" ""'),
        ("publish-orders", mpub("refunds", [b"no"]), b'E_UNAUTHORIZED AUTH failed for MPUB on "refunds" ""'),
        ("publish-orders", dpub("refunds", 5, b"no"), b'E_UNAUTHORIZED AUTH failed for DPUB on "refunds" ""'),
        ("publish-orders", sub("orders", "billing"), None),
        ("publish-orders", sub("orders", "shipping"), b'E_UNAUTHORIZED AUTH failed for SUB on "orders" "shipping"'),
        ("publish-no-channels", pub("orders", b"no"), b'E_UNAUTHORIZED AUTH failed for PUB on "orders" ""'),
    ],
    ids=[
        "pub-allowed",
        "pub-unanchored-name-denied",
        "mpub-denied",
        "dpub-denied",
        "sub-allowed",
        "sub-denied",
        "publish-with-empty-channel-list-denied",
    ],
)
def test_authorization_rules(daemon, secret, payload, expected):
    with authed(daemon, secret) as client:
        assert client.read_response().startswith(b'{"identity":')
        client.send(payload)
        if expected is None:
            client.expect_ok()
            client.send(b"NOP\n")
        else:
            client.expect_error(expected)
            client.assert_closed()
