"""nsqlookupd as a subprocess: the "  V1" TCP protocol with raw peers, and the HTTP API's exact answers."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import subprocess
import sys
import uuid

import pytest

from protocol.lookup_v1 import PING, encode_register, encode_unregister
from tests.integration.harness import REPO_ROOT, stop_all
from tests.integration.http_helpers import get, post, request
from tests.integration.lookupd_harness import LookupdProcess, RawPeer, lookup_producers, wait_for

pytestmark = pytest.mark.timeout(60)

NSQ_HEADER = "nsq; version=1.0"
JSON_TYPE = "application/json; charset=utf-8"


@pytest.fixture(scope="module")
def lookupd(tmp_path_factory):
    daemon = LookupdProcess(tmp_path_factory.mktemp("lookupd")).start()
    yield daemon
    stop_all([daemon])


@pytest.fixture
def topic() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def registered_peer(lookupd, topic: str, channel: str = "", **identify) -> RawPeer:
    peer = RawPeer(lookupd.tcp)
    peer.identify(**identify)
    assert peer.command(encode_register(topic, channel)) == b"OK"
    return peer


# -- TCP -----------------------------------------------------------------------------------------------------------
def test_identify_answers_with_the_lookupds_own_info(lookupd):
    with RawPeer(lookupd.tcp) as peer:
        peer.send(b"IDENTIFY\n")
        body = json.dumps({"broadcast_address": "127.0.0.1", "tcp_port": 1, "http_port": 2, "version": "1.3.0"})
        peer.send(struct.pack(">i", len(body)) + body.encode())
        raw = peer.read_response()
    assert json.loads(raw) == {
        "broadcast_address": "127.0.0.1",
        "hostname": socket.gethostname(),
        "http_port": lookupd.http_address[1],
        "tcp_port": lookupd.tcp[1],
        "version": "1.3.0",
    }
    assert list(json.loads(raw)) == sorted(json.loads(raw)), "keys are sorted, as Go marshals a map"


def test_register_lookup_and_leave_on_disconnect(lookupd, topic):
    peer = registered_peer(lookupd, topic, "archive", tcp_port=5150, http_port=5151, hostname="node-a")
    reply = get(lookupd.http_address, f"/lookup?topic={topic}")
    assert reply.status == 200
    assert reply.body == (
        b'{"channels":["archive"],"producers":[{"remote_address":"'
        + peer.local_address.encode()
        + b'","hostname":"node-a","broadcast_address":"127.0.0.1","tcp_port":5150,"http_port":5151,'
        b'"version":"1.3.0"}]}'
    )
    assert reply.headers["content-type"] == JSON_TYPE and reply.headers["x-nsq-content-type"] == NSQ_HEADER
    assert peer.command(PING) == b"OK"
    peer.close()
    wait_for(lambda: lookup_producers(lookupd, topic) == [], message="the producer left with its connection")
    # the keys stay
    assert topic in get(lookupd.http_address, "/topics").json()["topics"]
    assert get(lookupd.http_address, f"/channels?topic={topic}").json() == {"channels": ["archive"]}


def test_ping_before_identify_is_ok(lookupd):
    with RawPeer(lookupd.tcp) as peer:
        assert peer.command(PING) == b"OK"
        assert peer.command(PING) == b"OK"


def test_unregister_semantics(lookupd, topic):
    with registered_peer(lookupd, topic, "keep") as peer:
        assert peer.command(encode_register(topic, "gone#ephemeral")) == b"OK"
        assert get(lookupd.http_address, f"/channels?topic={topic}").json()["channels"] == ["keep", "gone#ephemeral"]
        # an ephemeral channel left without producers disappears; a normal one stays
        assert peer.command(encode_unregister(topic, "gone#ephemeral")) == b"OK"
        assert peer.command(encode_unregister(topic, "keep")) == b"OK"
        assert get(lookupd.http_address, f"/channels?topic={topic}").json()["channels"] == ["keep"]
        assert len(lookup_producers(lookupd, topic)) == 1
        # a topic unregistration takes the peer off the topic and its channels
        assert peer.command(encode_register(topic, "keep")) == b"OK"
        assert peer.command(encode_unregister(topic)) == b"OK"
        assert lookup_producers(lookupd, topic) == []
        debug = get(lookupd.http_address, "/debug").json()
        assert f"channel:{topic}:keep" not in debug and f"topic:{topic}:" not in debug
        # an ephemeral topic's key goes with its last producer
        assert peer.command(encode_register(f"{topic}#ephemeral")) == b"OK"
        assert peer.command(encode_unregister(f"{topic}#ephemeral")) == b"OK"
        assert f"{topic}#ephemeral" not in get(lookupd.http_address, "/topics").json()["topics"]


BAD_INPUT = [
    pytest.param(b"", b"  V2", b"E_BAD_PROTOCOL", id="wrong-magic"),
    pytest.param(b"", b"GET / HTTP/1.1\r\n\r\n", b"E_BAD_PROTOCOL", id="http-on-tcp-port"),
    pytest.param(b"  V1", b"\x00\x01garbage\xfe\n", b"E_INVALID invalid command \x00\x01garbage\xfe", id="garbage"),
    pytest.param(b"  V1", b"REGISTER t\n", b"E_INVALID client must IDENTIFY", id="REGISTER-before-IDENTIFY"),
    pytest.param(
        b"  V1",
        b"IDENTIFY\n\x7f\xff\xff\xff" + b"{" * 1000,
        b"E_BAD_BODY IDENTIFY failed to read body",
        id="huge-IDENTIFY-body",
    ),
    pytest.param(
        b"  V1",
        b"IDENTIFY\n\x00\x00\x00\x05{bad}",
        b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        id="bad-IDENTIFY-json",
    ),
    pytest.param(
        b"  V1", b"IDENTIFY\n\x00\x00\x00\x02{}", b"E_BAD_BODY IDENTIFY missing fields", id="IDENTIFY-missing-fields"
    ),
]


@pytest.mark.parametrize("magic,data,error", BAD_INPUT)
def test_bad_input_closes_only_that_connection(lookupd, topic, magic, data, error):
    bystander = registered_peer(lookupd, topic, "c")
    with RawPeer(lookupd.tcp, magic=False) as bad:
        bad.send(magic + data)
        assert bad.read_response() == error
        bad.assert_closed()
    # the other peer is untouched and the daemon serves on
    assert bystander.command(PING) == b"OK"
    assert [p["remote_address"] for p in lookup_producers(lookupd, topic)] == [bystander.local_address]
    bystander.close()
    lookupd.assert_running()


def test_fatal_error_removes_the_peers_registrations(lookupd, topic):
    peer = registered_peer(lookupd, topic)
    assert len(lookup_producers(lookupd, topic)) == 1
    assert peer.command(b"IDENTIFY\n") == b"E_INVALID cannot IDENTIFY again"
    peer.assert_closed()
    wait_for(lambda: lookup_producers(lookupd, topic) == [], message="registrations removed after the error")
    peer.close()


@pytest.mark.parametrize(
    "line,error",
    [
        (b"REGISTER bad!name\n", b"E_BAD_TOPIC REGISTER topic name 'bad!name' is not valid"),
        (b"UNREGISTER t bad/channel\n", b"E_BAD_CHANNEL UNREGISTER channel name 'bad/channel' is not valid"),
        (b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
    ],
)
def test_name_errors_after_identify(lookupd, line, error):
    with RawPeer(lookupd.tcp) as peer:
        peer.identify()
        assert peer.command(line) == error
        peer.assert_closed()


def test_endless_line_is_dropped(lookupd):
    with RawPeer(lookupd.tcp) as peer:
        with contextlib.suppress(OSError):  # the server may close before everything is written
            peer.send(b"x" * (256 * 1024))
        peer.assert_closed()
    with RawPeer(lookupd.tcp) as peer:
        assert peer.command(PING) == b"OK"


def test_many_commands_in_one_write(lookupd, topic):
    with RawPeer(lookupd.tcp) as peer:
        peer.identify()
        peer.send(b"".join(encode_register(topic, f"c{i}") for i in range(50)) + PING)
        assert [peer.read_response() for _ in range(51)] == [b"OK"] * 51
        assert len(get(lookupd.http_address, f"/channels?topic={topic}").json()["channels"]) == 50


# -- HTTP ----------------------------------------------------------------------------------------------------------
def test_ping_and_info(lookupd):
    ping = get(lookupd.http_address, "/ping")
    assert (ping.status, ping.body) == (200, b"OK")
    assert ping.headers["content-type"] == "text/plain; charset=utf-8" and "x-nsq-content-type" not in ping.headers
    info = get(lookupd.http_address, "/info")
    assert info.body == b'{"version":"1.3.0"}' and info.headers["x-nsq-content-type"] == NSQ_HEADER


@pytest.mark.parametrize(
    "method,path,status,body",
    [
        ("GET", "/channels", 400, b'{"message":"MISSING_ARG_TOPIC"}'),
        ("GET", "/lookup", 400, b'{"message":"MISSING_ARG_TOPIC"}'),
        ("GET", "/lookup?topic=never_registered_anywhere", 404, b'{"message":"TOPIC_NOT_FOUND"}'),
        ("GET", "/lookup?topic=%zz", 400, b'{"message":"INVALID_REQUEST"}'),
        ("GET", "/channels?topic=never_registered_anywhere", 200, b'{"channels":[]}'),
        ("POST", "/topic/create", 400, b'{"message":"MISSING_ARG_TOPIC"}'),
        ("POST", "/topic/create?topic=bad!", 400, b'{"message":"INVALID_ARG_TOPIC"}'),
        ("POST", "/topic/delete", 400, b'{"message":"MISSING_ARG_TOPIC"}'),
        ("POST", "/topic/delete?topic=bad!never", 200, b""),
        ("POST", "/channel/create?topic=t", 400, b'{"message":"MISSING_ARG_CHANNEL"}'),
        ("POST", "/channel/create?topic=bad!&channel=c", 400, b'{"message":"INVALID_ARG_TOPIC"}'),
        ("POST", "/channel/create?topic=t&channel=bad!", 400, b'{"message":"INVALID_ARG_CHANNEL"}'),
        ("POST", "/channel/delete?channel=c", 400, b'{"message":"MISSING_ARG_TOPIC"}'),
        ("POST", "/channel/delete?topic=never_x&channel=c", 404, b'{"message":"CHANNEL_NOT_FOUND"}'),
        ("POST", "/topic/tombstone?node=a:1", 400, b'{"message":"MISSING_ARG_TOPIC"}'),
        ("POST", "/topic/tombstone?topic=t", 400, b'{"message":"MISSING_ARG_NODE"}'),
        ("POST", "/topic/tombstone?topic=nobody&node=a:1", 200, b""),
        ("GET", "/nope", 404, b'{"message":"NOT_FOUND"}'),
        ("GET", "/topic/create", 405, b'{"message":"METHOD_NOT_ALLOWED"}'),
    ],
)
def test_http_answers(lookupd, method, path, status, body):
    reply = request(lookupd.http_address, method, path)
    assert (reply.status, reply.body) == (status, body)
    if status == 405:
        assert reply.headers["allow"] == "OPTIONS, POST"


def test_topic_and_channel_administration(lookupd, topic):
    http = lookupd.http_address
    assert post(http, f"/topic/create?topic={topic}").status == 200
    assert topic in get(http, "/topics").json()["topics"]
    assert get(http, f"/lookup?topic={topic}").body == b'{"channels":[],"producers":[]}'
    reply = post(http, f"/channel/create?topic={topic}_2&channel=c1")
    assert (reply.status, reply.body, reply.headers["x-nsq-content-type"]) == (200, b"", NSQ_HEADER)
    assert f"{topic}_2" in get(http, "/topics").json()["topics"]
    assert post(http, f"/channel/create?topic={topic}_2&channel=c2").status == 200
    assert get(http, f"/channels?topic={topic}_2").json() == {"channels": ["c1", "c2"]}
    assert post(http, f"/channel/delete?topic={topic}_2&channel=c1").status == 200
    assert get(http, f"/channels?topic={topic}_2").json() == {"channels": ["c2"]}
    assert post(http, f"/topic/delete?topic={topic}_2").status == 200
    assert get(http, f"/lookup?topic={topic}_2").status == 404
    assert get(http, f"/channels?topic={topic}_2").json() == {"channels": []}


def test_tombstone_nodes_and_debug(lookupd, topic):
    http = lookupd.http_address
    peer = registered_peer(lookupd, topic, "c", tcp_port=6150, http_port=6151, hostname="node-t")
    assert peer.command(encode_register(f"{topic}_other")) == b"OK"
    assert post(http, f"/topic/tombstone?topic={topic}&node=127.0.0.1:6151").status == 200
    # hidden from /lookup, listed and flagged in /nodes, only for that topic
    assert lookup_producers(lookupd, topic) == []
    assert len(lookup_producers(lookupd, f"{topic}_other")) == 1
    node = next(n for n in get(http, "/nodes").json()["producers"] if n["remote_address"] == peer.local_address)
    assert list(node) == [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "tombstones",
        "topics",
    ]
    assert len(node["tombstones"]) == len(node["topics"])
    assert dict(zip(node["topics"], node["tombstones"], strict=True)) == {topic: True, f"{topic}_other": False}
    # re-registering does not clear the tombstone
    assert peer.command(encode_register(topic)) == b"OK"
    assert lookup_producers(lookupd, topic) == []
    debug = get(http, "/debug").json()
    entry = next(e for e in debug[f"topic:{topic}:"] if e["id"] == peer.local_address)
    assert list(entry) == [
        "broadcast_address",
        "hostname",
        "http_port",
        "id",
        "last_update",
        "tcp_port",
        "tombstoned",
        "tombstoned_at",
        "version",
    ]
    assert entry["tombstoned"] is True and entry["tombstoned_at"] > 0
    other = next(e for e in debug[f"topic:{topic}_other:"] if e["id"] == peer.local_address)
    assert other["tombstoned"] is False and other["tombstoned_at"] == -6795364578871345152
    assert f"channel:{topic}:c" in debug and "client::" in debug
    # UNREGISTER removes the producer and its tombstone
    assert peer.command(encode_unregister(topic)) == b"OK"
    assert peer.command(encode_register(topic)) == b"OK"
    assert len(lookup_producers(lookupd, topic)) == 1
    peer.close()


def test_metrics_read_the_database_at_scrape_time(lookupd, topic):
    peer = registered_peer(lookupd, topic, "c")
    reply = get(lookupd.http_address, "/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = reply.body.decode()
    assert f'nsqlookupd_topic_producers{{topic="{topic}"}} 1.0' in text
    assert f'nsqlookupd_channel_producers{{channel="c",topic="{topic}"}} 1.0' in text
    assert 'nsqlookupd_info{version="1.3.0"} 1.0' in text
    peer.close()
    wait_for(
        lambda: (
            f'nsqlookupd_topic_producers{{topic="{topic}"}} 0.0' in get(lookupd.http_address, "/metrics").body.decode()
        ),
        message="metrics follow the database",
    )


def test_version_and_bad_flags():
    version = subprocess.run(
        [sys.executable, "-m", "lookupd", "--version"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0 and version.stdout.startswith("nsqlookupd v1.3.0 (built w/python")
    bad = subprocess.run(
        [sys.executable, "-m", "lookupd", "--no-such-flag"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "flag provided but not defined: -no-such-flag" in bad.stderr


def test_listen_failure_is_fatal(lookupd):
    taken = f"127.0.0.1:{lookupd.tcp[1]}"
    done = subprocess.run(
        [sys.executable, "-m", "lookupd", f"--tcp-address={taken}", "--http-address=127.0.0.1:0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 1
    assert f"FATAL: failed to instantiate nsqlookupd - listen ({taken}) failed" in done.stderr
