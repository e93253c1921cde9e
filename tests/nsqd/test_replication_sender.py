"""The origin's sender on an in-process origin, against a replica played by the test over a real socket: large
batches are written as they are made, and a write the socket takes only in part is finished before anything
else goes out."""

from __future__ import annotations

import trio

from nsqd.options import parse_options
from nsqd.replication import sender
from nsqd.server import NSQD
from protocol.replication import MAGIC_R1, Ack, Finished, Hello, Messages, ReplicationDecoder, Synced, Welcome, encode


async def _next(stream, decoder: ReplicationDecoder):
    while (event := decoder.next_event()) is None:
        data = await stream.receive_some(65536)
        assert data, "the origin closed the stream"
        decoder.receive_data(data)
    return event


async def test_batches_written_beyond_what_the_socket_takes_arrive_whole_and_in_order(tmp_path):
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    opts = parse_options(["--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={tmp_path}",
                          f"--replicate-to=127.0.0.1:{port}", "--replication-degraded=accept",
                          "--mem-queue-size=100000"], exit_on_error=False)
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
    assert sender.DIRECT_SIZE < len(batches[0]) * 1000


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
    assert warnings == [f"REPLICATION: peer 127.0.0.1:{port} did not answer within 0.5 s (no WELCOME yet) at start-up: "
                        "delivering the messages this node holds, any it adopted included (at-least-once)"]
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
        r.getMessage() for r in caplog.records]
