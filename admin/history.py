"""Graphs without Graphite: the cluster sampled every ``--history-interval`` into a bounded in-memory history.

Each sample is one fan-out (the node list, then every node's ``/stats`` without clients) reduced to a few
numbers per series key:

    ("cluster",)            every topic on every node
    ("topic", T)            topic T summed over its nodes
    ("channel", T, C)       channel C of T summed over its nodes
    ("node", N)             every topic on node N
    ("topic_node", T, N)    topic T on node N

and per key the tuple ``(message_count, depth, in_flight, deferred, channel_depth)``. ``message_count`` is a
counter (published to the topic, or put into the channel); the others are gauges. Rates are computed when
asked: (count − previous count) / (time between the samples). A counter that went down (a node restarted, a
topic deleted and created again) gives no rate for that step rather than a negative one.

The store keeps the last ``duration / interval`` samples in a deque (one dict per sample), so memory is
bounded by the number of series times the number of samples, about 720 with the defaults (5 s, 1 h).
A sample that fails completely is skipped and logged; the graphs show a gap at its time.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque

import trio

from .cluster import Cluster, ClusterError

__all__ = ["History", "Sampler"]

log = logging.getLogger("nsqadmin")

Values = tuple[int, int, int, int, int]
MESSAGES, DEPTH, IN_FLIGHT, DEFERRED, CHANNEL_DEPTH = range(5)
SPARK_POINTS = 60


def _add(table: dict, key: tuple, values: Values) -> None:
    old = table.get(key)
    table[key] = values if old is None else tuple(a + b for a, b in zip(old, values))


def reduce_sample(per_node: list[tuple[str, list[dict]]]) -> dict[tuple, Values]:
    """One sample's series values from per-node topic lists (``stats.node_topics`` form)."""
    table: dict[tuple, Values] = {("cluster",): (0, 0, 0, 0, 0)}
    for node, topics in per_node:
        _add(table, ("node", node), (0, 0, 0, 0, 0))
        for topic in topics:
            name = topic["topic_name"]
            in_flight = deferred = channel_depth = 0
            for channel in topic["channels"]:
                values = (channel["message_count"], channel["depth"], channel["in_flight_count"],
                          channel["deferred_count"], 0)
                _add(table, ("channel", name, channel["channel_name"]), values)
                in_flight += channel["in_flight_count"]
                deferred += channel["deferred_count"]
                channel_depth += channel["depth"]
            values = (topic["message_count"], topic["depth"], in_flight, deferred, channel_depth)
            _add(table, ("topic", name), values)
            _add(table, ("topic_node", name, node), values)
            whole = (topic["message_count"], topic["depth"] + channel_depth, in_flight, deferred, channel_depth)
            _add(table, ("node", node), whole)
            _add(table, ("cluster",), whole)
    return table


def _rate(previous: Values | None, current: Values | None, seconds: float) -> float | None:
    if previous is None or current is None or seconds <= 0:
        return None
    delta = current[MESSAGES] - previous[MESSAGES]
    if delta < 0:
        return None
    return round(delta / seconds, 3)


class History:
    """The bounded history of samples; ``series`` and ``overview`` answer the graph endpoints."""

    def __init__(self, interval: float, duration: float) -> None:
        self.interval = interval
        self.samples: deque[tuple[float, dict[tuple, Values]]] = deque(maxlen=max(2, int(duration / interval) + 1))

    def record(self, when: float, table: dict[tuple, Values]) -> None:
        self.samples.append((when, table))

    def __len__(self) -> int:
        return len(self.samples)

    def series(self, key: tuple) -> dict:
        """Timestamps and aligned values of one key, from the first sample that has it: ``rate`` (messages/s;
        null where unknown), ``depth``, ``in_flight``, ``deferred`` and ``channel_depth`` (null where the key
        was absent)."""
        timestamps: list[float] = []
        columns: dict[str, list] = {"rate": [], "depth": [], "in_flight": [], "deferred": [], "channel_depth": []}
        previous_time, previous = None, None
        samples = list(self.samples)
        first = next((i for i, (_when, table) in enumerate(samples) if key in table), len(samples))
        for when, table in samples[first:]:
            current = table.get(key)
            timestamps.append(round(when, 3))
            columns["rate"].append(_rate(previous, current, when - previous_time) if previous_time else None)
            for name, index in (("depth", DEPTH), ("in_flight", IN_FLIGHT), ("deferred", DEFERRED),
                                ("channel_depth", CHANNEL_DEPTH)):
                columns[name].append(current[index] if current is not None else None)
            previous_time, previous = when, current
        return {"interval": self.interval, "timestamps": timestamps, **columns}

    def latest_rates(self, kind: str) -> dict[str, dict]:
        """For every key of ``kind`` (``topic`` or ``node``) in the newest sample: its last rate, depth and the
        last rates as a sparkline."""
        if not self.samples:
            return {}
        recent = list(self.samples)[-(SPARK_POINTS + 1):]
        newest = recent[-1][1]
        result = {}
        for key, values in newest.items():
            if key[0] != kind:
                continue
            rates = []
            for (t0, a), (t1, b) in zip(recent, recent[1:]):
                rates.append(_rate(a.get(key), b.get(key), t1 - t0))
            result[key[1]] = {"rate": rates[-1] if rates else None, "depth": values[DEPTH],
                              "message_count": values[MESSAGES], "rates": rates}
        return result

    def child_rates(self, kind: str, parent: str) -> dict[str, float | None]:
        """The newest rate of every ``(kind, parent, child)`` key, by child: a topic's nodes or channels."""
        if len(self.samples) < 2:
            return {}
        (t0, before), (t1, after) = self.samples[-2], self.samples[-1]
        return {key[2]: _rate(before.get(key), values, t1 - t0) for key, values in after.items()
                if key[0] == kind and key[1] == parent}

    def overview(self) -> dict:
        cluster = self.series(("cluster",))
        return {"interval": self.interval, "timestamps": cluster["timestamps"], "rate": cluster["rate"],
                "depth": cluster["depth"], "topics": self.latest_rates("topic"), "nodes": self.latest_rates("node")}


class Sampler:
    """Samples the cluster into ``history`` every interval until cancelled."""

    def __init__(self, cluster: Cluster, history: History) -> None:
        self.cluster = cluster
        self.history = history

    async def sample_once(self) -> None:
        warnings: list[str] = []
        producers = await self.cluster.producers(warnings)
        per_node = await self.cluster.node_stats(producers, warnings, include_clients=False)
        self.history.record(time.time(), reduce_sample([(p.name, topics) for p, topics in per_node]))

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        interval = self.history.interval
        next_tick = trio.current_time()
        while True:
            try:
                await self.sample_once()
            except ClusterError as exc:
                log.warning("HISTORY: sample failed - %s", exc)
            # ticks stay on a fixed grid; a slow sample skips the ticks it overran
            now = trio.current_time()
            next_tick += interval * max(1, math.ceil((now - next_tick) / interval))
            await trio.sleep_until(next_tick)
