"""nsqd's side of discovery: one connection per ``--lookupd-tcp-address``, kept registered.

Each ``LookupPeer`` is a task that connects (1 s dial timeout), sends the ``  V1`` magic and
IDENTIFY, then announces every topic and channel this nsqd has (``REGISTER <T>`` for a topic
without channels, ``REGISTER <T> <C>`` for each channel otherwise). After that it sends the queued
REGISTER/UNREGISTER notifications as topics and channels come and go, and a PING every 15 s, each
command answered within 1 s. A response is ``[int32 size][bytes]``; lookupd's answers are logged,
not checked, as nsqd does (lookupd closes the connection after any error anyway).

Reconnecting: nsqd notices a lost lookupd at its next command; here a reader task also sees the
connection close at once (lookupd restarted), so the peer reconnects without waiting for the
next PING: after 0.25 s, doubling up to the 15 s ping period while lookupd stays away. Every
reconnect announces everything again; notifications queued for the old connection are dropped,
since lookupd forgot that connection's registrations when it closed.

Channel pre-creation: a topic created at run time (not while loading ``nsqd.dat``) is held, its
messages kept in the topic, while nsqd asks every lookupd it has identified with
(``GET http://<broadcast_address>:<http_port>/channels?topic=<T>``, in parallel, union of the
answers) which channels the topic has; each non-ephemeral one is created, then the topic starts
copying to its channels. So the first messages of a topic already reach the channels consumers
use elsewhere in the cluster. Queries use ``--http-client-connect-timeout`` and
``--http-client-request-timeout``. When no lookupd has identified yet (nsqd just started), the
topic waits for the first, ``IDENTIFY_WAIT`` at most, instead of going on without channels as
nsqd does (``no available nsqlookupd to query for channels to pre-create``): a message published
in that moment would reach only the channel a consumer makes first.

``--lookupd-tcp-address`` can change at run time (``set_addresses``): peers no longer listed are
closed, new ones started.
"""

from __future__ import annotations

import json
import logging
import math
import socket
from collections import deque
from urllib.parse import quote

import trio

from protocol.errors import ProtocolError
from protocol.lookup_v1 import (
    MAGIC_V1,
    PING,
    LookupdInfo,
    ResponseDecoder,
    encode_identify,
    encode_register,
    encode_unregister,
    parse_lookupd_info,
)
from protocol.names import is_ephemeral
from protocol.version import NSQ_VERSION
from runtime.startup import address_port, resolve_port, split_host_port

from .auth import AuthError, http_get

__all__ = ["LookupPeer", "Lookup", "PING_INTERVAL"]

log = logging.getLogger("nsqd")

PING_INTERVAL = 15.0  # fixed in nsqd
DIAL_TIMEOUT = 1.0
IO_TIMEOUT = 1.0
RECONNECT_MIN = 0.25
#: how long a topic created at run time is held for a first lookupd to identify, when none has yet (a node that
#: just started): one connection's dial and IDENTIFY. Its messages wait in the topic meanwhile, so the channels
#: lookupd names (and those consumers make meanwhile) all get them; then, without an answer, it goes on as NSQ's
IDENTIFY_WAIT = DIAL_TIMEOUT + IO_TIMEOUT
RECEIVE_SIZE = 4096
ACCEPT_V1 = ("Accept", "application/vnd.nsq; version=1.0")


class PeerLost(Exception):
    """The lookupd connection failed; the peer reconnects."""


def _describe(command: bytes) -> str:
    """A command as nsqd logs it: the line without its newline (IDENTIFY without its body)."""
    return command.split(b"\n", 1)[0].decode("utf-8", "surrogateescape")


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class LookupPeer:
    """One lookupd: its connection task, its queue of notifications and what it said about itself."""

    def __init__(self, lookup: Lookup, address: str) -> None:
        self.lookup = lookup
        self.address = address
        self.info: LookupdInfo | None = None  # kept across reconnects, like nsqd
        self.connected = False
        self.connects = 0
        self._accepting = False  # queue notifications (the session's announcement is under way)
        self._outbox: deque[tuple[bytes, str]] = deque()
        self._wake = trio.Event()
        self._responses: trio.MemoryReceiveChannel | None = None
        self._pending = 0
        self.scope = trio.CancelScope()
        self._connected_event = trio.Event()

    def __str__(self) -> str:
        return self.address

    def enqueue(self, command: bytes, branch: str) -> None:
        if self._accepting:
            self._outbox.append((command, branch))
            self._wake.set()

    def close(self) -> None:
        self.scope.cancel()

    async def wait_connected(self) -> None:
        """Return once the peer has identified and announced everything on its current connection."""
        await self._connected_event.wait()

    async def run(self) -> None:
        with self.scope:
            delay = RECONNECT_MIN
            while True:
                try:
                    await self._connect_and_serve()
                except* (
                    PeerLost,
                    OSError,
                    trio.BrokenResourceError,
                    trio.ClosedResourceError,
                    trio.TooSlowError,
                    ProtocolError,
                ) as group:
                    log.error("LOOKUPD(%s): %s", self, _reason(group))
                    if self.connected:
                        delay = RECONNECT_MIN  # it worked until now: retry soon
                except* Exception as group:
                    log.error("LOOKUPD(%s): internal error", self, exc_info=group)
                finally:
                    self.connected = False
                    self._accepting = False
                    self._outbox.clear()
                    if self._connected_event.is_set():
                        self._connected_event = trio.Event()
                await trio.sleep(delay)
                delay = min(delay * 2, self.lookup.ping_interval)

    async def _connect_and_serve(self) -> None:
        log.info("LOOKUP connecting to %s", self.address)
        try:
            host, service = split_host_port(self.address)
            port = resolve_port(service)
        except ValueError as exc:
            raise PeerLost(f"dial tcp: {exc}") from None  # Go's words; the address stays until it is replaced
        try:
            with trio.fail_after(DIAL_TIMEOUT):
                stream = await trio.open_tcp_stream(host, port)
        except trio.TooSlowError:
            raise PeerLost(f"dial tcp {self.address}: i/o timeout") from None
        async with stream:
            send, receive = trio.open_memory_channel(math.inf)
            self._responses = receive
            self._pending = 0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_responses, stream, send)
                with trio.fail_after(IO_TIMEOUT):
                    await stream.send_all(MAGIC_V1)
                await self._handshake(stream)
                await self._serve(stream)

    async def _read_responses(self, stream, send) -> None:
        decoder = ResponseDecoder(self.lookup.nsqd.opts.max_body_size)
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                raise PeerLost("connection closed by lookupd")
            decoder.receive_data(data)
            while (response := decoder.next_response()) is not None:
                if self._pending <= 0:
                    raise PeerLost("unexpected response from lookupd")
                self._pending -= 1
                send.send_nowait(response)

    async def _command(self, stream, command: bytes) -> bytes:
        """Send one command and wait for its answer (each within 1 s, as nsqd)."""
        responses = self._responses
        assert responses is not None  # set with the stream
        self._pending += 1
        try:
            with trio.fail_after(IO_TIMEOUT):
                await stream.send_all(command)
                return await responses.receive()
        except trio.TooSlowError:
            raise PeerLost(f"{_describe(command)} - i/o timeout") from None

    async def _handshake(self, stream) -> None:
        nsqd = self.lookup.nsqd
        identify = encode_identify(
            broadcast_address=nsqd.opts.broadcast_address,
            hostname=self.lookup.hostname,
            http_port=self.lookup.broadcast_http_port(),
            tcp_port=self.lookup.broadcast_tcp_port(),
            version=NSQ_VERSION,
        )
        response = await self._command(stream, identify)
        if response == b"E_INVALID":
            log.info("LOOKUPD(%s): lookupd returned %s", self, response.decode())
            raise PeerLost("IDENTIFY refused")
        try:
            info = parse_lookupd_info(response)
        except ValueError:
            raise PeerLost(f"parsing response - {response.decode('utf-8', 'replace')}") from None
        self.info = info
        self.lookup.identified.set()
        log.info(
            "LOOKUPD(%s): peer info {TCPPort:%d HTTPPort:%d Version:%s BroadcastAddress:%s}",
            self,
            info.tcp_port,
            info.http_port,
            info.version,
            info.broadcast_address,
        )
        if not info.broadcast_address:
            log.error("LOOKUPD(%s): no broadcast address", self)
        # From here on notifications queue up; the announcement below covers everything before.
        self._outbox.clear()
        self._accepting = True
        for command in self.lookup.registration_commands():
            log.info("LOOKUPD(%s): %s", self, _describe(command))
            await self._command(stream, command)
        self.connected = True
        self.connects += 1
        self._connected_event.set()

    async def _serve(self, stream) -> None:
        interval = self.lookup.ping_interval
        next_ping = trio.current_time() + interval
        while True:
            while self._outbox:
                command, branch = self._outbox[0]
                log.info("LOOKUPD(%s): %s %s", self, branch, _describe(command))
                await self._command(stream, command)
                self._outbox.popleft()
            if trio.current_time() >= next_ping:
                log.debug("LOOKUPD(%s): sending heartbeat", self)
                await self._command(stream, PING)
                next_ping = trio.current_time() + interval
                continue
            self._wake = trio.Event()
            with trio.move_on_at(next_ping):
                await self._wake.wait()


def _reason(group: BaseExceptionGroup) -> str:
    exc = group.exceptions[0]
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


class Lookup:
    """All lookupd peers of one nsqd (``NSQD.lookup``)."""

    def __init__(self, nsqd, *, ping_interval: float = PING_INTERVAL) -> None:
        self.nsqd = nsqd
        self.ping_interval = ping_interval
        self.hostname = socket.gethostname()
        self.peers: dict[str, LookupPeer] = {}
        self._nursery: trio.Nursery | None = None
        #: set once a lookupd identified itself (its HTTP address is known): a topic's channels can be asked for
        self.identified = trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self.set_addresses(list(self.nsqd.opts.lookupd_tcp_addresses))
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            log.info("LOOKUP: closing")

    # -- configuration ---------------------------------------------------------------------------
    def set_addresses(self, addresses: list[str]) -> None:
        """Close peers no longer listed and start new ones (``PUT /config/nsqlookupd_tcp_addresses``)."""
        self.nsqd.opts.lookupd_tcp_addresses = list(addresses)
        for address in list(self.peers):
            if address not in addresses:
                log.info("LOOKUP(%s): removing peer", address)
                self.peers.pop(address).close()
        if self._nursery is None:
            return
        for address in addresses:
            if address not in self.peers:
                log.info("LOOKUP(%s): adding peer", address)
                peer = self.peers[address] = LookupPeer(self, address)
                self._nursery.start_soon(peer.run)

    def broadcast_tcp_port(self) -> int:
        nsqd = self.nsqd
        if nsqd.opts.broadcast_tcp_port:
            return nsqd.opts.broadcast_tcp_port
        return address_port(nsqd.tcp_address, 0) or address_port(nsqd.opts.tcp_address, 0)

    def broadcast_http_port(self) -> int:
        nsqd = self.nsqd
        if nsqd.opts.broadcast_http_port:
            return nsqd.opts.broadcast_http_port
        return address_port(getattr(nsqd, "http_address", None), 0) or address_port(nsqd.opts.http_address, 0)

    # -- announcements ---------------------------------------------------------------------------
    def registration_commands(self) -> list[bytes]:
        commands = []
        for topic in list(self.nsqd.topics.values()):
            if not topic.channels:
                commands.append(encode_register(topic.name))
            else:
                commands.extend(encode_register(topic.name, name) for name in list(topic.channels))
        return commands

    def _notify(self, command: bytes, branch: str) -> None:
        for peer in self.peers.values():
            peer.enqueue(command, branch)

    # (nothing is encoded for a node without lookupds: a storm of creates pays no command per topic)
    def topic_created(self, topic) -> None:
        if self.peers:
            self._notify(encode_register(topic.name), "topic")

    def topic_deleted(self, topic) -> None:
        if self.peers:
            self._notify(encode_unregister(topic.name), "topic")
            for name in list(topic.channels):
                self._notify(encode_unregister(topic.name, name), "channel")

    def channel_created(self, channel) -> None:
        if self.peers:
            self._notify(encode_register(channel.topic_name, channel.name), "channel")

    def channel_deleted(self, channel) -> None:
        if self.peers:
            self._notify(encode_unregister(channel.topic_name, channel.name), "channel")

    # -- channel pre-creation --------------------------------------------------------------------
    def http_addresses(self) -> list[str]:
        """``host:port`` of the lookupds identified with so far (their broadcast address and HTTP port)."""
        return [
            join_host_port(peer.info.broadcast_address, peer.info.http_port)
            for peer in list(self.peers.values())
            if peer.info is not None and peer.info.broadcast_address
        ]

    def prepare_topic(self, topic) -> None:
        """Called for a topic created at run time: hold it while lookupd says which channels to create."""
        if not self.nsqd.opts.lookupd_tcp_addresses or self._nursery is None:
            return
        topic.held = True
        self._nursery.start_soon(self._precreate_channels, topic)

    async def _precreate_channels(self, topic) -> None:
        try:
            addresses = self.http_addresses()
            if not addresses:  # none identified yet (this node just started): wait for the first, a little
                with trio.move_on_after(IDENTIFY_WAIT):
                    await self.identified.wait()
                addresses = self.http_addresses()
            if not addresses:
                log.error("no available nsqlookupd to query for channels to pre-create for topic %s", topic.name)
                return
            names = await self.topic_channels(topic.name, addresses)
            if self.nsqd.topics.get(topic.name) is topic and not topic.exiting:
                for name in names:
                    if not is_ephemeral(name):  # an ephemeral channel exists only with a consumer
                        topic.get_channel(name)
        finally:
            topic.held = False
            if not topic.exiting:
                topic.pump()
                topic._start_drain()

    async def topic_channels(self, topic_name: str, addresses: list[str]) -> list[str]:
        """The sorted union of the channels the lookupds know for the topic (``[]`` if none answers)."""
        opts = self.nsqd.opts
        found: set[str] = set()
        errors: list[str] = []

        async def query(address: str) -> None:
            url = f"http://{address}/channels?topic={quote(topic_name, safe='')}"
            log.info("CI: querying nsqlookupd %s", url)
            try:
                status, body = await http_get(
                    url,
                    headers=[ACCEPT_V1],
                    ssl_context=None,
                    connect_timeout=opts.http_client_connect_timeout,
                    request_timeout=opts.http_client_request_timeout,
                )
                if status != 200:
                    raise AuthError(f"got response {status} {body[:200]!r}")
                channels = json.loads(body).get("channels") or []
                if not isinstance(channels, list) or not all(isinstance(c, str) for c in channels):
                    raise AuthError(f"bad response {body[:200]!r}")
                found.update(channels)
            except (AuthError, ValueError, AttributeError) as exc:
                errors.append(f"{url}: {exc}")

        async with trio.open_nursery() as nursery:
            for address in addresses:
                nursery.start_soon(query, address)
        if errors:
            log.warning(
                "failed to query nsqlookupd for channels to pre-create for topic %s - %s", topic_name, "; ".join(errors)
            )
        return sorted(found)
