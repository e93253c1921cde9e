"""/stats (JSON schema with key order, filters, null-vs-empty rules, text), Prometheus /metrics parsed with
prometheus-client's own parser, and statsd lines received on a real UDP socket (shared NSQ-FACTS 4.4, 5.3)."""

from __future__ import annotations

import re
import socket
import time
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.harness import RawClient, consumer, fin, req
from tests.integration.http_helpers import get, post, stats, wait_for

pytestmark = pytest.mark.timeout(60)

TOP_KEYS = ["version", "health", "start_time", "topics", "memory", "producers"]
TOPIC_KEYS = [
    "topic_name",
    "channels",
    "depth",
    "backend_depth",
    "message_count",
    "message_bytes",
    "paused",
    "e2e_processing_latency",
]
CHANNEL_KEYS = [
    "channel_name",
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "message_count",
    "requeue_count",
    "timeout_count",
    "client_count",
    "clients",
    "paused",
    "e2e_processing_latency",
]
CLIENT_KEYS = [
    "client_id",
    "hostname",
    "version",
    "remote_address",
    "state",
    "ready_count",
    "in_flight_count",
    "message_count",
    "finish_count",
    "requeue_count",
    "connect_ts",
    "sample_rate",
    "deflate",
    "snappy",
    "user_agent",
    "tls",
    "tls_cipher_suite",
    "tls_version",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
]
PRODUCER_KEYS = CLIENT_KEYS[:15] + ["pub_counts"] + CLIENT_KEYS[15:]
MEMORY_KEYS = [
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
]
E2E_KEYS = ["count", "percentiles"]


def name(prefix: str = "s") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def e2e_nsqd(tmp_path_factory):
    from tests.integration.harness import NsqdProcess, stop_all

    process = NsqdProcess(
        tmp_path_factory.mktemp("nsqd-e2e"),
        ["--e2e-processing-latency-percentile=0.5,1.0", "--broadcast-address=stats.test"],
    )
    process.start()
    yield process
    stop_all([process])


def test_stats_json_schema_field_by_field(e2e_nsqd):
    daemon = e2e_nsqd
    web = daemon.http()
    topic = name()
    bodies = [b"first", b"second!", b"third..."]
    with (
        RawClient(daemon.tcp) as producer,
        consumer(
            daemon.tcp,
            topic,
            "work",
            ready=0,
            identify_fields={"client_id": "worker-1", "hostname": "box.example", "user_agent": "stats-test/1.0"},
        ) as sub,
    ):
        producer.publish_many(topic, bodies)
        producer.publish(f"{topic}_other", b"elsewhere")
        sub.send(b"RDY 2\n")
        first = sub.read_message()
        second = sub.read_message()
        sub.send(fin(first.id))
        sub.send(req(second.id, 600000))
        third = sub.read_message()  # the FIN made room for it
        assert third.body == bodies[2]
        document = wait_for(
            lambda: (lambda d: d if d["topics"][0]["channels"][0]["deferred_count"] == 1 else None)(
                stats(web, f"topic={topic}")
            ),
            message="REQ reflected in /stats",
        )
        # the unfiltered document lists every topic a producer published to
        everything = stats(web)

    assert list(document) == TOP_KEYS
    assert document["version"] == "1.3.0" and document["health"] == "OK"
    assert isinstance(document["start_time"], int)
    assert list(document["memory"]) == MEMORY_KEYS
    assert all(isinstance(v, int) for v in document["memory"].values())

    (topic_doc,) = document["topics"]
    assert list(topic_doc) == TOPIC_KEYS
    assert topic_doc["topic_name"] == topic
    assert (topic_doc["depth"], topic_doc["backend_depth"]) == (0, 0)
    assert topic_doc["message_count"] == 3
    assert topic_doc["message_bytes"] == sum(map(len, bodies))
    assert topic_doc["paused"] is False

    (channel,) = topic_doc["channels"]
    assert list(channel) == CHANNEL_KEYS
    assert channel["channel_name"] == "work"
    assert channel["depth"] == 0 and channel["backend_depth"] == 0
    assert channel["in_flight_count"] == 1 and channel["deferred_count"] == 1
    assert channel["message_count"] == 3 and channel["requeue_count"] == 1 and channel["timeout_count"] == 0
    assert channel["client_count"] == 1 and channel["paused"] is False

    (client,) = channel["clients"]
    assert list(client) == CLIENT_KEYS
    assert client["client_id"] == "worker-1" and client["hostname"] == "box.example"
    assert client["version"] == "V2" and client["user_agent"] == "stats-test/1.0"
    assert re.fullmatch(r"127\.0\.0\.1:\d+", client["remote_address"])
    assert client["state"] == 3 and client["ready_count"] == 2 and client["in_flight_count"] == 1
    assert (client["message_count"], client["finish_count"], client["requeue_count"]) == (3, 1, 1)
    assert abs(client["connect_ts"] - time.time()) < 120
    assert client["sample_rate"] == 0 and client["tls"] is False and client["tls_cipher_suite"] == ""

    # e2e: one FIN recorded, percentiles in configured (descending) order
    for e2e in (channel["e2e_processing_latency"], topic_doc["e2e_processing_latency"]):
        assert list(e2e) == E2E_KEYS
        assert e2e["count"] == 1
        assert [list(p) for p in e2e["percentiles"]] == [["quantile", "value"]] * 2
        assert [p["quantile"] for p in e2e["percentiles"]] == [1.0, 0.5]
        assert all(p["value"] > 0 for p in e2e["percentiles"])

    (producer_doc,) = document["producers"]
    assert list(producer_doc) == PRODUCER_KEYS
    assert producer_doc["pub_counts"] == [{"topic": topic, "count": 3}]  # the topic filter keeps its entry only
    (everyone,) = [p for p in everything["producers"] if p["remote_address"] == producer_doc["remote_address"]]
    assert everyone["pub_counts"] == [{"topic": topic, "count": 3}, {"topic": f"{topic}_other", "count": 1}]


def test_stats_filters_and_null_rules(module_nsqd):
    web = module_nsqd.http()
    topic = name()
    assert post(web, f"/topic/create?topic={topic}").status == 200
    assert post(web, f"/channel/create?topic={topic}&channel=b").status == 200
    assert post(web, f"/channel/create?topic={topic}&channel=a").status == 200

    missing = stats(web, f"topic={name()}")
    assert (missing["topics"], missing["producers"]) == (None, None)

    no_channel = stats(web, f"topic={topic}&channel=zzz")
    assert no_channel["topics"] == []

    only_b = stats(web, f"topic={topic}&channel=b")
    assert [c["channel_name"] for c in only_b["topics"][0]["channels"]] == ["b"]

    both = stats(web, f"topic={topic}")
    assert [c["channel_name"] for c in both["topics"][0]["channels"]] == ["a", "b"]  # sorted
    assert both["topics"][0]["channels"][0]["clients"] == []
    e2e = both["topics"][0]["e2e_processing_latency"]
    assert e2e == {"count": 0, "percentiles": None}  # no percentiles configured

    no_clients = stats(web, f"topic={topic}&include_clients=false")
    assert no_clients["topics"][0]["channels"][0]["clients"] is None
    assert no_clients["topics"][0]["channels"][0]["client_count"] == 0
    assert no_clients["producers"] is None

    no_mem = stats(web, f"topic={topic}&include_mem=0")
    assert "memory" not in no_mem and list(no_mem) == [k for k in TOP_KEYS if k != "memory"]
    assert "memory" in stats(web, f"topic={topic}&include_mem=maybe")  # unknown value means true

    names = [t["topic_name"] for t in stats(web)["topics"]]
    assert names == sorted(names) and topic in names


def test_stats_bad_query_is_400(module_nsqd):
    reply = get(module_nsqd.http(), "/stats?format=json&topic=%zz")
    assert (reply.status, reply.body) == (400, b'{"message":"INVALID_REQUEST"}')


def test_topic_without_channels_has_null_percentiles(e2e_nsqd):
    web = e2e_nsqd.http()
    topic = name()
    assert post(web, f"/topic/create?topic={topic}").status == 200
    assert stats(web, f"topic={topic}")["topics"][0]["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    assert post(web, f"/channel/create?topic={topic}&channel=c").status == 200
    e2e = stats(web, f"topic={topic}")["topics"][0]["channels"][0]["e2e_processing_latency"]
    assert e2e == {"count": 0, "percentiles": [{"quantile": 1, "value": 0}, {"quantile": 0.5, "value": 0}]}


def test_stats_text(e2e_nsqd):
    daemon = e2e_nsqd
    web = daemon.http()
    topic = name()
    with RawClient(daemon.tcp) as producer, consumer(daemon.tcp, topic, "tc", ready=0):
        producer.publish(topic, b"x")
        assert post(web, f"/channel/pause?topic={topic}&channel=tc").status == 200
        reply = get(web, f"/stats?topic={topic}")
    assert reply.status == 200 and reply.headers["content-type"] == "text/plain; charset=utf-8"
    assert reply.headers["x-nsq-content-type"] == "nsq; version=1.0"
    lines = reply.body.decode().splitlines()
    assert re.fullmatch(r"nsqd v1\.3\.0 \(built w/python3\.\d+\.\d+\S*\)", lines[0])
    assert lines[1].startswith("start_time ") and lines[2].startswith("uptime ")
    assert "Health: OK" in lines and "Memory:" in lines and "Topics:" in lines and "Producers:" in lines
    (topic_line,) = [line for line in lines if f"[{topic}" in line]
    assert re.search(r"depth: 0 +be-depth: 0 +msgs: 1 +e2e%: p100=\S+, p50=\S+", topic_line), topic_line
    (channel_line,) = [line for line in lines if "[tc " in line]
    assert channel_line.startswith("   *P [tc") and "depth: 1 " in channel_line and "inflt: 0 " in channel_line
    text = get(web, f"/stats?topic={name()}&include_mem=false").body.decode()
    assert "Topics: None" in text and "Producers: None" in text and "Memory:" not in text


def test_metrics_parse_and_match_stats(e2e_nsqd):
    daemon = e2e_nsqd
    web = daemon.http()
    topic = name()
    with consumer(daemon.tcp, topic, "m", ready=1) as sub:
        assert post(web, f"/mpub?topic={topic}", b"a\nb\nc").status == 200
        message = sub.read_message()  # one in flight, two ready
        reply = get(web, "/metrics")
        sub.send(fin(message.id))
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(reply.body.decode())}

    def value(family: str, **labels) -> float:
        matches = [
            s.value
            for s in families[family].samples
            if all(s.labels.get(k) == v for k, v in labels.items()) and not s.name.endswith("_created")
        ]
        assert len(matches) == 1, (family, labels, families[family].samples)
        return matches[0]

    assert value("nsqd_info", version="1.3.0") == 1
    assert value("nsqd_healthy") == 1
    assert value("nsqd_uptime_seconds") >= 0
    assert value("nsqd_tcp_connections") >= 1
    assert value("nsqd_topic_messages", topic=topic) == 3
    assert families["nsqd_topic_messages"].type == "counter"
    assert value("nsqd_topic_message_bytes", topic=topic) == 3
    assert value("nsqd_topic_depth", topic=topic) == 0
    assert value("nsqd_channel_depth", topic=topic, channel="m") == 2
    assert value("nsqd_channel_in_flight", topic=topic, channel="m") == 1
    assert value("nsqd_channel_messages", topic=topic, channel="m") == 3
    assert value("nsqd_channel_clients", topic=topic, channel="m") == 1
    assert value("nsqd_channel_deferred", topic=topic, channel="m") == 0
    assert value("nsqd_channel_requeues", topic=topic, channel="m") == 0
    assert value("nsqd_channel_timeouts", topic=topic, channel="m") == 0
    assert value("nsqd_channel_e2e_processing_latency_seconds", topic=topic, channel="m", quantile="0.5") == 0
    assert "process_cpu_seconds" in families or "process_cpu_seconds_total" in families

    # after the FIN the latency window has a sample
    def latency_recorded():
        text = get(web, "/metrics").body.decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        samples = [
            s
            for s in fams["nsqd_channel_e2e_processing_latency_samples"].samples
            if s.labels == {"topic": topic, "channel": "m"}
        ]
        return samples and samples[0].value == 1

    wait_for(latency_recorded, message="FIN recorded in the e2e window")


def test_metrics_openmetrics_on_request(module_nsqd):
    reply = get(module_nsqd.http(), "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert reply.status == 200 and reply.headers["content-type"].startswith("application/openmetrics-text")
    assert reply.body.rstrip().endswith(b"# EOF")


# -- statsd ------------------------------------------------------------------------------------------------------
def test_statsd_lines_reach_a_udp_socket(nsqd_factory):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        port = udp.getsockname()[1]
        daemon = nsqd_factory(
            f"--statsd-address=127.0.0.1:{port}",
            "--statsd-interval=300ms",
            "--statsd-udp-packet-size=200",
            "--broadcast-address=node.test",
            "--statsd-exclude-ephemeral",
            "--e2e-processing-latency-percentile=0.99",
        )
        web = daemon.http()
        http_port = web[1]
        topic = name()
        assert post(web, f"/topic/create?topic={topic}").status == 200
        assert post(web, f"/channel/create?topic={topic}&channel=c").status == 200
        assert post(web, f"/channel/create?topic={topic}&channel=gone%23ephemeral").status == 200
        assert post(web, f"/mpub?topic={topic}", b"aa\nbbb").status == 200
        prefix = f"nsq.node_test_{http_port}."
        counts: list[int] = []
        datagrams: list[bytes] = []
        deadline = time.monotonic() + 20
        # read pushes until one after the publish and one more (whose counter delta must be 0)
        while len(counts) < 2 or counts[-1] != 0:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"statsd lines not seen in time: {datagrams[-5:]}"
            udp.settimeout(remaining)
            datagram = udp.recv(65536)
            datagrams.append(datagram)
            for line in datagram.decode().splitlines():
                if line.startswith(f"{prefix}topic.{topic}.message_count:"):
                    counts.append(int(line.split(":")[1].split("|")[0]))
        assert 2 in counts and sum(counts) == 2
    lines = [line for d in datagrams for line in d.decode().splitlines()]
    assert all(len(d) <= 200 and d.endswith(b"\n") for d in datagrams)
    assert all(re.fullmatch(rf"{re.escape(prefix)}[^:]+:-?\d+\|[cg]", line) for line in lines), lines[:10]
    names = {line[len(prefix) :].split(":")[0] + "|" + line.rsplit("|", 1)[1] for line in lines}
    base = f"topic.{topic}"
    expected = {
        f"{base}.message_count|c",
        f"{base}.message_bytes|c",
        f"{base}.depth|g",
        f"{base}.backend_depth|g",
        f"{base}.e2e_processing_latency_99|g",
        f"{base}.channel.c.message_count|c",
        f"{base}.channel.c.depth|g",
        f"{base}.channel.c.backend_depth|g",
        f"{base}.channel.c.in_flight_count|g",
        f"{base}.channel.c.deferred_count|g",
        f"{base}.channel.c.requeue_count|c",
        f"{base}.channel.c.timeout_count|c",
        f"{base}.channel.c.clients|g",
        f"{base}.channel.c.e2e_processing_latency_99|g",
        "mem.heap_objects|g",
        "mem.heap_idle_bytes|g",
        "mem.heap_in_use_bytes|g",
        "mem.heap_released_bytes|g",
        "mem.gc_pause_usec_100|g",
        "mem.gc_pause_usec_99|g",
        "mem.gc_pause_usec_95|g",
        "mem.next_gc_bytes|g",
        "mem.gc_runs|c",
    }
    assert expected <= names, expected - names
    assert not [n for n in names if "ephemeral" in n]
    assert f"{prefix}{base}.message_bytes:5|c" in lines
    assert f"{prefix}{base}.channel.c.depth:2|g" in lines
    daemon.wait_for_log(rf"STATSD: pushing stats to 127\.0\.0\.1:{port}", 5)
