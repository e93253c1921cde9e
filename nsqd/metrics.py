"""Prometheus ``/metrics``: a collector that turns one stats snapshot into metric families at scrape time.

Nothing is counted per message for Prometheus: topics, channels and clients keep plain integers, and
``NSQDCollector.collect`` reads them through ``stats.collect`` when a scrape comes (``prometheus_client``'s
own counters cost 20-70 times more than ``obj.count += 1`` on the hot path). The registry also carries the
standard ``process_*`` collector, which reads /proc at scrape time as well.

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

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry

from .replication.stats import replication_metrics
from .stats import collect

__all__ = ["NSQDCollector", "make_registry", "render"]


def _quantile_label(q: float) -> str:
    return repr(float(q))


class NSQDCollector:
    """A custom collector (``collect()`` yields families) over a running ``NSQD``."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd

    def describe(self):
        # no families are known before the first scrape; returning none keeps registration from collecting
        return []

    def collect(self):
        stats = collect(self.nsqd, include_clients=False, include_mem=False)
        topics = stats.topics or ()

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
        yield GaugeMetricFamily("nsqd_topics", "Topics", value=len(topics))

        t_depth = GaugeMetricFamily("nsqd_topic_depth", "Messages queued in the topic (memory and disk)",
                                    labels=["topic"])
        t_backend = GaugeMetricFamily("nsqd_topic_backend_depth", "Messages queued in the topic's disk queue",
                                      labels=["topic"])
        t_messages = CounterMetricFamily("nsqd_topic_messages", "Messages published to the topic",
                                         labels=["topic"])
        t_bytes = CounterMetricFamily("nsqd_topic_message_bytes", "Bytes of message bodies published",
                                      labels=["topic"])
        t_channels = GaugeMetricFamily("nsqd_topic_channels", "Channels of the topic", labels=["topic"])
        t_paused = GaugeMetricFamily("nsqd_topic_paused", "1 while the topic is paused", labels=["topic"])
        t_e2e = GaugeMetricFamily("nsqd_topic_e2e_processing_latency_seconds",
                                  "Publish-to-FIN latency quantiles over the window, all channels",
                                  labels=["topic", "quantile"])
        t_e2e_n = GaugeMetricFamily("nsqd_topic_e2e_processing_latency_samples",
                                    "Publish-to-FIN latency samples in the window, all channels", labels=["topic"])

        c_labels = ["topic", "channel"]
        c_depth = GaugeMetricFamily("nsqd_channel_depth", "Messages ready in the channel (memory and disk)",
                                    labels=c_labels)
        c_backend = GaugeMetricFamily("nsqd_channel_backend_depth", "Messages ready in the channel's disk queue",
                                      labels=c_labels)
        c_in_flight = GaugeMetricFamily("nsqd_channel_in_flight", "Messages delivered and not yet finished",
                                        labels=c_labels)
        c_deferred = GaugeMetricFamily("nsqd_channel_deferred", "Deferred messages waiting for their time",
                                       labels=c_labels)
        c_messages = CounterMetricFamily("nsqd_channel_messages", "Messages put into the channel",
                                         labels=c_labels)
        c_requeues = CounterMetricFamily("nsqd_channel_requeues", "Messages requeued by consumers (REQ)",
                                         labels=c_labels)
        c_timeouts = CounterMetricFamily("nsqd_channel_timeouts", "In-flight messages that timed out",
                                         labels=c_labels)
        c_clients = GaugeMetricFamily("nsqd_channel_clients", "Consumers connected to the channel",
                                      labels=c_labels)
        c_paused = GaugeMetricFamily("nsqd_channel_paused", "1 while the channel is paused", labels=c_labels)
        c_e2e = GaugeMetricFamily("nsqd_channel_e2e_processing_latency_seconds",
                                  "Publish-to-FIN latency quantiles over the window",
                                  labels=["topic", "channel", "quantile"])
        c_e2e_n = GaugeMetricFamily("nsqd_channel_e2e_processing_latency_samples",
                                    "Publish-to-FIN latency samples in the window", labels=c_labels)

        for t in topics:
            name = [t.topic_name]
            t_depth.add_metric(name, t.depth)
            t_backend.add_metric(name, t.backend_depth)
            t_messages.add_metric(name, t.message_count)
            t_bytes.add_metric(name, t.message_bytes)
            t_channels.add_metric(name, len(t.channels))
            t_paused.add_metric(name, 1 if t.paused else 0)
            e2e = t.e2e_processing_latency
            if e2e.percentiles is not None:
                t_e2e_n.add_metric(name, e2e.count)
                for q, value in e2e.percentiles:
                    t_e2e.add_metric([t.topic_name, _quantile_label(q)], value / 1e9)
            for c in t.channels:
                labels = [t.topic_name, c.channel_name]
                c_depth.add_metric(labels, c.depth)
                c_backend.add_metric(labels, c.backend_depth)
                c_in_flight.add_metric(labels, c.in_flight_count)
                c_deferred.add_metric(labels, c.deferred_count)
                c_messages.add_metric(labels, c.message_count)
                c_requeues.add_metric(labels, c.requeue_count)
                c_timeouts.add_metric(labels, c.timeout_count)
                c_clients.add_metric(labels, c.client_count)
                c_paused.add_metric(labels, 1 if c.paused else 0)
                e2e = c.e2e_processing_latency
                if e2e.percentiles is not None:
                    c_e2e_n.add_metric(labels, e2e.count)
                    for q, value in e2e.percentiles:
                        c_e2e.add_metric([*labels, _quantile_label(q)], value / 1e9)

        yield from (t_depth, t_backend, t_messages, t_bytes, t_channels, t_paused, t_e2e, t_e2e_n)
        yield from (c_depth, c_backend, c_in_flight, c_deferred, c_messages, c_requeues, c_timeouts, c_clients,
                    c_paused, c_e2e, c_e2e_n)
        if stats.replication is not None:
            yield from replication_metrics(stats.replication)


def make_registry(nsqd) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(NSQDCollector(nsqd))
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The exposition for a scrape (Prometheus text, or OpenMetrics when the ``Accept`` header asks for it)
    and its content type."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type
