"""Prometheus ``/metrics``: a collector that turns one stats snapshot into metric families at scrape time.

Nothing is counted per message for Prometheus (``prometheus_client``'s own counters cost 20-70 times more than
``obj.count += 1`` on the hot path): topics, channels and clients keep plain integers, read when a scrape comes.
The series come from ``stats_cache.py``, which renders again only the topics and channels that changed since the
last request, with ``topic_rows`` and ``channel_rows`` here. The registry also carries the
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
  ``nsqd_topic_message_bytes_total``, ``nsqd_topic_channels``, ``nsqd_topic_paused``,
  ``nsqd_topic_damaged_messages_total``;
- per channel ``{topic,channel}``: ``nsqd_channel_depth``, ``nsqd_channel_backend_depth``,
  ``nsqd_channel_in_flight``, ``nsqd_channel_deferred``, ``nsqd_channel_messages_total``,
  ``nsqd_channel_requeues_total``, ``nsqd_channel_timeouts_total``, ``nsqd_channel_clients``,
  ``nsqd_channel_paused``, ``nsqd_channel_damaged_messages_total``;
- per log channel ``{topic,channel}`` (LOG-PROTOCOL.md), written only when some channel is a log:
  ``nsqd_channel_log_start_offset``, ``nsqd_channel_log_committed_offset``, ``nsqd_channel_log_end_offset``;
- end-to-end latency, when percentiles are configured: ``nsqd_topic_e2e_processing_latency_seconds
  {topic,quantile}`` and ``nsqd_channel_e2e_processing_latency_seconds{topic,channel,quantile}`` with
  ``..._samples`` gauges counting the samples in the window;
- replication, on a node that replicates or holds copies: ``nsqd_replication_*`` (degraded, per-peer lag) and
  ``nsqd_replica_*`` (held per origin, takeovers), from ``replication/stats.py``.
"""

from __future__ import annotations

import os
import time
from functools import partial
from operator import attrgetter, itemgetter

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from .replication.stats import replication_metrics
from .stats import NodeStats, gc_paused, node_stats

__all__ = [
    "CHANNEL_SERIES",
    "TOPIC_SERIES",
    "MetricsEndpoint",
    "NSQDCollector",
    "channel_rows",
    "rows_pieces",
    "series_text",
    "topic_rows",
]


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
    (
        "nsqd_topic_damaged_messages",
        "counter",
        "Messages of the topic's disk queue found damaged or lost, never delivered",
        attrgetter("damaged_count"),
    ),
)
TOPIC_E2E = (
    "nsqd_topic_e2e_processing_latency_seconds",
    "Publish-to-FIN latency quantiles over the window, all channels",
    "nsqd_topic_e2e_processing_latency_samples",
    "Publish-to-FIN latency samples in the window, all channels",
)
#: the same for channels (``ChannelStats``)
CHANNEL_SERIES = (
    ("nsqd_channel_depth", "gauge", "Messages ready in the channel (memory and disk)", attrgetter("depth")),
    ("nsqd_channel_backend_depth", "gauge", "Messages ready in the channel's disk queue", attrgetter("backend_depth")),
    ("nsqd_channel_in_flight", "gauge", "Messages delivered and not yet finished", attrgetter("in_flight_count")),
    ("nsqd_channel_deferred", "gauge", "Deferred messages waiting for their time", attrgetter("deferred_count")),
    ("nsqd_channel_messages", "counter", "Messages put into the channel", attrgetter("message_count")),
    ("nsqd_channel_requeues", "counter", "Messages requeued by consumers (REQ)", attrgetter("requeue_count")),
    ("nsqd_channel_timeouts", "counter", "In-flight messages that timed out", attrgetter("timeout_count")),
    ("nsqd_channel_clients", "gauge", "Consumers connected to the channel", attrgetter("client_count")),
    ("nsqd_channel_paused", "gauge", "1 while the channel is paused", attrgetter("paused")),
    (
        "nsqd_channel_damaged_messages",
        "counter",
        "Messages of the channel's disk queue found damaged or lost, never delivered",
        attrgetter("damaged_count"),
    ),
)
#: the families of log channels' offsets (a ``ChannelStats.log`` tuple's fields), after the latency families
LOG_SERIES = (
    ("nsqd_channel_log_start_offset", "Oldest offset a log channel can be read from"),
    ("nsqd_channel_log_committed_offset", "Offset below which a log channel's messages are finished"),
    ("nsqd_channel_log_end_offset", "Offset the next message of a log channel gets"),
)
CHANNEL_E2E = (
    "nsqd_channel_e2e_processing_latency_seconds",
    "Publish-to-FIN latency quantiles over the window",
    "nsqd_channel_e2e_processing_latency_samples",
    "Publish-to-FIN latency samples in the window",
)


def _family(name: str, kind: str, documentation: str, openmetrics: bool) -> bytes:
    """A family's HELP and TYPE lines."""
    title = name if openmetrics or kind != "counter" else name + "_total"
    return f"# HELP {title} {documentation}\n# TYPE {title} {kind}\n".encode()


def _sample_names(series) -> tuple[str, ...]:
    return tuple(name + "_total" if kind == "counter" else name for name, kind, _, _ in series)


_TOPIC_SAMPLES = _sample_names(TOPIC_SERIES)
_CHANNEL_SAMPLES = _sample_names(CHANNEL_SERIES)


def _value(value) -> str:
    """``floatToGoString`` of an integer or boolean: ``repr(float(v))`` below a million, where they are the same (Go
    switches to an exponent from seven digits on)."""
    return repr(float(value)) if value < 1_000_000 else floatToGoString(value)


def _rows_of(
    item, samples: tuple[str, ...], series, latency: tuple, labels: str, before: str, after: str
) -> tuple[bytes, ...]:
    lines = [f"{sample}{labels} {_value(spec[3](item))}\n" for sample, spec in zip(samples, series, strict=True)]
    e2e = item.e2e_processing_latency
    if e2e.percentiles is None:
        lines += ("", "")
    else:
        seconds, _, count, _ = latency
        lines.append(
            "".join(
                [
                    f'{seconds}{{{before}quantile="{_quantile_label(q)}",{after}}} {floatToGoString(value / 1e9)}\n'
                    for q, value in e2e.percentiles
                ]
            )
        )
        lines.append(f"{count}{labels} {floatToGoString(e2e.count)}\n")
    return tuple(line.encode() for line in lines)


def topic_rows(topic) -> tuple[bytes, ...]:
    """A topic's sample lines (a ``TopicStats``), one string per family of ``TOPIC_SERIES``, then its latency
    quantiles' lines and its sample count's line (empty when its window is not configured)."""
    name = f'topic="{topic.topic_name}"'
    return _rows_of(topic, _TOPIC_SAMPLES, TOPIC_SERIES, TOPIC_E2E, "{" + name + "}", "", name)


def channel_rows(channel, topic_name: str) -> tuple[bytes, ...]:
    """The same for a channel (a ``ChannelStats``) of ``CHANNEL_SERIES``."""
    before, after = f'channel="{channel.channel_name}",', f'topic="{topic_name}"'
    labels = "{" + before + after + "}"
    rows = _rows_of(channel, _CHANNEL_SAMPLES, CHANNEL_SERIES, CHANNEL_E2E, labels, before, after)
    if channel.log is None:
        return rows + _NO_LOG_ROWS
    return rows + tuple(
        f"{name}{labels} {_value(value)}\n".encode() for (name, _), value in zip(LOG_SERIES, channel.log, strict=True)
    )


_NO_LOG_ROWS = (b"",) * len(LOG_SERIES)


def rows_pieces(topics: list, channels: list, *, openmetrics: bool = False) -> list[bytes]:
    """The per-topic and per-channel families from rows of ``topic_rows`` and of ``channel_rows`` (or any rows
    with as many columns: several channels' rows joined column by column), in order: family by family, as
    ``prometheus_client`` writes them. The pieces, to be joined once."""
    out: list[bytes] = []
    for rows, series, latency in ((topics, TOPIC_SERIES, TOPIC_E2E), (channels, CHANNEL_SERIES, CHANNEL_E2E)):
        seconds, seconds_help, samples, samples_help = latency
        families = [(name, kind, documentation) for name, kind, documentation, _ in series]
        families += [(seconds, "gauge", seconds_help), (samples, "gauge", samples_help)]
        for column, (name, kind, documentation) in enumerate(families):
            out.append(_family(name, kind, documentation, openmetrics))
            out += map(itemgetter(column), rows)
        if series is CHANNEL_SERIES:
            # the log families follow, only on a node that has a log channel: others' exposition is unchanged
            for column, (name, documentation) in enumerate(LOG_SERIES, len(families)):
                values = [row[column] for row in rows if len(row) > column]
                if any(values):
                    out.append(_family(name, "gauge", documentation, openmetrics))
                    out += values
    return out


def series_text(stats, *, openmetrics: bool = False) -> str:
    """The per-topic and per-channel families of a snapshot, as ``prometheus_client`` writes them in the Prometheus
    text format, or in OpenMetrics."""
    topics = stats.topics or ()
    return b"".join(
        rows_pieces(
            [topic_rows(t) for t in topics],
            [channel_rows(c, t.topic_name) for t in topics for c in t.channels],
            openmetrics=openmetrics,
        )
    ).decode()


class NSQDCollector:
    """A custom collector (``collect()`` yields families) of the daemon-wide figures of a snapshot: the one that
    ``MetricsEndpoint`` took for the scrape, or a new one."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        self.snapshot: NodeStats | None = None
        self.joined = False  # the snapshot is every worker's (``--workers``): count from it, not from this one

    def describe(self):
        # no families are known before the first scrape; returning none keeps registration from collecting
        return []

    def collect(self):
        stats = self.snapshot or node_stats(self.nsqd, None, None, include_mem=False, now_ns=time.time_ns())
        info = GaugeMetricFamily("nsqd_info", "nsqd version (always 1)", labels=["version"])
        info.add_metric([stats.version], 1)
        yield info
        yield GaugeMetricFamily(
            "nsqd_healthy", "1 while nsqd is healthy (no failing disk queue), else 0", value=1 if stats.healthy else 0
        )
        yield GaugeMetricFamily("nsqd_start_time_seconds", "Unix time nsqd started", value=stats.start_time)
        yield GaugeMetricFamily("nsqd_uptime_seconds", "Seconds since nsqd started", value=stats.uptime_ns / 1e9)
        yield GaugeMetricFamily(
            "nsqd_tcp_connections", "Open TCP (V2 protocol) connections", value=stats.tcp_connections
        )
        yield GaugeMetricFamily("nsqd_http_connections", "Open HTTP connections", value=stats.http_connections)
        if self.joined:
            producers, topics = len(stats.producers or ()), len(stats.topics or ())
        else:
            producers, topics = sum(1 for c in self.nsqd.clients.values() if c.pub_counts), len(self.nsqd.topics)
        yield GaugeMetricFamily("nsqd_producers", "TCP connections that have published", value=producers)
        yield GaugeMetricFamily("nsqd_topics", "Topics", value=topics)
        if stats.replication is not None:
            yield from replication_metrics(stats.replication)


class NodeProcessCollector:
    """``process_*`` of a node of several processes (``--workers``): a scrape lands on any worker, so each reports
    the node, the parent and every worker, and ``rate(process_cpu_seconds_total[...])`` is the node's CPU whatever
    worker answers. CPU time, resident and virtual memory are sums (a page the processes still share since the fork
    counts once in each, as ``ps`` shows them); the start time is the parent's; open and maximum file descriptors
    are those of the process nearest its limit, which each process has of its own. The processes are the parent
    (this worker's) and its children as /proc lists them, read at scrape time like ``ProcessCollector``'s."""

    #: the families whose value is the sum over the processes
    SUMMED = ("process_cpu_seconds", "process_resident_memory_bytes", "process_virtual_memory_bytes")

    def __init__(self, parent: int) -> None:
        self.parent = parent
        self._collectors: dict[int, ProcessCollector] = {}

    def describe(self):
        return []

    def pids(self) -> list[int]:
        try:
            with open(f"/proc/{self.parent}/task/{self.parent}/children") as handle:
                return [self.parent, *map(int, handle.read().split())]
        except OSError:  # (a kernel without the children file: this process alone)
            return [os.getpid()]

    def collect(self):
        found: dict[str, list] = {}  # family name -> its family in each process, the parent's first
        pids = self.pids()
        for pid in pids:
            collector = self._collectors.get(pid)
            if collector is None:
                collector = self._collectors[pid] = ProcessCollector(pid=partial(int, pid), registry=None)
            for family in collector.collect():
                found.setdefault(family.name, []).append(family)
        for gone in set(self._collectors) - set(pids):
            del self._collectors[gone]
        value = lambda family: family.samples[0].value  # noqa: E731
        nearest = None
        if len(found.get("process_open_fds", ())) == len(found.get("process_max_fds", ())):
            pairs = zip(found.get("process_open_fds", ()), found.get("process_max_fds", ()), strict=True)
            nearest = max(pairs, key=lambda pair: value(pair[0]) / max(value(pair[1]), 1.0), default=None)
        for name, families in found.items():
            family = families[0]
            if name in self.SUMMED:
                family.samples = [family.samples[0]._replace(value=sum(map(value, families)))]
            elif name in ("process_open_fds", "process_max_fds"):
                if nearest is None:
                    continue
                family = nearest[0] if name == "process_open_fds" else nearest[1]
            yield family


class MetricsEndpoint:
    """``GET /metrics`` of one daemon: the registry (daemon families, ``process_*``) and the series (see the
    module notes), from one snapshot per scrape."""

    def __init__(self, nsqd, cache=None) -> None:
        self.collector = NSQDCollector(nsqd)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        if nsqd.mesh is None:
            ProcessCollector(registry=self.registry)
        else:
            self.registry.register(NodeProcessCollector(os.getppid()))
        self.cache = cache if cache is not None else nsqd.stats_cache()

    def render(self, accept: str | None, joined: NodeStats | None = None) -> tuple[bytes, str]:
        """The exposition for a scrape (Prometheus text, or OpenMetrics when the ``Accept`` header asks for it)
        and its content type. ``joined``: the stats of every worker of the node (``--workers``), to report
        instead of this process's."""
        encoder, content_type = choose_encoder(accept or "")
        openmetrics = content_type.startswith("application/openmetrics-text")
        nsqd = self.collector.nsqd
        with gc_paused():
            if joined is None:
                self.collector.snapshot = node_stats(nsqd, None, None, include_mem=False, now_ns=time.time_ns())
            else:
                self.collector.snapshot, self.collector.joined = joined, True
            try:
                head = encoder(self.registry)
                if joined is None:
                    series = self.cache.metrics_pieces(openmetrics=openmetrics)
                else:
                    series = [series_text(joined, openmetrics=openmetrics).encode()]
            finally:
                self.collector.snapshot = None
                self.collector.joined = False
            end = b""
            if openmetrics and head.endswith(b"# EOF\n"):
                head, end = head[:-6], b"# EOF\n"
            return b"".join([head, *series, end]), content_type
