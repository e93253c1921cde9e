"""The incremental /stats and /metrics (nsqd/stats_cache.py) on an in-process NSQD: after every kind of change
(publish, delivery, FIN, REQ, timeout, deferral, pause, e2e samples, RDY, publish counts, topics and channels
created and deleted, clients connecting and leaving) the next rendering of each format and filter is byte for
byte what the snapshot's renderings write, and shows the new value."""

from __future__ import annotations

import gc
import json
import re
import time

import pytest
import trio

from nsqd.client import Client, ClientState
from nsqd.http_api import build_router
from nsqd.metrics import MetricsEndpoint, series_text
from nsqd.options import Options
from nsqd.server import NSQD
from nsqd.stats import collect, format_text, json_body
from nsqd.stats_cache import StatsCache
from protocol.http import Request


@pytest.fixture(params=["percentiles", "plain"])
def any_nsqd(request, tmp_path):
    """A daemon with two latency percentiles (every key is read at each request: windows move with the clock),
    and one without (only the topics and channels that marked themselves changed are read)."""
    if request.param == "percentiles":
        yield request.getfixturevalue("nsqd")
        return
    daemon = NSQD(Options(data_path=str(tmp_path), node_id=1))
    yield daemon
    for topic in list(daemon.topics.values()):
        topic.close(persist=False)


#: the variants of a whole-node request (``topic=`` goes through the snapshot)
VARIANTS = (
    {},
    {"include_clients": False},
    {"channel": "c"},
    {"channel": "c", "include_clients": False},
    {"channel": "missing"},
)


def _ageless(text: bytes) -> str:
    """The text without what moves with the clock (uptime, connection ages)."""
    text = re.sub(r"uptime \S+", "uptime -", text.decode())
    return re.sub(r"connected: \S+", "connected: -", text)


def assert_current(nsqd, cache: StatsCache) -> dict:
    """Every rendering of the cache equals the snapshot's; returns the JSON document."""
    for options in VARIANTS:
        options = {**options, "include_mem": False}
        assert cache.json(**options) == json_body(collect(nsqd, **options)), options
        assert _ageless(cache.text(**options)) == _ageless(format_text(collect(nsqd, **options)).encode()), options
    snapshot = collect(nsqd, include_clients=False, include_mem=False)
    for openmetrics in (False, True):
        assert (
            b"".join(cache.metrics_pieces(openmetrics=openmetrics))
            == series_text(snapshot, openmetrics=openmetrics).encode()
        )
    return json.loads(cache.json(include_mem=False))


def _connect(nsqd, channel=None, *, port: int) -> Client:
    client = Client(
        next(nsqd._client_ids),
        f"127.0.0.1:{port}",
        msg_timeout=60.0,
        heartbeat_interval=30.0,
        output_buffer_size=16384,
        output_buffer_timeout=0.25,
    )
    nsqd.clients[client.id] = client
    if channel is not None:
        client.state = ClientState.SUBSCRIBED
        client.channel = channel
        channel.add_client(client)
    return client


def _channel(document: dict, topic: str, channel: str) -> dict:
    found = [t for t in document["topics"] if t["topic_name"] == topic][0]
    return [c for c in found["channels"] if c["channel_name"] == channel][0]


def _topic(document: dict, topic: str) -> dict:
    return [t for t in document["topics"] if t["topic_name"] == topic][0]


def _deliver(channel, client) -> bytes:
    """What the dispatcher does for one message: from the queue into flight, owned by the client."""
    channel.changed.add(channel)  # (as the dispatcher's slice does)
    (message,) = channel.queue.take(1)
    message.client = client
    message.delivered_at = trio.current_time()
    channel.open_in_flight().push(message, trio.current_time() + 60.0)
    client.in_flight += 1
    client.message_count += 1
    return message.id


async def test_every_change_shows_in_the_next_rendering(any_nsqd):
    nsqd = any_nsqd
    cache = StatsCache(nsqd)
    alpha = nsqd.get_topic("alpha")
    channel = alpha.get_channel("c")
    other = alpha.get_channel("d")
    nsqd.get_topic("beta").get_channel("c")
    for topic in range(20):  # idle ones around
        nsqd.get_topic(f"idle{topic:02d}").get_channel("c")
    consumer = _connect(nsqd, channel, port=1001)
    document = assert_current(nsqd, cache)
    assert _channel(document, "alpha", "c")["client_count"] == 1

    alpha.publish([b"one", b"two", b"three"])
    document = assert_current(nsqd, cache)
    assert (_topic(document, "alpha")["message_count"], _channel(document, "alpha", "c")["depth"]) == (3, 3)

    consumer.rdy = 5
    assert _channel(assert_current(nsqd, cache), "alpha", "c")["clients"][0]["ready_count"] == 5

    first = _deliver(channel, consumer)
    document = assert_current(nsqd, cache)
    assert _channel(document, "alpha", "c")["in_flight_count"] == 1
    assert _channel(document, "alpha", "c")["clients"][0]["in_flight_count"] == 1

    channel.finish(consumer, first)  # FIN: a latency sample, the client's counters
    document = assert_current(nsqd, cache)
    assert _channel(document, "alpha", "c")["clients"][0]["finish_count"] == 1
    if nsqd.opts.e2e_processing_latency_percentiles:
        assert _channel(document, "alpha", "c")["e2e_processing_latency"]["count"] == 1
        assert _topic(document, "alpha")["e2e_processing_latency"]["count"] == 1

    channel.requeue(consumer, _deliver(channel, consumer), 0)
    assert _channel(assert_current(nsqd, cache), "alpha", "c")["requeue_count"] == 1
    channel.requeue(consumer, _deliver(channel, consumer), 30.0)  # deferred
    assert _channel(assert_current(nsqd, cache), "alpha", "c")["deferred_count"] == 1

    _deliver(channel, consumer)
    channel.process_queues(trio.current_time() + 3600.0)  # times out, and the deferred one is due
    document = assert_current(nsqd, cache)
    assert _channel(document, "alpha", "c")["timeout_count"] == 1
    assert _channel(document, "alpha", "c")["deferred_count"] == 0

    channel.pause()
    assert _channel(assert_current(nsqd, cache), "alpha", "c")["paused"] is True
    channel.unpause()
    alpha.pause()
    assert _topic(assert_current(nsqd, cache), "alpha")["paused"] is True
    alpha.publish([b"held"])  # stays in the paused topic
    assert _topic(assert_current(nsqd, cache), "alpha")["depth"] == 1
    alpha.unpause()
    assert _topic(assert_current(nsqd, cache), "alpha")["paused"] is False

    other.empty()
    assert _channel(assert_current(nsqd, cache), "alpha", "d")["depth"] == 0


async def test_topics_channels_and_clients_come_and_go(any_nsqd):
    nsqd = any_nsqd
    cache = StatsCache(nsqd)
    nsqd.get_topic("b").get_channel("c")
    assert [t["topic_name"] for t in assert_current(nsqd, cache)["topics"]] == ["b"]
    nsqd.get_topic("a").get_channel("c")
    nsqd.get_topic("c")
    assert [t["topic_name"] for t in assert_current(nsqd, cache)["topics"]] == ["a", "b", "c"]
    nsqd.get_topic("b").get_channel("a")
    document = assert_current(nsqd, cache)
    assert [c["channel_name"] for c in _topic(document, "b")["channels"]] == ["a", "c"]
    nsqd.get_topic("b").delete_channel("c")
    assert [c["channel_name"] for c in _topic(assert_current(nsqd, cache), "b")["channels"]] == ["a"]
    nsqd.delete_topic("a")
    assert [t["topic_name"] for t in assert_current(nsqd, cache)["topics"]] == ["b", "c"]
    nsqd.get_topic("a").get_channel("c")  # the same names again: new objects
    assert [t["topic_name"] for t in assert_current(nsqd, cache)["topics"]] == ["a", "b", "c"]

    # an ephemeral channel leaves with its last client, and a new one of the same name takes its place
    ephemeral = nsqd.get_topic("a").get_channel("e#ephemeral")
    first = _connect(nsqd, ephemeral, port=2001)
    assert _channel(assert_current(nsqd, cache), "a", "e#ephemeral")["client_count"] == 1
    ephemeral.remove_client(first)
    del nsqd.clients[first.id]
    assert [c["channel_name"] for c in _topic(assert_current(nsqd, cache), "a")["channels"]] == ["c"]
    ephemeral = nsqd.get_topic("a").get_channel("e#ephemeral")
    _connect(nsqd, ephemeral, port=2002)
    clients = _channel(assert_current(nsqd, cache), "a", "e#ephemeral")["clients"]
    assert [c["remote_address"] for c in clients] == ["127.0.0.1:2002"]

    # one client leaves and another joins the same channel between two requests: the count stays 1
    channel = nsqd.get_topic("b").get_channel("a")
    leaving = _connect(nsqd, channel, port=3001)
    assert_current(nsqd, cache)
    channel.remove_client(leaving)
    del nsqd.clients[leaving.id]
    _connect(nsqd, channel, port=3002)
    clients = _channel(assert_current(nsqd, cache), "b", "a")["clients"]
    assert [c["remote_address"] for c in clients] == ["127.0.0.1:3002"]


async def test_producers_identify_and_publish_counts(any_nsqd):
    nsqd = any_nsqd
    cache = StatsCache(nsqd)
    nsqd.get_topic("t").get_channel("c")
    producer = _connect(nsqd, port=4001)
    assert assert_current(nsqd, cache)["producers"] is None
    producer.published("t", 2)
    document = assert_current(nsqd, cache)
    assert document["producers"][0]["pub_counts"] == [{"topic": "t", "count": 2}]
    producer.published("t", 3)
    assert assert_current(nsqd, cache)["producers"][0]["pub_counts"] == [{"topic": "t", "count": 5}]
    # IDENTIFY after publishing (the client is still in its first state)
    producer.client_id, producer.hostname, producer.user_agent = "worker", "box", "pynsq/0.9"
    producer.identified = True
    assert assert_current(nsqd, cache)["producers"][0]["user_agent"] == "pynsq/0.9"
    # a subscriber that publishes too shows in its channel and among the producers
    consumer = _connect(nsqd, nsqd.get_topic("t").get_channel("c"), port=4002)
    consumer.published("t", 1)
    document = assert_current(nsqd, cache)
    assert len(document["producers"]) == 2
    assert _channel(document, "t", "c")["clients"][0]["pub_counts"] == [{"topic": "t", "count": 1}]


async def test_latency_windows_rotate_without_new_samples(nsqd):
    cache = StatsCache(nsqd)
    channel = nsqd.get_topic("t").get_channel("c")
    now = channel.e2e._rotate_at - 1
    channel.e2e.add(now - 5_000, now_ns=now)
    assert _channel(assert_current(nsqd, cache), "t", "c")["e2e_processing_latency"]["count"] == 1
    # the window's buckets move on with time alone: a whole window later its sample is gone
    channel.e2e._rotate_at = 0
    document = assert_current(nsqd, cache)
    assert _channel(document, "t", "c")["e2e_processing_latency"]["count"] == 0
    assert _topic(document, "t")["e2e_processing_latency"]["count"] == 0


async def test_the_http_handlers_use_the_cache(nsqd):
    router = build_router(nsqd)
    channel = nsqd.get_topic("t").get_channel("c")

    async def get(path: str, query: bytes) -> bytes:
        response = await router.handle(Request("GET", path, query, body=b"", remote_address="127.0.0.1:1"))
        assert response.status == 200
        return response.body

    assert json.loads(await get("/stats", b"format=json"))["topics"][0]["message_count"] == 0
    nsqd.get_topic("t").publish([b"m"])
    assert json.loads(await get("/stats", b"format=json"))["topics"][0]["message_count"] == 1
    assert b"msgs: 1 " in await get("/stats", b"")
    channel.pause()
    assert b'nsqd_channel_paused{channel="c",topic="t"} 1.0\n' in await get("/metrics", b"")
    assert json.loads(await get("/stats", b"format=json&topic=t"))["topics"][0]["channels"][0]["paused"] is True
    body, _ = MetricsEndpoint(nsqd).render(None)
    assert b"nsqd_topics 1.0\n" in body


async def test_metrics_runs_of_topics_are_joined_again_only_when_one_changed(nsqd, monkeypatch):
    monkeypatch.setattr("nsqd.stats_cache.METRICS_BLOCK", 3)
    cache = StatsCache(nsqd)
    for index in range(10):
        nsqd.get_topic(f"t{index}").get_channel("c")
    assert_current(nsqd, cache)
    kept = dict(cache._metrics_blocks)
    nsqd.get_topic("t4").publish([b"m"])  # in the second run of three
    assert_current(nsqd, cache)
    assert [cache._metrics_blocks[start] is kept[start] for start in (0, 3, 6, 9)] == [True, False, True, True]
    nsqd.delete_topic("t9")
    nsqd.delete_topic("t8")
    assert_current(nsqd, cache)
    assert sorted(cache._metrics_blocks) == [0, 3, 6]
    nsqd.get_topic("t1").delete_channel("c")  # a topic without channels among others
    assert_current(nsqd, cache)


def _tracked_by_cache(cache: StatsCache, nsqd) -> int:
    """The objects the cache holds that the cyclic collector looks at, after a collection (which stops tracking
    tuples of plain values); the daemon's own objects (topics, channels, clients...) are not counted."""
    gc.collect()
    own = {id(nsqd), id(nsqd.opts)} | {id(t) for t in nsqd.topics.values()} | {id(c) for c in nsqd.clients.values()}
    own |= {id(c) for t in nsqd.topics.values() for c in t.channels.values()}
    seen, pending, tracked = set(), [cache._columns, cache._producers, cache._metrics_blocks], 0
    while pending:
        obj = pending.pop()
        if id(obj) in seen or id(obj) in own or isinstance(obj, type):  # (an object's referents include its class)
            continue
        seen.add(id(obj))
        if gc.is_tracked(obj):
            tracked += 1
            pending += gc.get_referents(obj)
    return tracked


async def test_the_kept_pieces_of_idle_topics_are_few_objects_for_the_collector(nsqd):
    """However many topics and channels, the cache keeps a fixed number of objects that the cyclic collector walks
    (lists, not objects per topic or channel): a full collection's time, and how often one comes after the
    requests, do not grow with them."""
    cache = StatsCache(nsqd)
    counts = []
    for topics in (10, 200):
        for index in range(topics):
            topic = nsqd.get_topic(f"t{index:03d}")
            topic.get_channel("a")
            topic.get_channel("b").e2e.add(time.time_ns() - 5_000)
            topic.publish([b"m"])
        assert_current(nsqd, cache)
        counts.append(_tracked_by_cache(cache, nsqd))
    # 190 topics and 380 channels more: a few objects more (the second run of /metrics rows), not some per topic
    assert counts[1] - counts[0] < 10 and counts[1] < 50, counts


async def test_deleted_topics_and_channels_leave_the_changed_set(any_nsqd):
    nsqd = any_nsqd
    topic = nsqd.get_topic("t")
    kept, deleted = topic.get_channel("kept"), topic.get_channel("deleted")
    topic.publish([b"one"])
    assert nsqd.stats_changed == {topic, kept, deleted}
    topic.delete_channel("deleted")
    assert nsqd.stats_changed == {topic, kept}
    nsqd.delete_topic("t")  # nothing of theirs stays held until the next request
    assert nsqd.stats_changed == set()


async def test_clients_of_a_topic_kept_across_a_new_layout_still_show(any_nsqd):
    nsqd = any_nsqd
    cache = StatsCache(nsqd)
    consumer = _connect(nsqd, nsqd.get_topic("b").get_channel("c"), port=5001)
    assert_current(nsqd, cache)
    nsqd.get_topic("a").get_channel("c")  # laid out again: "b" keeps its entries
    assert _channel(assert_current(nsqd, cache), "b", "c")["clients"][0]["ready_count"] == 0
    consumer.rdy = 3
    assert _channel(assert_current(nsqd, cache), "b", "c")["clients"][0]["ready_count"] == 3


async def test_two_caches_of_one_node_both_stay_current(any_nsqd):
    """The HTTP and HTTPS servers share the node's cache; two caches would each empty the changed set the other
    reads, so with two every key is read."""
    nsqd = any_nsqd
    assert nsqd.stats_cache() is nsqd.stats_cache()
    build_router(nsqd)
    build_router(nsqd)
    assert nsqd.stats_readers == 1
    first, second = nsqd.stats_cache(), StatsCache(nsqd)
    topic = nsqd.get_topic("t")
    topic.get_channel("c")
    assert_current(nsqd, first)
    assert_current(nsqd, second)
    topic.publish([b"one"])
    assert _topic(assert_current(nsqd, first), "t")["message_count"] == 1
    assert _topic(assert_current(nsqd, second), "t")["message_count"] == 1
