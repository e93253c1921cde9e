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

Storage is columnar and tiered, so that its memory is a small constant per series (see ``History``): a series
keeps only the columns its pages draw, as 64-bit integers in two rings shared by every series, the newest
``SPARK_POINTS + 1`` samples at full resolution and older samples thinned to ``OLD_POINTS`` over the rest of
``duration``. A series absent from every kept sample is dropped.
A sample that fails completely is skipped and logged; the graphs show a gap at its time.
"""

from __future__ import annotations

import logging
import math
import time
from array import array
from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import trio

from .cluster import Cluster, ClusterError
from .stats import _int

__all__ = ["History", "Sampler"]

log = logging.getLogger("nsqadmin")

Values = tuple[int, int, int, int, int] | list[int]
MESSAGES, DEPTH, IN_FLIGHT, DEFERRED, CHANNEL_DEPTH = range(5)
SPARK_POINTS = 60


def _add(table: dict, key: tuple, values: list[int]) -> None:
    old = table.get(key)
    if old is None:
        table[key] = values
    else:
        for i, value in enumerate(values):
            old[i] += value


def reduce_sample(per_node: list[tuple[str, list[dict]]]) -> dict[tuple, list[int]]:
    """One sample's series values from per-node topic lists: the topics of nsqd's ``/stats`` as they come
    (or in ``stats.node_topics`` form; the keys read are the same). Values that are not numbers count as 0."""
    cluster = [0, 0, 0, 0, 0]
    table: dict[tuple, list[int]] = {("cluster",): cluster}
    for node, topics in per_node:
        whole_node = table.setdefault(("node", node), [0, 0, 0, 0, 0])
        for topic in topics:
            name = topic.get("topic_name", "")
            in_flight = deferred = channel_depth = 0
            for channel in topic.get("channels") or ():
                depth, flight, later = (
                    _int(channel.get("depth")),
                    _int(channel.get("in_flight_count")),
                    _int(channel.get("deferred_count")),
                )
                _add(
                    table,
                    ("channel", name, channel.get("channel_name", "")),
                    [_int(channel.get("message_count")), depth, flight, later, 0],
                )
                in_flight += flight
                deferred += later
                channel_depth += depth
            messages, depth = _int(topic.get("message_count")), _int(topic.get("depth"))
            _add(table, ("topic", name), [messages, depth, in_flight, deferred, channel_depth])
            table[("topic_node", name, node)] = [messages, depth, in_flight, deferred, channel_depth]
            for whole in (whole_node, cluster):
                whole[MESSAGES] += messages
                whole[DEPTH] += depth + channel_depth
                whole[IN_FLIGHT] += in_flight
                whole[DEFERRED] += deferred
                whole[CHANNEL_DEPTH] += channel_depth
    return table


def _rate(previous: int | None, current: int | None, seconds: float) -> float | None:
    if previous is None or current is None or seconds <= 0:
        return None
    delta = current - previous
    if delta < 0:
        return None
    return round(delta / seconds, 3)


#: the columns kept per kind of series (what its graphs and tables show)
COLUMNS = {
    "cluster": (MESSAGES, DEPTH),
    "node": (MESSAGES, DEPTH),
    "topic": (MESSAGES, DEPTH, CHANNEL_DEPTH),
    "channel": (MESSAGES, DEPTH, IN_FLIGHT, DEFERRED),
    "topic_node": (MESSAGES,),
}
_NAMES = (("depth", DEPTH), ("in_flight", IN_FLIGHT), ("deferred", DEFERRED), ("channel_depth", CHANNEL_DEPTH))
OLD_POINTS = 60
ABSENT = -(2**63)  # no value in this sample


class _Ring:
    """Sample times of one tier: slot ``n % size`` holds the ``n``-th sample of the tier."""

    __slots__ = ("size", "times", "count")

    def __init__(self, size: int) -> None:
        self.size = size
        self.times = [0.0] * size
        self.count = 0

    def slots(self) -> list[tuple[float, int]]:
        """(time, slot) of the samples held, oldest first."""
        first = max(0, self.count - self.size)
        return [(self.times[n % self.size], n % self.size) for n in range(first, self.count)]


class _Series:
    """One key's values: ``columns`` ints per slot of each tier (``ABSENT`` where the key was not sampled)."""

    __slots__ = ("columns", "recent", "old", "last_seen")

    def __init__(self, columns: tuple[int, ...], recent: int, old: int) -> None:
        self.columns = columns
        self.recent = array("q", [ABSENT]) * (recent * len(columns))
        self.old = array("q", [ABSENT]) * (old * len(columns))
        self.last_seen = 0.0

    def put(self, tier: array, slot: int, values: Values | None) -> None:
        width = len(self.columns)
        if values is None:
            tier[slot * width : (slot + 1) * width] = array("q", [ABSENT]) * width
        else:
            for i, column in enumerate(self.columns):
                tier[slot * width + i] = values[column]

    def get(self, tier: array, slot: int, column: int) -> int | None:
        try:
            index = self.columns.index(column)
        except ValueError:
            return None
        value = tier[slot * len(self.columns) + index]
        return None if value == ABSENT else value


class History:
    """The bounded history of samples; ``series`` and ``overview`` answer the graph endpoints.

    Memory: per series ``8 x columns x (recent + old)`` bytes of values (``COLUMNS``; 121 slots with the
    defaults, e.g. 2.9 kB for a topic) plus about 300 bytes of key and bookkeeping, whatever the number of
    samples kept; ``bytes_per_series`` says it for a kind.
    """

    def __init__(self, interval: float, duration: float) -> None:
        self.interval = interval
        self.duration = duration
        samples = max(2, int(duration / interval) + 1)
        recent = min(samples, SPARK_POINTS + 1)
        # every stride-th sample also goes to the old ring, whose OLD_POINTS + 1 slots span the whole duration
        self.stride = math.ceil(samples / OLD_POINTS)
        self.recent = _Ring(recent)
        self.old = _Ring(OLD_POINTS + 1 if samples > recent else 0)
        self.keys: dict[tuple, _Series] = {}

    def record(self, when: float, table: Mapping[tuple[Any, ...], Values]) -> None:
        recent, old = self.recent, self.old
        slot = recent.count % recent.size
        recent.times[slot] = when
        thin = old.size and recent.count % self.stride == 0
        old_slot = old.count % old.size if thin else 0
        if thin:
            old.times[old_slot] = when
        for key in table:
            if key not in self.keys:
                self.keys[key] = _Series(COLUMNS[key[0]], recent.size, old.size)
        oldest = self._times()[0][0] if self.__len__() else when
        gone: list[tuple[Any, ...]] = []
        for key, series in self.keys.items():
            row = table.get(key)
            series.put(series.recent, slot, row)
            if thin:
                series.put(series.old, old_slot, row)
            if row is not None:
                series.last_seen = when
            elif series.last_seen < oldest:
                gone.append(key)
        for key in gone:
            del self.keys[key]
        recent.count += 1
        if thin:
            old.count += 1

    def __len__(self) -> int:
        return min(self.recent.count, self.recent.size) + min(self.old.count, self.old.size)

    def bytes_per_series(self, kind: str) -> int:
        """Bytes of values one series of ``kind`` holds (its arrays' buffers)."""
        return 8 * len(COLUMNS[kind]) * (self.recent.size + self.old.size)

    def _times(self) -> list[tuple[float, str, int]]:
        """(time, tier, slot) of every kept sample, oldest first: the thinned samples within ``duration`` and
        older than the recent ones, then the recent ones."""
        recent = self.recent.slots()
        if not recent:
            return []
        start, horizon = recent[0][0], recent[-1][0] - self.duration
        kept = [(when, "old", slot) for when, slot in self.old.slots() if horizon <= when < start]
        return kept + [(when, "recent", slot) for when, slot in recent]

    def series(self, key: tuple) -> dict:
        """Timestamps and aligned values of one key, from the first sample that has it: ``rate`` (messages/s;
        null where unknown), ``depth``, ``in_flight``, ``deferred`` and ``channel_depth`` (null where the key
        was absent or does not keep that column)."""
        timestamps: list[float] = []
        columns: dict[str, list] = {"rate": [], "depth": [], "in_flight": [], "deferred": [], "channel_depth": []}
        found = self.keys.get(key)
        if found is None:
            return {"interval": self.interval, "timestamps": timestamps, **columns}
        started = False
        previous_time, previous = None, None
        for when, tier, slot in self._times():
            values = found.recent if tier == "recent" else found.old
            current = found.get(values, slot, MESSAGES)
            if not started and current is None:
                continue
            started = True
            timestamps.append(round(when, 3))
            columns["rate"].append(_rate(previous, current, when - previous_time) if previous_time else None)
            for name, column in _NAMES:
                columns[name].append(found.get(values, slot, column))
            previous_time, previous = when, current
        return {"interval": self.interval, "timestamps": timestamps, **columns}

    def latest_rates(self, kind: str, sparklines=None) -> dict[str, dict]:
        """For every key of ``kind`` (``topic`` or ``node``) in the newest sample: its last rate, depth and
        message count, and for the names in ``sparklines`` (every name when None) the last rates as a
        sparkline."""
        if not self.recent.count:
            return {}
        recent = self.recent.slots()[-(SPARK_POINTS + 1) :]
        newest_time, newest = recent[-1]
        before_time, before = recent[-2] if len(recent) > 1 else (newest_time, None)
        columns = COLUMNS[kind]
        width, messages, depth = len(columns), columns.index(MESSAGES), columns.index(DEPTH)
        result = {}
        for key, series in self.keys.items():
            if key[0] != kind or series.last_seen != newest_time:
                continue
            tier = series.recent
            count = tier[newest * width + messages]
            entry: dict[str, Any] = {"rate": None, "depth": tier[newest * width + depth], "message_count": count}
            if before is not None:
                previous = tier[before * width + messages]
                entry["rate"] = _rate(None if previous == ABSENT else previous, count, newest_time - before_time)
            if sparklines is None or key[1] in sparklines:
                entry["rates"] = [
                    _rate(series.get(tier, a, MESSAGES), series.get(tier, b, MESSAGES), t1 - t0)
                    for (t0, a), (t1, b) in pairwise(recent)
                ]
            result[key[1]] = entry
        return result

    def child_rates(self, kind: str, parent: str) -> dict[str, float | None]:
        """The newest rate of every ``(kind, parent, child)`` key, by child: a topic's nodes or channels."""
        recent = self.recent.slots()
        if len(recent) < 2:
            return {}
        (t0, before), (t1, after) = recent[-2], recent[-1]
        return {
            key[2]: _rate(
                series.get(series.recent, before, MESSAGES), series.get(series.recent, after, MESSAGES), t1 - t0
            )
            for key, series in self.keys.items()
            if key[0] == kind and key[1] == parent and series.last_seen == t1
        }

    def overview(self, sparklines=None) -> dict:
        """The cluster's graph, every node with its sparkline, and every topic (with a sparkline for the
        topics named in ``sparklines``, or for all when None)."""
        cluster = self.series(("cluster",))
        return {
            "interval": self.interval,
            "timestamps": cluster["timestamps"],
            "rate": cluster["rate"],
            "depth": cluster["depth"],
            "topics": self.latest_rates("topic", sparklines),
            "nodes": self.latest_rates("node"),
        }


class Sampler:
    """Samples the cluster into ``history`` every interval until cancelled."""

    def __init__(self, cluster: Cluster, history: History) -> None:
        self.cluster = cluster
        self.history = history

    async def sample_once(self) -> None:
        warnings: list[str] = []
        producers = await self.cluster.producers(warnings)
        per_node = await self.cluster.raw_node_stats(producers, warnings, include_clients=False)
        self.history.record(time.time(), reduce_sample([(p.name, stats.get("topics") or []) for p, stats in per_node]))

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
