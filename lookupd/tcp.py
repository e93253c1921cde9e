"""One ``  V1`` connection from an nsqd: the magic, the command loop, and cleanup on close.

The sans-IO ``protocol.lookup_v1.ServerProtocol`` turns received bytes into events; this loop
applies them to the registration database and answers, one write per received buffer. Every
protocol error is fatal, as in nsqlookupd: the error text is sent as a response and the
connection closes. Whatever way the connection ends, the peer leaves every registration (the keys
themselves stay).

lookupd sets no read deadline: an nsqd PINGs every 15 s, and an idle peer is only marked inactive
(``--inactive-producer-timeout``), never disconnected.
"""

from __future__ import annotations

import logging
import time

import trio

from protocol.errors import E_BAD_PROTOCOL, LineTooLong, ProtocolError
from protocol.lookup_v1 import (
    CLOSED,
    MAGIC_V1,
    NEED_DATA,
    OK,
    Identify,
    Ping,
    Register,
    ServerProtocol,
    Unregister,
    encode_identify_response,
    encode_response,
)
from protocol.names import is_ephemeral
from protocol.version import NSQ_VERSION
from runtime.http_server import go_duration

from .registration_db import CLIENT, PeerInfo, Producer, Registration

__all__ = ["LookupConnection"]

log = logging.getLogger("nsqlookupd")

RECEIVE_SIZE = 65536
ERROR_SEND_TIMEOUT = 1.0


class LookupConnection:
    """Drives one peer connection until it closes; ``run`` never raises for a client's misbehaviour."""

    def __init__(self, lookupd, stream: trio.SocketStream, remote: str) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.stream = stream
        self.remote = remote
        self.peer: PeerInfo | None = None
        self.protocol = ServerProtocol()

    async def run(self) -> None:
        protocol = self.protocol
        out: list[bytes] = []
        opening = b""
        while len(opening) < 4:
            data = await self.stream.receive_some(RECEIVE_SIZE)
            if not data:
                log.error("failed to read protocol version - %s", "unexpected EOF" if opening else "EOF")
                return
            opening += data
        log.info("CLIENT(%s): desired protocol magic '%s'", self.remote, _text(opening[:4]))
        protocol.receive_data(opening)
        try:
            while True:
                try:
                    event = protocol.next_event()
                except ProtocolError as exc:
                    if exc.code == E_BAD_PROTOCOL:
                        log.error("client(%s) bad protocol magic '%s'", self.remote, _text(protocol.magic))
                    else:
                        log.error("[%s] - %s", self.remote, exc)
                    out.append(encode_response(exc.payload()))
                    with trio.move_on_after(ERROR_SEND_TIMEOUT):
                        await self._flush(out)
                    return
                except LineTooLong as exc:
                    log.error("[%s] - %s", self.remote, exc)
                    return
                if event is NEED_DATA:
                    await self._flush(out)
                    protocol.receive_data(await self.stream.receive_some(RECEIVE_SIZE))
                elif event is CLOSED:
                    await self._flush(out)
                    return
                else:
                    out.append(encode_response(self.handle(event)))
        finally:
            if protocol.magic == MAGIC_V1:
                log.info("PROTOCOL(V1): [%s] exiting ioloop", self.remote)
            self._leave()

    async def _flush(self, out: list[bytes]) -> None:
        if out:
            data = b"".join(out)
            out.clear()
            await self.stream.send_all(data)

    # -- commands ------------------------------------------------------------------------------------
    def handle(self, event) -> bytes:
        if type(event) is Ping:
            return self.PING()
        if type(event) is Register:
            return self.REGISTER(event.topic, event.channel)
        if type(event) is Unregister:
            return self.UNREGISTER(event.topic, event.channel)
        if type(event) is Identify:
            return self.IDENTIFY(event)
        raise AssertionError(event)

    def PING(self) -> bytes:
        peer = self.peer
        if peer is not None:
            now = time.time_ns()
            log.info("CLIENT(%s): pinged (last ping %s)", peer.id, go_duration(now - peer.last_update))
            peer.last_update = now
        return OK

    def IDENTIFY(self, event: Identify) -> bytes:
        fields = event.peer
        peer = PeerInfo(
            id=self.remote,
            remote_address=self.remote,
            hostname=fields.hostname,
            broadcast_address=fields.broadcast_address,
            tcp_port=fields.tcp_port,
            http_port=fields.http_port,
            version=fields.version,
            last_update=time.time_ns(),
        )
        log.info(
            "CLIENT(%s): IDENTIFY Address:%s TCP:%d HTTP:%d Version:%s",
            self.remote,
            peer.broadcast_address,
            peer.tcp_port,
            peer.http_port,
            peer.version,
        )
        self.peer = peer
        if self.db.add_producer(CLIENT, Producer(peer)):
            self._log_db("REGISTER", CLIENT)
        lookupd = self.lookupd
        return encode_identify_response(
            broadcast_address=lookupd.opts.broadcast_address,
            hostname=lookupd.hostname,
            http_port=lookupd.http_port or 0,
            tcp_port=lookupd.tcp_port or 0,
            version=NSQ_VERSION,
        )

    def REGISTER(self, topic: str, channel: str) -> bytes:
        peer = self.peer
        assert peer is not None  # the protocol refuses REGISTER before IDENTIFY
        if channel:
            key = Registration("channel", topic, channel)
            if self.db.add_producer(key, Producer(peer)):
                self._log_db("REGISTER", key)
        key = Registration("topic", topic, "")
        if self.db.add_producer(key, Producer(peer)):
            self._log_db("REGISTER", key)
        return OK

    def UNREGISTER(self, topic: str, channel: str) -> bytes:
        peer = self.peer
        assert peer is not None
        db = self.db
        if channel:
            key = Registration("channel", topic, channel)
            removed, left = db.remove_producer(key, peer.id)
            if removed:
                self._log_db("UNREGISTER", key)
            if left == 0 and is_ephemeral(channel):
                db.remove_registration(key)
            return OK
        # A topic unregistration takes the peer off the topic's channels too; nsqd unregisters
        # those first, so finding any left is unexpected.
        for key in db.find_registrations("channel", topic, "*"):
            removed, _ = db.remove_producer(key, peer.id)
            if removed:
                log.warning(
                    "client(%s) unexpected UNREGISTER category:%s key:%s subkey:%s",
                    self.remote,
                    key.category,
                    key.key,
                    key.subkey,
                )
        key = Registration("topic", topic, "")
        removed, left = db.remove_producer(key, peer.id)
        if removed:
            self._log_db("UNREGISTER", key)
        if left == 0 and is_ephemeral(topic):
            db.remove_registration(key)
        return OK

    def _log_db(self, action: str, key: Registration) -> None:
        log.info(
            "DB: client(%s) %s category:%s key:%s subkey:%s", self.remote, action, key.category, key.key, key.subkey
        )

    def _leave(self) -> None:
        if self.peer is None:
            return
        for key in self.db.remove_peer(self.peer.id):
            self._log_db("UNREGISTER", key)


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "surrogateescape")
