"""Admin-action notifications: a JSON POST to ``--notification-http-endpoint`` for each action, as nsqadmin sends.

The body (FACTS 8.5): ``action``, ``topic``, ``channel`` and ``node`` (left out when empty), ``timestamp``
(Unix seconds), ``user`` (the HTTP Basic-auth user, left out when none), ``remote_ip`` (the client's
``ip:port``), ``user_agent``, ``url`` (the request's URL; ``https`` when served over TLS or when a proxy says
``X-Scheme: https``) and ``via`` (this host's name).

Sending is fire-and-forget: the action's answer never waits for it. Notifications go through a bounded
memory channel to one task that posts them in order; when the endpoint is slow and the channel is full, a
notification is dropped and logged rather than holding up the admin.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import time

import trio

from protocol.http import Request

from .http_client import HTTPClient, UpstreamError

__all__ = ["Notifier", "notification"]

log = logging.getLogger("nsqadmin")
QUEUE_SIZE = 256


def _basic_user(request: Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return ""
    try:
        return base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")[0]
    except (ValueError, UnicodeDecodeError):
        return ""


def notification(
    request: Request, action: str, topic: str, channel: str = "", node: str = "", via: str | None = None
) -> dict:
    scheme = "https" if request.tls or request.headers.get("X-Scheme", "").lower() == "https" else "http"
    body: dict = {"action": action, "topic": topic}
    if channel:
        body["channel"] = channel
    if node:
        body["node"] = node
    body["timestamp"] = int(time.time())
    user = _basic_user(request)
    if user:
        body["user"] = user
    body["remote_ip"] = request.remote_address
    body["user_agent"] = request.headers.get("User-Agent", "")
    body["url"] = f"{scheme}://{request.headers.get('Host', '')}{request.target}"
    body["via"] = via if via is not None else socket.gethostname()
    return body


class Notifier:
    def __init__(self, endpoint: str, client: HTTPClient) -> None:
        self.endpoint = endpoint
        self.client = client
        self._send, self._receive = trio.open_memory_channel(QUEUE_SIZE)

    def notify(self, request: Request, action: str, topic: str, channel: str = "", node: str = "") -> None:
        if not self.endpoint:
            return
        try:
            self._send.send_nowait(notification(request, action, topic, channel, node))
        except trio.WouldBlock:
            log.warning("NOTIFY: queue full, dropped %s %s", action, topic)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for body in self._receive:
            data = json.dumps(body, separators=(",", ":")).encode()
            try:
                reply = await self.client.request(
                    "POST", self.endpoint, data, headers={"Content-Type": "application/json"}
                )
                if reply.status >= 400:
                    log.warning("NOTIFY: %s answered %d", self.endpoint, reply.status)
            except UpstreamError as exc:
                log.warning("NOTIFY: failed - %s", exc)
