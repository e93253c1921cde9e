"""/metrics series written directly: byte for byte what prometheus_client's families and encoders write, in the
Prometheus text format and in OpenMetrics, for a snapshot with paused topics and channels, large counters and
end-to-end latency windows."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.registry import CollectorRegistry

from nsqd.metrics import CHANNEL_E2E, CHANNEL_SERIES, TOPIC_E2E, TOPIC_SERIES, MetricsEndpoint, series_text
from nsqd.stats import collect


class Families:
    """A collector yielding the families built with prometheus_client (the reference)."""

    def __init__(self, families) -> None:
        self.families = families

    def describe(self):
        return []

    def collect(self):
        yield from self.families


def reference(stats) -> CollectorRegistry:
    families = []

    def build(specs, items, label_names, labels_of):
        for name, kind, documentation, value in specs:
            family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, documentation, labels=label_names
            )
            for item in items:
                family.add_metric(labels_of(item), value(item))
            families.append(family)

    def latency(names, items, label_names, labels_of):
        seconds, seconds_help, samples, samples_help = names
        quantiles = GaugeMetricFamily(seconds, seconds_help, labels=[*label_names, "quantile"])
        counts = GaugeMetricFamily(samples, samples_help, labels=label_names)
        for item in items:
            e2e = item.e2e_processing_latency
            if e2e.percentiles is not None:
                counts.add_metric(labels_of(item), e2e.count)
                for q, value in e2e.percentiles:
                    quantiles.add_metric([*labels_of(item), repr(float(q))], value / 1e9)
        families.extend([quantiles, counts])

    topics = stats.topics or ()
    build(TOPIC_SERIES, topics, ["topic"], lambda t: [t.topic_name])
    latency(TOPIC_E2E, topics, ["topic"], lambda t: [t.topic_name])
    pairs = [(t, c) for t in topics for c in t.channels]
    channels = [c for _, c in pairs]
    topic_of = {id(c): t.topic_name for t, c in pairs}
    build(CHANNEL_SERIES, channels, ["topic", "channel"], lambda c: [topic_of[id(c)], c.channel_name])
    latency(CHANNEL_E2E, channels, ["topic", "channel"], lambda c: [topic_of[id(c)], c.channel_name])
    registry = CollectorRegistry()
    registry.register(Families(families))
    return registry


def test_series_are_what_prometheus_client_writes(nsqd):
    big = nsqd.get_topic("big")
    big.message_count, big.message_bytes = 1_234_567, 98_765_432_100
    big.get_channel("b").pause()
    big.get_channel("a").requeue_count = 999_999
    nsqd.get_topic("paused.topic_1").pause()
    nsqd.get_topic("quiet#ephemeral").get_channel("x#ephemeral")
    channel = nsqd.get_topic("lat").get_channel("c")
    for latency in (1_500, 2_000_000_000, 7):
        channel.e2e.add(publish_ts_ns=10**18 - latency, now_ns=10**18)
    stats = collect(nsqd, include_clients=False, include_mem=False)
    registry = reference(stats)
    assert series_text(stats).encode() == generate_latest(registry)
    assert series_text(stats, openmetrics=True).encode() + b"# EOF\n" == generate_openmetrics(registry)


def test_a_node_without_topics_still_names_its_families(nsqd):
    stats = collect(nsqd, include_clients=False, include_mem=False)
    assert series_text(stats).encode() == generate_latest(reference(stats))
    body, content_type = MetricsEndpoint(nsqd).render(None)
    assert content_type.startswith("text/plain; version=0.0.4")
    assert b"# TYPE nsqd_topic_messages_total counter\n" in body and b"# TYPE nsqd_topics gauge\n" in body
    body, content_type = MetricsEndpoint(nsqd).render("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n") and body.count(b"# EOF") == 1
    assert b"# TYPE nsqd_topic_messages counter\n" in body
