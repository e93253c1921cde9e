"""The HTTP listener of a real nsqd under bad and unusual input: malformed requests, header floods, huge
Content-Lengths, slow clients, bad encodings; and the HTTP/1.1 features clients rely on (keep-alive,
pipelining, 100-continue, HTTP/1.0). Each case gets nsqd's answer or a clean 4xx, and nothing disturbs
the other connections or the daemon."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import pytest

from tests.integration.http_helpers import get, post, raw_exchange, read_responses, read_until_closed, stats

pytestmark = pytest.mark.timeout(60)


def name() -> str:
    return f"r_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def daemon(module_nsqd):
    yield module_nsqd
    module_nsqd.assert_running()
    log = module_nsqd.log_text()
    assert "internal error" not in log and "Traceback" not in log, log[-3000:]


@pytest.fixture
def web(daemon):
    return daemon.http()


@pytest.fixture
def bystander(web):
    """A kept-alive connection opened before the bad input and used after it."""
    sock = socket.create_connection(web, timeout=10)
    sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_responses(sock, 1)[0][0] == 200
    yield sock
    sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_responses(sock, 1)[0][:1] == (200,), "the bystander connection was disturbed"
    sock.close()


def status_of(raw: bytes) -> int:
    assert raw.startswith(b"HTTP/1.1 "), raw[:200]
    return int(raw.split(b" ", 2)[1])


@pytest.mark.parametrize(
    "data",
    [
        b"GARBAGE\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET /ping\r\n\r\n",
        b"GET /ping HTTP/1.1 extra\r\n\r\n",
        b"\x00\x01\x02\x03\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a TLS ClientHello on the plain port
        b"GET /ping HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /ping%zz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /stats?topic=\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /ping HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
    ],
)
def test_malformed_requests_get_a_clean_4xx_and_close(web, bystander, data):
    raw = raw_exchange(web, data, shutdown=True)
    assert 400 <= status_of(raw) < 500, raw[:300]
    assert get(web, "/ping").status == 200


@pytest.mark.parametrize(
    "version, statuses", [(b"HTTP/2.0", {505}), (b"HTTP/0.9", {400, 505}), (b"HTTP/3.1", {505}), (b"HTTP/9.9", {505})]
)
def test_unsupported_http_versions_are_refused(web, bystander, version, statuses):
    raw = raw_exchange(web, b"GET /ping " + version + b"\r\nHost: x\r\n\r\n", shutdown=True)
    assert status_of(raw) in statuses


def test_unknown_transfer_coding_is_501_as_in_go(web, bystander):
    raw = raw_exchange(web, b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", shutdown=True)
    assert status_of(raw) == 501


def test_content_length_beyond_int64_is_400(web, bystander):
    raw = raw_exchange(
        web, b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 30 + b"\r\n\r\n", shutdown=True
    )
    assert status_of(raw) == 400


def test_non_utf8_query_values_are_invalid_request(web, bystander):
    for path in [
        "/stats?format=json&topic=%ff",
        "/pub?topic=%ff%fe",
        "/topic/create?topic=%c3%28",
        "/channel/create?topic=a&channel=%80",
    ]:
        method = "GET" if path.startswith("/stats") else "POST"
        reply = get(web, path) if method == "GET" else post(web, path, b"m")
        assert (reply.status, reply.body) == (400, b'{"message":"INVALID_REQUEST"}'), (path, reply)
    # endpoints that read no parameters do not care, as in nsqd
    assert get(web, "/ping?%ff=%zz").status == 200


def test_header_floods_get_431(web, bystander):
    one_huge = b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    assert status_of(raw_exchange(web, one_huge, shutdown=True)) == 431
    many = b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)) + b"\r\n"
    assert status_of(raw_exchange(web, many, shutdown=True)) == 431
    # a big but reasonable head is fine
    ok = b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n"
    assert status_of(raw_exchange(web, ok + b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) == 200


@pytest.mark.parametrize(
    "path, method, code",
    [
        ("/pub?topic={t}", "POST", "MSG_TOO_BIG"),
        ("/mpub?topic={t}", "POST", "BODY_TOO_BIG"),
        ("/topic/create?topic={t}", "POST", "BODY_TOO_BIG"),
        ("/config/log_level", "PUT", "INVALID_VALUE"),
    ],
)
@pytest.mark.parametrize("length", [2 * 1024**3, (1 << 63) - 1])
def test_huge_content_length_is_answered_without_reading_the_body(web, bystander, path, method, code, length):
    topic = name()
    head = f"{method} {path.format(t=topic)} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()
    with socket.create_connection(web, timeout=10) as sock:
        sock.sendall(head + b"only a little of the body")
        raw = read_until_closed(sock, 10)
    assert status_of(raw) == 413
    assert raw.endswith(b'{"message":"%s"}' % code.encode())
    assert stats(web, f"topic={topic}")["topics"] is None


def test_expect_100_continue(web, bystander):
    topic = name()
    with socket.create_connection(web, timeout=10) as sock:
        sock.sendall(
            f"POST /pub?topic={topic} HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n".encode()
        )
        (interim,) = read_responses(sock, 1)
        assert interim[0] == 100
        sock.sendall(b"hello")
        (final,) = read_responses(sock, 1)
        assert (final[0], final[2]) == (200, b"OK")
        # over the limit: refused at once, no 100 Continue, and the connection is closed
        sock.sendall(
            f"POST /pub?topic={topic} HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n"
            "Expect: 100-continue\r\n\r\n".encode()
        )
        raw = read_until_closed(sock, 10)
    assert status_of(raw) == 413 and b"100 Continue" not in raw
    assert stats(web, f"topic={topic}")["topics"][0]["message_count"] == 1


def test_keep_alive_and_pipelining(web, bystander):
    topic = name()
    requests = [
        f"POST /pub?topic={topic} HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nm{i:03d}".encode() for i in range(50)
    ]
    requests.insert(25, f"GET /stats?format=json&topic={topic} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    requests.append(b"POST /mpub?topic=" + topic.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\na\nb")
    with socket.create_connection(web, timeout=10) as sock:
        sock.sendall(b"".join(requests))
        responses = read_responses(sock, len(requests))
    assert [r[0] for r in responses] == [200] * len(requests)
    assert responses[25][2].startswith(b'{"version":"1.3.0"')
    assert [r[2] for i, r in enumerate(responses) if i != 25] == [b"OK"] * (len(requests) - 1)
    assert stats(web, f"topic={topic}")["topics"][0]["message_count"] == 52


def test_http_1_0_closes_unless_keep_alive(web):
    raw = raw_exchange(web, b"GET /ping HTTP/1.0\r\n\r\n")
    assert status_of(raw) == 200 and raw.endswith(b"OK")
    with socket.create_connection(web, timeout=10) as sock:
        sock.sendall(b"GET /ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" * 2)
        assert [r[0] for r in read_responses(sock, 2)] == [200, 200]


def test_connection_close_is_honoured(web):
    raw = raw_exchange(web, b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /info HTTP/1.1\r\n\r\n")
    assert raw.count(b"HTTP/1.1 ") == 1 and b"Connection: close" in raw


def test_a_slowloris_client_is_dropped_and_disturbs_nobody(daemon, web, bystander):
    """A head dribbled a byte at a time is cut off by the header timeout (10 s); meanwhile other clients are
    served as usual."""
    topic = name()
    closed = threading.Event()
    sent = []

    def dribble() -> None:
        with socket.create_connection(web, timeout=30) as sock:
            for byte in b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"z" * 1000:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break
                sent.append(byte)
                sock.settimeout(0.2)
                try:
                    if sock.recv(1) == b"":
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
            closed.set()

    thread = threading.Thread(target=dribble, daemon=True)
    thread.start()
    served = 0
    start = time.monotonic()
    while not closed.is_set():
        assert time.monotonic() - start < 30, "the slow client was never dropped"
        assert post(web, f"/pub?topic={topic}", b"meanwhile").status == 200
        served += 1
    thread.join(5)
    assert 0 < len(sent) < 1000 + 40, "the server waited for the whole dribbled head"
    assert served > 0 and stats(web, f"topic={topic}")["topics"][0]["message_count"] == served
