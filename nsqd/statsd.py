"""Pushing nsqd's figures to statsd over UDP (``--statsd-address`` and friends), in nsqd's names and format.

Every ``--statsd-interval`` the daemon takes one stats snapshot (``stats.collect``, without clients) and
sends, for each topic and channel, lines of the form ``<prefix><name>:<int>|c`` for counters (the change
since the previous push) and ``<prefix><name>:<int>|g`` for gauges::

    topic.<T>.message_count|c  topic.<T>.message_bytes|c  topic.<T>.depth|g  topic.<T>.backend_depth|g
    topic.<T>.e2e_processing_latency_<pct>|g
    topic.<T>.channel.<C>.message_count|c  .depth|g  .backend_depth|g  .in_flight_count|g  .deferred_count|g
    .requeue_count|c  .timeout_count|c  .clients|g  .e2e_processing_latency_<pct>|g
    mem.heap_objects|g ... mem.next_gc_bytes|g  mem.gc_runs|c        (with --statsd-mem-stats)

``<pct>`` is the quantile times 100 without decimals (``99``). Every line ends with a newline; lines are
packed into datagrams of at most ``--statsd-udp-packet-size`` bytes without splitting a line, and the
datagrams of one push are spread evenly over ``interval - 1s`` so a large node does not burst. The prefix
is ``--statsd-prefix`` with ``%s`` replaced by ``<broadcast address>_<broadcast HTTP port>`` (``.`` and
``:`` turned into ``_``) and a trailing ``.`` added when missing. ``--statsd-exclude-ephemeral`` leaves out
``#ephemeral`` topics and channels.

A push that cannot reach statsd (no route, ICMP refusals) is logged and the next interval tries again.
"""

from __future__ import annotations

import contextlib
import logging
import socket

import trio

from protocol.names import is_ephemeral
from runtime.startup import address_port, resolve_port, split_host_port

from .stats import MemoryStats, NodeStats, collect

__all__ = ["StatsdPusher", "host_key", "pack_datagrams", "statsd_lines", "statsd_prefix"]

log = logging.getLogger("nsqd")


def host_key(address: str) -> str:
    return address.replace(".", "_").replace(":", "_")


def statsd_prefix(template: str, broadcast_address: str, broadcast_http_port: int) -> str:
    """``--statsd-prefix`` with its ``%s`` filled in and a trailing dot ("" stays "": no prefix)."""
    if not template:
        return ""
    host = f"[{broadcast_address}]" if ":" in broadcast_address else broadcast_address
    prefix = template.replace("%s", host_key(f"{host}:{broadcast_http_port}"))
    return prefix if prefix.endswith(".") else prefix + "."


def _pct(quantile: float) -> str:
    return "%.0f" % (quantile * 100.0)


def statsd_lines(
    stats: NodeStats,
    last: NodeStats | None,
    prefix: str,
    *,
    exclude_ephemeral: bool = False,
    memory: MemoryStats | None = None,
    last_memory: MemoryStats | None = None,
) -> list[bytes]:
    """Every line of one push (each with its newline); counters are differences from ``last``."""
    lines: list[str] = []
    counter = lambda name, value: lines.append(f"{prefix}{name}:{value}|c\n")  # noqa: E731
    gauge = lambda name, value: lines.append(f"{prefix}{name}:{value}|g\n")  # noqa: E731
    previous_topics = {t.topic_name: t for t in (last.topics or ())} if last is not None else {}
    for topic in stats.topics or ():
        name = topic.topic_name
        if exclude_ephemeral and is_ephemeral(name):
            continue
        before = previous_topics.get(name)
        counter(f"topic.{name}.message_count", topic.message_count - (before.message_count if before else 0))
        counter(f"topic.{name}.message_bytes", topic.message_bytes - (before.message_bytes if before else 0))
        gauge(f"topic.{name}.depth", topic.depth)
        gauge(f"topic.{name}.backend_depth", topic.backend_depth)
        for quantile, value in topic.e2e_processing_latency.percentiles or ():
            gauge(f"topic.{name}.e2e_processing_latency_{_pct(quantile)}", int(value))
        previous_channels = {c.channel_name: c for c in before.channels} if before else {}
        for channel in topic.channels:
            if exclude_ephemeral and is_ephemeral(channel.channel_name):
                continue
            was = previous_channels.get(channel.channel_name)
            base = f"topic.{name}.channel.{channel.channel_name}"
            counter(f"{base}.message_count", channel.message_count - (was.message_count if was else 0))
            gauge(f"{base}.depth", channel.depth)
            gauge(f"{base}.backend_depth", channel.backend_depth)
            gauge(f"{base}.in_flight_count", channel.in_flight_count)
            gauge(f"{base}.deferred_count", channel.deferred_count)
            counter(f"{base}.requeue_count", channel.requeue_count - (was.requeue_count if was else 0))
            counter(f"{base}.timeout_count", channel.timeout_count - (was.timeout_count if was else 0))
            gauge(f"{base}.clients", channel.client_count)
            for quantile, value in channel.e2e_processing_latency.percentiles or ():
                gauge(f"{base}.e2e_processing_latency_{_pct(quantile)}", int(value))
    if memory is not None:
        gauge("mem.heap_objects", memory.heap_objects)
        gauge("mem.heap_idle_bytes", memory.heap_idle_bytes)
        gauge("mem.heap_in_use_bytes", memory.heap_in_use_bytes)
        gauge("mem.heap_released_bytes", memory.heap_released_bytes)
        gauge("mem.gc_pause_usec_100", memory.gc_pause_usec_100)
        gauge("mem.gc_pause_usec_99", memory.gc_pause_usec_99)
        gauge("mem.gc_pause_usec_95", memory.gc_pause_usec_95)
        gauge("mem.next_gc_bytes", memory.next_gc_bytes)
        counter("mem.gc_runs", memory.gc_total_runs - (last_memory.gc_total_runs if last_memory else 0))
    return [line.encode("utf-8", "surrogateescape") for line in lines]


def pack_datagrams(lines: list[bytes], size: int) -> list[bytes]:
    """Join lines into datagrams of at most ``size`` bytes, never splitting a line (a longer line goes alone)."""
    datagrams: list[bytes] = []
    current: list[bytes] = []
    length = 0
    for line in lines:
        if current and length + len(line) > size:
            datagrams.append(b"".join(current))
            current = []
            length = 0
        current.append(line)
        length += len(line)
    if current:
        datagrams.append(b"".join(current))
    return datagrams


class StatsdPusher:
    """The push loop; run it in the daemon's nursery with ``nursery.start(pusher.run)``. With ``--workers`` above
    1, worker 0 alone runs it, and pushes the node's figures: one push per interval, as from one nsqd."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        self.pushes = 0
        self._last: NodeStats | None = None
        self._last_memory: MemoryStats | None = None

    def prefix(self) -> str:
        nsqd = self.nsqd
        opts = nsqd.opts
        port = opts.broadcast_http_port
        if not port:
            port = address_port(getattr(nsqd, "http_address", None), 0)  # 0 on a unix socket, as nsqd's
        return statsd_prefix(opts.statsd_prefix, opts.broadcast_address, port)

    async def next_push(self) -> list[bytes]:
        """Collect and format one push (and remember it for the next counters' differences)."""
        opts = self.nsqd.opts
        mesh = self.nsqd.mesh
        if mesh is None:
            stats = collect(self.nsqd, include_clients=False, include_mem=opts.statsd_mem_stats)
        else:  # worker 0 pushes the node's figures, every worker's joined (``--workers``)
            stats = await mesh.node_stats(None, False, opts.statsd_mem_stats)
        memory = stats.memory
        lines = statsd_lines(
            stats,
            self._last,
            self.prefix(),
            exclude_ephemeral=opts.statsd_exclude_ephemeral,
            memory=memory,
            last_memory=self._last_memory,
        )
        self._last = stats
        if memory is not None:
            self._last_memory = memory
        return pack_datagrams(lines, max(opts.statsd_udp_packet_size, 1))

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        interval = max(self.nsqd.opts.statsd_interval, 0.001)
        task_status.started()
        next_at = trio.current_time() + interval
        while True:
            await trio.sleep_until(next_at)
            await self.push_once(spread=max(interval - 1.0, 0.0))
            next_at += interval
            now = trio.current_time()
            if next_at <= now:  # a slow push skips the ticks it overran, as a Go ticker drops them
                next_at = now + interval

    async def push_once(self, spread: float = 0.0) -> None:
        address = self.nsqd.opts.statsd_address
        datagrams = await self.next_push()
        log.info("STATSD: pushing stats to %s", address)
        try:
            host, service = split_host_port(address)
            infos = await trio.socket.getaddrinfo(host or None, resolve_port(service), type=socket.SOCK_DGRAM)
            family, kind, proto, _, sockaddr = infos[0]
            with trio.socket.socket(family, kind, proto) as sock:
                await sock.connect(sockaddr)
                gap = spread / len(datagrams) if datagrams else 0.0
                for index, datagram in enumerate(datagrams):
                    if index and gap:
                        await trio.sleep(gap)
                    # nobody listening right now: UDP reports it on a later send; keep going
                    with contextlib.suppress(ConnectionRefusedError):
                        await sock.send(datagram)
        except (OSError, ValueError) as exc:
            log.error("STATSD: failed to push to %s - %s", address, exc)
            return
        self.pushes += 1
