"""The origin's sender on an in-process origin, against a replica played by the test over a real socket: large
batches are written as they are made, a write the socket takes only in part is finished before anything
else goes out, and an ACK is taken by the read poller, which sends the OK it covers."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from nsqd.message import Message
from nsqd.options import parse_options
from nsqd.replication import sender
from nsqd.server import NSQD
from protocol.commands import MAGIC_V2, encode_mpub
from protocol.replication import (
    HEARTBEAT_FRAME,
    MAGIC_R1,
    OP_CREATED,
    OP_LOG,
    Ack,
    ChannelOp,
    Error,
    Finished,
    Heartbeat,
    Hello,
    Messages,
    ReplicationDecoder,
    Synced,
    Welcome,
    encode,
)


async def _next(stream, decoder: ReplicationDecoder):
    while (event := decoder.next_event()) is None:
        data = await stream.receive_some(65536)
        assert data, "the origin closed the stream"
        decoder.receive_data(data)
    return event


REPLICA_WELCOME = Welcome("replica:1", "", 0)


async def _origin_with_replica(tmp_path, nursery, *flags, welcome: Welcome = REPLICA_WELCOME):
    """An in-process origin replicating to the test: (nsqd, the replica's end of the stream, its decoder)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    opts = parse_options(
        [
            "--tcp-address=127.0.0.1:0",
            "--http-address=",
            f"--data-path={tmp_path}",
            f"--replicate-to=127.0.0.1:{port}",
            *flags,
        ],
        exit_on_error=False,
    )
    nsqd = NSQD(opts)
    await nursery.start(nsqd.run)
    stream = await listeners[0].accept()
    assert await stream.receive_some(4) == MAGIC_R1
    decoder = ReplicationDecoder()
    assert type(await _next(stream, decoder)) is Hello
    await stream.send_all(encode(welcome))
    decoder.version = welcome.version  # a replica of that version: it refuses what that version lacks
    while type(event := await _next(stream, decoder)) is not Synced:  # the (empty) backfill
        pass
    await stream.send_all(encode(Ack(event.seq)))
    while nsqd.replication.degraded:
        await trio.sleep(0.01)
    return nsqd, stream, decoder


async def _connect(nsqd) -> trio.SocketStream:
    """A client connection to the origin's TCP port."""
    host, _, port = nsqd.tcp_address.rpartition(":")
    return await trio.open_tcp_stream(host, int(port))


async def test_an_ack_is_taken_by_the_read_poller_and_sends_the_ok_it_covers_without_a_turn_of_the_loop(tmp_path):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nsqd, stream, decoder = await _origin_with_replica(tmp_path, nursery)
            client = await _connect(nsqd)
            await client.send_all(MAGIC_V2 + encode_mpub("t", [b"one", b"two"]))
            while type(event := await _next(stream, decoder)) is not Messages:  # the topic's creation first
                pass
            assert [m.body for m in event.messages] == [b"one", b"two"]
            await trio.testing.wait_all_tasks_blocked()  # the connection's writer waits for the ACK
            fd = client.socket.fileno()
            try:
                os.read(fd, 100)
                raise AssertionError("an OK before the replica acknowledged")
            except BlockingIOError:
                pass
            # the ACK arrives while the loop is busy: no await from here on, so only the poller can take it
            os.write(stream.socket.fileno(), encode(Ack(event.seq)))
            nsqd.read_poller.poll_once()
            assert nsqd.replication.acked == event.seq
            assert os.read(fd, 100) == b"\0\0\0\x06\0\0\0\0OK"
            await client.aclose()
            nursery.cancel_scope.cancel()


async def test_a_pipelined_publish_gets_no_ok_before_the_replica_acknowledged_it(tmp_path):
    """Two MPUBs on one connection, the second read while the first waits for its ACK: the ACK of the first
    alone must not let the second's OK out."""
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nsqd, stream, decoder = await _origin_with_replica(tmp_path, nursery)
            client = await _connect(nsqd)
            await client.send_all(MAGIC_V2 + encode_mpub("t", [b"one"]))
            while type(first := await _next(stream, decoder)) is not Messages:  # the topic's creation first
                pass
            await trio.testing.wait_all_tasks_blocked()  # the writer waits for the first ACK
            await client.send_all(encode_mpub("t", [b"two"]))
            while type(second := await _next(stream, decoder)) is not Messages:
                pass
            assert second.seq > first.seq
            await stream.send_all(encode(Ack(first.seq)))
            while nsqd.replication.acked < first.seq:
                await trio.sleep(0.01)
            await trio.testing.wait_all_tasks_blocked()
            ok = b"\0\0\0\x06\0\0\0\0OK"
            try:
                early = os.read(client.socket.fileno(), 100)
            except BlockingIOError:
                early = b""
            assert early in (b"", ok), "the second OK left before the replica held its message"
            await stream.send_all(encode(Ack(second.seq)))
            received = early
            while len(received) < 2 * len(ok):
                received += await client.receive_some(100)
            assert received == ok * 2
            await client.aclose()
            nursery.cancel_scope.cancel()


async def test_a_publish_waiting_for_its_ack_holds_no_task_and_the_ack_writes_its_ok(tmp_path):
    """The OK of a publish waits in the replicator's heap as a call (``call_when_acked``), not as a writer task
    woken to wait for an event: the ACK writes it."""
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nsqd, stream, decoder = await _origin_with_replica(tmp_path, nursery)
            client = await _connect(nsqd)
            await client.send_all(MAGIC_V2)
            for body in (b"one", b"two"):  # the first also meets the connection's tasks as they start
                await client.send_all(encode_mpub("t", [body]))
                while type(event := await _next(stream, decoder)) is not Messages:
                    pass
                await trio.testing.wait_all_tasks_blocked()
                waiting = nsqd.replication._waiters
                assert waiting, "the OK waits for nothing"
                if body == b"two":
                    assert all(entry[2] is None for entry in waiting), "a task waits for the ACK"
                await stream.send_all(encode(Ack(event.seq)))
                assert await client.receive_some(100) == b"\0\0\0\x06\0\0\0\0OK"
            await client.aclose()
            nursery.cancel_scope.cancel()


async def test_a_publish_waiting_when_its_only_peer_goes_gets_no_ok_and_its_connection_closes(tmp_path):
    """``--replication-degraded=refuse`` (the default): the peer's stream ends while a publish waits for its ACK;
    the publisher gets no OK, and its connection is closed."""
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nsqd, stream, decoder = await _origin_with_replica(tmp_path, nursery)
            client = await _connect(nsqd)
            await client.send_all(MAGIC_V2 + encode_mpub("t", [b"one"]))
            while type(await _next(stream, decoder)) is not Messages:
                pass
            await trio.testing.wait_all_tasks_blocked()
            await stream.aclose()
            received = b""
            while data := await client.receive_some(100):
                received += data
            assert received == b"", "an OK for a message no peer holds"
            assert nsqd.replication.degraded
            nursery.cancel_scope.cancel()


async def test_the_sender_task_writes_what_the_socket_takes_without_a_turn_of_the_loop(tmp_path):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nsqd, stream, decoder = await _origin_with_replica(tmp_path, nursery)
            replication = nsqd.replication
            peer = replication.peers[0]
            while peer.fd < 0:
                await trio.sleep(0.01)
            # no turn of the loop in which a publish would find the sender writing (and not write its frame)
            with trio.testing.assert_no_checkpoints():
                await replication._send(peer, None, HEARTBEAT_FRAME)
            assert not peer.sending
            while type(await _next(stream, decoder)) is not Heartbeat:
                pass
            nursery.cancel_scope.cancel()


async def test_an_error_or_the_end_of_the_stream_read_by_the_poller_ends_the_connection(tmp_path, caplog):
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nsqd, stream, decoder = await _origin_with_replica(tmp_path, nursery, "--replication-degraded=accept")
            peer = nsqd.replication.peers[0]
            # an ACK and an ERROR in one read: the ACK counts, the ERROR ends the connection
            await stream.send_all(encode(Ack(peer.acked)) + encode(Error("E_STORE_FAILED", "disk full")))
            while peer.state == "connected":
                await trio.sleep(0.01)
            assert "E_STORE_FAILED" in caplog.text and nsqd.replication.degraded
            nursery.cancel_scope.cancel()
    (tmp_path / "eof").mkdir()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nsqd, stream, decoder = await _origin_with_replica(
                tmp_path / "eof", nursery, "--replication-degraded=accept"
            )
            await stream.aclose()
            while nsqd.replication.peers[0].state == "connected":
                await trio.sleep(0.01)
            assert "peer 127.0.0.1" in caplog.text and "lost - connection closed by the peer" in caplog.text
            nursery.cancel_scope.cancel()


async def test_batches_written_beyond_what_the_socket_takes_arrive_whole_and_in_order(tmp_path):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    opts = parse_options(
        [
            "--tcp-address=127.0.0.1:0",
            "--http-address=",
            f"--data-path={tmp_path}",
            f"--replicate-to=127.0.0.1:{port}",
            "--replication-degraded=accept",
            "--mem-queue-size=100000",
        ],
        exit_on_error=False,
    )
    nsqd = NSQD(opts)
    batches = [[b"%04d-%03d" % (n, i) + b"." * 992 for i in range(100)] for n in range(60)]  # 100 KB each
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(nsqd.run)
            stream = await listeners[0].accept()
            assert await stream.receive_some(4) == MAGIC_R1
            decoder = ReplicationDecoder()
            hello = await _next(stream, decoder)
            assert type(hello) is Hello
            await stream.send_all(encode(Welcome("replica:1", "", 0)))
            while type(event := await _next(stream, decoder)) is not Synced:  # the (empty) backfill
                pass
            await stream.send_all(encode(Ack(event.seq)))
            replication = nsqd.replication
            while replication.degraded:
                await trio.sleep(0.01)
            topic = nsqd.get_topic("t")
            await trio.sleep(0.1)  # the topic's creation goes out first
            first_seq = replication.seq + 1
            # 6 MB in one turn of the event loop, the replica not reading: the socket takes part of it at once
            for bodies in batches:
                topic.publish(bodies)
            peer = replication.peers[0]
            assert peer.sent >= first_seq  # the batches went out as they were made, until the socket was full:
            assert peer.tail is not None  # the rest of the frame it took in part waits for the sender task
            received = []
            while len(received) < len(batches):
                event = await _next(stream, decoder)
                if type(event) is Messages:
                    received.append(event)
                else:
                    assert type(event) is Finished or event.seq < first_seq, event
            assert [event.seq for event in received] == list(range(first_seq, first_seq + len(batches)))
            assert [[m.body for m in event.messages] for event in received] == batches
            await stream.send_all(encode(Ack(received[-1].seq)))
            while replication.acked < received[-1].seq:
                await trio.sleep(0.01)
            assert peer.tail is None
            nursery.cancel_scope.cancel()
    assert len(batches[0]) * 1000 > sender.DIRECT_SIZE


async def test_a_starting_node_waits_for_a_peer_that_took_its_connection_and_says_when_it_gives_up(caplog):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    replicator = sender.Replicator("127.0.0.1:1", [f"127.0.0.1:{port}"], acks=1, degraded="accept", durable=False)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(replicator.run)
            taken = await listeners[0].accept()  # never answered
            await replicator.wait_started(0.5)
            assert replicator.ready.is_set() and not replicator.peers[0].welcomed
            nursery.cancel_scope.cancel()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"REPLICATION: peer 127.0.0.1:{port} did not answer within 0.5 s (no WELCOME yet) at start-up: "
        "delivering the messages this node holds, any it adopted included (at-least-once)"
    ]
    await taken.aclose()
    await listeners[0].aclose()


async def test_a_starting_node_does_not_wait_for_a_peer_that_refuses_its_connection(caplog):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()  # nothing listens there
    replicator = sender.Replicator("127.0.0.1:1", [f"127.0.0.1:{port}"], acks=1, degraded="accept", durable=False)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(replicator.run)
            await replicator.wait_started(3600)  # returns once the connection was refused
            nursery.cancel_scope.cancel()
    assert replicator.peers[0].unreachable
    assert "REPLICATION: no peer reachable at start-up: delivering the messages this node holds (at-least-once)" in [
        r.getMessage() for r in caplog.records
    ]


class _Finished:
    """What ``Replicator.finished`` reads of a message."""

    def __init__(self, msg_id: bytes) -> None:
        self.id = msg_id


def test_the_outbox_stays_bounded_while_no_peer_acknowledges(monkeypatch):
    # every peer gone in ``accept`` mode: no ACK trims the outbox, so publishes, FINs and requeues must not grow
    # it past the limit; the peer falls behind and gets a backfill when it comes back
    limit = 64 * 1024
    monkeypatch.setattr(sender, "OUTBOX_LIMIT", limit)
    replicator = sender.Replicator("127.0.0.1:1", ["127.0.0.1:9"], acks=1, degraded="accept", durable=False)
    for n in range(1000):
        replicator.offer_published("t", [b"%016d" % n], [b"x" * 1000], 1)
    assert limit - 2000 < replicator._outbox_bytes <= limit
    assert replicator.peers[0].lagging
    assert replicator.statistics().unreplicated_messages == len(replicator._outbox)
    for n in range(3 * sender.FIN_BATCH):
        replicator.finished("t", "c", [_Finished(b"%016d" % n)])
        replicator.requeued("t", "d", [(b"%016d" % n, 1, 0)])
    assert len(replicator._fins.get(("t", "c"), ())) < sender.FIN_BATCH
    assert len(replicator._requeues.get(("t", "d"), ())) < sender.FIN_BATCH
    assert replicator._outbox_bytes <= limit


@pytest.mark.parametrize("version", [2, 1], ids=["version-2", "version-1"])
async def test_a_log_channel_is_announced_and_its_commits_go_as_fins(tmp_path, version):
    """LOG sends CHANNEL op LOG on a stream of protocol version 2, and op CREATED of the same channel in its
    place (same seq: the seqs stay dense) on one of version 1, whose replica predates log channels; a commit
    sends the FINs of the messages it finishes, without a round trip of its own."""
    log_channels = version >= 2
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            welcome = Welcome("replica:1", "", 0, version=version)
            nsqd, stream, decoder = await _origin_with_replica(tmp_path, nursery, welcome=welcome)
            channel = nsqd.get_topic("t").get_channel("c")
            ops, seqs = [], []
            while (event := await _next(stream, decoder)).channel != "c":
                ops.append((event.channel, event.op))
            ops.append((event.channel, event.op))
            seqs.append(event.seq)
            await stream.send_all(encode(Ack(event.seq)))
            while nsqd.replication.acked < event.seq:  # then the op LOG frame is written as soon as it is made
                await trio.sleep(0.01)
            channel.make_log()
            ids = [b"%016d" % i for i in range(5)]
            channel.put_many([Message(msg_id, b"body", 1, 0, 0.0) for msg_id in ids])
            channel.log_commit(3)
            while type(event := await _next(stream, decoder)) is not Finished:
                if type(event) is ChannelOp:
                    ops.append((event.channel, event.op))
                if hasattr(event, "seq"):
                    seqs.append(event.seq)
            assert ops == [("", OP_CREATED), ("c", OP_CREATED), ("c", OP_LOG if log_channels else OP_CREATED)]
            assert (event.topic, event.channel, list(event.ids)) == ("t", "c", ids[:3])
            seqs.append(event.seq)
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            channel.log_commit(3)  # nothing moved: nothing sent
            channel.log_commit(5)
            while type(event := await _next(stream, decoder)) is not Finished:
                pass
            assert list(event.ids) == ids[3:]
            nursery.cancel_scope.cancel()
