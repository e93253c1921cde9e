"""``Trigger.AvailableNow`` on the driver path: where the query ends on each nsqd.

A log channel says where its end is (the log path fixes the end at the offsets nsqd answers);
NSQ's nsqd 1.3.0 does not, but its HTTP API says how many of a channel's messages wait:
``GET /stats?format=json&topic=T&channel=C`` gives the topic's ``depth`` (published, not yet
copied to the channels) and the channel's ``depth``, ``in_flight_count`` (with each client's)
and ``deferred_count``. At the query's first trigger, for each nsqd its consumer reads::

    target = logged + topic depth + channel depth + in flight - (logged, not FIN'd yet)

the stats asked first and the log's end read after, so that a message logged in between counts
twice (a target too high, which the rules below end) and never not at all; the stats are asked
again (up to ``_MEASURES`` times) while the consumer logged something meanwhile. The last term is the
``ackMode=commit`` messages the log holds and nsqd counts in flight. Deferred messages are not
available now (their time has not come), nor is anything of a paused topic or channel.

The query then goes on, in as many batches as ``maxBytesPerTrigger`` and ``maxOffsetsPerTrigger``
make, and ends for an nsqd once

1. its log reached the target (a number of messages, since NSQ keeps no order: messages
   published after the start may come first, and count towards it; the end never passes it), or
2. nsqd has nothing more for this query: topic and channel depth 0 and nothing in flight to its
   consumer but what it logged (messages in flight to other consumers of the channel are theirs),
   or the topic or channel is paused, or
3. its consumer, free to receive (not held at RDY 0 by ``maxBacklogMessages``), logged nothing
   for ``STALL_SECONDS`` (nsqd unreachable or stalled; logged as a warning).

Spark ends an AvailableNow query at the first trigger that finds no new data, so ``bound``
waits, polling, until some nsqd not yet ended has logged more or every one has ended: each
wait is bounded by rule 3, and the targets by rule 1, so the query always ends.

nsqd's HTTP API: lookupd lists each nsqd's HTTP port; an address of ``nsqd.tcp.addresses`` is
tried at its port + 1 (NSQ's 4150 and 4151), accepted when ``/info`` names the same TCP port.
Without it the end is estimated: an nsqd ends once its consumer, free to receive, logged
nothing for ``IDLE_SECONDS``.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

from .consumer import ConsumerGroup, NsqdConsumer
from .wal import MessageLog

__all__ = ["IDLE_SECONDS", "STALL_SECONDS", "AvailableNowEnd", "ChannelStats", "channel_stats", "find_http_address"]

log = logging.getLogger("spark_connector.available_now")

STALL_SECONDS = 30.0
IDLE_SECONDS = 1.0
_HTTP_TIMEOUT = 5.0
_STATS_INTERVAL = 0.5
_POLL_SECONDS = 0.05
_MEASURES = 10


@dataclass(frozen=True)
class ChannelStats:
    """What nsqd's ``/stats`` says of one channel of one topic."""

    topic_depth: int = 0
    depth: int = 0
    in_flight: int = 0
    deferred: int = 0
    paused: bool = False  # the topic or the channel
    clients_in_flight: Mapping[str, int] = field(default_factory=dict)  # remote_address -> in flight

    @property
    def waiting(self) -> int:
        """Messages this channel will hand out that nobody has finished: none while paused."""
        return 0 if self.paused else self.topic_depth + self.depth + self.in_flight


def _get_json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT) as response:
            found = json.loads(response.read())
    except (OSError, ValueError) as exc:  # urllib's errors are OSErrors
        log.debug("GET %s: %s", url, exc)
        return None
    return found if isinstance(found, dict) else None


def channel_stats(http_address: str, topic: str, channel: str) -> ChannelStats | None:
    """The channel's stats from nsqd's HTTP API; None when it does not answer."""
    query = urllib.parse.urlencode({"format": "json", "topic": topic, "channel": channel})
    found = _get_json(f"http://{http_address}/stats?{query}")
    if found is None:
        return None
    found = found.get("data", found)  # nsqd before 1.0 wrapped its answers
    for t in found.get("topics") or []:
        if t.get("topic_name") != topic:
            continue
        for c in t.get("channels") or []:
            if c.get("channel_name") == channel:
                return ChannelStats(
                    topic_depth=int(t.get("depth", 0)),
                    depth=int(c.get("depth", 0)),
                    in_flight=int(c.get("in_flight_count", 0)),
                    deferred=int(c.get("deferred_count", 0)),
                    paused=bool(t.get("paused") or c.get("paused")),
                    clients_in_flight={
                        str(client.get("remote_address")): int(client.get("in_flight_count", 0))
                        for client in c.get("clients") or []
                    },
                )
        return ChannelStats(topic_depth=int(t.get("depth", 0)), paused=bool(t.get("paused")))
    return ChannelStats()


def find_http_address(tcp_address: str, known: Mapping[str, str]) -> str | None:
    """nsqd's HTTP API: as lookupd listed it, else at the TCP port + 1 if ``/info`` there names
    that TCP port."""
    if tcp_address in known:
        return known[tcp_address]
    host, _, port = tcp_address.rpartition(":")
    if not port.isdigit():
        return None
    candidate = f"{host}:{int(port) + 1}"
    info = _get_json(f"http://{candidate}/info")
    if info is not None:
        info = info.get("data", info)
        if info.get("tcp_port") == int(port):
            return candidate
    return None


@dataclass
class _Node:
    """One nsqd's end: ``limit`` caps its positions (the target, then where it ended)."""

    address: str
    http: str | None
    limit: int | None  # None: no target (no HTTP API), until it ends
    ended: bool = False
    last_end: int = -1
    last_move: float = 0.0
    next_stats: float = 0.0


class AvailableNowEnd:
    """The driver path's AvailableNow end, fixed by ``start`` and applied by ``bound``."""

    def __init__(self, topic: str, channel: str) -> None:
        self.topic = topic
        self.channel = channel
        self.nodes: dict[str, _Node] | None = None

    def start(self, group: ConsumerGroup) -> None:
        """Fix each nsqd's target (see the module's notes)."""
        nodes = {}
        wal = group.wal
        assert wal is not None  # the group has started
        logs = wal.snapshot()
        for address, consumer in sorted(group.consumers.items()):
            http = find_http_address(address, group.http_addresses)
            mlog = logs.get(address) or wal.log_for(address)
            stats, logged = self._measure(http, mlog) if http else (None, mlog.end)
            node = nodes[address] = _Node(address, http, None, last_end=logged, last_move=time.monotonic())
            if stats is None:
                log.warning(
                    "nsq source: Trigger.AvailableNow: nsqd %s's HTTP API %s; its end is where its consumer, "
                    "free to receive, logs nothing for %.0f s (list nsqd through lookupd, or give its HTTP "
                    "API the TCP port + 1)",
                    address,
                    f"at {http} does not answer" if http else "is not at its TCP port + 1",
                    IDLE_SECONDS,
                )
                continue
            node.limit = logged + max(0, stats.waiting - consumer.pending_count())
            log.info(
                "nsq source: Trigger.AvailableNow: nsqd %s holds %d messages of %s/%s (%d logged before); "
                "the query reads up to position %d of its log, or until nsqd has no more for it",
                address,
                stats.waiting,
                self.topic,
                self.channel,
                logged,
                node.limit,
            )
        self.nodes = nodes

    def _measure(self, http: str, mlog: MessageLog) -> tuple[ChannelStats | None, int]:
        """The channel's stats and the log's end read after them, asked again while the log grew
        in between (each message logged meanwhile is counted twice)."""
        for _ in range(_MEASURES):
            before = mlog.end
            stats = channel_stats(http, self.topic, self.channel)
            logged = mlog.end
            if stats is None or logged == before:
                break
            time.sleep(_POLL_SECONDS)
        return stats, logged

    def bound(self, group: ConsumerGroup, begin: Mapping[str, int]) -> dict[str, int]:
        """The logs' ends, capped by the targets; waits (bounded) while none of them is past
        ``begin`` and some nsqd has not ended, since no new data ends Spark's query."""
        if self.nodes is None:
            self.start(group)
        nodes, wal = self.nodes, group.wal
        assert nodes is not None and wal is not None
        while True:
            group.raise_if_failed()
            logs = wal.snapshot()
            now = time.monotonic()
            ends = {}
            for key, mlog in logs.items():
                node = nodes.get(key)
                if node is None:  # an nsqd found after the start: nothing of it was waiting then
                    ends[key] = begin.get(key, 0)
                    continue
                consumer = group.consumers.get(key)
                if not node.ended and consumer is not None:
                    self._update(node, consumer, mlog.synced_end, now)
                end = mlog.synced_end
                ends[key] = end if node.limit is None else min(end, node.limit)
            if all(n.ended for n in nodes.values()) or any(v > begin.get(k, 0) for k, v in ends.items()):
                return ends
            time.sleep(_POLL_SECONDS)

    def _update(self, node: _Node, consumer: NsqdConsumer, end: int, now: float) -> None:
        if end != node.last_end or consumer.held:
            node.last_end, node.last_move = end, now  # a consumer held by the bound waits for Spark
        if node.limit is not None and end >= node.limit:
            self._end(node, node.limit, "logged what it held at the start")
            return
        if node.limit is not None and node.http is not None and now >= node.next_stats:
            node.next_stats = now + _STATS_INTERVAL
            stats = channel_stats(node.http, self.topic, self.channel)
            if stats is not None and (stats.paused or self._drained(stats, consumer)):
                logged = consumer.log.synced_end  # after the stats: what nsqd handed over is in it
                self._end(node, min(logged, node.limit), "paused" if stats.paused else "has nothing more for it")
                return
        if node.limit is None and now - node.last_move >= IDLE_SECONDS:
            self._end(node, end, f"its consumer logged nothing for {IDLE_SECONDS:.0f} s")
        elif now - node.last_move >= STALL_SECONDS:
            log.warning(
                "nsq source: Trigger.AvailableNow: nsqd %s handed over nothing for %.0f s though its consumer "
                "is ready; the query ends there at position %d%s",
                node.address,
                STALL_SECONDS,
                end,
                f" of {node.limit}" if node.limit is not None else "",
            )
            self._end(node, end, "stalled")

    @staticmethod
    def _drained(stats: ChannelStats, consumer: NsqdConsumer) -> bool:
        """No message waits in the topic or the channel, and none is in flight to this consumer
        but the logged ones it has not FIN'd yet (ackMode=commit)."""
        if stats.topic_depth or stats.depth:
            return False
        ours = stats.clients_in_flight.get(consumer.local_address or "", stats.in_flight)
        return ours <= consumer.pending_count()

    @staticmethod
    def _end(node: _Node, position: int, why: str) -> None:
        node.ended, node.limit = True, position
        log.info("nsq source: Trigger.AvailableNow: nsqd %s ends at position %d (%s)", node.address, position, why)
