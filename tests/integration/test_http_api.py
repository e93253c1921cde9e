"""nsqd's HTTP endpoints against a real nsqd subprocess: every route, its status codes and error bodies in
nsqd's check order, headers, and the router's 404/405/OPTIONS/redirect answers (shared NSQ-FACTS 4.1, 4.2)."""

from __future__ import annotations

import json
import struct
import uuid

import pytest

from tests.integration.harness import NsqdProcess, RawClient, consumer, fin, stop_all
from tests.integration.http_helpers import get, post, raw_exchange, request, stats

pytestmark = pytest.mark.timeout(60)

NSQ_HEADER = "nsq; version=1.0"
JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
MAX_MSG = 100
MAX_BODY = 1000


def name(prefix: str = "h") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def daemon(module_nsqd):
    yield module_nsqd
    module_nsqd.assert_running()


@pytest.fixture
def web(daemon):
    return daemon.http()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """An nsqd with tiny size limits, for the 413 paths."""
    process = NsqdProcess(
        tmp_path_factory.mktemp("nsqd-small"),
        [f"--max-msg-size={MAX_MSG}", f"--max-body-size={MAX_BODY}", "--max-req-timeout=10s"],
    )
    process.start()
    yield process
    stop_all([process])


def binary_mpub(bodies: list[bytes], count: int | None = None) -> bytes:
    parts = [struct.pack(">i", len(bodies) if count is None else count)]
    for body in bodies:
        parts += [struct.pack(">i", len(body)), body]
    return b"".join(parts)


def expect_error(reply, status: int, code: str) -> None:
    assert (reply.status, reply.body) == (status, json.dumps({"message": code}, separators=(",", ":")).encode()), reply
    assert reply.headers["content-type"] == JSON_TYPE
    assert reply.headers["x-nsq-content-type"] == NSQ_HEADER


def expect_ok_text(reply) -> None:
    assert (reply.status, reply.body) == (200, b"OK"), reply
    assert reply.headers["x-nsq-content-type"] == NSQ_HEADER


def expect_empty(reply) -> None:
    assert (reply.status, reply.body) == (200, b""), reply
    assert reply.headers["x-nsq-content-type"] == NSQ_HEADER
    assert "content-type" not in reply.headers


def topic_stats(web, topic: str) -> dict | None:
    topics = stats(web, f"topic={topic}")["topics"]
    return topics[0] if topics else None


# -- /ping and /info ---------------------------------------------------------------------------------------------
def test_ping_is_plain_ok_without_the_nsq_header(web):
    reply = get(web, "/ping")
    assert (reply.status, reply.body) == (200, b"OK")
    assert reply.headers["content-type"] == TEXT_TYPE
    assert "x-nsq-content-type" not in reply.headers


def test_head_ping_has_no_body(web):
    reply = request(web, "HEAD", "/ping")
    assert (reply.status, reply.body) == (200, b"")


def test_info_reports_the_real_ports_in_nsqd_key_order(daemon, web):
    reply = get(web, "/info")
    assert reply.status == 200 and reply.headers["content-type"] == JSON_TYPE
    assert reply.headers["x-nsq-content-type"] == NSQ_HEADER
    info = reply.json()
    assert list(info) == [
        "version",
        "broadcast_address",
        "hostname",
        "http_port",
        "tcp_port",
        "start_time",
        "max_heartbeat_interval",
        "max_output_buffer_size",
        "max_output_buffer_timeout",
        "max_deflate_level",
    ]
    assert info["version"] == "1.3.0"
    assert info["http_port"] == web[1] != 0
    assert info["tcp_port"] == daemon.tcp[1] != 0
    assert info["max_heartbeat_interval"] == 60_000_000_000
    assert info["max_output_buffer_size"] == 65536
    assert info["max_output_buffer_timeout"] == 30_000_000_000
    assert info["max_deflate_level"] == 6
    assert isinstance(info["start_time"], int) and isinstance(info["hostname"], str)


# -- /pub --------------------------------------------------------------------------------------------------------
def test_pub_delivers_to_a_tcp_consumer_and_counts_no_producer(daemon, web):
    topic = name()
    with consumer(daemon.tcp, topic, "c", ready=1) as sub:
        expect_ok_text(post(web, f"/pub?topic={topic}", b"hello over http"))
        message = sub.read_message()
        assert message.body == b"hello over http"
        sub.send(fin(message.id))
    document = stats(web, f"topic={topic}")
    assert document["topics"][0]["message_count"] == 1
    assert document["topics"][0]["message_bytes"] == len(b"hello over http")
    assert document["producers"] is None


def test_pub_with_defer_holds_the_message(web):
    topic = name()
    expect_empty(post(web, f"/topic/create?topic={topic}"))
    expect_empty(post(web, f"/channel/create?topic={topic}&channel=c"))
    expect_ok_text(post(web, f"/pub?topic={topic}&defer=600000", b"later"))
    channel = topic_stats(web, topic)["channels"][0]
    assert (channel["deferred_count"], channel["depth"], channel["message_count"]) == (1, 0, 1)


@pytest.mark.parametrize(
    "path, body, status, code",
    [
        ("/pub?topic=x", b"", 400, "MSG_EMPTY"),
        ("/pub", b"", 400, "MSG_EMPTY"),  # the body is checked before the topic
        ("/pub?topic=%zz", b"m", 400, "INVALID_REQUEST"),
        ("/pub?a=1;b=2", b"m", 400, "INVALID_REQUEST"),
        ("/pub", b"m", 400, "MISSING_ARG_TOPIC"),
        ("/pub?channel=x", b"m", 400, "MISSING_ARG_TOPIC"),
        ("/pub?topic=", b"m", 400, "INVALID_TOPIC"),
        ("/pub?topic=bad!name", b"m", 400, "INVALID_TOPIC"),
        ("/pub?topic=" + "x" * 65, b"m", 400, "INVALID_TOPIC"),
        ("/pub?topic=%C3%A9t%C3%A9", b"m", 400, "INVALID_TOPIC"),
    ],
)
def test_pub_errors(web, path, body, status, code):
    expect_error(post(web, path, body), status, code)


@pytest.mark.parametrize("value", ["abc", "-1", "3600001", "1.5", "", "99999999999999999999", " 5"])
def test_pub_invalid_defer_still_creates_the_topic(web, value):
    topic = name()
    expect_error(post(web, f"/pub?topic={topic}&defer={value.replace(' ', '%20')}", b"m"), 400, "INVALID_DEFER")
    created = topic_stats(web, topic)
    assert created is not None and created["message_count"] == 0


@pytest.mark.parametrize("value", ["0", "3600000", "%2B5"])
def test_pub_defer_bounds_accepted(web, value):
    expect_ok_text(post(web, f"/pub?topic={name()}&defer={value}", b"m"))


def test_pub_size_limits(small):
    web = small.http()
    topic = name()
    expect_ok_text(post(web, f"/pub?topic={topic}", b"x" * MAX_MSG))
    expect_error(post(web, f"/pub?topic={topic}", b"x" * (MAX_MSG + 1)), 413, "MSG_TOO_BIG")
    # the size wins over every other check
    expect_error(post(web, "/pub", b"x" * (MAX_MSG + 1)), 413, "MSG_TOO_BIG")
    assert topic_stats(web, topic)["message_count"] == 1


def test_pub_with_a_chunked_body_over_the_limit(small):
    web = small.http()
    head = f"POST /pub?topic={name()} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    raw = raw_exchange(web, head + b"3c\r\n" + b"y" * 60 + b"\r\n" + b"3c\r\n" + b"y" * 60 + b"\r\n0\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 413 "), raw
    assert raw.endswith(b'{"message":"MSG_TOO_BIG"}'), raw


# -- /mpub -------------------------------------------------------------------------------------------------------
def test_mpub_text_mode_skips_empty_lines_and_keeps_carriage_returns(daemon, web):
    topic = name()
    with consumer(daemon.tcp, topic, "c", ready=10) as sub:
        expect_ok_text(post(web, f"/mpub?topic={topic}", b"one\n\ntwo\r\nthree\n"))
        bodies = []
        for _ in range(3):
            message = sub.read_message()
            bodies.append(message.body)
            sub.send(fin(message.id))
    assert bodies == [b"one", b"two\r", b"three"]


@pytest.mark.parametrize("flag", ["true", "1", "yes"])  # an unknown value means binary (deprecated)
def test_mpub_binary_mode(web, flag):
    topic = name()
    expect_ok_text(post(web, f"/mpub?topic={topic}&binary={flag}", binary_mpub([b"a\nb", b"c"]) + b"trailing"))
    assert topic_stats(web, topic)["message_count"] == 2


@pytest.mark.parametrize("flag", ["false", "0"])
def test_mpub_binary_false_is_text(web, flag):
    topic = name()
    expect_ok_text(post(web, f"/mpub?topic={topic}&binary={flag}", b"a\nb\nc"))
    assert topic_stats(web, topic)["message_count"] == 3


def test_mpub_empty_body_is_ok_and_creates_the_topic(web):
    topic = name()
    expect_ok_text(post(web, f"/mpub?topic={topic}", b"\n\n"))
    assert topic_stats(web, topic)["message_count"] == 0


def test_mpub_defer_extension(web):
    topic = name()
    expect_empty(post(web, f"/topic/create?topic={topic}"))
    expect_empty(post(web, f"/channel/create?topic={topic}&channel=c"))
    expect_ok_text(post(web, f"/mpub?topic={topic}&defer=600000", b"a\nb"))
    assert topic_stats(web, topic)["channels"][0]["deferred_count"] == 2
    expect_error(post(web, f"/mpub?topic={topic}&defer=-5", b"a"), 400, "INVALID_DEFER")


@pytest.mark.parametrize(
    "query, body, status, code",
    [
        ("", b"a", 400, "MISSING_ARG_TOPIC"),
        ("topic=bad!", b"a", 400, "INVALID_TOPIC"),
        ("topic=%zz", b"a", 400, "INVALID_REQUEST"),
        ("binary=true&topic={t}", b"", 413, "BAD_BODY"),
        ("binary=true&topic={t}", b"\x00\x00", 413, "BAD_BODY"),
        ("binary=true&topic={t}", struct.pack(">i", 0), 413, "BAD_BODY"),
        ("binary=true&topic={t}", struct.pack(">i", -1), 413, "BAD_BODY"),
        ("binary=true&topic={t}", struct.pack(">i", (MAX_BODY - 4) // 5 + 1), 413, "BAD_BODY"),
        ("binary=true&topic={t}", binary_mpub([b""]), 413, "BAD_MESSAGE"),
        ("binary=true&topic={t}", binary_mpub([b"x" * (MAX_MSG + 1)]), 413, "BAD_MESSAGE"),
        ("binary=true&topic={t}", binary_mpub([b"abc"])[:-1], 413, "BAD_MESSAGE"),
        ("binary=true&topic={t}", binary_mpub([b"abc"], count=2), 413, "BAD_MESSAGE"),
        ("binary=true&topic={t}", binary_mpub([b"abc"])[:6], 413, "BAD_MESSAGE"),
        ("topic={t}", b"ok\n" + b"x" * (MAX_MSG + 1), 413, "MSG_TOO_BIG"),
        ("topic={t}", b"x" * (MAX_BODY + 1), 413, "BODY_TOO_BIG"),
        ("binary=true&topic={t}", b"x" * (MAX_BODY + 1), 413, "BODY_TOO_BIG"),
    ],
)
def test_mpub_errors_publish_nothing_and_create_no_topic(small, query, body, status, code):
    web = small.http()
    topic = name()
    expect_error(post(web, "/mpub?" + query.format(t=topic), body), status, code)
    assert stats(web, f"topic={topic}")["topics"] is None


def test_mpub_at_the_limits(small):
    web = small.http()
    topic = name()
    expect_ok_text(post(web, f"/mpub?topic={topic}", b"x" * MAX_MSG + b"\n"))
    bodies = [b"z" * 10] * ((MAX_BODY - 4) // 14)
    expect_ok_text(post(web, f"/mpub?topic={topic}&binary=true", binary_mpub(bodies)))
    assert topic_stats(web, topic)["message_count"] == 1 + len(bodies)


# -- topics ------------------------------------------------------------------------------------------------------
def test_topic_lifecycle(daemon, web):
    topic = name()
    expect_empty(post(web, f"/topic/create?topic={topic}"))
    expect_empty(post(web, f"/topic/create?topic={topic}"))  # idempotent
    expect_ok_text(post(web, f"/mpub?topic={topic}", b"a\nb\nc"))
    assert topic_stats(web, topic)["depth"] == 3  # no channel: messages stay in the topic
    expect_empty(post(web, f"/topic/empty?topic={topic}"))
    assert topic_stats(web, topic)["depth"] == 0
    expect_empty(post(web, f"/topic/delete?topic={topic}"))
    assert stats(web, f"topic={topic}")["topics"] is None
    expect_error(post(web, f"/topic/delete?topic={topic}"), 404, "TOPIC_NOT_FOUND")


@pytest.mark.parametrize(
    "path, status, code",
    [
        ("/topic/create", 400, "MISSING_ARG_TOPIC"),
        ("/topic/create?topic=a%zz", 400, "INVALID_REQUEST"),
        ("/topic/create?topic=bad!", 400, "INVALID_TOPIC"),
        ("/topic/create?topic=", 400, "INVALID_TOPIC"),
        ("/topic/delete", 400, "MISSING_ARG_TOPIC"),
        ("/topic/delete?topic=%zz", 400, "INVALID_REQUEST"),
        ("/topic/delete?topic=bad!", 404, "TOPIC_NOT_FOUND"),  # not validated
        ("/topic/delete?topic=nope_never", 404, "TOPIC_NOT_FOUND"),
        ("/topic/empty", 400, "MISSING_ARG_TOPIC"),
        ("/topic/empty?topic=bad!", 400, "INVALID_TOPIC"),
        ("/topic/empty?topic=nope_never", 404, "TOPIC_NOT_FOUND"),
        ("/topic/pause", 400, "MISSING_ARG_TOPIC"),
        ("/topic/pause?topic=bad!", 404, "TOPIC_NOT_FOUND"),
        ("/topic/unpause?topic=nope_never", 404, "TOPIC_NOT_FOUND"),
        ("/topic/unpause", 400, "MISSING_ARG_TOPIC"),
    ],
)
def test_topic_errors(web, path, status, code):
    expect_error(post(web, path), status, code)


def test_topic_pause_holds_messages_and_is_persisted(daemon, web):
    topic = name()
    with consumer(daemon.tcp, topic, "c", ready=5) as sub:
        expect_empty(post(web, f"/topic/pause?topic={topic}"))
        assert topic_stats(web, topic)["paused"] is True
        metadata = json.loads((daemon.data_path / "nsqd.dat").read_bytes())
        assert {"name": topic, "paused": True} in [
            {"name": t["name"], "paused": t["paused"]} for t in metadata["topics"]
        ]
        expect_ok_text(post(web, f"/pub?topic={topic}", b"held"))
        assert sub.poll_frame(0.3) is None
        assert topic_stats(web, topic)["depth"] == 1
        expect_empty(post(web, f"/topic/unpause?topic={topic}"))
        message = sub.read_message()
        assert message.body == b"held"
        sub.send(fin(message.id))
    metadata = json.loads((daemon.data_path / "nsqd.dat").read_bytes())
    assert [t["paused"] for t in metadata["topics"] if t["name"] == topic] == [False]


# -- channels ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("action", ["create", "delete", "empty", "pause", "unpause"])
@pytest.mark.parametrize(
    "query, status, code",
    [
        ("", 400, "MISSING_ARG_TOPIC"),
        ("topic=%zz", 400, "INVALID_REQUEST"),
        ("topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("topic=ok", 400, "MISSING_ARG_CHANNEL"),
        ("topic=ok&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
        ("topic=ok&channel=", 400, "INVALID_ARG_CHANNEL"),
        ("topic=nope_never&channel=c", 404, "TOPIC_NOT_FOUND"),
    ],
)
def test_channel_argument_errors(web, action, query, status, code):
    expect_error(post(web, f"/channel/{action}?{query}"), status, code)


@pytest.mark.parametrize("action", ["delete", "empty", "pause", "unpause"])
def test_channel_not_found(web, action):
    topic = name()
    expect_empty(post(web, f"/topic/create?topic={topic}"))
    expect_error(post(web, f"/channel/{action}?topic={topic}&channel=missing"), 404, "CHANNEL_NOT_FOUND")


def test_channel_lifecycle_and_persisted_pause(daemon, web):
    topic = name()
    expect_empty(post(web, f"/topic/create?topic={topic}"))
    expect_empty(post(web, f"/channel/create?topic={topic}&channel=c1"))
    expect_empty(post(web, f"/channel/create?topic={topic}&channel=c2"))
    expect_ok_text(post(web, f"/mpub?topic={topic}", b"a\nb"))
    channels = {c["channel_name"]: c for c in topic_stats(web, topic)["channels"]}
    assert (channels["c1"]["depth"], channels["c2"]["depth"]) == (2, 2)

    expect_empty(post(web, f"/channel/empty?topic={topic}&channel=c1"))
    expect_empty(post(web, f"/channel/pause?topic={topic}&channel=c2"))
    channels = {c["channel_name"]: c for c in topic_stats(web, topic)["channels"]}
    assert (channels["c1"]["depth"], channels["c2"]["paused"]) == (0, True)
    metadata = json.loads((daemon.data_path / "nsqd.dat").read_bytes())
    (entry,) = [t for t in metadata["topics"] if t["name"] == topic]
    assert {c["name"]: c["paused"] for c in entry["channels"]} == {"c1": False, "c2": True}

    with consumer(daemon.tcp, topic, "c2", ready=5) as sub:
        assert sub.poll_frame(0.3) is None  # paused: nothing delivered
        expect_empty(post(web, f"/channel/unpause?topic={topic}&channel=c2"))
        for _ in range(2):
            sub.send(fin(sub.read_message().id))
    expect_empty(post(web, f"/channel/delete?topic={topic}&channel=c1"))
    assert [c["channel_name"] for c in topic_stats(web, topic)["channels"]] == ["c2"]
    expect_error(post(web, f"/channel/delete?topic={topic}&channel=c1"), 404, "CHANNEL_NOT_FOUND")


def test_channel_create_needs_the_topic(web):
    expect_error(post(web, f"/channel/create?topic={name()}&channel=c"), 404, "TOPIC_NOT_FOUND")


# -- router behaviour --------------------------------------------------------------------------------------------
ROUTES = {
    "/ping": "GET",
    "/info": "GET",
    "/stats": "GET",
    "/pub": "POST",
    "/mpub": "POST",
    "/topic/create": "POST",
    "/topic/delete": "POST",
    "/topic/empty": "POST",
    "/topic/pause": "POST",
    "/topic/unpause": "POST",
    "/channel/create": "POST",
    "/channel/delete": "POST",
    "/channel/empty": "POST",
    "/channel/pause": "POST",
    "/channel/unpause": "POST",
    "/config/log_level": "GET, PUT",
    "/debug/setblockrate": "PUT",
    "/debug/freememory": "POST",
}


@pytest.mark.parametrize("path, methods", ROUTES.items())
def test_wrong_method_is_405_with_allow(web, path, methods):
    wrong = "DELETE"
    reply = request(web, wrong, path)
    expect_error(reply, 405, "METHOD_NOT_ALLOWED")
    assert reply.headers["allow"] == ", ".join(sorted({*methods.split(", "), "OPTIONS"}))


@pytest.mark.parametrize("path, methods", ROUTES.items())
def test_options_lists_the_methods(web, path, methods):
    reply = request(web, "OPTIONS", path)
    assert (reply.status, reply.body) == (200, b"")
    assert reply.headers["allow"] == ", ".join(sorted({*methods.split(", "), "OPTIONS"}))


@pytest.mark.parametrize("path", ["/", "/nope", "/put", "/create_topic", "/topic", "/config", "/config/a/b"])
def test_unknown_paths_are_404(web, path):
    expect_error(get(web, path), 404, "NOT_FOUND")


def test_trailing_slash_redirects(web):
    reply = get(web, "/ping/")
    assert reply.status == 301 and reply.headers["location"] == "/ping"
    reply = get(web, "/debug/pprof")
    assert reply.status == 301 and reply.headers["location"] == "/debug/pprof/"
    reply = post(web, "/topic/create/?topic=x")
    assert reply.status == 307 and reply.headers["location"] == "/topic/create?topic=x"


def test_debug_hooks(web):
    assert get(web, "/debug/pprof/").status == 200
    reply = request(web, "PUT", "/debug/setblockrate?rate=1")
    assert (reply.status, reply.body) == (200, b"")
    reply = request(web, "PUT", "/debug/setblockrate?rate=abc")
    assert (reply.status, reply.body) == (400, b'invalid block rate : strconv.Atoi: parsing "abc": invalid syntax')
    expect_empty(post(web, "/debug/freememory"))


def test_access_log_skips_pub_and_mpub(daemon, web):
    topic = name()
    start = len(daemon.lines)
    expect_ok_text(post(web, f"/pub?topic={topic}", b"quiet"))
    expect_ok_text(post(web, f"/mpub?topic={topic}", b"quiet"))
    expect_empty(post(web, f"/topic/create?topic={topic}"))
    daemon.wait_for_log(rf"INFO: 200 POST /topic/create\?topic={topic} \(127\.0\.0\.1:\d+\) \S+$", 5, start)
    logged = daemon.log_text()
    assert f"/pub?topic={topic}" not in logged and f"/mpub?topic={topic}" not in logged


def test_tcp_producer_and_http_publisher_share_the_topic(daemon, web):
    topic = name()
    with RawClient(daemon.tcp) as producer:
        producer.publish(topic, b"tcp")
        expect_ok_text(post(web, f"/pub?topic={topic}", b"http"))
        document = stats(web, f"topic={topic}")
    assert document["topics"][0]["message_count"] == 2
    (entry,) = document["producers"]
    assert entry["pub_counts"] == [{"topic": topic, "count": 1}]
