"""nsqd's HTTP API: the routes, their parameter rules, status codes and bodies, as nsqd 1.3.0 answers them.

The server (``runtime.http_server``) owns sockets, keep-alive, timeouts and body limits; the router
(``protocol.http``) owns 404/405/OPTIONS/redirects and the ``{"message":"<CODE>"}`` error bodies. This module
holds the handlers. Parameters come from the query string only; a badly encoded one is ``400 INVALID_REQUEST``
for the endpoints that read parameters. Handlers check in nsqd's order, so the first failing check decides
the answer. Publishing goes through ``Topic.put_many`` like TCP publishing, and counts no producer.

Routes and their checks (status CODE, in order):

- ``GET /ping``: ``OK``, or ``500 NOK - <error>`` while a disk queue's last write failed (plain text).
- ``GET /info``: version, addresses, ports and client limits.
- ``POST /pub?topic=&defer=``: 413 MSG_TOO_BIG (Content-Length or body over ``--max-msg-size``, answered
  before reading), 400 MSG_EMPTY, 400 INVALID_REQUEST, 400 MISSING_ARG_TOPIC, 400 INVALID_TOPIC, then the
  topic is created, 400 INVALID_DEFER (not an int64, negative, or over ``--max-req-timeout``), 503 EXITING.
- ``POST /mpub?topic=&binary=&defer=``: 413 BODY_TOO_BIG (over ``--max-body-size``), the topic checks; text
  mode (default) splits on ``\\n`` and skips empty lines (413 MSG_TOO_BIG for a line over
  ``--max-msg-size``); binary mode (``binary`` not ``false``/``0``) reads ``[int32 count]`` then
  ``[int32 size][bytes]`` items (413 BAD_BODY for a bad count, 413 BAD_MESSAGE for a bad item). ``defer``
  is an extension of this implementation (nsqd 1.3.0 has none on /mpub) with /pub's rules. The body is
  validated before the topic is created.
- ``POST /topic/{create,delete,empty,pause,unpause}`` and ``/channel/{...}``: see the handlers; pausing and
  unpausing persist the metadata at once.
- ``GET /stats?format=json&topic=&channel=&include_clients=&include_mem=``: ``stats.py``; without ``topic=``,
  ``stats_cache.py`` writes the same bytes re-rendering only what changed since the last request.
- ``GET /metrics``: Prometheus exposition (``metrics.py``); an addition of this implementation.
- ``GET|PUT /config/:opt``: option values by config-file name; only ``nsqlookupd_tcp_addresses`` (JSON array)
  and ``log_level`` (a level word) can be changed.
- ``GET /debug/pprof/``, ``PUT /debug/setblockrate``, ``POST /debug/freememory``: nsqd's Go runtime hooks,
  kept for their status codes; there is no Go runtime to profile.

``--tls-required=true`` makes every request that did not come over TLS a 403 with nsqd's body.
"""

from __future__ import annotations

import gc
import json
import logging
import re
import socket
import struct
from typing import TYPE_CHECKING, Any

from protocol.http import (
    HTTPError,
    Request,
    Response,
    Router,
    empty_response,
    encoded_json_response,
    error_response,
    json_response,
    text_response,
)
from protocol.names import go_quote, is_valid_channel_name, is_valid_topic_name
from protocol.version import NSQ_VERSION
from runtime.http_server import HTTPServer

if TYPE_CHECKING:  # imported at the first scrape (prometheus_client costs start-up time)
    from .metrics import MetricsEndpoint
from runtime.logfmt import log_level_word
from runtime.startup import address_port

from .options import config_value
from .stats import collect, format_text, gc_paused, json_body
from .topic import TopicExiting, TopicFull

__all__ = ["BOOL_PARAMS", "NSQDRouter", "build_router", "make_http_server"]

log = logging.getLogger("nsqd")

#: nsqd's boolean query values; anything else is "not given" (or, for /mpub's binary, deprecated true)
BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}

_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_INT32 = struct.Struct(">i")
_OK = text_response("OK", nsq_header=True)  # shared: responses are never changed once made


def _go_int64_ms_to_ns(ms: int) -> int:
    """``time.Duration(ms) * time.Millisecond`` with int64 wrap-around."""
    ns = (ms * 1_000_000) & ((1 << 64) - 1)
    return ns - (1 << 64) if ns >= 1 << 63 else ns


class NSQDRouter(Router):
    """The router, with nsqd's check ahead of routing: ``--tls-required=true`` refuses plain HTTP."""

    def __init__(self, nsqd, **kwargs) -> None:
        super().__init__(**kwargs)
        self.nsqd = nsqd
        self.tls_required = nsqd.opts.tls_required_on_http()  # fixed at startup, like nsqd

    async def call(self, match, request: Request) -> Response:
        if not request.tls and self.tls_required:
            body = f'{{"message": "TLS_REQUIRED", "https_port": {self.nsqd_https_port()}}}'.encode()
            return Response(
                403,
                [("Content-Type", "application/json; charset=utf-8"), ("X-Nsq-Content-Type", "nsq; version=1.0")],
                body,
            )
        mesh = self.nsqd.mesh
        if mesh is not None and match.route is not None:
            owner = None
            if match.route.path in _OWNED_ROUTES:
                owner = _topic_owner(mesh, request)
            elif mesh.index and (
                match.route.path in _REPLICA_ROUTES or (mesh.replicating and match.route.path in _REPLICATION_ROUTES)
            ):
                owner = 0  # worker 0 keeps the replica stores and runs the node's replication (nsqd/workers.py)
            if owner is not None:  # the topic's worker answers (nsqd/workers.py)
                try:
                    status, headers, body = await mesh.forward_http(owner, request)
                except Exception:  # its worker stopped: the node is stopping
                    return error_response(503, "EXITING")
                return Response(status, headers, body)
        return await super().call(match, request)

    def nsqd_https_port(self) -> int:
        address = getattr(self.nsqd, "https_address", None) or self.nsqd.opts.https_address
        try:
            return int(str(address).rpartition(":")[2])
        except ValueError:
            return 0


#: the routes about one topic, answered by the worker that owns it (``/stats?topic=`` is joined: its producers are
#: every worker's)
_OWNED_ROUTES = frozenset(
    (
        "/pub",
        "/mpub",
        "/topic/create",
        "/topic/delete",
        "/topic/empty",
        "/topic/pause",
        "/topic/unpause",
        "/channel/create",
        "/channel/delete",
        "/channel/empty",
        "/channel/pause",
        "/channel/unpause",
    )
)
#: answered by worker 0, which keeps the replica stores
_REPLICA_ROUTES = frozenset(("/replica/takeover",))
#: with replication, answered by worker 0, which runs the replicator too (``/ping``: its health says whether
#: replication refuses publishes; without replication, each worker's health is its own queues')
_REPLICATION_ROUTES = _REPLICA_ROUTES | {"/ping"}


def _topic_owner(mesh, request: Request) -> int | None:
    """The worker that owns the request's ``topic``, None when it is this one or there is none (a bad query string
    or a missing or invalid name is then answered here, as by one nsqd)."""
    try:
        names = request.query.get("topic")
    except HTTPError:
        return None
    if not names or not names[0]:
        return None
    owner = mesh.owner(names[0])
    return None if owner == mesh.index else owner


class _API:
    """The handlers, bound to one ``NSQD``."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        self.metrics_endpoint: MetricsEndpoint | None = (
            None  # built at the first scrape: prometheus_client costs start-up time otherwise
        )
        self.stats_cache = nsqd.stats_cache()

    # -- parameter helpers -------------------------------------------------------------------------------------
    @staticmethod
    def _param(request: Request, name: str) -> str | None:
        values = request.query.get(name)
        return values[0] if values else None

    def _topic_name(self, request: Request) -> str:
        """/pub, /mpub, /topic/create: ``MISSING_ARG_TOPIC``, ``INVALID_TOPIC``."""
        name = self._param(request, "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        return name

    def _topic_channel_names(self, request: Request) -> tuple[str, str]:
        """/channel/*: the ``..._ARG_...`` codes."""
        topic = self._param(request, "topic")
        if topic is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        channel = self._param(request, "channel")
        if channel is None:
            raise HTTPError(400, "MISSING_ARG_CHANNEL")
        if not is_valid_channel_name(channel):
            raise HTTPError(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    def _existing_topic(self, name: str):
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic

    def _defer_seconds(self, request: Request) -> float:
        text = self._param(request, "defer")
        if text is None:
            return 0.0
        if _INT64.fullmatch(text) is None:
            raise HTTPError(400, "INVALID_DEFER")
        ms = int(text)
        if not _INT64_MIN <= ms <= _INT64_MAX:
            raise HTTPError(400, "INVALID_DEFER")
        ns = _go_int64_ms_to_ns(ms)
        if ns < 0 or ns > round(self.nsqd.opts.max_req_timeout * 1e9):
            raise HTTPError(400, "INVALID_DEFER")
        return ns / 1e9

    def _get_topic(self, name: str):
        nsqd = self.nsqd
        if nsqd.exiting:
            raise HTTPError(503, "EXITING")
        return nsqd.get_topic(name)

    async def _publish(self, topic, bodies: list[bytes], defer: float) -> None:
        """Into the topic as TCP publishing does (``Topic.publish``); no producer is counted. With replication,
        answered once the peers hold the messages (503 REPLICATION_DEGRADED when they cannot)."""
        if not bodies:
            return
        replication = self.nsqd.replication
        if replication is not None and replication.refusing():
            raise HTTPError(503, "REPLICATION_DEGRADED")
        try:
            topic.publish(bodies, defer)
        except (TopicExiting, TopicFull):
            raise HTTPError(503, "EXITING") from None
        if self.nsqd.sync_barrier and not self.nsqd.sync_barrier.commit():
            # durable mode: nsqd.dat names a topic created for this publish, and a sync that failed covers it
            raise HTTPError(503, "EXITING")
        if replication is not None and not await replication.wait_acked(replication.seq):
            raise HTTPError(503, "REPLICATION_DEGRADED")

    # -- handlers ----------------------------------------------------------------------------------------------
    async def ping(self, request: Request) -> Response:
        health = self.nsqd.health()
        if health != "OK":
            return text_response(health, 500)
        return text_response("OK")

    async def info(self, request: Request) -> Response:
        nsqd = self.nsqd
        opts = nsqd.opts
        try:
            hostname = socket.gethostname()
        except OSError as exc:
            raise HTTPError(500, str(exc)) from None
        return json_response(
            {
                "version": NSQ_VERSION,
                "broadcast_address": opts.broadcast_address,
                "hostname": hostname,
                # -1 on a unix socket; 0 without HTTP (nsqd reports its empty TCP address then)
                "http_port": address_port(nsqd.http_address) if nsqd.http_address else 0,
                "tcp_port": address_port(nsqd.tcp_address),
                "start_time": nsqd.start_time,
                "max_heartbeat_interval": round(opts.max_heartbeat_interval * 1e9),
                "max_output_buffer_size": opts.max_output_buffer_size,
                "max_output_buffer_timeout": round(opts.max_output_buffer_timeout * 1e9),
                "max_deflate_level": opts.max_deflate_level,
            }
        )

    async def pub(self, request: Request) -> Response:
        body = request.body  # the route's limit already answered 413 MSG_TOO_BIG
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        query = request.query
        names = query.get("topic")
        # an existing topic's name is valid: the check is only needed for new names
        topic = self.nsqd.topics.get(names[0]) if names else None
        if topic is None or self.nsqd.exiting:
            topic = self._get_topic(self._topic_name(request))  # nsqd creates the topic before it looks at defer
        defer = self._defer_seconds(request) if "defer" in query else 0.0
        await self._publish(topic, [body], defer)
        return _OK

    async def mpub(self, request: Request) -> Response:
        name = self._topic_name(request)
        binary = False
        mode = self._param(request, "binary")
        if mode is not None:
            binary = BOOL_PARAMS.get(mode, True)
            if mode not in BOOL_PARAMS:
                log.warning("deprecated value '%s' used for /mpub binary param", mode)
        defer = self._defer_seconds(request)
        opts = self.nsqd.opts
        if binary:
            bodies = _binary_bodies(request.body, opts.max_msg_size, opts.max_body_size)
        else:
            bodies = [line for line in request.body.split(b"\n") if line]
            if any(len(line) > opts.max_msg_size for line in bodies):
                raise HTTPError(413, "MSG_TOO_BIG")
        await self._publish(self._get_topic(name), bodies, defer)
        return _OK

    async def stats(self, request: Request) -> Response:
        fmt = self._param(request, "format")  # a bad query string: 400 INVALID_REQUEST from here
        include_clients = BOOL_PARAMS.get(self._param(request, "include_clients") or "", True)
        include_mem = BOOL_PARAMS.get(self._param(request, "include_mem") or "", True)
        topic, channel = self._param(request, "topic") or None, self._param(request, "channel") or None
        mesh = self.nsqd.mesh
        if mesh is not None:  # every worker's part, joined (nsqd/workers.py)
            joined = await mesh.node_stats(channel, include_clients, include_mem, topic)
            body = json_body(joined) if fmt == "json" else format_text(joined).encode("utf-8", "replace")
            return encoded_json_response(body) if fmt == "json" else text_response(body, nsq_header=True)
        with gc_paused():
            if topic is None:  # the whole node: only what changed since the last request is rendered again
                render = self.stats_cache.json if fmt == "json" else self.stats_cache.text
                body = render(channel=channel, include_clients=include_clients, include_mem=include_mem)
            else:
                stats = collect(
                    self.nsqd, topic=topic, channel=channel, include_clients=include_clients, include_mem=include_mem
                )
                body = json_body(stats) if fmt == "json" else format_text(stats).encode("utf-8", "replace")
                del stats
        if fmt == "json":
            return encoded_json_response(body)
        return text_response(body, nsq_header=True)

    async def metrics(self, request: Request) -> Response:
        if self.metrics_endpoint is None:
            from .metrics import MetricsEndpoint

            self.metrics_endpoint = MetricsEndpoint(self.nsqd, self.stats_cache)
        mesh = self.nsqd.mesh
        joined = await mesh.node_stats(None, True, False) if mesh is not None else None
        body, content_type = self.metrics_endpoint.render(request.headers.get("accept"), joined)
        return Response(200, [("Content-Type", content_type)], body)

    # topics
    async def topic_create(self, request: Request) -> Response:
        name = self._topic_name(request)
        if self.nsqd.exiting:
            raise HTTPError(503, "EXITING")
        self.nsqd.get_topic(name, after=request.after_answer)
        return empty_response()

    async def topic_delete(self, request: Request) -> Response:
        name = self._param(request, "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not self.nsqd.delete_topic(name):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return empty_response()

    async def topic_empty(self, request: Request) -> Response:
        topic = self._existing_topic(self._topic_name(request))
        try:
            topic.empty()
        except OSError as exc:
            log.error("TOPIC(%s): failed to empty - %s", topic.name, exc)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        return empty_response()

    async def topic_pause(self, request: Request) -> Response:
        return await self._pause_topic(request, pause=True)

    async def topic_unpause(self, request: Request) -> Response:
        return await self._pause_topic(request, pause=False)

    async def _pause_topic(self, request: Request, *, pause: bool) -> Response:
        name = self._param(request, "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        topic = self._existing_topic(name)
        if pause:
            topic.pause()
        else:
            topic.unpause()
        log.info("TOPIC(%s): %s", name, "paused" if pause else "unpaused")
        self.nsqd.metadata_changed(name)
        await self.nsqd.persist_metadata()  # nsqd answers once the file holds the new flag
        return empty_response()

    # channels
    def _existing_channel_topic(self, request: Request):
        topic_name, channel_name = self._topic_channel_names(request)
        return self._existing_topic(topic_name), channel_name

    def _existing_channel(self, request: Request):
        topic, channel_name = self._existing_channel_topic(request)
        channel = topic.channels.get(channel_name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return channel

    async def channel_create(self, request: Request) -> Response:
        topic, channel_name = self._existing_channel_topic(request)
        topic.get_channel(channel_name)
        return empty_response()

    async def channel_delete(self, request: Request) -> Response:
        topic, channel_name = self._existing_channel_topic(request)
        if not topic.delete_channel(channel_name):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return empty_response()

    async def channel_empty(self, request: Request) -> Response:
        channel = self._existing_channel(request)
        try:
            channel.empty()
        except OSError as exc:
            log.error("CHANNEL(%s:%s): failed to empty - %s", channel.topic_name, channel.name, exc)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        return empty_response()

    async def channel_pause(self, request: Request) -> Response:
        return await self._pause_channel(request, pause=True)

    async def channel_unpause(self, request: Request) -> Response:
        return await self._pause_channel(request, pause=False)

    async def _pause_channel(self, request: Request, *, pause: bool) -> Response:
        channel = self._existing_channel(request)
        if pause:
            channel.pause()
        else:
            channel.unpause()
        log.info("CHANNEL(%s:%s): %s", channel.topic_name, channel.name, "paused" if pause else "unpaused")
        self.nsqd.metadata_changed(channel.topic_name)
        await self.nsqd.persist_metadata()
        return empty_response()

    # replication
    async def replica_takeover(self, request: Request) -> Response:
        """Adopt now the messages this node holds for the origin ``node`` (its TCP address as its peers name it)."""
        node = self._param(request, "node")
        if not node:
            raise HTTPError(400, "MISSING_ARG_NODE")
        try:
            count = await self.nsqd.replica_host.takeover(node)
        except KeyError:
            raise HTTPError(404, "NODE_NOT_FOUND") from None
        except OSError as exc:
            log.error("REPLICATION: takeover of %s failed - %s", node, exc)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        return json_response({"node": node, "messages": count})

    # configuration
    async def config(self, request: Request, opt: str) -> Response:
        nsqd = self.nsqd
        opts = nsqd.opts
        if request.method == "PUT":
            body = request.body  # over --max-msg-size: the route answered 413 INVALID_VALUE
            if not body:
                raise HTTPError(413, "INVALID_VALUE")
            change: Any
            if opt == "nsqlookupd_tcp_addresses":
                change = _string_list(body)
            elif opt == "log_level":
                try:
                    change = log_level_word(body.decode("utf-8"))
                except (UnicodeDecodeError, ValueError, KeyError):
                    raise HTTPError(400, "INVALID_VALUE") from None
            else:
                raise HTTPError(400, "INVALID_OPTION")
            nsqd.configure(opt, change)
            if nsqd.mesh is not None:  # every worker has made the change before the answer (nsqd/workers.py)
                await nsqd.mesh.configure(opt, change)
        try:
            value = config_value(opts, opt)
        except KeyError:
            raise HTTPError(400, "INVALID_OPTION") from None
        if isinstance(value, str):
            # nsqd answers a string option with the bare text (its V1 responder writes strings as they are)
            return text_response(value, nsq_header=True)
        return json_response(value)

    # Go runtime hooks
    async def pprof_index(self, request: Request) -> Response:
        page = (
            "<html><head><title>/debug/pprof/</title></head><body>/debug/pprof/<br><br>"
            "No profiles: this nsqd does not run on the Go runtime.</body></html>\n"
        )
        return Response(200, [("Content-Type", "text/html; charset=utf-8")], page.encode())

    async def set_block_rate(self, request: Request) -> Response:
        text = self._param(request, "rate") or ""
        if _INT64.fullmatch(text) is None:
            return text_response(f"invalid block rate : strconv.Atoi: parsing {go_quote(text)}: invalid syntax", 400)
        if not _INT64_MIN <= int(text) <= _INT64_MAX:
            return text_response(
                f"invalid block rate : strconv.Atoi: parsing {go_quote(text)}: value out of range", 400
            )
        return Response(200, [], b"")

    async def free_memory(self, request: Request) -> Response:
        gc.collect()
        return empty_response()


def _string_list(body: bytes) -> list[str]:
    """A JSON array of strings (or ``null``), as Go decodes into ``[]string``; else 400 INVALID_VALUE."""
    try:
        value = json.loads(body)
    except ValueError:
        raise HTTPError(400, "INVALID_VALUE") from None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise HTTPError(400, "INVALID_VALUE")
    return value


def _binary_bodies(body: bytes, max_msg_size: int, max_body_size: int) -> list[bytes]:
    """/mpub?binary=true: ``[int32 count]`` then ``count`` x ``[int32 size][size bytes]``; what follows the last
    message is ignored. Errors are the TCP codes without ``E_``, with status 413."""
    if len(body) < 4:
        raise HTTPError(413, "BAD_BODY")
    (count,) = _INT32.unpack_from(body)
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise HTTPError(413, "BAD_BODY")
    bodies = []
    pos = 4
    end = len(body)
    for _ in range(count):
        if pos + 4 > end:
            raise HTTPError(413, "BAD_MESSAGE")
        (size,) = _INT32.unpack_from(body, pos)
        pos += 4
        if size <= 0 or size > max_msg_size or pos + size > end:
            raise HTTPError(413, "BAD_MESSAGE")
        bodies.append(body[pos : pos + size])
        pos += size
    return bodies


def build_router(nsqd) -> NSQDRouter:
    """Every nsqd route, bound to ``nsqd``."""
    api = _API(nsqd)
    opts_of = lambda: nsqd.opts  # noqa: E731  (options can be swapped at run time)
    router = NSQDRouter(nsqd, logger=log)
    router.add(["GET"], "/ping", api.ping)
    router.add(["GET"], "/info", api.info)
    router.add(
        ["POST"],
        "/pub",
        api.pub,
        access_log=False,
        max_body_bytes=lambda: opts_of().max_msg_size,
        body_too_big=error_response(413, "MSG_TOO_BIG"),
    )
    router.add(
        ["POST"],
        "/mpub",
        api.mpub,
        access_log=False,
        max_body_bytes=lambda: opts_of().max_body_size,
        body_too_big=error_response(413, "BODY_TOO_BIG"),
    )
    router.add(["GET"], "/stats", api.stats)
    router.add(["GET"], "/metrics", api.metrics)
    router.add(["POST"], "/topic/create", api.topic_create)
    router.add(["POST"], "/topic/delete", api.topic_delete)
    router.add(["POST"], "/topic/empty", api.topic_empty)
    router.add(["POST"], "/topic/pause", api.topic_pause)
    router.add(["POST"], "/topic/unpause", api.topic_unpause)
    router.add(["POST"], "/channel/create", api.channel_create)
    router.add(["POST"], "/channel/delete", api.channel_delete)
    router.add(["POST"], "/channel/empty", api.channel_empty)
    router.add(["POST"], "/channel/pause", api.channel_pause)
    router.add(["POST"], "/channel/unpause", api.channel_unpause)
    router.add(
        ["GET", "PUT"],
        "/config/:opt",
        api.config,
        max_body_bytes=lambda: opts_of().max_msg_size,
        body_too_big=error_response(413, "INVALID_VALUE"),
    )
    router.add(["POST"], "/replica/takeover", api.replica_takeover)
    router.add(["GET"], "/debug/pprof/", api.pprof_index)
    router.add(["PUT"], "/debug/setblockrate", api.set_block_rate)
    router.add(["POST"], "/debug/freememory", api.free_memory)
    return router


def make_http_server(nsqd, listeners: list, *, name: str = "HTTP", ssl_context=None) -> HTTPServer:
    """The HTTP (or, with ``ssl_context``, HTTPS) server of ``nsqd`` on already bound ``listeners``."""
    return HTTPServer(
        build_router(nsqd),
        logger=log,
        listeners=listeners,
        name=name,
        ssl_context=ssl_context,
        max_body_bytes=lambda: nsqd.opts.max_body_size,
    )
