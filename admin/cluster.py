"""The cluster as the admin sees it: fan-out queries and actions over the public HTTP APIs of nsqlookupd and nsqd.

Two modes, as in nsqadmin. With ``--lookupd-http-address`` the lookupds are asked who the nsqd nodes are
(``/nodes``) and which nodes produce a topic (``/lookup``); with ``--nsqd-http-address`` the given nsqds are the
whole cluster (``/info`` names each one, ``/stats`` lists its topics). A node is named by its
``broadcast_address:http_port``; that name is what ``/api/nodes/:node`` and the tombstone action take.

Every fan-out runs its calls concurrently in one nursery. When every upstream fails the call raises
``ClusterError`` (the API answers 502 ``UPSTREAM_ERROR: ...``); when only some fail, their errors are appended to
the ``warnings`` list the caller passes in, and the API answers 200 with ``WARNING: ...`` in ``message``.
Actions follow nsqadmin's order (FACTS 8.3): lookupds first, then the producing nsqds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import quote

import trio

from .http_client import HTTPClient, UpstreamError
from .options import upstream_url
from .stats import node_topics

__all__ = ["Cluster", "ClusterError", "Producer", "version_key"]

log = logging.getLogger("nsqadmin")


class ClusterError(Exception):
    """Every upstream of a fan-out failed."""


def _q(value: str) -> str:
    return quote(value, safe="")


def version_key(version: str) -> tuple:
    parts = []
    for piece in version.split("-", 1)[0].split("."):
        parts.append(int(piece) if piece.isdigit() else 0)
    return tuple(parts)


def _node_topics(raw: dict) -> list[tuple[str, bool]]:
    """(topic, tombstoned) of one producer of lookupd's ``/nodes``."""
    topics = raw.get("topics") or []
    flags = raw.get("tombstones") or [False] * len(topics)
    return [(topic, bool(tombstoned)) for topic, tombstoned in zip(topics, flags, strict=True)]


def _join_host(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class Producer:
    """One nsqd node. ``url`` is where the admin reaches its HTTP API."""

    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    remote_address: str = ""
    remote_addresses: list[str] | None = None
    topics: list[dict] = field(default_factory=list)
    out_of_date: bool = False
    url: str = ""

    @property
    def name(self) -> str:
        return _join_host(self.broadcast_address, self.http_port)

    def to_json(self) -> dict:
        return {
            "remote_addresses": self.remote_addresses,
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
            "topics": self.topics,
            "out_of_date": self.out_of_date,
        }


class Cluster:
    def __init__(self, opts, client: HTTPClient) -> None:
        self.opts = opts
        self.client = client

    @property
    def uses_lookupd(self) -> bool:
        return bool(self.opts.lookupd_http_addresses)

    # -- fan-out ----------------------------------------------------------------------------------------------
    async def _fan_out(
        self, calls: Sequence[tuple[str, Callable[[], Awaitable[Any]]]], what: str, warnings: list[str]
    ) -> dict:
        """Run the calls concurrently; results by key. All failed ⇒ ClusterError; some ⇒ ``warnings``."""
        results: dict = {}
        errors: list[str] = []

        async def one(key, call) -> None:
            try:
                results[key] = await call()
            except UpstreamError as exc:
                errors.append(str(exc))

        async with trio.open_nursery() as nursery:
            for key, call in calls:
                nursery.start_soon(one, key, call)
        if calls and len(errors) == len(calls):
            raise ClusterError(f"Failed to query any {what}: " + "; ".join(errors))
        if errors:
            log.warning("%s", "; ".join(errors))
            warnings.extend(errors)
        return results

    def _lookupd_calls(self, path: str):
        return [
            (address, partial(self.client.get_json, upstream_url(address) + path))
            for address in self.opts.lookupd_http_addresses
        ]

    # -- topics -----------------------------------------------------------------------------------------------
    async def topics(self, warnings: list[str]) -> list[str]:
        names: set[str] = set()
        if self.uses_lookupd:
            for answer in (await self._fan_out(self._lookupd_calls("/topics"), "nsqlookupd", warnings)).values():
                names.update(answer.get("topics") or ())
        else:
            for _producer, stats in await self.raw_node_stats(
                await self.producers(warnings), warnings, include_clients=False
            ):
                names.update(t.get("topic_name", "") for t in stats.get("topics") or ())
        return sorted(names)

    async def lookupd_channels(self, topic: str, warnings: list[str]) -> list[str]:
        answers = await self._fan_out(self._lookupd_calls(f"/channels?topic={_q(topic)}"), "nsqlookupd", warnings)
        names: set[str] = set()
        for answer in answers.values():
            names.update(answer.get("channels") or ())
        return sorted(names)

    async def inactive_topics(self, warnings: list[str]) -> dict[str, list[str] | None]:
        """Topics that lookupd knows but no node produces, with their channels (lookupd mode only)."""
        if not self.uses_lookupd:
            return {}
        # a topic has a producer in some lookupd's /lookup exactly when one of that lookupd's /nodes lists it
        # untombstoned: one request per lookupd instead of one per topic
        answers = await self._fan_out(self._lookupd_calls("/nodes"), "nsqlookupd", warnings)
        produced = {
            topic
            for answer in answers.values()
            for raw in answer.get("producers") or ()
            for topic, tombstoned in _node_topics(raw)
            if not tombstoned
        }
        result: dict[str, list[str] | None] = {}
        for topic in await self.topics(warnings):
            if topic not in produced:
                result[topic] = await self.lookupd_channels(topic, warnings) or None
        return result

    # -- producers --------------------------------------------------------------------------------------------
    async def producers(self, warnings: list[str]) -> list[Producer]:
        """Every nsqd node, sorted by hostname then name; ``out_of_date`` marks versions below the newest."""
        if self.uses_lookupd:
            producers = await self._lookupd_nodes(warnings)
        else:
            producers = await self._nsqd_producers(warnings)
        if producers:
            newest = max(version_key(p.version) for p in producers)
            for p in producers:
                p.out_of_date = version_key(p.version) < newest
        producers.sort(key=lambda p: (p.hostname, p.name))
        return producers

    async def _lookupd_nodes(self, warnings: list[str]) -> list[Producer]:
        answers = await self._fan_out(self._lookupd_calls("/nodes"), "nsqlookupd", warnings)
        merged: dict[str, Producer] = {}
        tombstones: dict[str, dict[str, bool]] = {}
        for address in self.opts.lookupd_http_addresses:
            answer = answers.get(address)
            if answer is None:
                continue
            for raw in answer.get("producers") or ():
                producer = _producer_from_peer(raw)
                known = merged.setdefault(producer.name, producer)
                known.remote_addresses = (known.remote_addresses or []) + [f"{address}/{producer.remote_address}"]
                marks = tombstones.setdefault(producer.name, {})
                for topic, tombstoned in _node_topics(raw):
                    marks[topic] = marks.get(topic, False) or tombstoned
        for name, producer in merged.items():
            producer.topics = [{"topic": t, "tombstoned": tombstones[name][t]} for t in sorted(tombstones[name])]
        return list(merged.values())

    async def _nsqd_producers(self, warnings: list[str]) -> list[Producer]:
        async def describe(address: str) -> Producer:
            url = upstream_url(address)
            info = await self.client.get_json(url + "/info")
            stats = await self.client.get_json(url + "/stats?format=json&include_clients=false")
            producer = _producer_from_peer(info)
            producer.remote_address = address
            producer.url = url
            producer.topics = [
                {"topic": t.get("topic_name", ""), "tombstoned": False} for t in stats.get("topics") or ()
            ]
            return producer

        calls = [(address, partial(describe, address)) for address in self.opts.nsqd_http_addresses]
        answers = await self._fan_out(calls, "nsqd", warnings)
        return [answers[a] for a in self.opts.nsqd_http_addresses if a in answers]

    async def _lookupd_producers(self, topic: str, warnings: list[str]) -> list[Producer]:
        calls = self._lookupd_calls(f"/lookup?topic={_q(topic)}")
        answers = await self._fan_out(calls, "nsqlookupd", warnings)
        merged: dict[str, Producer] = {}
        for answer in answers.values():
            for raw in answer.get("producers") or ():
                producer = _producer_from_peer(raw)
                merged.setdefault(producer.name, producer)
        return sorted(merged.values(), key=lambda p: (p.hostname, p.name))

    async def topic_producers(self, topic: str, warnings: list[str]) -> list[Producer]:
        """The nodes that have ``topic``."""
        if self.uses_lookupd:
            return await self._lookupd_producers(topic, warnings)
        return [p for p in await self.producers(warnings) if any(t["topic"] == topic for t in p.topics)]

    async def find_node(self, node: str, warnings: list[str]) -> Producer | None:
        for producer in await self.producers(warnings):
            if node in (producer.name, producer.remote_address):
                return producer
        return None

    # -- stats ------------------------------------------------------------------------------------------------
    async def node_stats(
        self,
        producers: list[Producer],
        warnings: list[str],
        *,
        topic: str | None = None,
        channel: str | None = None,
        include_clients: bool = True,
    ) -> list[tuple[Producer, list[dict]]]:
        """Each reachable producer with its topics in nsqadmin's per-node form (``stats.node_topics``)."""
        answers = await self.raw_node_stats(
            producers, warnings, topic=topic, channel=channel, include_clients=include_clients
        )
        now = int(time.time())  # connect_ts is a Unix time
        return [(p, node_topics(stats, p.name, p.hostname, now)) for p, stats in answers]

    async def raw_node_stats(
        self,
        producers: list[Producer],
        warnings: list[str],
        *,
        topic: str | None = None,
        channel: str | None = None,
        include_clients: bool = True,
    ) -> list[tuple[Producer, dict]]:
        """Each reachable producer with its ``/stats?format=json`` answer as it came."""
        query = "/stats?format=json&include_clients=" + ("true" if include_clients else "false")
        if topic is not None:
            query += f"&topic={_q(topic)}"
            if channel is not None:
                query += f"&channel={_q(channel)}"
        calls = [(p.name, partial(self.client.get_json, p.url + query)) for p in producers]
        answers = await self._fan_out(calls, "nsqd", warnings)
        return [(p, answers[p.name]) for p in producers if p.name in answers]

    async def node_replication(self, producer: Producer, warnings: list[str]) -> dict | None:
        """The ``replication`` section of a trionsq node's ``/stats`` (None for a node without one)."""
        url = producer.url + "/stats?format=json&include_clients=false&include_mem=false"
        answers = await self._fan_out([(producer.name, lambda: self.client.get_json(url))], "nsqd", warnings)
        document = answers.get(producer.name)
        return document.get("replication") if isinstance(document, dict) else None

    # -- actions ----------------------------------------------------------------------------------------------
    async def replica_takeover(self, producer: Producer, origin: str, warnings: list[str]) -> None:
        await self._post_all([producer.url + f"/replica/takeover?node={_q(origin)}"], "nsqd", warnings)

    async def _post_all(self, urls: list[str], what: str, warnings: list[str]) -> None:
        calls = [(url, partial(self.client.post, url)) for url in urls]
        await self._fan_out(calls, what, warnings)

    def _lookupd_urls(self, path: str) -> list[str]:
        return [upstream_url(a) + path for a in self.opts.lookupd_http_addresses]

    async def create_topic_channel(self, topic: str, channel: str, warnings: list[str]) -> None:
        qt = _q(topic)
        if self.uses_lookupd:
            await self._post_all(self._lookupd_urls(f"/topic/create?topic={qt}"), "nsqlookupd", warnings)
            if channel:
                qc = _q(channel)
                await self._post_all(
                    self._lookupd_urls(f"/channel/create?topic={qt}&channel={qc}"), "nsqlookupd", warnings
                )
                producers = await self.topic_producers(topic, warnings)
                await self._post_all(
                    [p.url + f"/channel/create?topic={qt}&channel={qc}" for p in producers], "nsqd", warnings
                )
            return
        # without lookupd the nodes themselves are the registry: create on every one of them
        producers = await self.producers(warnings)
        await self._post_all([p.url + f"/topic/create?topic={qt}" for p in producers], "nsqd", warnings)
        if channel:
            await self._post_all(
                [p.url + f"/channel/create?topic={qt}&channel={_q(channel)}" for p in producers], "nsqd", warnings
            )

    async def delete_topic(self, topic: str, warnings: list[str]) -> None:
        producers = await self.topic_producers(topic, warnings)  # before lookupd forgets them
        qt = _q(topic)
        if self.uses_lookupd:
            await self._post_all(self._lookupd_urls(f"/topic/delete?topic={qt}"), "nsqlookupd", warnings)
        await self._post_all([p.url + f"/topic/delete?topic={qt}" for p in producers], "nsqd", warnings)

    async def delete_channel(self, topic: str, channel: str, warnings: list[str]) -> None:
        producers = await self.topic_producers(topic, warnings)
        query = f"?topic={_q(topic)}&channel={_q(channel)}"
        if self.uses_lookupd:
            await self._post_all(self._lookupd_urls("/channel/delete" + query), "nsqlookupd", warnings)
        await self._post_all([p.url + "/channel/delete" + query for p in producers], "nsqd", warnings)

    async def topic_action(self, topic: str, action: str, warnings: list[str]) -> None:
        """``action`` is pause, unpause or empty, applied on every node of the topic."""
        producers = await self.topic_producers(topic, warnings)
        await self._post_all([p.url + f"/topic/{action}?topic={_q(topic)}" for p in producers], "nsqd", warnings)

    async def channel_action(self, topic: str, channel: str, action: str, warnings: list[str]) -> None:
        producers = await self.topic_producers(topic, warnings)
        query = f"?topic={_q(topic)}&channel={_q(channel)}"
        await self._post_all([p.url + f"/channel/{action}" + query for p in producers], "nsqd", warnings)

    async def tombstone_topic(self, topic: str, node: str, warnings: list[str]) -> None:
        """Tell every lookupd to stop listing ``node`` for ``topic``, then delete the topic on that node."""
        qt = _q(topic)
        if self.uses_lookupd:
            await self._post_all(
                self._lookupd_urls(f"/topic/tombstone?topic={qt}&node={_q(node)}"), "nsqlookupd", warnings
            )
        producer = await self.find_node(node, warnings)
        url = producer.url if producer is not None else upstream_url(node)
        await self._post_all([url + f"/topic/delete?topic={qt}"], "nsqd", warnings)


def _producer_from_peer(raw: dict) -> Producer:
    """A producer from a lookupd peer object (or an nsqd ``/info``, which has the same fields)."""
    producer = Producer(
        hostname=str(raw.get("hostname", "")),
        broadcast_address=str(raw.get("broadcast_address", "")),
        tcp_port=int(raw.get("tcp_port") or 0),
        http_port=int(raw.get("http_port") or 0),
        version=str(raw.get("version", "")),
        remote_address=str(raw.get("remote_address", "")),
    )
    producer.url = "http://" + producer.name
    return producer
