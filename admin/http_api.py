"""nsqadmin's HTTP surface: the pages, static assets, ``/api`` (FACTS 8.4), ``/config`` and the graph history.

Every route is mounted under ``--base-path``. The pages are one HTML shell (routing happens in the browser);
the shell carries the admin's settings as a JSON data block, never as executable script, and is served
with a Content-Security-Policy that allows only the admin's own scripts and styles.

``/api`` answers keep nsqadmin's JSON shapes and V1 conventions: objects with ``message`` (``""``, or
``WARNING: ...`` when some upstreams failed), ``{"message": CODE}`` errors, 502 ``UPSTREAM_ERROR: ...`` when
every upstream failed. Mutating calls are checked by ``security.Guard`` first (403), then validated (400).

Extensions of this implementation: ``GET /api/session`` (user, admin flag and the CSRF token for scripts),
``GET /api/history`` and ``/api/history/{topics/:topic[/:channel],nodes/:node}`` (sampled rates and depths
for the graphs; ``/api/history?spark=a,b`` gives the recent-rate sparkline of the topics named only, which keeps
the topics page's refresh small with thousands of topics). Responses are gzip-compressed when the client accepts
it and the body is worth it.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import ipaddress
import json
import logging
import mimetypes
import socket
from pathlib import Path
from urllib.parse import quote

from protocol.http import HTTPError, Request, Response, Router, error_response, go_json, json_response, text_response
from protocol.names import is_valid_channel_name, is_valid_topic_name
from protocol.version import NSQ_VERSION
from runtime.logfmt import get_log_level, log_level_word, set_log_level

from .cluster import ClusterError
from .http_client import USER_AGENT, UpstreamError
from .options import config_value
from .stats import aggregate_channel, aggregate_topic

__all__ = ["build_router"]

log = logging.getLogger("nsqadmin")

PACKAGE_DIR = Path(__file__).resolve().parent
STATIC_DIR = PACKAGE_DIR / "static"
TEMPLATE = PACKAGE_DIR / "templates" / "index.html"
PAGES = ("", "/topics", "/topics/:topic", "/topics/:topic/:channel", "/lookup", "/nodes", "/nodes/:node", "/counter")
COMPRESS_MIN_BYTES = 1024
COMPRESSIBLE = ("text/", "application/json", "application/javascript", "image/svg+xml")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
PAGE_HEADERS = [
    ("Content-Security-Policy", CSP),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "same-origin"),
]
CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
    ".woff2": "font/woff2",
}
TOPIC_ACTIONS = ("pause", "unpause", "empty")


def _message(warnings: list[str]) -> str:
    return "WARNING: " + "; ".join(warnings) if warnings else ""


def _go_decode_error(body: bytes) -> str:
    """The text Go's JSON decoder gives for a body that is not a JSON object (nsqadmin answers it as is)."""
    text = body.decode("utf-8", "replace").lstrip()
    if not text:
        return "EOF"
    try:
        value = json.loads(text)
    except ValueError as exc:
        position = getattr(exc, "pos", 0)
        char = text[position] if position < len(text) else ""
        if not char:
            return "unexpected EOF"
        return f"invalid character {char!r} looking for beginning of value"
    return f"json: cannot unmarshal {type(value).__name__} into Go value of type struct"


def _json_body(request: Request, *, error: str | None = None) -> dict:
    try:
        value = json.loads(request.body)
    except ValueError:
        raise HTTPError(400, error or _go_decode_error(request.body)) from None
    if not isinstance(value, dict):
        raise HTTPError(400, error or _go_decode_error(request.body))
    return value


def _string_field(body: dict, name: str) -> str:
    value = body.get(name, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise HTTPError(
            400, f"json: cannot unmarshal {type(value).__name__} into Go struct field .{name} of type string"
        )
    return value


def _compress(request: Request, response: Response) -> Response:
    if len(response.body) < COMPRESS_MIN_BYTES or response.header("Content-Encoding"):
        return response
    content_type = response.header("Content-Type") or ""
    if not content_type.startswith(COMPRESSIBLE):
        return response
    accepted = request.headers.get("Accept-Encoding", "")
    if "gzip" not in [part.split(";")[0].strip().lower() for part in accepted.split(",")]:
        return response
    response.body = gzip.compress(response.body, compresslevel=6, mtime=0)
    response.headers += [("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")]
    return response


class StaticFiles:
    """The files of ``admin/static`` (or ``--dev-static-dir``), read once; ``--dev-static-dir`` is re-read on
    every request for development."""

    def __init__(self, directory: Path, reload: bool = False) -> None:
        self.directory = directory
        self.reload = reload
        self.files: dict[str, tuple[bytes, str, str]] = {}
        if not reload:
            for path in sorted(directory.rglob("*")):
                if path.is_file():
                    self.files[path.relative_to(directory).as_posix()] = self._load(path)

    @staticmethod
    def _load(path: Path) -> tuple[bytes, str, str]:
        data = path.read_bytes()
        content_type = (
            CONTENT_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        )
        return data, content_type, '"' + hashlib.sha256(data).hexdigest()[:20] + '"'

    def get(self, name: str) -> tuple[bytes, str, str] | None:
        if self.reload:
            path = (self.directory / name).resolve()
            if self.directory.resolve() not in path.parents or not path.is_file():
                return None
            return self._load(path)
        return self.files.get(name)


class AdminAPI:
    def __init__(self, admin) -> None:
        self.admin = admin
        self.opts = admin.opts
        self.cluster = admin.cluster
        self.guard = admin.guard
        self.history = admin.history
        self.notifier = admin.notifier
        self.template = TEMPLATE.read_text("utf-8")
        dev = self.opts.dev_static_dir
        self.static = StaticFiles(Path(dev) if dev else STATIC_DIR, reload=bool(dev))
        self.hostname = socket.gethostname()

    # -- pages ------------------------------------------------------------------------------------------------
    def _page_config(self, request: Request) -> dict:
        opts = self.opts
        return {
            "VERSION": NSQ_VERSION,
            "GRAPHITE_URL": opts.graphite_url,
            "GRAPH_ENABLED": True,
            "STATSD_INTERVAL": int(opts.statsd_interval),
            "STATSD_COUNTER_FORMAT": opts.statsd_counter_format,
            "STATSD_GAUGE_FORMAT": opts.statsd_gauge_format,
            "STATSD_PREFIX": opts.statsd_prefix,
            "NSQLOOKUPD": list(opts.lookupd_http_addresses),
            "IS_ADMIN": self.guard.is_admin(request),
            "BASE_PATH": opts.base_path,
            "USER_AGENT": USER_AGENT,
            "CSRF_TOKEN": self.guard.token(request),
            "CSRF_HEADER": "X-CSRF-Token",
            "HISTORY_INTERVAL": opts.history_interval,
            "USER": self.guard.user(request),
        }

    async def index(self, request: Request, **_params) -> Response:
        base = "" if self.opts.base_path == "/" else self.opts.base_path
        config = go_json(self._page_config(request)).decode("utf-8")
        page = self.template.replace("{{BASE}}", html.escape(base)).replace("{{CONFIG_JSON}}", config)
        headers = [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store")] + PAGE_HEADERS
        return _compress(request, Response(200, headers, page.encode("utf-8")))

    async def static_asset(self, request: Request, asset: str) -> Response:
        found = self.static.get(asset)
        if found is None:
            raise HTTPError(404, "NOT_FOUND")
        data, content_type, etag = found
        headers = [
            ("Content-Type", content_type),
            ("ETag", etag),
            ("Cache-Control", "no-cache"),
            ("X-Content-Type-Options", "nosniff"),
        ]
        if request.headers.get("If-None-Match") == etag:
            return Response(304, headers, b"")
        return _compress(request, Response(200, headers, data))

    async def ping(self, request: Request) -> Response:
        return text_response("OK")

    # -- read-only api ----------------------------------------------------------------------------------------
    async def topics(self, request: Request) -> Response:
        warnings: list[str] = []
        if request.query_value("inactive") == "true":
            body = {"topics": await self.cluster.inactive_topics(warnings)}
        else:
            body = {"topics": await self.cluster.topics(warnings)}
        body["message"] = _message(warnings)
        return _compress(request, json_response(body))

    async def topic(self, request: Request, topic: str) -> Response:
        warnings: list[str] = []
        producers = await self.cluster.topic_producers(topic, warnings)
        per_node = await self.cluster.node_stats(producers, warnings, topic=topic, include_clients=False)
        found = [t for _p, topics in per_node for t in topics if t["topic_name"] == topic]
        body = aggregate_topic(topic, found)
        body["message"] = _message(warnings)
        return _compress(request, json_response(body))

    async def channel(self, request: Request, topic: str, channel: str) -> Response:
        warnings: list[str] = []
        producers = await self.cluster.topic_producers(topic, warnings)
        per_node = await self.cluster.node_stats(producers, warnings, topic=topic, channel=channel)
        found = [
            c
            for _p, topics in per_node
            for t in topics
            if t["topic_name"] == topic
            for c in t["channels"]
            if c["channel_name"] == channel
        ]
        body = aggregate_channel(topic, channel, found) if found else {}
        body["message"] = _message(warnings)
        return _compress(request, json_response(body))

    async def nodes(self, request: Request) -> Response:
        warnings: list[str] = []
        producers = await self.cluster.producers(warnings)
        body = {"nodes": [p.to_json() for p in producers], "message": _message(warnings)}
        return _compress(request, json_response(body))

    async def node(self, request: Request, node: str) -> Response:
        warnings: list[str] = []
        producer = await self.cluster.find_node(node, warnings)
        if producer is None:
            raise HTTPError(404, "NODE_NOT_FOUND")
        per_node = await self.cluster.node_stats([producer], warnings)
        topics = per_node[0][1] if per_node else []
        total_clients = sum(len(c["clients"]) for t in topics for c in t["channels"])
        body = {
            "node": node,
            "topics": topics,
            "total_messages": sum(t["message_count"] for t in topics),
            "total_clients": total_clients,
        }
        replication = await self.cluster.node_replication(producer, warnings)
        if replication is not None:  # a trionsq node that replicates or holds copies
            body["replication"] = replication
        body["message"] = _message(warnings)
        return _compress(request, json_response(body))

    async def node_action(self, request: Request, node: str) -> Response:
        """``{"action": "takeover", "origin": "<host:port>"}``: the node adopts now the messages it holds for that
        origin (trionsq's ``POST /replica/takeover``)."""
        self.guard.check_action(request)
        body = _json_body(request, error="INVALID_BODY")
        origin = body.get("origin")
        if body.get("action") != "takeover":
            raise HTTPError(400, "INVALID_ACTION")
        if not isinstance(origin, str) or not origin:
            raise HTTPError(400, "INVALID_ORIGIN")
        warnings: list[str] = []
        producer = await self.cluster.find_node(node, warnings)
        if producer is None:
            raise HTTPError(404, "NODE_NOT_FOUND")
        await self.cluster.replica_takeover(producer, origin, warnings)
        self.notifier.notify(request, "replica_takeover", "", node=node)
        log.info("ACTION: takeover of %s by %s", origin, node)
        return self._done(warnings)

    async def counter(self, request: Request) -> Response:
        warnings: list[str] = []
        producers = await self.cluster.producers(warnings)
        per_node = await self.cluster.node_stats(producers, warnings, include_clients=False)
        stats = {}
        for _producer, topics in per_node:
            for t in topics:
                for c in t["channels"]:
                    stats[f"{c['topic_name']}:{c['channel_name']}:{c['node']}"] = {
                        "node": c["node"],
                        "topic_name": c["topic_name"],
                        "channel_name": c["channel_name"],
                        "message_count": c["message_count"],
                    }
        return _compress(request, json_response({"stats": stats, "message": _message(warnings)}))

    async def graphite(self, request: Request) -> Response:
        metric = request.query_value("metric", "")
        if metric != "rate":
            raise HTTPError(400, "INVALID_ARG_METRIC")
        target = request.query_value("target", "")
        if not target:
            raise HTTPError(400, "INVALID_ARG_TARGET")
        if not self.opts.graphite_url:
            raise HTTPError(500, "INTERNAL_ERROR")
        interval = int(self.opts.statsd_interval)
        url = (
            f"{self.opts.graphite_url.rstrip('/')}/render?target={quote(target, safe='')}"
            f"&from=-{interval * 2}sec&format=json"
        )
        try:
            series = await self.cluster.client.get_json(url)
        except UpstreamError as exc:
            log.error("graphite request failed - %s", exc)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        rate = "N/A"
        try:
            points = [p[0] for p in series[0]["datapoints"] if p[0] is not None]
            if points:
                rate = f"{points[-1] / interval:.2f}"
        except (IndexError, KeyError, TypeError):
            pass
        return json_response({"rate": rate})

    async def render_proxy(self, request: Request) -> Response:
        url = f"{self.opts.graphite_url.rstrip('/')}/render"
        if request.raw_query:
            url += "?" + request.raw_query.decode("latin-1")
        try:
            reply = await self.cluster.client.request("GET", url, accept="*/*")
        except UpstreamError as exc:
            log.error("graphite proxy failed - %s", exc)
            return error_response(502, "UPSTREAM_ERROR")
        content_type = reply.headers.get("content-type", "application/octet-stream")
        return Response(reply.status, [("Content-Type", content_type)], reply.body)

    async def session(self, request: Request) -> Response:
        return json_response(
            {
                "user": self.guard.user(request),
                "is_admin": self.guard.is_admin(request),
                "csrf_token": self.guard.token(request),
                "csrf_header": "X-CSRF-Token",
                "message": "",
            }
        )

    # -- history ----------------------------------------------------------------------------------------------
    async def history_overview(self, request: Request) -> Response:
        spark = request.query_value("spark")
        names = None if spark is None else set(filter(None, spark.split(",")))
        return _compress(request, json_response({**self.history.overview(names), "message": ""}))

    async def history_topic(self, request: Request, topic: str) -> Response:
        body = self.history.series(("topic", topic))
        body["node_rates"] = self.history.child_rates("topic_node", topic)
        body["channel_rates"] = self.history.child_rates("channel", topic)
        return _compress(request, json_response({**body, "message": ""}))

    async def history_channel(self, request: Request, topic: str, channel: str) -> Response:
        body = self.history.series(("channel", topic, channel))
        return _compress(request, json_response({**body, "message": ""}))

    async def history_node(self, request: Request, node: str) -> Response:
        return _compress(request, json_response({**self.history.series(("node", node)), "message": ""}))

    # -- actions ----------------------------------------------------------------------------------------------
    def _done(self, warnings: list[str]) -> Response:
        return json_response({"message": _message(warnings)})

    async def create_topic_channel(self, request: Request) -> Response:
        self.guard.check_action(request)
        body = _json_body(request)
        topic, channel = _string_field(body, "topic"), _string_field(body, "channel")
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if channel and not is_valid_channel_name(channel):
            raise HTTPError(400, "INVALID_CHANNEL")
        warnings: list[str] = []
        await self.cluster.create_topic_channel(topic, channel, warnings)
        self.notifier.notify(request, "create_topic", topic)
        if channel:
            self.notifier.notify(request, "create_channel", topic, channel)
        log.info("ACTION: create %s%s", topic, f"/{channel}" if channel else "")
        return self._done(warnings)

    async def delete_topic(self, request: Request, topic: str) -> Response:
        self.guard.check_action(request)
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        warnings: list[str] = []
        await self.cluster.delete_topic(topic, warnings)
        self.notifier.notify(request, "delete_topic", topic)
        log.info("ACTION: delete topic %s", topic)
        return self._done(warnings)

    async def delete_channel(self, request: Request, topic: str, channel: str) -> Response:
        self.guard.check_action(request)
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if not is_valid_channel_name(channel):
            raise HTTPError(400, "INVALID_CHANNEL")
        warnings: list[str] = []
        await self.cluster.delete_channel(topic, channel, warnings)
        self.notifier.notify(request, "delete_channel", topic, channel)
        log.info("ACTION: delete channel %s/%s", topic, channel)
        return self._done(warnings)

    async def topic_action(self, request: Request, topic: str) -> Response:
        self.guard.check_action(request)
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        action = _string_field(_json_body(request), "action")
        if action not in TOPIC_ACTIONS:
            raise HTTPError(400, "INVALID_ACTION")
        warnings: list[str] = []
        await self.cluster.topic_action(topic, action, warnings)
        self.notifier.notify(request, f"{action}_topic", topic)
        log.info("ACTION: %s topic %s", action, topic)
        return self._done(warnings)

    async def channel_action(self, request: Request, topic: str, channel: str) -> Response:
        self.guard.check_action(request)
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if not is_valid_channel_name(channel):
            raise HTTPError(400, "INVALID_CHANNEL")
        action = _string_field(_json_body(request), "action")
        if action not in TOPIC_ACTIONS:
            raise HTTPError(400, "INVALID_ACTION")
        warnings: list[str] = []
        await self.cluster.channel_action(topic, channel, action, warnings)
        self.notifier.notify(request, f"{action}_channel", topic, channel)
        log.info("ACTION: %s channel %s/%s", action, topic, channel)
        return self._done(warnings)

    async def tombstone(self, request: Request, node: str) -> Response:
        self.guard.check_action(request)
        body = _json_body(request, error="INVALID_BODY")
        topic = body.get("topic")
        if not isinstance(topic, str) or not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        warnings: list[str] = []
        await self.cluster.tombstone_topic(topic, node, warnings)
        self.notifier.notify(request, "tombstone_topic_producer", topic, node=node)
        log.info("ACTION: tombstone topic %s on %s", topic, node)
        return self._done(warnings)

    # -- config -----------------------------------------------------------------------------------------------
    def _check_config_access(self, request: Request) -> None:
        host = request.remote_address.rpartition(":")[0].strip("[]")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise HTTPError(400, "INVALID_REMOTE_ADDR") from None
        if address not in ipaddress.ip_network(self.opts.allow_config_from_cidr, strict=False):
            raise HTTPError(403, "FORBIDDEN")

    async def config(self, request: Request, opt: str) -> Response:
        self._check_config_access(request)
        if request.method == "PUT":
            return self._put_config(request, opt)
        if opt == "log_level":
            return json_response(get_log_level(log))
        try:
            return json_response(config_value(self.opts, opt))
        except KeyError:
            raise HTTPError(400, "INVALID_OPTION") from None

    def _put_config(self, request: Request, opt: str) -> Response:
        if opt == "nsqlookupd_http_addresses":
            try:
                value = json.loads(request.body)
            except ValueError:
                raise HTTPError(400, "INVALID_VALUE") from None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise HTTPError(400, "INVALID_VALUE")
            self.opts.lookupd_http_addresses = value
            log.info("CONFIG: nsqlookupd_http_addresses set to %s", value)
            return json_response(value)
        if opt == "log_level":
            word = request.body.decode("utf-8", "replace").strip()
            try:
                level = set_log_level(log, word)
            except ValueError:
                raise HTTPError(400, "INVALID_VALUE") from None
            self.opts.log_level = log_level_word(level)
            return json_response(level)
        raise HTTPError(400, "INVALID_OPTION")


def build_router(admin) -> Router:
    api = AdminAPI(admin)
    router = Router(logger=log)
    base = "" if admin.opts.base_path == "/" else admin.opts.base_path

    def add(methods, path, handler, **extra) -> None:
        router.add(methods, (base + path) or "/", handler, **extra)

    for page in PAGES:
        add(["GET"], page, api.index)
    add(["GET"], "/ping", api.ping)
    add(["GET"], "/static/:asset", api.static_asset, access_log=False)
    add(["GET", "POST"], "/api/topics", _by_method(get=api.topics, post=api.create_topic_channel))
    add(
        ["GET", "POST", "DELETE"],
        "/api/topics/:topic",
        _by_method(get=api.topic, post=api.topic_action, delete=api.delete_topic),
    )
    add(
        ["GET", "POST", "DELETE"],
        "/api/topics/:topic/:channel",
        _by_method(get=api.channel, post=api.channel_action, delete=api.delete_channel),
    )
    add(["GET"], "/api/nodes", _by_method(get=api.nodes))
    add(
        ["GET", "POST", "DELETE"],
        "/api/nodes/:node",
        _by_method(get=api.node, post=api.node_action, delete=api.tombstone),
    )
    add(["GET"], "/api/counter", _by_method(get=api.counter))
    add(["GET"], "/api/graphite", api.graphite)
    add(["GET"], "/api/session", api.session)
    add(["GET"], "/api/history", api.history_overview, access_log=False)
    add(["GET"], "/api/history/topics/:topic", api.history_topic, access_log=False)
    add(["GET"], "/api/history/topics/:topic/:channel", api.history_channel, access_log=False)
    add(["GET"], "/api/history/nodes/:node", api.history_node, access_log=False)
    add(["GET", "PUT"], "/config/:opt", api.config)
    if admin.opts.proxy_graphite and admin.opts.graphite_url:
        add(["GET"], "/render", api.render_proxy)
    return router


def _by_method(**handlers):
    """One route for several methods, each with its handler; upstream failures become 502."""

    async def dispatch(request: Request, **params) -> Response:
        handler = handlers[request.method.lower() if request.method != "HEAD" else "get"]
        try:
            return await handler(request, **params)
        except ClusterError as exc:
            return error_response(502, f"UPSTREAM_ERROR: {exc}")

    return dispatch
