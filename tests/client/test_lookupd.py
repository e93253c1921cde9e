"""trionsq's lookupd discovery: the parsers on both answer shapes (NSQ 1.x and 0.x's envelope), URLs, and the trio
queries against a real nsqlookupd with a real nsqd registered to it."""

from __future__ import annotations

import json

import pytest
import trio

from tests.integration.harness import RawClient, free_port
from tests.integration.lookupd_harness import wait_for_producers
from trionsq._lookupd import (
    LookupdError,
    Peer,
    lookup,
    lookup_producers,
    lookup_url,
    nodes,
    parse_lookup,
    parse_nodes,
    parse_topics,
    topics,
)

pytestmark = pytest.mark.timeout(60)

URL = "http://lookupd/lookup?topic=t"
PEER = {
    "remote_address": "127.0.0.1:50000",
    "hostname": "h",
    "broadcast_address": "10.0.0.1",
    "tcp_port": 4150,
    "http_port": 4151,
    "version": "1.3.0",
}


def body(doc) -> bytes:
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("status", "raw", "expected"),
    [
        (200, body({"channels": ["c"], "producers": [PEER]}), ["10.0.0.1:4150"]),
        (200, body({"channels": [], "producers": []}), []),
        (200, body({"channels": [], "producers": None}), []),
        # NSQ 0.x's envelope, with the old "address" key of peers before 0.2.28
        (200, body({"status_code": 200, "status_txt": "OK", "data": {"producers": [PEER]}}), ["10.0.0.1:4150"]),
        (
            200,
            body(
                {
                    "status_code": 200,
                    "status_txt": "OK",
                    "data": {"producers": [{"address": "old-host", "tcp_port": 4150, "http_port": 4151}]},
                }
            ),
            ["old-host:4150"],
        ),
        (200, body({"channels": [], "producers": [dict(PEER, broadcast_address="::1")]}), ["[::1]:4150"]),
        # an unknown topic is no producer, in both shapes
        (404, body({"message": "TOPIC_NOT_FOUND"}), []),
        (500, body({"status_code": 500, "status_txt": "TOPIC_NOT_FOUND", "data": None}), []),
    ],
)
def test_parse_lookup(status, raw, expected):
    assert [peer.tcp_address for peer in parse_lookup(URL, status, raw)] == expected


@pytest.mark.parametrize(
    ("status", "raw", "error"),
    [
        (400, body({"message": "MISSING_ARG_TOPIC"}), "HTTP 400 MISSING_ARG_TOPIC"),
        (500, body({"status_code": 500, "status_txt": "INTERNAL_ERROR", "data": None}), "HTTP 500 INTERNAL_ERROR"),
        (502, b"<html>bad gateway</html>", "HTTP 502 <html>bad gateway</html>"),
        (200, b"not json", "not a JSON object"),
        (200, body(["a"]), "not a JSON object"),
        (200, body({"producers": {"a": 1}}), "producers is not a list"),
        (200, body({"producers": [{"hostname": "h"}]}), "lacks broadcast_address or tcp_port"),
        (200, body({"producers": [dict(PEER, tcp_port="4150")]}), "lacks broadcast_address or tcp_port"),
    ],
)
def test_parse_lookup_errors(status, raw, error):
    with pytest.raises(LookupdError, match="GET http://lookupd/lookup\\?topic=t: ") as caught:
        parse_lookup(URL, status, raw)
    assert error in str(caught.value)


def test_parse_nodes_and_topics():
    node = dict(PEER, topics=["a", "b"], tombstones=[False, True])
    (peer,) = parse_nodes("u", 200, body({"producers": [node]}))
    assert peer == Peer("10.0.0.1", 4150, 4151, "h", "127.0.0.1:50000", "1.3.0", ("a", "b"), (False, True))
    assert peer.http_address == "10.0.0.1:4151"
    assert parse_topics("u", 200, body({"topics": ["x", "y"]})) == ["x", "y"]
    assert parse_topics("u", 200, body({"status_code": 200, "status_txt": "OK", "data": {"topics": ["z"]}})) == ["z"]
    with pytest.raises(LookupdError, match="topics is not a list"):
        parse_topics("u", 200, body({"topics": [1]}))


@pytest.mark.parametrize(
    ("address", "path", "expected"),
    [
        ("127.0.0.1:4161", "/lookup", "http://127.0.0.1:4161/lookup?topic=a%20b%2Fc"),
        ("http://h:4161", "/lookup", "http://h:4161/lookup?topic=a%20b%2Fc"),
        ("https://h/", "/lookup", "https://h/lookup?topic=a%20b%2Fc"),
        # a proxy path stands for /lookup and prefixes the other endpoints; a query of its own stays
        ("http://proxy/nsq/lookup?x=1", "/lookup", "http://proxy/nsq/lookup?x=1&topic=a%20b%2Fc"),
        ("http://proxy/nsq/lookup", "/nodes", "http://proxy/nsq/nodes"),
        ("[::1]:4161", "/nodes", "http://[::1]:4161/nodes"),
    ],
)
def test_lookup_url(address, path, expected):
    query = {"topic": "a b/c"} if path == "/lookup" else {}
    assert lookup_url(address, path, **query) == expected


@pytest.mark.parametrize("address", ["", "ftp://h:1", "h:port", "http://"])
def test_lookup_url_rejects_bad_addresses(address):
    with pytest.raises(LookupdError, match="nsqlookupd HTTP address"):
        lookup_url(address, "/lookup", topic="t")


async def test_queries_against_a_real_lookupd(cluster, topic):
    (lookupd,), (nsqd,) = cluster.lookupds, cluster.nsqds
    address = "{}:{}".format(*lookupd.http_address)
    assert await lookup(address, topic) == []  # the topic does not exist yet: no error
    with RawClient(nsqd.tcp) as client:
        client.publish(topic, b"x")
    wait_for_producers(lookupd, topic, {nsqd.tcp[1]})

    assert await lookup(address, topic) == [f"127.0.0.1:{nsqd.tcp[1]}"]
    assert await lookup(f"http://{address}/lookup", topic) == [f"127.0.0.1:{nsqd.tcp[1]}"]
    (peer,) = await lookup_producers(address, topic)
    assert (peer.broadcast_address, peer.tcp_port, peer.version) == ("127.0.0.1", nsqd.tcp[1], "1.3.0")
    assert peer.http_port == nsqd.listening["HTTP"][1]

    (node,) = await nodes(address)
    assert node.tcp_address == peer.tcp_address and topic in node.topics
    assert len(node.tombstones) == len(node.topics)
    assert topic in await topics(address)


async def test_unreachable_lookupd_is_a_lookupd_error():
    port = free_port()
    with pytest.raises(LookupdError, match=f"GET http://127.0.0.1:{port}/lookup\\?topic=t: .*refused"):
        await lookup(f"127.0.0.1:{port}", "t", timeout=2)


async def test_timeout_is_a_lookupd_error():
    # a listener that never answers: the query gives up after its timeout
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    with trio.fail_after(5):
        with pytest.raises(LookupdError, match="timeout"):
            await lookup(f"127.0.0.1:{port}", "t", timeout=0.3)
    for listener in listeners:
        await listener.aclose()
