"""TLS on the V2 connection (NSQ-FACTS 1.5 TLS policy, 2.3, 2.4) and on HTTPS, with a CA made at test time."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import uuid

import pytest

from protocol.commands import encode_identify
from protocol.frames import FRAME_TYPE_RESPONSE

from .features import FeatureClient
from .harness import NOP, ConnectionClosed, NsqdProcess, RawClient, fin, pub, rdy, stop_all, sub

REFUSED = (ssl.SSLError, ConnectionClosed, ConnectionError)

pytestmark = pytest.mark.timeout(60)


def _daemon(tmp_path_factory, name, args):
    process = NsqdProcess(tmp_path_factory.mktemp(name), args)
    process.start()
    return process


@pytest.fixture(scope="module")
def tls_nsqd(certs, tmp_path_factory):
    """TLS offered, client certificates optional and checked against the test CA."""
    daemon = _daemon(tmp_path_factory, "nsqd-tls", certs.daemon_args(f"--tls-root-ca-file={certs.ca_file}"))
    yield daemon
    stop_all([daemon])


def fresh() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def negotiate_tls(client: FeatureClient, certs, **context_args) -> dict:
    response = client.identify({"feature_negotiation": True, "tls_v1": True})
    assert response["tls_v1"] is True
    client.start_tls(certs.client_context(**context_args))
    return response


def exchange_messages(client: FeatureClient, count: int = 20, size: int = 3000) -> None:
    """Publish and consume over the current layers, bodies large enough to span TLS records."""
    topic = fresh()
    bodies = [bytes([65 + i % 26]) * (size + i) for i in range(count)]
    for body in bodies:
        client.send(pub(topic, body))
        client.expect_ok()
    client.send(sub(topic, "ch"))
    client.expect_ok()
    client.send(rdy(count))
    received = []
    for _ in range(count):
        message = client.read_message()
        received.append(message.body)
        client.send(fin(message.id))
    assert sorted(received) == sorted(bodies)


def test_identify_offers_tls_only_with_a_certificate(module_nsqd):
    with FeatureClient(module_nsqd.tcp) as client:
        response = client.identify({"feature_negotiation": True, "tls_v1": True})
        assert response["tls_v1"] is False
        client.send(pub(fresh(), b"still clear text"))
        client.expect_ok()


def test_tls_without_client_certificate(tls_nsqd, certs):
    with FeatureClient(tls_nsqd.tcp) as client:
        negotiate_tls(client, certs)
        assert client.io.version() in ("TLSv1.2", "TLSv1.3")
        exchange_messages(client)


def test_tls_with_client_certificate(tls_nsqd, certs):
    with FeatureClient(tls_nsqd.tcp) as client:
        negotiate_tls(client, certs, with_cert=True)
        exchange_messages(client, count=5)


def expect_handshake_refused(daemon, context: ssl.SSLContext) -> None:
    """The upgrade to TLS with this client context fails, nsqd logs why and keeps serving others."""
    mark = len(daemon.lines)
    with FeatureClient(daemon.tcp) as client:
        client.identify({"feature_negotiation": True, "tls_v1": True})
        with pytest.raises(REFUSED):
            client.start_tls(context)
            client.send(pub(fresh(), b"x"))  # TLS 1.3 reports the refusal on the first read
            client.expect_ok()
    daemon.wait_for_log(r"TLS handshake failed", 5, start=mark)
    daemon.assert_running()


def test_tls_client_certificate_from_an_unknown_ca_is_refused(tls_nsqd, certs):
    expect_handshake_refused(tls_nsqd, certs.client_context(with_cert=True, foreign=True))


def test_identify_pipelined_with_the_client_hello(tls_nsqd, certs):
    """The TLS handshake's first bytes arrive in the same segment as IDENTIFY: they belong to TLS."""
    context = certs.client_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    sock = socket.create_connection(tls_nsqd.tcp, timeout=10)
    try:
        sock.sendall(b"  V2" + encode_identify({"feature_negotiation": True, "tls_v1": True}) + hello)
        clear = b""
        while len(clear) < 4 or len(clear) < 4 + int.from_bytes(clear[:4], "big"):
            clear += sock.recv(1)
        assert json.loads(clear[8:])["tls_v1"] is True
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pending = outgoing.read()
                if pending:
                    sock.sendall(pending)
                data = sock.recv(65536)
                assert data, "server closed during the handshake"
                incoming.write(data)
        sock.sendall(outgoing.read())
        plain = b""
        while len(plain) < 10:
            try:
                plain += tls.read(65536)
            except ssl.SSLWantReadError:
                data = sock.recv(65536)
                assert data
                incoming.write(data)
        assert plain[:10] == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    finally:
        sock.close()


def test_garbage_instead_of_a_handshake(tls_nsqd, certs):
    mark = len(tls_nsqd.lines)
    with FeatureClient(tls_nsqd.tcp) as client:
        assert client.identify({"feature_negotiation": True, "tls_v1": True})["tls_v1"] is True
        client.send(b"this is not a TLS ClientHello\n" * 4)
        client.assert_closed()
    tls_nsqd.wait_for_log(r"TLS handshake failed", 5, start=mark)
    with RawClient(tls_nsqd.tcp) as other:  # the daemon is fine
        other.publish(fresh(), b"after the garbage")


def test_tls_then_snappy(tls_nsqd, certs):
    with FeatureClient(tls_nsqd.tcp) as client:
        response = client.identify({"feature_negotiation": True, "tls_v1": True, "snappy": True})
        assert (response["tls_v1"], response["snappy"], response["deflate"]) == (True, True, False)
        client.start_tls(certs.client_context())
        client.start_snappy()
        exchange_messages(client)


@pytest.mark.parametrize("level", [1, 6])
def test_tls_then_deflate(tls_nsqd, certs, level):
    with FeatureClient(tls_nsqd.tcp) as client:
        response = client.identify(
            {"feature_negotiation": True, "tls_v1": True, "deflate": True, "deflate_level": level}
        )
        assert (response["tls_v1"], response["deflate"], response["deflate_level"]) == (True, True, level)
        client.start_tls(certs.client_context())
        client.start_deflate(level)
        exchange_messages(client)


def test_https_listener_serves_the_api(tls_nsqd, certs):
    tls_nsqd.wait_for_log(r"HTTPS: listening on ", 5)
    host, port = tls_nsqd.listening["HTTPS"]
    conn = http.client.HTTPSConnection(host, port, timeout=10, context=certs.client_context())
    try:
        conn.request("GET", "/ping")
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, b"OK")
    finally:
        conn.close()


# -- TLS required -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def required_nsqd(certs, tmp_path_factory):
    daemon = _daemon(tmp_path_factory, "nsqd-tls-required", certs.daemon_args("--tls-required=true"))
    yield daemon
    stop_all([daemon])


@pytest.mark.parametrize(
    "payload,verb",
    [
        (pub("t", b"x"), b"PUB"),
        (NOP, b"NOP"),
        (sub("t", "c"), b"SUB"),
        (b"AUTH\n\x00\x00\x00\x01s", b"AUTH"),
        (b"BOGUS\n", b"BOGUS"),
    ],
    ids=["PUB", "NOP", "SUB", "AUTH", "unknown"],
)
def test_tls_required_refuses_commands_in_clear(required_nsqd, payload, verb):
    with RawClient(required_nsqd.tcp) as client:
        client.send(payload)
        client.expect_error(b"E_INVALID cannot " + verb + b" in current state (TLS required)")
        client.assert_closed()


def test_tls_required_allows_identify_then_refuses_without_upgrade(required_nsqd):
    with RawClient(required_nsqd.tcp) as client:
        assert client.identify({}) == b"OK"
        client.send(pub("t", b"x"))
        client.expect_error(b"E_INVALID cannot PUB in current state (TLS required)")
        client.assert_closed()


def test_tls_required_works_after_the_upgrade(required_nsqd, certs):
    with FeatureClient(required_nsqd.tcp) as client:
        negotiate_tls(client, certs)
        exchange_messages(client, count=3)
        client.send(NOP)


def test_tls_required_refuses_plain_http(required_nsqd):
    address = required_nsqd.http()
    assert address is not None
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request("GET", "/ping")
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    https_port = required_nsqd.listening["HTTPS"][1]
    assert response.status == 403
    assert body == f'{{"message": "TLS_REQUIRED", "https_port": {https_port}}}'.encode()


# -- client certificate policies -------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["require", "require-verify"])
def policy_nsqd(request, certs, tmp_path_factory):
    daemon = _daemon(
        tmp_path_factory,
        f"nsqd-{request.param}",
        certs.daemon_args(f"--tls-client-auth-policy={request.param}", f"--tls-root-ca-file={certs.ca_file}"),
    )
    yield daemon
    stop_all([daemon])


def test_policy_implies_tls_required(policy_nsqd):
    with RawClient(policy_nsqd.tcp) as client:
        client.send(pub("t", b"x"))
        client.expect_error(b"E_INVALID cannot PUB in current state (TLS required)")


def test_policy_accepts_a_certificate_from_the_ca(policy_nsqd, certs):
    with FeatureClient(policy_nsqd.tcp) as client:
        negotiate_tls(client, certs, with_cert=True)
        exchange_messages(client, count=2)


def test_policy_refuses_a_client_without_certificate(policy_nsqd, certs):
    expect_handshake_refused(policy_nsqd, certs.client_context())


# -- minimum version and startup -------------------------------------------------------------------------


def test_tls_min_version_refuses_older_clients(certs, nsqd_factory):
    daemon = nsqd_factory(*certs.daemon_args("--tls-min-version=tls1.3"))
    with FeatureClient(daemon.tcp) as client:
        client.identify({"feature_negotiation": True, "tls_v1": True})
        with pytest.raises(REFUSED):
            client.start_tls(certs.client_context(maximum=ssl.TLSVersion.TLSv1_2))
    daemon.wait_for_log(r"TLS handshake failed", 5)
    with FeatureClient(daemon.tcp) as client:
        negotiate_tls(client, certs)
        assert client.io.version() == "TLSv1.3"


@pytest.mark.parametrize(
    "flags",
    [
        ["--tls-cert={d}/missing.pem", "--tls-key={d}/missing.key"],
        ["--auth-http-address=127.0.0.1:1", "--tls-root-ca-file={d}/missing-ca.pem"],
    ],
    ids=["certificate", "auth-root-ca"],
)
def test_unreadable_tls_files_stop_startup(tmp_path, flags):
    daemon = NsqdProcess(tmp_path / "data", [flag.format(d=tmp_path) for flag in flags])
    with pytest.raises(AssertionError):
        daemon.start()
    assert daemon.proc.wait(10) == 1
    assert "failed to build TLS config" in daemon.log_text()


def test_heartbeats_flow_through_tls(certs, nsqd_factory):
    daemon = nsqd_factory(*certs.daemon_args())
    with FeatureClient(daemon.tcp) as client:
        client.identify({"feature_negotiation": True, "tls_v1": True, "heartbeat_interval": 1000})
        client.start_tls(certs.client_context())
        frame = client.read_frame(timeout=5, skip_heartbeats=False)
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_RESPONSE, b"_heartbeat_")
        client.send(NOP)


def test_info_over_https_without_http_reports_http_port_0(certs, tmp_path_factory):
    """nsqd with --http-address="" reports the port of its empty HTTP address, 0 (-1 is a unix socket's)."""
    daemon = _daemon(
        tmp_path_factory, "nsqd-https-only", certs.daemon_args("--http-address=", "--https-address=127.0.0.1:0")
    )
    try:
        port = int(daemon.wait_for_log(r"HTTPS: listening on \S+:(\d+)", 10).group(1))
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=certs.client_context())
        try:
            conn.request("GET", "/info")
            info = json.loads(conn.getresponse().read())
        finally:
            conn.close()
        assert (info["http_port"], info["tcp_port"]) == (0, daemon.tcp[1])
    finally:
        stop_all([daemon])
