"""One snapshot of nsqd's state, and its renderings: ``/stats`` JSON and text.

``collect(nsqd, ...)`` reads the plain counters that topics, channels and clients keep (nothing is
counted for the stats' sake) into dataclasses (with slots; not frozen, whose ``__init__`` costs five times
more, 50 ms at 30,000 topics and channels). The snapshot is taken synchronously, so it is
consistent: no message moves while it is read. ``/stats?topic=`` (``json_body``, ``format_text``) and statsd
(``statsd.py``) start from it. ``/stats`` and ``/metrics`` of the whole node go through ``stats_cache.py``, which
keeps each topic's, channel's and client's pieces and renders them with the functions here (``channel_json_parts``,
``topic_text_line``...), so both paths write the same bytes.

Filters and null-vs-empty rules are nsqd's:
- ``topic`` names a missing topic: ``topics`` and ``producers`` are ``None`` (JSON ``null``);
- ``channel`` given: only topics having that channel are listed, each with that channel alone;
- no topics: ``topics`` is an empty tuple (``[]``);
- ``include_clients=False``: every channel's ``clients`` and ``producers`` are ``None``; ``client_count``
  is still filled in;
- producers are the TCP connections that have published at least one message; ``pub_counts`` lists every
  topic a producer published to (only the filtered topic's entry under a ``topic`` filter).

Topics and channels are sorted by name. JSON objects keep nsqd's key order.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import sys
import time
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields

from protocol.http import go_json_text, go_string
from protocol.version import NSQ_VERSION, version_string
from runtime.http_server import go_duration

from .e2e import EMPTY as EMPTY_E2E
from .e2e import E2EResult, merge_results
from .replication.stats import ReplicationStats, collect_replication, replication_json, replication_text

__all__ = [
    "PRODUCERS_TEXT",
    "TOPICS_TEXT",
    "ChannelStats",
    "ClientStats",
    "E2EResult",
    "MemoryStats",
    "NodeStats",
    "TopicStats",
    "channel_json_parts",
    "channel_stats",
    "channel_text_line",
    "client_body",
    "client_stats",
    "client_text_parts",
    "collect",
    "connected_text",
    "format_text",
    "gc_paused",
    "json_body",
    "json_end",
    "json_head",
    "json_middle",
    "memory_of_processes",
    "memory_stats",
    "node_stats",
    "producer_stats",
    "text_end",
    "text_head",
    "to_json",
    "topic_json_head",
    "topic_json_tail",
    "topic_stats",
    "topic_text_line",
]


@dataclass(slots=True)
class ClientStats:
    client_id: str
    hostname: str
    version: str
    remote_address: str
    state: int
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    user_agent: str
    authed: bool
    auth_identity: str
    auth_identity_url: str
    pub_counts: tuple[tuple[str, int], ...]
    tls: bool
    tls_cipher_suite: str
    tls_version: str
    tls_negotiated_protocol: str
    tls_negotiated_protocol_is_mutual: bool


@dataclass(slots=True)
class ChannelStats:
    channel_name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    client_count: int
    clients: tuple[ClientStats, ...] | None
    paused: bool
    e2e_processing_latency: E2EResult
    #: messages of its disk queue found damaged or lost (never delivered) since start-up; not in nsqd's schema:
    #: the JSON shows ``damaged_count`` only when it is not 0, so a document from a node without damage is nsqd's
    damaged_count: int = 0
    #: a log channel's (start, committed, end) offsets (LOG-PROTOCOL.md), None for an ordinary channel
    log: tuple[int, int, int] | None = None


@dataclass(slots=True)
class TopicStats:
    topic_name: str
    channels: tuple[ChannelStats, ...]
    depth: int
    backend_depth: int
    message_count: int
    message_bytes: int
    paused: bool
    e2e_processing_latency: E2EResult
    damaged_count: int = 0  # as ChannelStats'


@dataclass(slots=True)
class MemoryStats:
    """nsqd reports Go runtime figures under these names; here they are the interpreter's own:
    allocated blocks, resident and unused-mapped memory, and CPython's collection count."""

    heap_objects: int
    heap_idle_bytes: int
    heap_in_use_bytes: int
    heap_released_bytes: int
    gc_pause_usec_100: int
    gc_pause_usec_99: int
    gc_pause_usec_95: int
    next_gc_bytes: int
    gc_total_runs: int


@dataclass(slots=True)
class NodeStats:
    version: str
    health: str
    start_time: int
    uptime_ns: int
    topics: tuple[TopicStats, ...] | None
    memory: MemoryStats | None
    producers: tuple[ClientStats, ...] | None
    # not part of /stats JSON; /metrics reports them
    tcp_connections: int = 0
    http_connections: int = 0
    # the replication section (nsqd/replication/stats.py), None on a node without replication
    replication: ReplicationStats | None = None

    @property
    def healthy(self) -> bool:
        return self.health == "OK"


# -- collecting ------------------------------------------------------------------------------------------------
def client_stats(client, topic_filter: str | None) -> ClientStats:
    pub_counts = client.pub_counts
    if not pub_counts:
        counts: tuple = ()
    elif topic_filter:
        count = pub_counts.get(topic_filter)
        counts = ((topic_filter, count),) if count is not None else ()
    else:
        counts = tuple(pub_counts.items())
    auth = client.auth_state
    authorizations = getattr(auth, "authorizations", None) if auth is not None else None
    tls = bool(client.tls)
    return ClientStats(
        client_id=client.client_id,
        hostname=client.hostname,
        version="V2",
        remote_address=client.remote_address,
        state=int(client.state),
        ready_count=client.rdy,
        in_flight_count=client.in_flight,
        message_count=client.message_count,
        finish_count=client.finish_count,
        requeue_count=client.requeue_count,
        connect_ts=client.connect_ts,
        sample_rate=client.sample_rate,
        deflate=bool(client.deflate),
        snappy=bool(client.snappy),
        user_agent=client.user_agent,
        authed=bool(authorizations),
        auth_identity=(getattr(auth, "identity", "") or "") if auth is not None else "",
        auth_identity_url=(getattr(auth, "identity_url", "") or "") if auth is not None else "",
        pub_counts=counts,
        tls=tls,
        tls_cipher_suite=client.tls_cipher_suite if tls else "",
        tls_version=client.tls_version if tls else "",
        tls_negotiated_protocol=(getattr(client, "tls_negotiated_protocol", "") or "") if tls else "",
        tls_negotiated_protocol_is_mutual=bool(getattr(client, "tls_negotiated_protocol_is_mutual", False))
        if tls
        else False,
    )


def _e2e(channel, now_ns: int) -> E2EResult:
    window = channel.e2e
    return window.result(now_ns) if window is not None else EMPTY_E2E


def channel_stats(channel, include_clients: bool, topic_filter: str | None, now_ns: int) -> ChannelStats:
    # called for every channel of a full /stats: positional arguments and the depth read once
    clients = channel.clients
    listed = None
    if include_clients:
        listed = tuple([client_stats(c, topic_filter) for c in clients.values()]) if clients else ()
    backend_depth = channel.backend_depth()
    window = channel.e2e
    backend = channel.backend
    return ChannelStats(
        channel.name,
        len(channel.queue) + backend_depth,
        backend_depth,
        len(channel.in_flight),
        len(channel.deferred),
        channel.message_count,
        channel.requeue_count,
        channel.timeout_count,
        len(clients),
        listed,
        channel.paused,
        window.result(now_ns) if window is not None else EMPTY_E2E,
        backend.damaged if backend is not None else 0,
        channel.log.offsets() if channel.log is not None else None,
    )


def topic_stats(topic, channels: tuple[ChannelStats, ...], e2e: E2EResult) -> TopicStats:
    backend_depth = topic.backend_depth()
    backend = topic.backend
    return TopicStats(
        topic.name,
        channels,
        len(topic.queue) + backend_depth,
        backend_depth,
        topic.message_count,
        topic.message_bytes,
        topic.paused,
        e2e,
        backend.damaged if backend is not None else 0,
    )


@contextlib.contextmanager
def gc_paused():
    """No automatic garbage collection while a snapshot is taken and rendered (drop it inside the block). Its
    tens of thousands of short-lived objects would otherwise start collections, and those that are still alive
    at one would be promoted, making full collections of the whole heap (0.3 s at 10,000 topics) come often."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def memory_stats() -> MemoryStats:
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    resident = size = 0
    try:
        with open("/proc/self/statm", "rb") as handle:
            fields = handle.read().split()
        size, resident = int(fields[0]) * page, int(fields[1]) * page
    except (OSError, ValueError, IndexError):
        pass
    runs = sum(generation.get("collections", 0) for generation in gc.get_stats())
    return MemoryStats(
        heap_objects=sys.getallocatedblocks(),
        heap_idle_bytes=max(size - resident, 0),
        heap_in_use_bytes=resident,
        heap_released_bytes=0,
        gc_pause_usec_100=0,
        gc_pause_usec_99=0,
        gc_pause_usec_95=0,
        next_gc_bytes=0,
        gc_total_runs=runs,
    )


def memory_of_processes(parts: list[MemoryStats]) -> MemoryStats:
    """The figures of the workers of one node (``--workers``) as the node's: sums, and the longest pauses."""
    figures = {}
    for field in dataclass_fields(MemoryStats):
        values = [getattr(part, field.name) for part in parts]
        figures[field.name] = max(values) if field.name.startswith("gc_pause") else sum(values)
    return MemoryStats(**figures)


def collect(
    nsqd,
    *,
    topic: str | None = None,
    channel: str | None = None,
    include_clients: bool = True,
    include_mem: bool = True,
) -> NodeStats:
    """The snapshot ``/stats`` reports, with nsqd's filters (see the module notes)."""
    now_ns = time.time_ns()
    quantiles = tuple(nsqd.opts.e2e_processing_latency_percentiles)
    topics: tuple[TopicStats, ...] | None
    producers: tuple[ClientStats, ...] | None = None
    if topic:
        found = nsqd.topics.get(topic)
        chosen = [found] if found is not None else None
    else:
        chosen = sorted(nsqd.topics.values(), key=lambda t: t.name)
    if chosen is None:
        topics = None
    else:
        entries = []
        for t in chosen:
            if channel:
                selected = [t.channels[channel]] if channel in t.channels else None
                if selected is None:
                    continue
            else:
                selected = sorted(t.channels.values(), key=lambda c: c.name)
            channels = tuple(channel_stats(c, include_clients, topic, now_ns) for c in selected)
            # the topic's latency merges all its channels, whichever are listed
            if channel:
                results = [_e2e(c, now_ns) for c in t.channels.values()]
            else:
                results = [c.e2e_processing_latency for c in channels]
            entries.append(topic_stats(t, channels, merge_results(results, quantiles)))
        topics = tuple(entries)
        if include_clients:
            producers = producer_stats(nsqd, topic)
    return node_stats(nsqd, topics, producers, include_mem=include_mem, now_ns=now_ns)


def producer_stats(nsqd, topic: str | None) -> tuple[ClientStats, ...] | None:
    """The connections that have published (their counts for ``topic`` only, when given); None when none has."""
    return tuple(client_stats(c, topic) for c in list(nsqd.clients.values()) if c.pub_counts) or None


def node_stats(nsqd, topics, producers, *, include_mem: bool, now_ns: int) -> NodeStats:
    """The snapshot of the daemon-wide figures, around the given topics and producers."""
    http_server = getattr(nsqd, "http_server", None)
    return NodeStats(
        version=NSQ_VERSION,
        health=nsqd.health(),
        start_time=nsqd.start_time,
        uptime_ns=max(now_ns - nsqd.start_time * 1_000_000_000, 0),
        topics=topics,
        memory=memory_stats() if include_mem else None,
        producers=producers,
        tcp_connections=len(nsqd.clients),
        http_connections=http_server.connections if http_server is not None else 0,
        replication=collect_replication(nsqd) if hasattr(nsqd, "replica_host") else None,
    )


# -- JSON ------------------------------------------------------------------------------------------------------
def _e2e_json(result: E2EResult) -> dict:
    percentiles = None
    if result.percentiles is not None:
        percentiles = [{"quantile": q, "value": v} for q, v in result.percentiles]
    return {"count": result.count, "percentiles": percentiles}


def _client_json(c: ClientStats) -> dict:
    obj = {
        "client_id": c.client_id,
        "hostname": c.hostname,
        "version": c.version,
        "remote_address": c.remote_address,
        "state": c.state,
        "ready_count": c.ready_count,
        "in_flight_count": c.in_flight_count,
        "message_count": c.message_count,
        "finish_count": c.finish_count,
        "requeue_count": c.requeue_count,
        "connect_ts": c.connect_ts,
        "sample_rate": c.sample_rate,
        "deflate": c.deflate,
        "snappy": c.snappy,
        "user_agent": c.user_agent,
    }
    # omitted when empty, as nsqd's omitempty fields
    if c.authed:
        obj["authed"] = True
    if c.auth_identity:
        obj["auth_identity"] = c.auth_identity
    if c.auth_identity_url:
        obj["auth_identity_url"] = c.auth_identity_url
    if c.pub_counts:
        obj["pub_counts"] = [{"topic": topic, "count": count} for topic, count in c.pub_counts]
    obj["tls"] = c.tls
    obj["tls_cipher_suite"] = c.tls_cipher_suite
    obj["tls_version"] = c.tls_version
    obj["tls_negotiated_protocol"] = c.tls_negotiated_protocol
    obj["tls_negotiated_protocol_is_mutual"] = c.tls_negotiated_protocol_is_mutual
    return obj


def _log_json(offsets: tuple[int, int, int]) -> dict:
    return dict(zip(("start", "committed", "end"), offsets, strict=True))


def _channel_json(c: ChannelStats) -> dict:
    obj = {
        "channel_name": c.channel_name,
        "depth": c.depth,
        "backend_depth": c.backend_depth,
        "in_flight_count": c.in_flight_count,
        "deferred_count": c.deferred_count,
        "message_count": c.message_count,
        "requeue_count": c.requeue_count,
        "timeout_count": c.timeout_count,
        "client_count": c.client_count,
        "clients": None if c.clients is None else [_client_json(x) for x in c.clients],
        "paused": c.paused,
        "e2e_processing_latency": _e2e_json(c.e2e_processing_latency),
        **({"damaged_count": c.damaged_count} if c.damaged_count else {}),
    }
    if c.log is not None:
        obj["log"] = _log_json(c.log)
    return obj


def _topic_json(t: TopicStats) -> dict:
    return {
        "topic_name": t.topic_name,
        "channels": [_channel_json(c) for c in t.channels],
        "depth": t.depth,
        "backend_depth": t.backend_depth,
        "message_count": t.message_count,
        "message_bytes": t.message_bytes,
        "paused": t.paused,
        "e2e_processing_latency": _e2e_json(t.e2e_processing_latency),
        **({"damaged_count": t.damaged_count} if t.damaged_count else {}),
    }


def _memory_json(m: MemoryStats) -> dict:
    return {
        "heap_objects": m.heap_objects,
        "heap_idle_bytes": m.heap_idle_bytes,
        "heap_in_use_bytes": m.heap_in_use_bytes,
        "heap_released_bytes": m.heap_released_bytes,
        "gc_pause_usec_100": m.gc_pause_usec_100,
        "gc_pause_usec_99": m.gc_pause_usec_99,
        "gc_pause_usec_95": m.gc_pause_usec_95,
        "next_gc_bytes": m.next_gc_bytes,
        "gc_total_runs": m.gc_total_runs,
    }


def to_json(stats: NodeStats) -> dict:
    """``/stats?format=json``: nsqd's document, keys in nsqd's order (``memory`` only when collected)."""
    obj = {
        "version": stats.version,
        "health": stats.health,
        "start_time": stats.start_time,
        "topics": None if stats.topics is None else [_topic_json(t) for t in stats.topics],
    }
    if stats.memory is not None:
        obj["memory"] = _memory_json(stats.memory)
    obj["producers"] = None if stats.producers is None else [_client_json(p) for p in stats.producers]
    if stats.replication is not None:
        obj["replication"] = replication_json(stats.replication)
    return obj


# -- JSON, written directly ------------------------------------------------------------------------------------
# ``json_body(stats)`` is ``go_json(to_json(stats))`` byte for byte, without building the dicts: one formatted string
# per channel and topic. At 10,000 topics and 20,000 channels the dicts, their encoding and go_json's scans of the
# whole text took most of a /stats request. Topic and channel names need no escaping (their alphabet is
# ``[.a-zA-Z0-9_#-]``); the clients' free-form strings go through ``go_string``.
_BOOL = ("false", "true")
_EMPTY_E2E_JSON = '{"count":0,"percentiles":null}'


def _e2e_body(result: E2EResult) -> str:
    if result.percentiles is None and not result.count:
        return _EMPTY_E2E_JSON
    return go_json_text(_e2e_json(result))


def client_body(c: ClientStats) -> str:
    optional = ""
    if c.authed:
        optional += ',"authed":true'
    if c.auth_identity:
        optional += f',"auth_identity":{go_string(c.auth_identity)}'
    if c.auth_identity_url:
        optional += f',"auth_identity_url":{go_string(c.auth_identity_url)}'
    if c.pub_counts:
        optional += (
            ',"pub_counts":['
            + ",".join(f'{{"topic":"{topic}","count":{count}}}' for topic, count in c.pub_counts)
            + "]"
        )
    return (
        f'{{"client_id":{go_string(c.client_id)},"hostname":{go_string(c.hostname)},'
        f'"version":"{c.version}","remote_address":{go_string(c.remote_address)},"state":{c.state},'
        f'"ready_count":{c.ready_count},"in_flight_count":{c.in_flight_count},'
        f'"message_count":{c.message_count},"finish_count":{c.finish_count},'
        f'"requeue_count":{c.requeue_count},"connect_ts":{c.connect_ts},"sample_rate":{c.sample_rate},'
        f'"deflate":{_BOOL[c.deflate]},"snappy":{_BOOL[c.snappy]},"user_agent":{go_string(c.user_agent)}'
        f'{optional},"tls":{_BOOL[c.tls]},"tls_cipher_suite":{go_string(c.tls_cipher_suite)},'
        f'"tls_version":{go_string(c.tls_version)},'
        f'"tls_negotiated_protocol":{go_string(c.tls_negotiated_protocol)},'
        f'"tls_negotiated_protocol_is_mutual":{_BOOL[c.tls_negotiated_protocol_is_mutual]}}}'
    )


def _clients_body(clients) -> str:
    if clients is None:
        return "null"
    return "[" + ",".join([client_body(c) for c in clients]) + "]"


def channel_json_parts(c: ChannelStats) -> tuple[str, str]:
    """A channel's JSON object around its ``clients`` value: what comes before it and what after."""
    return (
        (
            f'{{"channel_name":"{c.channel_name}","depth":{c.depth},"backend_depth":{c.backend_depth},'
            f'"in_flight_count":{c.in_flight_count},"deferred_count":{c.deferred_count},'
            f'"message_count":{c.message_count},"requeue_count":{c.requeue_count},'
            f'"timeout_count":{c.timeout_count},"client_count":{c.client_count},"clients":'
        ),
        f',"paused":{_BOOL[c.paused]},"e2e_processing_latency":{_e2e_body(c.e2e_processing_latency)}'
        f"{_damaged_body(c.damaged_count)}{_log_body(c.log)}",
    )


def _log_body(log: tuple[int, int, int] | None) -> str:
    """A log channel's offsets and the channel object's closing brace."""
    if log is None:
        return "}"
    start, committed, end = log
    return f',"log":{{"start":{start},"committed":{committed},"end":{end}}}}}'


def _channel_body(c: ChannelStats) -> str:
    head, tail = channel_json_parts(c)
    return head + _clients_body(c.clients) + tail


def topic_json_head(name: str) -> str:
    """A topic's JSON object up to its channels."""
    return f'{{"topic_name":"{name}","channels":['


def topic_json_tail(t: TopicStats) -> str:
    """A topic's JSON object after its channels."""
    return (
        f'],"depth":{t.depth},"backend_depth":{t.backend_depth},"message_count":{t.message_count},'
        f'"message_bytes":{t.message_bytes},"paused":{_BOOL[t.paused]},'
        f'"e2e_processing_latency":{_e2e_body(t.e2e_processing_latency)}{_damaged_body(t.damaged_count)}}}'
    )


def _damaged_body(count: int) -> str:
    return f',"damaged_count":{count}' if count else ""


def _topic_body(t: TopicStats) -> str:
    return topic_json_head(t.topic_name) + ",".join([_channel_body(c) for c in t.channels]) + topic_json_tail(t)


def json_head(stats: NodeStats) -> str:
    """The document up to its topics' value."""
    return (
        f'{{"version":{go_string(stats.version)},"health":{go_string(stats.health)},'
        f'"start_time":{stats.start_time},"topics":'
    )


def json_middle(stats: NodeStats) -> str:
    """The document from after its topics to its producers' value."""
    memory = "" if stats.memory is None else ',"memory":' + go_json_text(_memory_json(stats.memory))
    return memory + ',"producers":'


def json_end(stats: NodeStats) -> str:
    """The document after its producers."""
    replication = (
        "" if stats.replication is None else ',"replication":' + go_json_text(replication_json(stats.replication))
    )
    return replication + "}"


def json_body(stats: NodeStats) -> bytes:
    """``/stats?format=json``: ``go_json(to_json(stats))``, written directly (see above)."""
    topics = "null" if stats.topics is None else "[" + ",".join([_topic_body(t) for t in stats.topics]) + "]"
    return (json_head(stats) + topics + json_middle(stats) + _clients_body(stats.producers) + json_end(stats)).encode(
        "utf-8", "replace"
    )


# -- text ------------------------------------------------------------------------------------------------------
def _e2e_text(result: E2EResult) -> str:
    if not result.percentiles:
        return ""
    return ", ".join(f"p{q * 100:g}={go_duration(int(v))}" for q, v in result.percentiles)


def client_text_parts(c: ClientStats) -> tuple[str, str]:
    """A client's text line around its connection's age (which changes every second)."""
    identity = f"{c.client_id}/{c.hostname}" if c.client_id != c.hostname else c.client_id
    before = (
        f"[{c.version} {c.remote_address:<21}] state: {c.state} inflt: {c.in_flight_count:<4} "
        f"rdy: {c.ready_count:<4} fin: {c.finish_count:<8} re-q: {c.requeue_count:<8} "
        f"msgs: {c.message_count:<8} connected: "
    )
    after = f" ({identity})"
    if c.user_agent:
        after += f" {c.user_agent}"
    if c.pub_counts:
        after += " pub: " + ", ".join(f"{topic}={count}" for topic, count in c.pub_counts)
    return before, after


def connected_text(connect_ts: int, now: int) -> str:
    return go_duration(max(now - connect_ts, 0) * 1_000_000_000)


def _client_text(c: ClientStats, now: int) -> str:
    before, after = client_text_parts(c)
    return before + connected_text(c.connect_ts, now) + after


def _rfc3339(ts: int) -> str:
    text = datetime.datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def text_head(stats: NodeStats) -> list[str]:
    """The text's lines before its topics."""
    out = [
        version_string("nsqd"),
        f"start_time {_rfc3339(stats.start_time)}",
        f"uptime {go_duration(stats.uptime_ns // 1_000_000 * 1_000_000)}",
        "",
        f"Health: {stats.health}",
    ]
    if stats.memory is not None:
        out += ["", "Memory:"]
        out += [f"   {name:<25}\t{value}" for name, value in _memory_json(stats.memory).items()]
    return out


def topic_text_line(t: TopicStats) -> str:
    prefix = "*P " if t.paused else "   "
    return (
        f"{prefix}[{t.topic_name:<15}] depth: {t.depth:<5} be-depth: {t.backend_depth:<5} "
        f"msgs: {t.message_count:<8} e2e%: {_e2e_text(t.e2e_processing_latency)}"
        + (f" damaged: {t.damaged_count}" if t.damaged_count else "")
    )


def _log_text(log: tuple[int, int, int] | None, indent: str) -> str:
    if log is None:
        return ""
    start, committed, end = log
    return f"\n{indent}[log start: {start} committed: {committed} end: {end}]"


def channel_text_line(c: ChannelStats) -> str:
    prefix = "   *P " if c.paused else "      "
    return (
        f"{prefix}[{c.channel_name:<25}] depth: {c.depth:<5} be-depth: {c.backend_depth:<5} "
        f"inflt: {c.in_flight_count:<4} def: {c.deferred_count:<4} re-q: {c.requeue_count:<5} "
        f"timeout: {c.timeout_count:<5} msgs: {c.message_count:<8} "
        f"e2e%: {_e2e_text(c.e2e_processing_latency)}"
        + (f" damaged: {c.damaged_count}" if c.damaged_count else "")
        + _log_text(c.log, " " * len(prefix))
    )


#: the text's line introducing its topics, without topics and with
TOPICS_TEXT = (["", "Topics: None"], ["", "Topics:"])
#: the same for producers
PRODUCERS_TEXT = (["", "Producers: None"], ["", "Producers:"])


def format_text(stats: NodeStats) -> str:
    """``/stats`` without ``format=json``: for people, in nsqd's layout (not an interface contract)."""
    now = int(time.time())
    out = text_head(stats)
    out += TOPICS_TEXT[bool(stats.topics)]
    for t in stats.topics or ():
        out.append(topic_text_line(t))
        for c in t.channels:
            out.append(channel_text_line(c))
            for client in c.clients or ():
                out.append(f"        {_client_text(client, now)}")
    out += PRODUCERS_TEXT[bool(stats.producers)]
    out += [f"   {_client_text(p, now)}" for p in stats.producers or ()]
    out += text_end(stats)
    return "\n".join(out) + "\n"


def text_end(stats: NodeStats) -> list[str]:
    """The text's lines after its producers."""
    return replication_text(stats.replication) if stats.replication is not None else []
