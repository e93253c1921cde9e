"""nsqd's ``/stats`` JSON turned into nsqadmin's shapes, and summed across nodes. Pure functions, no I/O.

``node_topics(stats, node, hostname, now)`` annotates one nsqd's topics: every topic, channel and client gets
``node`` (the nsqd's ``broadcast_address:http_port``) and ``hostname``; topics and channels get ``memory_depth``
(depth − backend_depth); clients get ``connected`` (nanoseconds since ``connect_ts``, whole seconds). The result
keeps nsqadmin's key order, which scripts reading ``/api`` see.

``aggregate_topic`` and ``aggregate_channel`` add up the per-node objects into one with ``node`` ``"*"``; the
per-node objects stay under ``nodes``, the clients of every node are listed together, and the end-to-end
latency windows are merged per quantile (count-weighted average; the minimum and maximum across nodes).
"""

from __future__ import annotations

from typing import Any

__all__ = ["aggregate_channel", "aggregate_topic", "e2e_aggregate", "node_topics", "sum_e2e"]

_CLIENT_KEYS = ("remote_address", "version", "client_id", "hostname", "user_agent", "connect_ts")
_CLIENT_COUNTS = ("in_flight_count", "ready_count", "finish_count", "requeue_count", "message_count", "sample_rate")
_CLIENT_FLAGS = ("deflate", "snappy", "authed")
_TLS_KEYS = (
    ("tls", False),
    ("tls_cipher_suite", ""),
    ("tls_version", ""),
    ("tls_negotiated_protocol", ""),
    ("tls_negotiated_protocol_is_mutual", False),
)
_CHANNEL_SUMS = (
    "depth",
    "memory_depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "requeue_count",
    "timeout_count",
    "message_count",
    "client_count",
)
_TOPIC_SUMS = ("depth", "memory_depth", "backend_depth", "message_count")


def _add_damaged(target: dict, sources) -> None:
    """``damaged_count`` (messages an nsqd found damaged on disk, never delivered; trionsq's, not in nsqd's
    schema): kept, summed, only where it is not 0, so that nsqadmin's answers stay nsqadmin's otherwise."""
    damaged = sum(_int(s.get("damaged_count")) for s in sources)
    if damaged:
        target["damaged_count"] = damaged


def _int(value) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def e2e_aggregate(raw, topic: str, channel: str, host: str) -> dict:
    """One node's e2e window in nsqadmin's form: each percentile gets min = max = average = value."""
    raw = raw if isinstance(raw, dict) else {}
    count = _int(raw.get("count"))
    percentiles = []
    for item in raw.get("percentiles") or ():
        value = float(item.get("value", 0))
        percentiles.append(
            {
                "average": value,
                "count": count,
                "max": value,
                "min": value,
                "quantile": float(item.get("quantile", 0)),
                "value": value,
            }
        )
    return {"count": count, "percentiles": percentiles, "topic": topic, "channel": channel, "host": host}


def sum_e2e(parts: list[dict], topic: str, channel: str) -> dict:
    """Merge per-node e2e aggregates: counts add up; per quantile the count-weighted average is the value."""
    total = sum(part["count"] for part in parts)
    merged: dict[float, dict] = {}
    for part in parts:
        for p in part["percentiles"]:
            entry = merged.get(p["quantile"])
            if entry is None:
                merged[p["quantile"]] = dict(p)
                continue
            weight = entry["count"] + p["count"]
            if weight:
                entry["average"] = (entry["average"] * entry["count"] + p["average"] * p["count"]) / weight
            entry["count"] = weight
            entry["min"] = min(entry["min"], p["min"])
            entry["max"] = max(entry["max"], p["max"])
            entry["value"] = entry["average"]
    percentiles = [merged[q] for q in sorted(merged, reverse=True)]
    return {"count": total, "percentiles": percentiles, "topic": topic, "channel": channel, "host": "*"}


def _client(raw: dict, node: str, now: int) -> dict:
    client: dict[str, Any] = {"node": node}
    for key in _CLIENT_KEYS:
        client[key] = raw.get(key, 0 if key == "connect_ts" else "")
    connect_ts = _int(raw.get("connect_ts"))
    client["connected"] = max(0, now - connect_ts) * 1_000_000_000 if connect_ts else 0
    for key in _CLIENT_COUNTS:
        client[key] = _int(raw.get(key))
    for key in _CLIENT_FLAGS:
        client[key] = bool(raw.get(key, False))
    client["auth_identity"] = raw.get("auth_identity", "")
    client["auth_identity_url"] = raw.get("auth_identity_url", "")
    for key, default in _TLS_KEYS:
        client[key] = raw.get(key, default)
    return client


def _channel(raw: dict, topic: str, node: str, hostname: str, now: int) -> dict:
    name = raw.get("channel_name", "")
    depth, backend = _int(raw.get("depth")), _int(raw.get("backend_depth"))
    clients = [_client(c, node, now) for c in raw.get("clients") or ()]
    clients.sort(key=lambda c: (c["hostname"], c["client_id"], c["remote_address"]))
    return {
        "node": node,
        "hostname": hostname,
        "topic_name": topic,
        "channel_name": name,
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "in_flight_count": _int(raw.get("in_flight_count")),
        "deferred_count": _int(raw.get("deferred_count")),
        "requeue_count": _int(raw.get("requeue_count")),
        "timeout_count": _int(raw.get("timeout_count")),
        "message_count": _int(raw.get("message_count")),
        "client_count": _int(raw.get("client_count")),
        "nodes": None,
        "clients": clients,
        "paused": bool(raw.get("paused", False)),
        "e2e_processing_latency": e2e_aggregate(raw.get("e2e_processing_latency"), topic, name, node),
        "log": _log(raw.get("log")),
    } | _damaged(raw)


def _damaged(raw: dict) -> dict:
    out: dict = {}
    _add_damaged(out, (raw,))
    return out


def _log(raw) -> dict | None:
    """A log channel's offsets (nsqd/LOG-PROTOCOL.md) as nsqd gives them, None for an ordinary channel. Offsets are
    per node: the channel page lists each node's, and they are never summed."""
    if not isinstance(raw, dict):
        return None
    return {key: _int(raw.get(key)) for key in ("start", "committed", "end")}


def node_topics(stats: dict, node: str, hostname: str, now: int) -> list[dict]:
    """The topics of one nsqd's ``/stats?format=json`` answer in nsqadmin's per-node form, sorted by name."""
    topics = []
    for raw in stats.get("topics") or ():
        name = raw.get("topic_name", "")
        depth, backend = _int(raw.get("depth")), _int(raw.get("backend_depth"))
        channels = [_channel(c, name, node, hostname, now) for c in raw.get("channels") or ()]
        channels.sort(key=lambda c: c["channel_name"])
        topics.append(
            {
                "node": node,
                "hostname": hostname,
                "topic_name": name,
                "depth": depth,
                "memory_depth": depth - backend,
                "backend_depth": backend,
                "message_count": _int(raw.get("message_count")),
                "nodes": None,
                "channels": channels,
                "paused": bool(raw.get("paused", False)),
                "e2e_processing_latency": e2e_aggregate(raw.get("e2e_processing_latency"), name, "", node),
            }
            | _damaged(raw)
        )
    topics.sort(key=lambda t: t["topic_name"])
    return topics


def aggregate_channel(topic: str, channel: str, per_node: list[dict]) -> dict:
    """Per-node channel objects of one channel summed into one (``node`` ``"*"``)."""
    total: dict[str, Any] = {"node": "*", "hostname": "", "topic_name": topic, "channel_name": channel}
    for key in _CHANNEL_SUMS:
        total[key] = sum(c[key] for c in per_node)
    nodes = sorted(per_node, key=lambda c: (c["hostname"], c["node"]))
    clients = [client for c in nodes for client in c["clients"]]
    clients.sort(key=lambda c: (c["hostname"], c["client_id"], c["node"], c["remote_address"]))
    total["nodes"] = nodes
    total["clients"] = clients
    total["paused"] = any(c["paused"] for c in per_node)
    total["e2e_processing_latency"] = sum_e2e([c["e2e_processing_latency"] for c in per_node], topic, channel)
    _add_damaged(total, per_node)
    total["log"] = None  # per node only (``nodes``)
    return total


def aggregate_topic(topic: str, per_node: list[dict]) -> dict:
    """Per-node topic objects of one topic summed into one; channels are summed per name."""
    total: dict[str, Any] = {"node": "*", "hostname": "", "topic_name": topic}
    for key in _TOPIC_SUMS:
        total[key] = sum(t[key] for t in per_node)
    total["nodes"] = sorted(per_node, key=lambda t: (t["hostname"], t["node"]))
    by_channel: dict[str, list[dict]] = {}
    for t in per_node:
        for c in t["channels"]:
            by_channel.setdefault(c["channel_name"], []).append(c)
    total["channels"] = [aggregate_channel(topic, name, by_channel[name]) for name in sorted(by_channel)]
    total["paused"] = any(t["paused"] for t in per_node)
    total["e2e_processing_latency"] = sum_e2e([t["e2e_processing_latency"] for t in per_node], topic, "")
    _add_damaged(total, per_node)
    return total
