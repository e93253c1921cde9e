"""The ``replication`` section of ``/stats`` (JSON and text) and its source for ``/metrics``.

One snapshot (``ReplicationStats``) from the origin's ``Replicator`` (peers, lag) and the replica's
``ReplicaHost`` (stores per origin, takeovers), and the duplicates after takeover the node learnt of. It is present only
on a node that replicates or holds copies, so the document of a plain nsqd stays nsqd's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .host import OriginStatistics
from .sender import ReplicatorStatistics

__all__ = [
    "ReplicationStats",
    "collect_replication",
    "replication_json",
    "replication_metrics",
    "replication_text",
]


@dataclass(frozen=True)
class ReplicationStats:
    node: str
    origin: ReplicatorStatistics | None  # None without --replicate-to
    replicas: tuple[OriginStatistics, ...]
    takeovers: int
    adopted_messages: int
    #: held copies a takeover here left to the replica of the same origin that had adopted them already
    left_to_peers: int
    #: messages of this node a replica adopted that this node had finished (PROTOCOL.md, "Duplicates after
    #: takeover"): delivered twice
    duplicates_after_takeover: int
    duplicates_received: int  # copies an origin sent again while this replica held them (resent frames)


def collect_replication(nsqd) -> ReplicationStats | None:
    replication = nsqd.replication
    host = nsqd.replica_host
    if replication is None and not host.origins:
        return None
    return ReplicationStats(
        node=nsqd.node_name if nsqd.tcp_address else "",
        origin=replication.statistics() if replication is not None else None,
        replicas=tuple(host.statistics()),
        takeovers=host.takeovers,
        adopted_messages=host.adopted_messages,
        left_to_peers=host.left_to_peers,
        duplicates_after_takeover=nsqd.duplicates_after_takeover,
        duplicates_received=sum(o.store.duplicates for o in host.origins.values()),
    )


def replication_json(stats: ReplicationStats) -> dict:
    origin = stats.origin
    return {
        "node": stats.node,
        "state": "off" if origin is None else ("degraded" if origin.degraded else "replicating"),
        "acks_required": 0 if origin is None else origin.acks_required,
        "degraded_mode": "" if origin is None else origin.degraded_mode,
        "unreplicated_messages": 0 if origin is None else origin.unreplicated_messages,
        "accepted_unreplicated": 0 if origin is None else origin.accepted_unreplicated,
        "restored_messages": 0 if origin is None else origin.restored_messages,
        "replaced_peers": 0 if origin is None else origin.replaced_peers,
        "peers": [] if origin is None else [asdict(p) for p in origin.peers],
        "replicas": [asdict(r) for r in stats.replicas],
        "takeovers": stats.takeovers,
        "adopted_messages": stats.adopted_messages,
        "left_to_peers": stats.left_to_peers,
        "duplicates_after_takeover": stats.duplicates_after_takeover,
        "duplicates_received": stats.duplicates_received,
    }


def replication_text(stats: ReplicationStats) -> list[str]:
    doc = replication_json(stats)
    out = [
        "",
        f"Replication: {doc['state']} (node {doc['node']}, acks {doc['acks_required']}, "
        f"degraded: {doc['degraded_mode'] or '-'}, unreplicated: {doc['unreplicated_messages']})",
    ]
    for p in doc["peers"]:
        out.append(
            f"   peer [{p['address']:<21}] state: {p['state']:<10} acked: {p['acked']:<8} "
            f"pending: {p['pending_messages']} msgs / {p['pending_bytes']} bytes protocol: v{p['version']}"
            + (f" round trip: {p['round_trip_ms']} ms" if p["round_trip_ms"] is not None else "")
            + (" LAGGING (needs backfill)" if p["lagging"] else "")
        )
    for r in doc["replicas"]:
        out.append(
            f"   replica of [{r['node']:<21}] state: {r['state']:<10} held: {r['held_messages']} msgs / "
            f"{r['held_bytes']} bytes epoch: {r['epoch']}"
            + (f" DAMAGED: {r['damaged_records']} record(s), backfill asked" if r["damaged_records"] else "")
        )
    if doc["restored_messages"]:
        out.append(f"   restored from replicas after damage: {doc['restored_messages']} message(s)")
    out.append(
        f"   takeovers: {doc['takeovers']} adopted: {doc['adopted_messages']} "
        f"left to other replicas: {doc['left_to_peers']} "
        f"duplicates after takeover: {doc['duplicates_after_takeover']} "
        f"copies received twice: {doc['duplicates_received']}"
    )
    return out


def replication_metrics(stats: ReplicationStats):
    """The ``nsqd_replication_*`` families (``metrics.py`` yields them when the section exists)."""
    origin = stats.origin
    if origin is not None:
        yield GaugeMetricFamily(
            "nsqd_replication_degraded", "1 while fewer peers are connected than required", value=int(origin.degraded)
        )
        yield GaugeMetricFamily(
            "nsqd_replication_unreplicated_messages",
            "Messages not yet held by enough peers",
            value=origin.unreplicated_messages,
        )
        yield CounterMetricFamily(
            "nsqd_replication_accepted_unreplicated",
            "Messages accepted while degraded (--replication-degraded=accept)",
            value=origin.accepted_unreplicated,
        )
        yield CounterMetricFamily(
            "nsqd_replication_restored_messages",
            "Messages this node lost to damaged files and got back from its replicas' copies",
            value=origin.restored_messages,
        )
        connected = GaugeMetricFamily(
            "nsqd_replication_peer_connected", "1 while the peer is connected", labels=["peer"]
        )
        pending = GaugeMetricFamily(
            "nsqd_replication_peer_pending_messages", "Messages the peer has not acknowledged", labels=["peer"]
        )
        pending_bytes = GaugeMetricFamily(
            "nsqd_replication_peer_pending_bytes", "Bytes of frames the peer has not acknowledged", labels=["peer"]
        )
        round_trip = GaugeMetricFamily(
            "nsqd_replication_peer_round_trip_seconds",
            "The last heartbeat's round trip to the peer (protocol version 2)",
            labels=["peer"],
        )
        for peer in origin.peers:
            connected.add_metric([peer.address], int(peer.state == "connected"))
            pending.add_metric([peer.address], peer.pending_messages)
            pending_bytes.add_metric([peer.address], peer.pending_bytes)
            if peer.round_trip_ms is not None:
                round_trip.add_metric([peer.address], peer.round_trip_ms / 1000)
        yield from (connected, pending, pending_bytes, round_trip)
    held = GaugeMetricFamily("nsqd_replica_held_messages", "Messages held for an origin", labels=["origin"])
    held_bytes = GaugeMetricFamily("nsqd_replica_held_bytes", "Body bytes held for an origin", labels=["origin"])
    damaged = CounterMetricFamily(
        "nsqd_replica_damaged_records",
        "Records of an origin's store found damaged or lost (a new backfill is asked for)",
        labels=["origin"],
    )
    for replica in stats.replicas:
        held.add_metric([replica.node], replica.held_messages)
        held_bytes.add_metric([replica.node], replica.held_bytes)
        damaged.add_metric([replica.node], replica.damaged_records)
    yield from (held, held_bytes, damaged)
    yield CounterMetricFamily("nsqd_replica_takeovers", "Origins taken over by this node", value=stats.takeovers)
    yield CounterMetricFamily(
        "nsqd_replica_adopted_messages", "Messages adopted at takeovers", value=stats.adopted_messages
    )
    yield CounterMetricFamily(
        "nsqd_replica_left_to_peers",
        "Held copies a takeover left to another replica of the origin that had adopted them",
        value=stats.left_to_peers,
    )
    yield CounterMetricFamily(
        "nsqd_replication_duplicates_after_takeover",
        "Messages of this node a replica adopted after this node had finished them",
        value=stats.duplicates_after_takeover,
    )
