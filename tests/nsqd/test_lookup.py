"""nsqd's lookup loop on the wire: a real NSQD (in this process) against a recording "  V1" server.

The server decodes what nsqd sends with the protocol's own state machine and answers as lookupd does, so these
tests pin the exact commands, their order, the PING period (shortened here) and the reconnect behaviour.
"""

from __future__ import annotations

import json
import math

import pytest
import trio

from nsqd.options import parse_options
from nsqd.server import NSQD
from protocol.errors import ProtocolError
from protocol.lookup_v1 import (
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

pytestmark = pytest.mark.timeout(30)


class RecordingLookupd:
    """Accepts connections, records every event per connection, answers like nsqlookupd."""

    def __init__(self) -> None:
        self.connections: list[list] = []
        self.changed = trio.Condition()
        self.streams: list[trio.SocketStream] = []
        self.port = 0

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        await trio.serve_listeners(self._handle, listeners, task_status=task_status)

    async def _handle(self, stream: trio.SocketStream) -> None:
        events: list = []
        self.connections.append(events)
        self.streams.append(stream)
        protocol = ServerProtocol()
        try:
            while True:
                event = protocol.next_event()
                if event is NEED_DATA:
                    data = await stream.receive_some(4096)
                    if not data:
                        return
                    protocol.receive_data(data)
                    continue
                events.append(event)
                async with self.changed:
                    self.changed.notify_all()
                if isinstance(event, Identify):
                    # no broadcast address: nsqd then has no HTTP API to ask for channels to pre-create
                    answer = encode_identify_response(
                        broadcast_address="", hostname="rec", http_port=self.port, tcp_port=self.port, version="1.3.0"
                    )
                else:
                    answer = OK
                await stream.send_all(encode_response(answer))
        except (trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError):
            return

    async def wait_until(self, predicate) -> None:
        async with self.changed:
            while not predicate():
                await self.changed.wait()


def registrations(events) -> list:
    return [e for e in events if isinstance(e, (Register, Unregister))]


async def start_nsqd(nursery, tmp_path, lookupd: RecordingLookupd, *, ping_interval: float = math.inf) -> NSQD:
    opts = parse_options(
        [
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={tmp_path}",
            "--broadcast-address=127.0.0.1",
            f"--lookupd-tcp-address=127.0.0.1:{lookupd.port}",
        ],
        exit_on_error=False,
    )
    nsqd = NSQD(opts)
    nsqd.lookup.ping_interval = ping_interval
    await nursery.start(nsqd.run)
    await nsqd.lookup.peers[f"127.0.0.1:{lookupd.port}"].wait_connected()
    return nsqd


def stop(nsqd, nursery) -> None:
    nsqd.exit()
    nursery.cancel_scope.cancel()


async def test_identify_register_and_notifications(tmp_path):
    lookupd = RecordingLookupd()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(lookupd.serve)
            nsqd = await start_nsqd(nursery, tmp_path, lookupd)
            identify = lookupd.connections[0][0]
            assert isinstance(identify, Identify)
            assert identify.peer.broadcast_address == "127.0.0.1"
            assert identify.peer.tcp_port == int(nsqd.tcp_address.rpartition(":")[2])
            assert identify.peer.http_port == int(nsqd.http_address.rpartition(":")[2])
            assert identify.peer.version == "1.3.0"
            # topics and channels as they come and go
            topic = nsqd.get_topic("orders")
            topic.get_channel("billing")
            topic.get_channel("audit#ephemeral")
            topic.delete_channel("audit#ephemeral")
            nsqd.delete_topic("orders")
            expected = [
                Register("orders", ""),
                Register("orders", "billing"),
                Register("orders", "audit#ephemeral"),
                Unregister("orders", "audit#ephemeral"),
                Unregister("orders", ""),
                Unregister("orders", "billing"),
            ]
            await lookupd.wait_until(lambda: len(registrations(lookupd.connections[0])) >= len(expected))
            assert registrations(lookupd.connections[0]) == expected
            stop(nsqd, nursery)


async def test_reconnect_announces_everything(tmp_path):
    lookupd = RecordingLookupd()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(lookupd.serve)
            nsqd = await start_nsqd(nursery, tmp_path, lookupd)
            nsqd.get_topic("quiet")
            events = nsqd.get_topic("busy")
            events.get_channel("c1")
            events.get_channel("c2")
            await lookupd.wait_until(lambda: len(registrations(lookupd.connections[0])) == 4)
            # lookupd drops the connection: nsqd notices without waiting for a PING and announces all again
            await lookupd.streams[0].aclose()
            await lookupd.wait_until(lambda: len(lookupd.connections) == 2 and len(lookupd.connections[1]) == 4)
            second = lookupd.connections[1]
            assert isinstance(second[0], Identify)
            assert sorted(second[1:], key=repr) == sorted(
                [Register("quiet", ""), Register("busy", "c1"), Register("busy", "c2")], key=repr
            )
            peer = nsqd.lookup.peers[f"127.0.0.1:{lookupd.port}"]
            await peer.wait_connected()
            assert peer.connects == 2
            stop(nsqd, nursery)


async def test_ping_period(tmp_path):
    lookupd = RecordingLookupd()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(lookupd.serve)
            nsqd = await start_nsqd(nursery, tmp_path, lookupd, ping_interval=0.05)
            await lookupd.wait_until(
                lambda: lookupd.connections and sum(isinstance(e, Ping) for e in lookupd.connections[0]) >= 3
            )
            assert len(lookupd.connections) == 1  # PINGs answered: the same connection throughout
            stop(nsqd, nursery)


async def test_addresses_change_at_run_time(tmp_path):
    first, second = RecordingLookupd(), RecordingLookupd()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(first.serve)
            await nursery.start(second.serve)
            nsqd = await start_nsqd(nursery, tmp_path, first)
            nsqd.get_topic("kept")
            await first.wait_until(lambda: registrations(first.connections[0]))
            nsqd.set_lookupd_addresses([f"127.0.0.1:{second.port}"])
            assert nsqd.opts.lookupd_tcp_addresses == [f"127.0.0.1:{second.port}"]
            await second.wait_until(lambda: second.connections and registrations(second.connections[0]))
            assert registrations(second.connections[0]) == [Register("kept", "")]
            assert list(nsqd.lookup.peers) == [f"127.0.0.1:{second.port}"]
            stop(nsqd, nursery)


def test_identify_body_is_go_json_with_sorted_keys():
    from protocol.lookup_v1 import encode_identify

    data = encode_identify(broadcast_address="a", hostname="h", http_port=2, tcp_port=1, version="1.3.0")
    body = data.split(b"\n", 1)[1][4:]
    assert list(json.loads(body)) == ["broadcast_address", "hostname", "http_port", "tcp_port", "version"]
