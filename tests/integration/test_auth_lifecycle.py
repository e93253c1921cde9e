"""AUTH over time and across servers (NSQ-FACTS 3.1-3.3): TTL expiry and re-query, auth servers that are
down, slow, several, behind HTTPS, and the TLS facts sent along. The auth server is a real HTTP server
whose answers each test sets."""

from __future__ import annotations

import json
import socket
import ssl
import uuid

import pytest

from .features import FeatureClient, ScriptedAuthServer, grant
from .harness import FRAME_TYPE_RESPONSE, NsqdProcess, RawClient, command, http_get, pub, stop_all, sub

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def auth_server():
    """Shared by the module's tests, each with its own secrets."""
    server = ScriptedAuthServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def daemon(auth_server, certs, tmp_path_factory):
    """Auth through ``auth_server``; TLS offered; the test CA trusted for client certificates and HTTPS."""
    process = NsqdProcess(
        tmp_path_factory.mktemp("nsqd-auth-lifecycle"),
        certs.daemon_args(f"--tls-root-ca-file={certs.ca_file}", f"--auth-http-address={auth_server.address}"),
    )
    process.start()
    yield process
    stop_all([process])


def requests_for(server: ScriptedAuthServer, secret: str) -> list[dict]:
    return [query for _, query in server.requests if query.get("secret") == [secret]]


def fresh() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def auth(client, secret: str) -> bytes:
    client.send(command("AUTH", body=secret.encode()))
    return client.read_response()


def wait_heartbeats(client: RawClient, count: int) -> None:
    """Let time pass by the daemon's own clock: each heartbeat comes one interval after the previous."""
    seen = 0
    while seen < count:
        frame = client.read_frame(timeout=5, skip_heartbeats=False)
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_RESPONSE, b"_heartbeat_")
        seen += 1
        client.send(b"NOP\n")


def expiring_client(daemon, auth_server, secret: str) -> RawClient:
    """A connection authed with a 1 s TTL whose answer has expired by the time this returns."""
    auth_server.answers[secret] = (200, grant(ttl=1))
    client = RawClient(daemon.tcp)
    client.identify({"heartbeat_interval": 1000})
    assert auth(client, secret).startswith(b'{"identity":"ivy"')
    wait_heartbeats(client, 2)  # two heartbeats 1 s apart: more than the TTL has passed
    return client


def test_expired_answer_is_asked_again(daemon, auth_server):
    with expiring_client(daemon, auth_server, "renewable") as client:
        assert len(requests_for(auth_server, "renewable")) == 1
        client.publish(fresh(), b"after expiry")
        assert len(requests_for(auth_server, "renewable")) == 2
        client.publish(fresh(), b"fresh answer cached")  # the new answer is valid for another second
        assert len(requests_for(auth_server, "renewable")) == 2


def test_expired_answer_now_denies(daemon, auth_server):
    with expiring_client(daemon, auth_server, "narrowed") as client:
        auth_server.answers["narrowed"] = (200, grant(topic="^only_this$"))
        topic = fresh()
        client.send(pub(topic, b"x"))
        client.expect_error(f'E_UNAUTHORIZED AUTH failed for PUB on "{topic}" ""'.encode())
        client.assert_closed()


def test_expired_answer_and_auth_server_failing(daemon, auth_server):
    mark = len(daemon.lines)
    with expiring_client(daemon, auth_server, "revoked") as client:
        auth_server.answers["revoked"] = (500, {"message": "down for maintenance"})
        client.send(sub(fresh(), "ch"))
        client.expect_error(b"E_AUTH_FAILED AUTH failed")
        client.assert_closed()
    daemon.wait_for_log(r"auth failed", 5, start=mark)


def test_auth_server_down(nsqd_factory):
    with socket.socket() as placeholder:  # a port nobody listens on
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    daemon = nsqd_factory(f"--auth-http-address=127.0.0.1:{port}")
    with RawClient(daemon.tcp) as client:
        client.send(command("AUTH", body=b"anything"))
        client.expect_error(b"E_AUTH_FAILED AUTH failed")
        client.assert_closed()
    daemon.wait_for_log(rf"failed auth against 127\.0\.0\.1:{port}", 5)


def test_auth_server_too_slow(nsqd_factory):
    slow = ScriptedAuthServer()
    slow.hang = True
    try:
        daemon = nsqd_factory(f"--auth-http-address={slow.address}", "--http-client-request-timeout=300ms")
        with RawClient(daemon.tcp) as client:
            client.send(command("AUTH", body=b"slow"))
            client.expect_error(b"E_AUTH_FAILED AUTH failed")
            client.assert_closed()
        daemon.wait_for_log(r"request timeout", 5)
    finally:
        slow.close()


def test_several_servers_one_down_one_by_full_url(nsqd_factory, auth_server):
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{placeholder.getsockname()[1]}"
    auth_server.answers["either"] = (200, grant(identity="either"))
    daemon = nsqd_factory(f"--auth-http-address={dead}", f"--auth-http-address=http://{auth_server.address}/v2/check")
    for _ in range(4):  # the first server tried is random: every attempt must still succeed
        with RawClient(daemon.tcp) as client:
            assert json.loads(auth(client, "either"))["identity"] == "either"
    paths = {path for path, query in auth_server.requests if query.get("secret") == ["either"]}
    assert paths == {"/v2/check"}


def test_secret_bytes_are_url_encoded(daemon, auth_server):
    secret = "a b&c=d/é+"
    auth_server.answers[secret] = (200, grant())
    with RawClient(daemon.tcp) as client:
        auth(client, secret)
    [query] = requests_for(auth_server, secret)
    assert (query["tls"], query["common_name"], query["remote_ip"]) == (["false"], [""], ["127.0.0.1"])


def test_stats_show_the_identity(daemon, auth_server):
    auth_server.answers["visible"] = (200, grant(identity="vic", identity_url="https://id.example/vic"))
    topic = fresh()
    with RawClient(daemon.tcp) as client:
        auth(client, "visible")
        client.subscribe(topic, "ch")
        status, body = http_get(daemon.http(), f"/stats?format=json&topic={topic}")
        assert status == 200
        [entry] = json.loads(body)["topics"][0]["channels"][0]["clients"]
        assert (entry["authed"], entry["auth_identity"], entry["auth_identity_url"]) == (
            True,
            "vic",
            "https://id.example/vic",
        )


# -- with TLS: the query tells, and an HTTPS auth server -------------------------------------------------


def test_tls_facts_in_the_query(daemon, auth_server, certs):
    auth_server.answers["over-tls"] = (200, grant())
    with FeatureClient(daemon.tcp) as client:
        assert client.identify({"feature_negotiation": True, "tls_v1": True})["auth_required"] is True
        client.start_tls(certs.client_context(with_cert=True))
        client.send(command("AUTH", body=b"over-tls"))
        assert json.loads(client.read_response())["permission_count"] == 1
    [query] = requests_for(auth_server, "over-tls")
    assert (query["tls"], query["common_name"], query["remote_ip"]) == (["true"], ["client-one"], ["127.0.0.1"])


def test_forbidden_answer_points_to_https(daemon, auth_server, certs):
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certs.ca.issue_cert("127.0.0.1").configure_cert(server_context)
    secure = ScriptedAuthServer(server_context)
    try:
        secure.answers["tls-only"] = (200, grant(identity="secure"))
        auth_server.answers["tls-only"] = (
            403,
            {"message": "TLS_REQUIRED", "https_port": secure.httpd.server_address[1]},
        )
        with RawClient(daemon.tcp) as client:
            assert json.loads(auth(client, "tls-only"))["identity"] == "secure"
        assert secure.requests[0][1]["secret"] == ["tls-only"]
    finally:
        secure.close()
