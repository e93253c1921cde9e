"""NSQLookupd: the discovery daemon. Owns the registration database and both listeners.

``open_listeners`` binds the TCP and HTTP addresses (a failure is the daemon's FATAL startup
error, before anything is served); ``run`` serves them inside one nursery and reports readiness
through ``task_status``; ``exit`` stops accepting, closes every peer connection (each peer leaves
its registrations) and returns from ``run``.
"""

from __future__ import annotations

import logging
import socket

import trio

from protocol.version import version_string
from runtime.daemon import ListenError, accept_connections, address_port, adopt_listeners, format_address, listen
from runtime.http_server import HTTPServer

from .http_api import build_router
from .registration_db import RegistrationDB
from .tcp import LookupConnection

__all__ = ["NSQLookupd"]

log = logging.getLogger("nsqlookupd")


class NSQLookupd:
    def __init__(self, opts) -> None:
        self.opts = opts
        self.db = RegistrationDB()
        self.hostname = socket.gethostname()
        self.tcp_port: int | None = None
        self.http_port: int | None = None
        self.tcp_address: str | None = None
        self.http_address: str | None = None
        self.connections: dict[int, LookupConnection] = {}
        self.connections_total = 0
        self.exiting = False
        self._tcp_listeners: list = []
        self._http_listeners: list = []
        self._stopped = trio.Event()
        self._serve_scope = trio.CancelScope()

    @property
    def inactive_producer_timeout_ns(self) -> int:
        return int(round(self.opts.inactive_producer_timeout * 1e9))

    @property
    def tombstone_lifetime_ns(self) -> int:
        return int(round(self.opts.tombstone_lifetime * 1e9))

    async def open_listeners(self, prebound: list | None = None) -> None:
        """Bind both addresses; ``ListenError`` names the one that cannot be bound (nothing stays open then).
        ``prebound``: the TCP and HTTP sockets the entry point bound before start-up (``bind_all``)."""
        if prebound is not None:
            self._tcp_listeners, self._http_listeners = (adopt_listeners(sockets) for sockets in prebound)
        else:
            try:
                self._tcp_listeners = await listen(self.opts.tcp_address)
                self._http_listeners = await listen(self.opts.http_address)
            except ListenError:
                for listener in self._tcp_listeners:
                    await listener.aclose()
                self._tcp_listeners = []
                raise
        self.tcp_address = format_address(self._tcp_listeners[0].socket.getsockname())
        self.http_address = format_address(self._http_listeners[0].socket.getsockname())
        self.tcp_port = address_port(self.tcp_address)  # -1 on a unix socket, as nsqd's /info says
        self.http_port = address_port(self.http_address)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        log.info("%s", version_string("nsqlookupd"))
        if not self._tcp_listeners:
            await self.open_listeners()
        tcp_listeners, http_listeners = self._tcp_listeners, self._http_listeners
        for listener in tcp_listeners:
            log.info("TCP: listening on %s", format_address(listener.socket.getsockname()))
        http = HTTPServer(build_router(self), logger=log, listeners=http_listeners)
        try:
            with self._serve_scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(http.run)
                    nursery.start_soon(self._serve_tcp, tcp_listeners)
                    task_status.started()
                    await self._stopped.wait()
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                for name, listeners in (("TCP", tcp_listeners), ("HTTP", http_listeners)):
                    log.info("%s: closing %s", name, self.tcp_address if name == "TCP" else self.http_address)
                    for listener in listeners:
                        await listener.aclose()

    async def _serve_tcp(self, listeners) -> None:
        async with trio.open_nursery() as connections:
            for listener in listeners:
                connections.start_soon(accept_connections, listener, connections, self._handle_tcp, log)

    async def _handle_tcp(self, stream: trio.SocketStream) -> None:
        try:
            remote = format_address(stream.socket.getpeername())
        except OSError:
            await trio.aclose_forcefully(stream)
            return
        log.info("TCP: new client(%s)", remote)
        connection = LookupConnection(self, stream, remote)
        self.connections[id(connection)] = connection
        self.connections_total += 1
        try:
            await connection.run()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            log.info("[%s] connection error: %s", remote, group.exceptions[0])
        except* Exception as group:
            log.error("[%s] internal error", remote, exc_info=group)
        finally:
            self.connections.pop(id(connection), None)
            await trio.aclose_forcefully(stream)

    def exit(self) -> None:
        """Start a graceful stop: no new connections, close the open ones, return from ``run``."""
        if self.exiting:
            return
        self.exiting = True
        log.info("LOOKUP: exiting")
        self._stopped.set()
