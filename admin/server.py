"""NSQAdmin: the web UI daemon. Owns the HTTP listener, the cluster client, the history sampler and the
notification sender, all in one nursery.

``open_listener`` binds ``--http-address`` (a failure is the FATAL startup error, before anything runs);
``run`` serves until ``exit`` is called, reporting readiness through ``task_status`` once the
``HTTP: listening on <addr>`` line is logged; ``exit`` stops everything by cancellation.
"""

from __future__ import annotations

import logging

import trio

from protocol.version import version_string
from runtime.daemon import adopt_listeners, listen_tcp
from runtime.http_server import HTTPServer

from .cluster import Cluster
from .history import History, Sampler
from .http_api import build_router
from .http_client import HTTPClient, client_ssl_context
from .notify import Notifier
from .security import Guard

__all__ = ["NSQAdmin"]

log = logging.getLogger("nsqadmin")


class NSQAdmin:
    def __init__(self, opts) -> None:
        self.opts = opts
        needs_tls = bool(
            opts.http_client_tls_cert or opts.http_client_tls_root_ca_file or opts.http_client_tls_insecure_skip_verify
        )
        self.client = HTTPClient(
            connect_timeout=opts.http_client_connect_timeout,
            request_timeout=opts.http_client_request_timeout,
            ssl_context=client_ssl_context(opts) if needs_tls else None,
        )
        self.cluster = Cluster(opts, self.client)
        self.history = History(opts.history_interval, opts.history_duration)
        self.sampler = Sampler(self.cluster, self.history)
        self.guard = Guard(opts)
        self.notifier = Notifier(opts.notification_http_endpoint, self.client)
        self.http_address: str | None = None
        self._listeners: list = []
        self._stopped = trio.Event()

    async def open_listener(self, prebound: list | None = None) -> None:
        """Bind ``--http-address``; ``ListenError`` when it cannot be bound. ``prebound``: the sockets the entry
        point bound before start-up (``bind_tcp``)."""
        if prebound is not None:
            self._listeners = adopt_listeners(prebound)
        else:
            self._listeners = await listen_tcp(self.opts.http_address)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        log.info("%s", version_string("nsqadmin"))
        if not self._listeners:
            await self.open_listener()
        http = HTTPServer(build_router(self), logger=log, listeners=self._listeners)
        async with trio.open_nursery() as nursery:
            self.http_address = await nursery.start(http.run)
            await nursery.start(self.sampler.run)
            await nursery.start(self.notifier.run)
            task_status.started(self.http_address)
            await self._stopped.wait()
            log.info("HTTP: closing %s", self.http_address)
            nursery.cancel_scope.cancel()

    def exit(self) -> None:
        self._stopped.set()
