"""The admin's pure parts: options, stats aggregation, the sampled history and the action guard."""

from __future__ import annotations

from pathlib import Path

import pytest

from admin.history import OLD_POINTS, SPARK_POINTS, History, reduce_sample
from admin.options import (
    Options,
    OptionsError,
    config_value,
    normalize_base_path,
    parse_options,
    upstream_url,
    validate,
)
from admin.security import CSRF_HEADER, Guard
from admin.stats import aggregate_topic, node_topics
from protocol.http import Headers, HTTPError, Request
from runtime.flags import FlagError


def test_admin_package_is_this_checkout():
    import admin

    assert Path(admin.__file__).resolve().parent == Path(__file__).resolve().parents[2] / "admin"


# -- options ------------------------------------------------------------------------------------------------------
def test_defaults_are_nsqadmins():
    opts = parse_options(["--lookupd-http-address=127.0.0.1:4161"], exit_on_error=False)
    assert opts.http_address == "0.0.0.0:4171"
    assert opts.base_path == "/"
    assert opts.acl_http_header == "X-Forwarded-User"
    assert opts.admin_users == []
    assert opts.allow_config_from_cidr == "127.0.0.1/8"
    assert opts.http_client_connect_timeout == 2.0 and opts.http_client_request_timeout == 5.0
    assert opts.statsd_interval == 60.0 and opts.statsd_prefix == "nsq.%s"
    assert opts.log_prefix == "[nsqadmin] "
    validate(opts)


def test_repeated_flags_and_config_keys(tmp_path):
    config = tmp_path / "admin.toml"
    config.write_text(
        'nsqlookupd_http_addresses = ["10.0.0.1:4161", "10.0.0.2:4161"]\n'
        'admin_users = ["alice"]\nbase_path = "admin/"\n'
    )
    opts = parse_options([f"--config={config}", "--admin-user=bob", "--admin-user", "carol"], exit_on_error=False)
    assert opts.lookupd_http_addresses == ["10.0.0.1:4161", "10.0.0.2:4161"]
    assert opts.admin_users == ["bob", "carol"]  # the command line wins over the file
    assert opts.base_path == "/admin"
    assert config_value(opts, "nsqlookupd_http_addresses") == ["10.0.0.1:4161", "10.0.0.2:4161"]
    assert config_value(opts, "http_client_connect_timeout") == 2_000_000_000
    with pytest.raises(KeyError):
        config_value(opts, "no_such_option")


@pytest.mark.parametrize(
    "raw, cleaned", [("/", "/"), ("", "/"), ("admin", "/admin"), ("/admin/", "/admin"), ("//a/./b/../c", "/a/c")]
)
def test_base_path_is_normalised(raw, cleaned):
    assert normalize_base_path(raw) == cleaned


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "--nsqd-http-address or --lookupd-http-address required"),
        (["--lookupd-http-address=a:1", "--nsqd-http-address=b:2"], "not both"),
        (["--nsqd-http-address=nohost"], "failed to resolve --nsqd-http-address"),
        (["--nsqd-http-address=a:1", "--http-client-tls-cert=x.pem"], "must be specified together"),
        (["--nsqd-http-address=a:1", "--allow-config-from-cidr=nonsense"], "--allow-config-from-cidr"),
        (["--nsqd-http-address=a:1", "--notification-http-endpoint=ftp:x"], "--notification-http-endpoint"),
    ],
)
def test_validation_failures(argv, message):
    opts = parse_options(argv, exit_on_error=False)
    with pytest.raises(OptionsError, match=message.replace("-", r"\-")):
        validate(opts)


def test_unknown_flag_is_a_usage_error():
    with pytest.raises(FlagError) as info:
        parse_options(["--no-such-flag"], exit_on_error=False)
    assert info.value.exit_code == 2


def test_upstream_url():
    assert upstream_url("127.0.0.1:4161") == "http://127.0.0.1:4161"
    assert upstream_url("https://nsqd.example:4152/") == "https://nsqd.example:4152"


# -- stats --------------------------------------------------------------------------------------------------------
def _nsqd_stats(depth, backend, channel_depth, clients=(), p99=None):
    e2e = (
        {"count": 10, "percentiles": [{"quantile": 0.99, "value": p99}]}
        if p99 is not None
        else {"count": 0, "percentiles": None}
    )
    return {
        "topics": [
            {
                "topic_name": "orders",
                "depth": depth,
                "backend_depth": backend,
                "message_count": 100,
                "paused": False,
                "e2e_processing_latency": e2e,
                "channels": [
                    {
                        "channel_name": "billing",
                        "depth": channel_depth,
                        "backend_depth": 0,
                        "in_flight_count": 2,
                        "deferred_count": 1,
                        "message_count": 100,
                        "requeue_count": 3,
                        "timeout_count": 4,
                        "client_count": len(clients),
                        "clients": list(clients),
                        "paused": True,
                        "e2e_processing_latency": e2e,
                    }
                ],
            }
        ]
    }


def test_node_topics_and_aggregation():
    client = {
        "client_id": "c1",
        "hostname": "h1",
        "version": "V2",
        "remote_address": "1.2.3.4:5",
        "state": 3,
        "ready_count": 7,
        "in_flight_count": 2,
        "message_count": 9,
        "finish_count": 6,
        "requeue_count": 1,
        "connect_ts": 1000,
        "sample_rate": 0,
        "deflate": False,
        "snappy": True,
        "user_agent": "ua",
        "tls": False,
        "tls_cipher_suite": "",
        "tls_version": "",
        "tls_negotiated_protocol": "",
        "tls_negotiated_protocol_is_mutual": False,
    }
    a = node_topics(_nsqd_stats(10, 4, 5, [client], p99=2000.0), "10.0.0.1:4151", "a", now=1060)
    b = node_topics(_nsqd_stats(1, 0, 2, p99=4000.0), "10.0.0.2:4151", "b", now=1060)
    assert a[0]["memory_depth"] == 6
    first_client = a[0]["channels"][0]["clients"][0]
    assert list(first_client)[:8] == [
        "node",
        "remote_address",
        "version",
        "client_id",
        "hostname",
        "user_agent",
        "connect_ts",
        "connected",
    ]
    assert first_client["connected"] == 60_000_000_000
    total = aggregate_topic("orders", a + b)
    assert list(total)[:10] == [
        "node",
        "hostname",
        "topic_name",
        "depth",
        "memory_depth",
        "backend_depth",
        "message_count",
        "nodes",
        "channels",
        "paused",
    ]
    assert (total["node"], total["depth"], total["backend_depth"], total["message_count"]) == ("*", 11, 4, 200)
    channel = total["channels"][0]
    assert (channel["depth"], channel["in_flight_count"], channel["timeout_count"]) == (7, 4, 8)
    assert channel["paused"] is True
    assert [c["client_id"] for c in channel["clients"]] == ["c1"]
    assert [n["node"] for n in total["nodes"]] == ["10.0.0.1:4151", "10.0.0.2:4151"]
    p99 = total["e2e_processing_latency"]["percentiles"][0]
    assert (p99["min"], p99["max"], p99["average"], p99["count"]) == (2000.0, 4000.0, 3000.0, 20)


# -- history ------------------------------------------------------------------------------------------------------
def _sample(count, depth):
    topic = {
        "topic_name": "t",
        "message_count": count,
        "depth": depth,
        "channels": [
            {"channel_name": "c", "message_count": count, "depth": 1, "in_flight_count": 2, "deferred_count": 0}
        ],
    }
    return reduce_sample([("n1", [topic])])


def test_history_rates_and_counter_reset():
    history = History(interval=1.0, duration=2.0)
    history.record(100.0, _sample(10, 5))
    history.record(101.0, _sample(30, 5))
    history.record(103.0, _sample(40, 6))
    history.record(104.0, _sample(5, 0))  # counter went down: the node restarted
    series = history.series(("topic", "t"))
    assert series["timestamps"] == [101.0, 103.0, 104.0]  # bounded to duration / interval + 1 samples
    assert series["rate"] == [None, 5.0, None]
    assert series["depth"] == [5, 6, 0]
    assert series["channel_depth"] == [1, 1, 1]
    node = history.series(("node", "n1"))
    assert node["depth"] == [6, 7, 1]  # topic plus channel depth
    assert history.child_rates("channel", "t") == {"c": None}
    assert history.series(("topic", "missing"))["depth"] == []
    history.record(105.0, {**_sample(6, 0), ("topic", "late"): (1, 0, 0, 0, 0)})
    assert history.series(("topic", "late"))["timestamps"] == [105.0]


def test_history_overview_sparklines():
    history = History(interval=1.0, duration=60.0)
    for second in range(5):
        history.record(float(second), _sample(second * 10, 0))
    overview = history.overview()
    assert overview["topics"]["t"]["rate"] == 10.0
    assert overview["topics"]["t"]["rates"] == [10.0] * 4
    assert overview["nodes"]["n1"]["message_count"] == 40


def test_reduce_sample_reads_nsqd_stats_as_they_come():
    topics = [
        {"topic_name": "t", "message_count": 7, "depth": 2, "channels": None},
        {"topic_name": "u", "message_count": "x", "channels": [{"channel_name": "c", "depth": 3}]},
    ]
    table = reduce_sample([("n1", topics), ("n2", topics[:1])])
    assert list(table[("topic", "t")]) == [14, 4, 0, 0, 0]
    assert list(table[("topic_node", "t", "n2")]) == [7, 2, 0, 0, 0]
    assert list(table[("channel", "u", "c")]) == [0, 3, 0, 0, 0]
    assert list(table[("node", "n1")]) == [7, 5, 0, 0, 3]
    assert list(table[("cluster",)]) == [14, 7, 0, 0, 3]


def test_history_memory_is_per_series_whatever_the_samples():
    history = History(interval=5.0, duration=3600.0)
    for n in range(800):  # more samples than an hour holds
        table = _sample(n * 10, n % 7)
        if n < 50:
            table[("topic", "gone")] = (n, 0, 0, 0, 0)
        history.record(n * 5.0, table)
    series = history.series(("topic", "t"))
    times = series["timestamps"]
    assert len(times) <= SPARK_POINTS + 1 + OLD_POINTS + 1
    assert times[-1] == 3995.0 and times[-1] - times[0] >= 3600.0 - 5 * history.stride
    assert times[-SPARK_POINTS - 1 :] == [5.0 * n for n in range(800 - SPARK_POINTS - 1, 800)]  # full resolution
    assert set(series["rate"][1:]) == {2.0}  # 10 messages per 5 s, also across thinned samples
    assert ("topic", "gone") not in history.keys  # absent from every kept sample
    assert history.bytes_per_series("topic") == 8 * 3 * (SPARK_POINTS + 1 + history.old.size)
    assert history.bytes_per_series("topic") < 3000


def test_history_overview_sparklines_for_the_named_topics_only():
    history = History(interval=1.0, duration=60.0)
    for second in range(3):
        table = _sample(second * 10, 0)
        table[("topic", "u")] = (second, 0, 0, 0, 0)
        history.record(float(second), table)
    overview = history.overview({"u"})
    assert "rates" not in overview["topics"]["t"] and overview["topics"]["t"]["rate"] == 10.0
    assert overview["topics"]["u"]["rates"] == [1.0, 1.0]


# -- guard --------------------------------------------------------------------------------------------------------
def _request(headers: dict, method: str = "POST") -> Request:
    items = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request(method, "/api/topics/t", headers=Headers(items), remote_address="127.0.0.1:5555")


def test_guard_admin_users_and_tokens():
    opts = Options(admin_users=["alice"], nsqd_http_addresses=["a:1"])
    guard = Guard(opts, secret=b"k" * 32)
    alice = {"X-Forwarded-User": "alice", "Host": "admin:4171"}
    token = guard.token(_request(alice))
    assert token != guard.token(_request({"X-Forwarded-User": "mallory"}))
    guard.check_action(_request({**alice, CSRF_HEADER: token}))
    guard.check_action(_request(alice))  # no browser signal: a program, which no page can have forged
    same_origin = {**alice, "Origin": "http://admin:4171"}
    guard.check_action(_request({**same_origin, CSRF_HEADER: token}))
    guard.check_action(
        _request(
            {
                **alice,
                "Referer": "http://admin:4171/topics/t",
                "Cookie": "s=1",
                "Sec-Fetch-Site": "same-origin",
                CSRF_HEADER: token,
            }
        )
    )
    cases = [
        ({"Host": "admin:4171", CSRF_HEADER: token}, "FORBIDDEN"),
        ({"Host": "admin:4171"}, "FORBIDDEN"),
        (same_origin, "INVALID_CSRF_TOKEN"),
        ({**alice, "Referer": "http://admin:4171/topics/t"}, "INVALID_CSRF_TOKEN"),
        ({**alice, "Cookie": "session=1"}, "INVALID_CSRF_TOKEN"),
        ({**alice, "Sec-Fetch-Mode": "cors"}, "INVALID_CSRF_TOKEN"),
        ({**same_origin, CSRF_HEADER: "0" * 64}, "INVALID_CSRF_TOKEN"),
        ({**alice, CSRF_HEADER: token, "Origin": "http://evil.example"}, "CROSS_ORIGIN_REQUEST"),
        ({**alice, CSRF_HEADER: token, "Origin": "null"}, "CROSS_ORIGIN_REQUEST"),
        ({**alice, "Origin": "http://evil.example"}, "CROSS_ORIGIN_REQUEST"),
        ({**alice, "Referer": "http://evil.example/page"}, "CROSS_ORIGIN_REQUEST"),
        ({**alice, "Referer": "http://[evil"}, "CROSS_ORIGIN_REQUEST"),
        ({**alice, CSRF_HEADER: token, "Sec-Fetch-Site": "cross-site"}, "CROSS_ORIGIN_REQUEST"),
        ({**alice, "Sec-Fetch-Site": "same-site"}, "CROSS_ORIGIN_REQUEST"),
    ]
    for headers, code in cases:
        with pytest.raises(HTTPError) as info:
            guard.check_action(_request(headers))
        assert (info.value.status, info.value.message) == (403, code), headers


def test_guard_everyone_is_admin_without_admin_users():
    guard = Guard(Options(nsqd_http_addresses=["a:1"]))
    request = _request({"Host": "h"})
    assert guard.is_admin(request)
    guard.check_action(_request({"Host": "h", "Origin": "http://h", CSRF_HEADER: guard.token(request)}))
