"""Unit tests of the stats snapshot and its renderings: the e2e latency window, stats.collect's filters on an
in-process NSQD, statsd line formatting and datagram packing."""

from __future__ import annotations

import pytest

from nsqd.e2e import E2ELatency, E2EResult, merge_results, quantile_values
from nsqd.options import Options
from nsqd.server import NSQD
from nsqd.stats import (
    ChannelStats,
    ClientStats,
    NodeStats,
    TopicStats,
    collect,
    format_text,
    json_body,
    memory_stats,
    to_json,
)
from nsqd.statsd import host_key, pack_datagrams, statsd_lines, statsd_prefix
from protocol.http import go_json

SECOND = 1_000_000_000


# -- e2e window ----------------------------------------------------------------------------------------------------
def test_quantiles_are_nearest_rank():
    samples = list(range(1, 101))
    assert quantile_values(samples, (1.0, 0.99, 0.5, 0.01)) == ((1.0, 100.0), (0.99, 99.0), (0.5, 50.0), (0.01, 1.0))
    assert quantile_values([], (0.5,)) == ((0.5, 0.0),)
    assert quantile_values([7], (0.001, 1.0)) == ((0.001, 7.0), (1.0, 7.0))


def test_window_counts_and_measures_latency():
    window = E2ELatency((0.5, 1.0), 10.0, now_ns=0)
    for latency in (1, 2, 3, 4):
        window.add(publish_ts_ns=SECOND - latency * 1000, now_ns=SECOND)
    result = window.result(now_ns=SECOND)
    assert result.count == 4
    assert result.percentiles == ((0.5, 2000.0), (1.0, 4000.0))


def test_window_rotates_by_half_windows():
    window = E2ELatency((1.0,), 10.0, now_ns=0)  # buckets of 5 s
    window.add(0, now_ns=1 * SECOND)  # latency 1 s, bucket [0, 5)
    window.add(0, now_ns=6 * SECOND)  # latency 6 s, bucket [5, 10)
    assert window.result(now_ns=9 * SECOND).count == 2
    # at 10 s the first bucket is dropped
    result = window.result(now_ns=10 * SECOND)
    assert (result.count, result.percentiles) == (1, ((1.0, 6.0 * SECOND),))
    # a whole window of silence empties both
    assert window.result(now_ns=21 * SECOND).count == 0
    window.add(20 * SECOND, now_ns=22 * SECOND)
    assert window.result(now_ns=22 * SECOND).percentiles == ((1.0, 2.0 * SECOND),)


def test_window_caps_samples_but_counts_all():
    window = E2ELatency((1.0, 0.5), 60.0, max_samples=10, now_ns=0)
    for i in range(25):
        window.add(0, now_ns=SECOND + i)
    result = window.result(now_ns=SECOND + 30)
    assert result.count == 25
    assert len(result.samples) == 10
    assert result.samples == tuple(SECOND + i for i in range(15, 25))  # the most recent ones


def test_merge_results():
    a = E2EResult(2, ((1.0, 5.0),), (1, 5))
    b = E2EResult(1, ((1.0, 9.0),), (9,))
    merged = merge_results([a, b], (1.0, 0.5))
    assert (merged.count, merged.percentiles) == (3, ((1.0, 9.0), (0.5, 5.0)))
    assert merge_results([], (0.5,)) == E2EResult()
    assert merge_results([E2EResult()], (0.5,)).percentiles is None


# -- collect on an in-process daemon -------------------------------------------------------------------------------
@pytest.fixture
def nsqd(tmp_path):
    daemon = NSQD(Options(data_path=str(tmp_path), node_id=1, e2e_processing_latency_percentiles=[0.99]))
    yield daemon
    for topic in list(daemon.topics.values()):
        topic.close(persist=False)


def test_collect_filters(nsqd):
    nsqd.get_topic("b").get_channel("y")
    topic = nsqd.get_topic("a")
    topic.get_channel("z")
    topic.get_channel("x")
    snapshot = collect(nsqd)
    assert [t.topic_name for t in snapshot.topics] == ["a", "b"]
    assert [c.channel_name for c in snapshot.topics[0].channels] == ["x", "z"]
    assert snapshot.producers is None and snapshot.memory is not None and snapshot.health == "OK"
    assert collect(nsqd, topic="missing").topics is None
    assert collect(nsqd, topic="a", channel="nope").topics == ()
    only = collect(nsqd, channel="y", include_mem=False)
    assert [t.topic_name for t in only.topics] == ["b"] and only.memory is None
    assert collect(nsqd, include_clients=False).topics[0].channels[0].clients is None
    # e2e configured: channels report the percentile with no samples, the topic merges them
    e2e = snapshot.topics[0].channels[0].e2e_processing_latency
    assert (e2e.count, e2e.percentiles) == (0, ((0.99, 0.0),))


def test_json_and_text_render_the_same_snapshot(nsqd):
    nsqd.get_topic("alpha").get_channel("c").pause()
    snapshot = collect(nsqd, include_mem=False)
    document = to_json(snapshot)
    assert list(document) == ["version", "health", "start_time", "topics", "producers"]
    channel = document["topics"][0]["channels"][0]
    assert channel["paused"] is True and channel["clients"] == []
    assert channel["e2e_processing_latency"] == {"count": 0, "percentiles": [{"quantile": 0.99, "value": 0.0}]}
    text = format_text(snapshot)
    assert "   [alpha          ] depth: 0" in text
    assert "   *P [c                        ] depth: 0" in text
    assert text.endswith("Producers: None\n")


def _client(**fields) -> ClientStats:
    base = dict(
        client_id="c1",
        hostname="h",
        version="V2",
        remote_address="127.0.0.1:5",
        state=3,
        ready_count=1,
        in_flight_count=0,
        message_count=7,
        finish_count=6,
        requeue_count=1,
        connect_ts=1700000000,
        sample_rate=0,
        deflate=False,
        snappy=True,
        user_agent="",
        authed=False,
        auth_identity="",
        auth_identity_url="",
        pub_counts=(),
        tls=False,
        tls_cipher_suite="",
        tls_version="",
        tls_negotiated_protocol="",
        tls_negotiated_protocol_is_mutual=False,
    )
    return ClientStats(**{**base, **fields})


def test_the_json_body_is_go_json_of_the_document(nsqd):
    nsqd.get_topic("alpha").get_channel("c").pause()
    nsqd.get_topic("beta").pause()
    nsqd.get_topic("beta#ephemeral").get_channel("x#ephemeral")
    for options in (
        {},
        {"include_clients": False},
        {"topic": "alpha"},
        {"topic": "none"},
        {"channel": "c"},
        {"include_mem": False},
    ):
        snapshot = collect(nsqd, **options)
        assert json_body(snapshot) == go_json(to_json(snapshot))
    odd = _client(
        client_id="a<b>&c\u2028",
        hostname='q"uote\\ \x01 é',
        user_agent="pynsq/0.9 <x>",
        authed=True,
        auth_identity="id&",
        auth_identity_url="http://a/?b=<c>",
        pub_counts=(("alpha", 3), ("beta", 0)),
        tls=True,
        tls_cipher_suite="TLS_AES",
        tls_version="TLS1.3",
        tls_negotiated_protocol="h2",
        tls_negotiated_protocol_is_mutual=True,
    )
    channel = ChannelStats(
        "c", 1, 0, 2, 3, 4, 5, 6, 2, (odd, _client()), True, E2EResult(3, ((0.99, 1.5e-7), (0.5, 1234.0)), (1, 2, 3))
    )
    topic = TopicStats("alpha", (channel,), 1, 0, 9, 900, False, E2EResult(3, ((0.99, 2.5),), ()))
    stats = NodeStats("1.3.0", "NOK - disk <full>", 1700000000, 5, (topic,), memory_stats(), (odd,))
    assert json_body(stats) == go_json(to_json(stats))


# -- statsd --------------------------------------------------------------------------------------------------------
def test_statsd_prefix():
    assert host_key("a.b:4151") == "a_b_4151"
    assert statsd_prefix("nsq.%s", "host.example", 4151) == "nsq.host_example_4151."
    assert statsd_prefix("nsq.%s.", "h", 1) == "nsq.h_1."
    assert statsd_prefix("plain", "h", 1) == "plain."
    assert statsd_prefix("nsq.%s", "::1", 4151) == "nsq.[__1]_4151."
    assert statsd_prefix("", "h", 1) == ""


def test_statsd_lines_counters_are_deltas(nsqd):
    topic = nsqd.get_topic("t")
    topic.get_channel("c")
    nsqd.get_topic("e#ephemeral")
    first = collect(nsqd, include_clients=False, include_mem=False)
    lines = statsd_lines(first, None, "p.", exclude_ephemeral=True)
    assert b"p.topic.t.message_count:0|c\n" in lines
    assert b"p.topic.t.channel.c.clients:0|g\n" in lines
    assert b"p.topic.t.e2e_processing_latency_99:0|g\n" in lines
    assert not [line for line in lines if b"ephemeral" in line]
    topic.message_count += 5
    topic.message_bytes += 50
    topic.channels["c"].message_count += 5
    second = collect(nsqd, include_clients=False, include_mem=False)
    lines = statsd_lines(second, first, "p.")
    assert b"p.topic.t.message_count:5|c\n" in lines
    assert b"p.topic.t.message_bytes:50|c\n" in lines
    assert b"p.topic.t.channel.c.message_count:5|c\n" in lines
    assert b"p.topic.e#ephemeral.depth:0|g\n" in lines
    assert statsd_lines(second, second, "p.").count(b"p.topic.t.message_count:0|c\n") == 1


def test_pack_datagrams_never_splits_a_line():
    lines = [b"a" * 30 + b"\n", b"b" * 30 + b"\n", b"c" * 70 + b"\n", b"d\n"]
    datagrams = pack_datagrams(lines, 64)
    assert datagrams == [lines[0] + lines[1], lines[2], lines[3]]
    assert b"".join(datagrams) == b"".join(lines)
    assert pack_datagrams([], 10) == []
