"""nsqlookupd's HTTP API: discovery queries, registration administration, ``/metrics``.

Responses follow NSQ's V1 conventions (``protocol.http``): JSON objects with the
``X-NSQ-Content-Type`` header, empty 200 bodies for administrative actions, ``{"message":"<CODE>"}``
errors. Objects keep lookupd's key order; arrays are ``[]`` rather than ``null`` when empty.
Parameters come from the query string only. A missing parameter and an empty one differ:
``/channels?topic=`` is a query for the topic named "" (and finds nothing).

``/metrics`` is Prometheus text built at scrape time by a collector that reads the registration
database, so registering costs nothing extra.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector

from protocol.http import HTTPError, Request, Response, Router, empty_response, json_response, text_response
from protocol.names import is_valid_channel_name, is_valid_topic_name
from protocol.version import NSQ_VERSION

from .registration_db import CLIENT, Registration, filter_active

__all__ = ["LookupdCollector", "build_router"]

log = logging.getLogger("nsqlookupd")


def _param(request: Request, name: str, missing: str) -> str:
    values = request.query.get(name)
    if not values:
        raise HTTPError(400, missing)
    return values[0]


def _topic_channel(request: Request) -> tuple[str, str]:
    topic = _param(request, "topic", "MISSING_ARG_TOPIC")
    if not is_valid_topic_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    channel = _param(request, "channel", "MISSING_ARG_CHANNEL")
    if not is_valid_channel_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


class LookupdAPI:
    def __init__(self, lookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(LookupdCollector(lookupd))
        ProcessCollector(registry=self.registry)

    # -- plain ---------------------------------------------------------------------------------------
    async def ping(self, request: Request) -> Response:
        return text_response("OK")

    async def info(self, request: Request) -> Response:
        return json_response({"version": NSQ_VERSION})

    async def metrics(self, request: Request) -> Response:
        # Prometheus text, or OpenMetrics when the Accept header asks for it
        encoder, content_type = choose_encoder(request.headers.get("Accept") or "")
        return Response(200, [("Content-Type", content_type)], encoder(self.registry))

    # -- discovery -----------------------------------------------------------------------------------
    async def topics(self, request: Request) -> Response:
        return json_response({"topics": [r.key for r in self.db.find_registrations("topic", "*", "")]})

    async def channels(self, request: Request) -> Response:
        topic = _param(request, "topic", "MISSING_ARG_TOPIC")
        return json_response({"channels": [r.subkey for r in self.db.find_registrations("channel", topic, "*")]})

    async def lookup(self, request: Request) -> Response:
        topic = _param(request, "topic", "MISSING_ARG_TOPIC")
        db = self.db
        if not db.find_registrations("topic", topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        channels = [r.subkey for r in db.find_registrations("channel", topic, "*")]
        lookupd = self.lookupd
        producers = filter_active(
            db.find_producers("topic", topic, ""),
            lookupd.inactive_producer_timeout_ns,
            lookupd.tombstone_lifetime_ns,
            time.time_ns(),
        )
        return json_response({"channels": channels, "producers": [p.peer.as_json() for p in producers]})

    async def nodes(self, request: Request) -> Response:
        db = self.db
        lookupd = self.lookupd
        now = time.time_ns()
        lifetime = lookupd.tombstone_lifetime_ns
        # tombstoned producers are listed here, flagged per topic
        peers = filter_active(db.find_producers(*CLIENT), lookupd.inactive_producer_timeout_ns, 0, now)
        nodes = []
        for client in peers:
            peer = client.peer
            found = db.peer_producers(peer.id, "topic")
            node = peer.as_json()
            node["tombstones"] = [producer.is_tombstoned(lifetime, now) for _key, producer in found]
            node["topics"] = [key.key for key, _producer in found]
            nodes.append(node)
        return json_response({"producers": nodes})

    async def debug(self, request: Request) -> Response:
        data: dict[str, list] = {}
        for registration, producers in self.db.items():
            for producer in producers.values():
                peer = producer.peer
                data.setdefault(f"{registration.category}:{registration.key}:{registration.subkey}", []).append(
                    {
                        "broadcast_address": peer.broadcast_address,
                        "hostname": peer.hostname,
                        "http_port": peer.http_port,
                        "id": peer.id,
                        "last_update": peer.last_update,
                        "tcp_port": peer.tcp_port,
                        "tombstoned": producer.tombstoned,
                        "tombstoned_at": producer.tombstoned_at,
                        "version": peer.version,
                    }
                )
        return json_response(dict(sorted(data.items())))

    # -- administration ------------------------------------------------------------------------------
    async def topic_create(self, request: Request) -> Response:
        topic = _param(request, "topic", "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))
        return empty_response()

    async def topic_delete(self, request: Request) -> Response:
        topic = _param(request, "topic", "MISSING_ARG_TOPIC")
        db = self.db
        for registration in db.find_registrations("channel", topic, "*"):
            log.info("DB: removing channel(%s) from topic(%s)", registration.subkey, topic)
            db.remove_registration(registration)
        for registration in db.find_registrations("topic", topic, ""):
            log.info("DB: removing topic(%s)", topic)
            db.remove_registration(registration)
        return empty_response()

    async def topic_tombstone(self, request: Request) -> Response:
        topic = _param(request, "topic", "MISSING_ARG_TOPIC")
        node = _param(request, "node", "MISSING_ARG_NODE")
        log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        now = time.time_ns()
        for producer in self.db.find_producers("topic", topic, ""):
            peer = producer.peer
            if f"{peer.broadcast_address}:{peer.http_port}" == node:
                producer.tombstone(now)
        return empty_response()

    async def channel_create(self, request: Request) -> Response:
        topic, channel = _topic_channel(request)
        log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.db.add_registration(Registration("channel", topic, channel))
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))
        return empty_response()

    async def channel_delete(self, request: Request) -> Response:
        topic, channel = _topic_channel(request)
        registrations = self.db.find_registrations("channel", topic, channel)
        if not registrations:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        for registration in registrations:
            self.db.remove_registration(registration)
        return empty_response()


def build_router(lookupd) -> Router:
    api = LookupdAPI(lookupd)
    router = Router(logger=log)
    router.add(["GET"], "/ping", api.ping)
    router.add(["GET"], "/info", api.info)
    router.add(["GET"], "/debug", api.debug)
    router.add(["GET"], "/lookup", api.lookup)
    router.add(["GET"], "/topics", api.topics)
    router.add(["GET"], "/channels", api.channels)
    router.add(["GET"], "/nodes", api.nodes)
    router.add(["POST"], "/topic/create", api.topic_create)
    router.add(["POST"], "/topic/delete", api.topic_delete)
    router.add(["POST"], "/channel/create", api.channel_create)
    router.add(["POST"], "/channel/delete", api.channel_delete)
    router.add(["POST"], "/topic/tombstone", api.topic_tombstone)
    router.add(["GET"], "/metrics", api.metrics)
    return router


class LookupdCollector:
    """Reads the registration database at scrape time (Prometheus custom collector)."""

    def __init__(self, lookupd) -> None:
        self.lookupd = lookupd

    def collect(self):
        lookupd = self.lookupd
        db = lookupd.db
        now = time.time_ns()
        inactive, lifetime = lookupd.inactive_producer_timeout_ns, lookupd.tombstone_lifetime_ns

        info = GaugeMetricFamily("nsqlookupd_info", "nsqlookupd version", labels=["version"])
        info.add_metric([NSQ_VERSION], 1)
        yield info

        nodes = GaugeMetricFamily("nsqlookupd_nodes", "Identified nsqd peers seen within the inactivity timeout")
        nodes.add_metric([], len(filter_active(db.find_producers(*CLIENT), inactive, 0, now)))
        yield nodes

        connections = GaugeMetricFamily("nsqlookupd_tcp_connections", "Open TCP connections from nsqd peers")
        connections.add_metric([], len(lookupd.connections))
        yield connections
        accepted = CounterMetricFamily("nsqlookupd_tcp_connections_accepted", "TCP connections accepted")
        accepted.add_metric([], lookupd.connections_total)
        yield accepted

        topics = db.find_registrations("topic", "*", "")
        topic_count = GaugeMetricFamily("nsqlookupd_topics", "Registered topics")
        topic_count.add_metric([], len(topics))
        yield topic_count
        channels = db.find_registrations("channel", "*", "*")
        channel_count = GaugeMetricFamily("nsqlookupd_channels", "Registered channels")
        channel_count.add_metric([], len(channels))
        yield channel_count

        producers = GaugeMetricFamily(
            "nsqlookupd_topic_producers",
            "Producers of a topic that /lookup returns (active, not tombstoned)",
            labels=["topic"],
        )
        tombstoned = GaugeMetricFamily(
            "nsqlookupd_topic_tombstoned_producers", "Producers of a topic hidden by a tombstone", labels=["topic"]
        )
        for registration in topics:
            found = db.find_producers(*registration)
            producers.add_metric([registration.key], len(filter_active(found, inactive, lifetime, now)))
            tombstoned.add_metric([registration.key], sum(p.is_tombstoned(lifetime, now) for p in found))
        yield producers
        yield tombstoned

        channel_producers = GaugeMetricFamily(
            "nsqlookupd_channel_producers", "Producers registered for a channel", labels=["topic", "channel"]
        )
        for registration in channels:
            found = db.find_producers(*registration)
            channel_producers.add_metric(
                [registration.key, registration.subkey], len(filter_active(found, inactive, 0, now))
            )
        yield channel_producers
