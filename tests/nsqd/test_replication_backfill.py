"""The backfill on an in-process origin: captured at once, then sent in bounded writes with the event loop free
between them; a disk backlog is read whole through the files opened at the capture, even once the queue has read
and deleted them, and nothing published after the capture is in it."""

from __future__ import annotations

import os
import socket

import trio

from nsqd.options import parse_options
from nsqd.replication import snapshot
from nsqd.replication.snapshot import Backfill
from nsqd.server import NSQD
from protocol.replication import ChannelOp, Messages, ReplicationDecoder


def _dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


async def test_a_spilled_backlog_is_sent_in_bounded_steps_from_the_files_of_the_capture(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot, "SEND_SIZE", 16384)
    monkeypatch.setattr(snapshot, "BATCH", 64)
    opts = parse_options(
        [
            "--tcp-address=127.0.0.1:0",
            "--http-address=",
            f"--data-path={tmp_path}",
            "--mem-queue-size=10",
            "--max-bytes-per-file=32768",
            f"--replicate-to={_dead_address()}",
            "--replication-degraded=accept",
        ],
        exit_on_error=False,
    )
    nsqd = NSQD(opts)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(nsqd.run)
            await nsqd.replication.ready.wait()  # the peer is not there: its first attempt failed
            topic = nsqd.get_topic("t")
            channel = topic.get_channel("c")
            topic.get_channel("other#ephemeral")
            before = [b"before%05d" % n + b"." * 100 for n in range(2000)]
            for first in range(0, len(before), 100):
                topic.publish(before[first : first + 100])
            backend = channel.backend
            while topic.depth():  # the topic's drain passes its own backlog on to the channel, onto its disk
                await trio.sleep(0)
            assert backend.depth() > 1500
            first_file = backend.file_name(backend.read_position()[0])

            backfill = Backfill(nsqd)
            # after the capture: the channel reads (and deletes) most of its files, more messages come
            while backend.depth() > 100:
                backend.read_many(100)
            backend.wait_idle()
            assert not os.path.exists(first_file)
            topic.publish([b"after"] * 50)

            ticks = 0
            writes: list[bytes] = []

            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await trio.sleep(0)

            async def send_all(data: bytes) -> None:
                writes.append(data)
                await trio.sleep(0)

            nursery.start_soon(tick)
            await backfill.send(send_all)
            nursery.cancel_scope.cancel()

    assert len(writes) > 10 and max(map(len, writes)) < 16384 + 64 * 200
    assert ticks >= len(writes)
    decoder = ReplicationDecoder()
    decoder.receive_data(b"".join(writes))
    events = []
    while (event := decoder.next_event()) is not None:
        events.append(event)
    ops = [(e.topic, e.channel, e.op) for e in events if type(e) is ChannelOp]
    assert ops == [("t", "", 1), ("t", "c", 1)]  # the ephemeral channel is not replicated
    frames = [e for e in events if type(e) is Messages]
    assert all(e.seq == 0 and e.channel == "c" for e in frames)
    sent = [m.body for e in frames for m in e.messages]
    assert sorted(sent) == before and backfill.count == len(before)
