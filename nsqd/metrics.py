"""Prometheus ``/metrics``: a collector that turns one stats snapshot into metric families at scrape time.

Nothing is counted per message for Prometheus: topics, channels and clients keep plain integers, and
``NSQDCollector.collect`` reads them through ``stats.collect`` when a scrape comes (``prometheus_client``'s
own counters cost 20-70 times more than ``obj.count += 1`` on the hot path). The registry also carries the
standard ``process_*`` collector, which reads /proc at scrape time as well.

The per-topic and per-channel series (15 families, 240,000 samples at 10,000 topics and 20,000 channels) are written
here directly, byte for byte as ``prometheus_client`` writes them in either format (our metric and label names need
no escaping, topic and channel names contain no character a label value escapes), after what the registry writes
for the daemon's own families (and before OpenMetrics' ``# EOF``): through ``prometheus_client``'s families and
encoders, a scrape took 60 microseconds per sample.

Series (labels in braces):
- daemon: ``nsqd_info{version}``, ``nsqd_healthy``, ``nsqd_start_time_seconds``, ``nsqd_uptime_seconds``,
  ``nsqd_tcp_connections``, ``nsqd_http_connections``, ``nsqd_producers``, ``nsqd_topics``;
- per topic ``{topic}``: ``nsqd_topic_depth``, ``nsqd_topic_backend_depth``, ``nsqd_topic_messages_total``,
  ``nsqd_topic_message_bytes_total``, ``nsqd_topic_channels``, ``nsqd_topic_paused``;
- per channel ``{topic,channel}``: ``nsqd_channel_depth``, ``nsqd_channel_backend_depth``,
  ``nsqd_channel_in_flight``, ``nsqd_channel_deferred``, ``nsqd_channel_messages_total``,
  ``nsqd_channel_requeues_total``, ``nsqd_channel_timeouts_total``, ``nsqd_channel_clients``,
  ``nsqd_channel_paused``;
- end-to-end latency, when percentiles are configured: ``nsqd_topic_e2e_processing_latency_seconds
  {topic,quantile}`` and ``nsqd_channel_e2e_processing_latency_seconds{topic,channel,quantile}`` with
  ``..._samples`` gauges counting the samples in the window;
- replication, on a node that replicates or holds copies: ``nsqd_replication_*`` (degraded, per-peer lag) and
  ``nsqd_replica_*`` (held per origin, takeovers), from ``replication/stats.py``.
"""

from __future__ import annotations

from operator import attrgetter

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from .replication.stats import replication_metrics
from .stats import collect, gc_paused

__all__ = ["CHANNEL_SERIES", "TOPIC_SERIES", "MetricsEndpoint", "NSQDCollector", "series_text"]


def _quantile_label(q: float) -> str:
    return repr(float(q))


def _channel_count(topic) -> int:
    return len(topic.channels)


#: (name, type, help, value of a ``TopicStats``) of the per-topic families, in the order they are written
TOPIC_SERIES = (
    ("nsqd_topic_depth", "gauge", "Messages queued in the topic (memory and disk)", attrgetter("depth")),
    ("nsqd_topic_backend_depth", "gauge", "Messages queued in the topic's disk queue", attrgetter("backend_depth")),
    ("nsqd_topic_messages", "counter", "Messages published to the topic", attrgetter("message_count")),
    ("nsqd_topic_message_bytes", "counter", "Bytes of message bodies published", attrgetter("message_bytes")),
    ("nsqd_topic_channels", "gauge", "Channels of the topic", _channel_count),
    ("nsqd_topic_paused", "gauge", "1 while the topic is paused", attrgetter("paused")),
)
TOPIC_E2E = ("nsqd_topic_e2e_processing_latency_seconds",
             "Publish-to-FIN latency quantiles over the window, all channels",
             "nsqd_topic_e2e_processing_latency_samples",
             "Publish-to-FIN latency samples in the window, all channels")
#: the same for channels (``ChannelStats``)
CHANNEL_SERIES = (
    ("nsqd_channel_depth", "gauge", "Messages ready in the channel (memory and disk)", attrgetter("depth")),
    ("nsqd_channel_backend_depth", "gauge", "Messages ready in the channel's disk queue",
     attrgetter("backend_depth")),
    ("nsqd_channel_in_flight", "gauge", "Messages delivered and not yet finished", attrgetter("in_flight_count")),
    ("nsqd_channel_deferred", "gauge", "Deferred messages waiting for their time", attrgetter("deferred_count")),
    ("nsqd_channel_messages", "counter", "Messages put into the channel", attrgetter("message_count")),
    ("nsqd_channel_requeues", "counter", "Messages requeued by consumers (REQ)", attrgetter("requeue_count")),
    ("nsqd_channel_timeouts", "counter", "In-flight messages that timed out", attrgetter("timeout_count")),
    ("nsqd_channel_clients", "gauge", "Consumers connected to the channel", attrgetter("client_count")),
    ("nsqd_channel_paused", "gauge", "1 while the channel is paused", attrgetter("paused")),
)
CHANNEL_E2E = ("nsqd_channel_e2e_processing_latency_seconds", "Publish-to-FIN latency quantiles over the window",
               "nsqd_channel_e2e_processing_latency_samples", "Publish-to-FIN latency samples in the window")


def _number(value) -> str:
    return floatToGoString(value)


def _numbers(values: list) -> list[str]:
    """``floatToGoString`` of integers (and booleans): ``repr(float(v))`` in C where they are the same (below a
    million, where Go does not switch to an exponent yet)."""
    if values and max(values) >= 1_000_000:
        return [floatToGoString(value) for value in values]
    return list(map(repr, map(float, values)))


def _family(out: list, name: str, kind: str, documentation: str, openmetrics: bool) -> str:
    """Append a family's HELP and TYPE lines; returns the name its samples carry."""
    sample = name + "_total" if kind == "counter" else name
    title = name if openmetrics else sample
    out.append(f"# HELP {title} {documentation}\n# TYPE {title} {kind}\n")
    return sample


def _series(out: list, spec, items: list, labels: list[str], openmetrics: bool) -> None:
    name, kind, documentation, value = spec
    sample = _family(out, name, kind, documentation, openmetrics)
    out.append("".join(map((sample + "{} {}\n").format, labels, _numbers(list(map(value, items))))))


def _latency(out: list, names: tuple, items: list, label_parts: list[str], openmetrics: bool) -> None:
    """The quantile gauges and the sample-count gauges, for the items whose window is configured."""
    seconds, seconds_help, samples, samples_help = names
    _family(out, seconds, "gauge", seconds_help, openmetrics)
    tracked = [(item.e2e_processing_latency, part) for item, part in zip(items, label_parts)
               if item.e2e_processing_latency.percentiles is not None]
    # label names sort as prometheus_client sorts them: channel < quantile < topic
    for e2e, (before, after) in tracked:
        for q, value in e2e.percentiles:
            out.append(f'{seconds}{{{before}quantile="{_quantile_label(q)}",{after}}} {_number(value / 1e9)}\n')
    _family(out, samples, "gauge", samples_help, openmetrics)
    for e2e, (before, after) in tracked:
        out.append(f"{samples}{{{before}{after}}} {_number(e2e.count)}\n")


def series_text(stats, *, openmetrics: bool = False) -> str:
    """The per-topic and per-channel families of a snapshot, as ``prometheus_client`` writes them in the Prometheus
    text format, or in OpenMetrics."""
    topics = stats.topics or ()
    out: list[str] = []
    topic_labels = [f'{{topic="{t.topic_name}"}}' for t in topics]
    for spec in TOPIC_SERIES:
        _series(out, spec, topics, topic_labels, openmetrics)
    _latency(out, TOPIC_E2E, topics, [("", f'topic="{t.topic_name}"') for t in topics], openmetrics)
    channels = [c for t in topics for c in t.channels]
    channel_labels = [f'{{channel="{c.channel_name}",topic="{t.topic_name}"}}' for t in topics for c in t.channels]
    for spec in CHANNEL_SERIES:
        _series(out, spec, channels, channel_labels, openmetrics)
    _latency(out, CHANNEL_E2E, channels,
             [(f'channel="{c.channel_name}",', f'topic="{t.topic_name}"') for t in topics for c in t.channels],
             openmetrics)
    return "".join(out)


class NSQDCollector:
    """A custom collector (``collect()`` yields families) of the daemon-wide figures of a snapshot: the one that
    ``MetricsEndpoint`` took for the scrape, or a new one."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        self.snapshot = None

    def describe(self):
        # no families are known before the first scrape; returning none keeps registration from collecting
        return []

    def collect(self):
        stats = self.snapshot or collect(self.nsqd, include_clients=False, include_mem=False)
        info = GaugeMetricFamily("nsqd_info", "nsqd version (always 1)", labels=["version"])
        info.add_metric([stats.version], 1)
        yield info
        yield GaugeMetricFamily("nsqd_healthy", "1 while nsqd is healthy (no failing disk queue), else 0",
                                value=1 if stats.healthy else 0)
        yield GaugeMetricFamily("nsqd_start_time_seconds", "Unix time nsqd started", value=stats.start_time)
        yield GaugeMetricFamily("nsqd_uptime_seconds", "Seconds since nsqd started", value=stats.uptime_ns / 1e9)
        yield GaugeMetricFamily("nsqd_tcp_connections", "Open TCP (V2 protocol) connections",
                                value=stats.tcp_connections)
        yield GaugeMetricFamily("nsqd_http_connections", "Open HTTP connections", value=stats.http_connections)
        yield GaugeMetricFamily("nsqd_producers", "TCP connections that have published",
                                value=sum(1 for c in self.nsqd.clients.values() if c.pub_counts))
        yield GaugeMetricFamily("nsqd_topics", "Topics", value=len(stats.topics or ()))
        if stats.replication is not None:
            yield from replication_metrics(stats.replication)


class MetricsEndpoint:
    """``GET /metrics`` of one daemon: the registry (daemon families, ``process_*``) and the series (see the
    module notes), from one snapshot per scrape."""

    def __init__(self, nsqd) -> None:
        self.collector = NSQDCollector(nsqd)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """The exposition for a scrape (Prometheus text, or OpenMetrics when the ``Accept`` header asks for it)
        and its content type."""
        encoder, content_type = choose_encoder(accept or "")
        openmetrics = content_type.startswith("application/openmetrics-text")
        with gc_paused():
            self.collector.snapshot = collect(self.collector.nsqd, include_clients=False, include_mem=False)
            try:
                head = encoder(self.registry)
                series = series_text(self.collector.snapshot, openmetrics=openmetrics).encode()
            finally:
                self.collector.snapshot = None
        if openmetrics and head.endswith(b"# EOF\n"):
            return head[:-6] + series + b"# EOF\n", content_type
        return head + series, content_type
