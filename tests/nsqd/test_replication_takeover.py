"""A takeover on an in-process replica: done in slices with the event loop free between them (the streams of the
other origins must go on: their ACKs and heartbeat answers wait on this loop), the origin's HELLO refused
meanwhile, and an ASK answered with every id it adopts, done or still to do."""

from __future__ import annotations

import socket

import pytest
import trio

from nsqd.options import parse_options
from nsqd.replication import host as host_module
from nsqd.replication.store import ReplicaStore
from nsqd.server import NSQD
from protocol.errors import ProtocolError
from protocol.replication import E_TAKING_OVER, OP_CREATED, ChannelOp, Hello, Messages, ReplicatedMessage

RECORDS, PER_RECORD = 400, 5


def _dead_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def _id(n: int) -> bytes:
    return b"%016x" % n


async def test_a_takeover_runs_in_slices_and_answers_ask_with_everything_it_adopts(tmp_path, monkeypatch):
    monkeypatch.setattr(host_module, "TAKEOVER_SLICE", 0.0)  # a turn of the loop after each record
    origin = _dead_address()
    store = ReplicaStore(origin, str(tmp_path), durable=False, max_record_size=1 << 20)
    events: list = [ChannelOp(1, "t", "c", OP_CREATED)]
    for record in range(RECORDS):
        numbers = range(record * PER_RECORD, (record + 1) * PER_RECORD)
        events.append(Messages(record + 2, "t", tuple(ReplicatedMessage(_id(n), n, 0, 0, b"m") for n in numbers)))
    store.store(events)
    store.close()
    everything = {_id(n) for n in range(RECORDS * PER_RECORD)}
    opts = parse_options(
        [
            "--tcp-address=127.0.0.1:0",
            "--http-address=",
            f"--data-path={tmp_path}",
            "--replica-takeover-timeout=0",  # only on request: this test asks
        ],
        exit_on_error=False,
    )
    nsqd = NSQD(opts)
    replica = nsqd.replica_host
    stages: list[int] = []  # messages adopted so far, each time another task found the takeover under way
    answers: list = []
    refused: list[ProtocolError] = []

    async def ask() -> None:  # another replica of the origin, about to take it over too
        answers.append(await replica._ask(nsqd.tcp_address, origin))

    async def watch(nursery) -> None:
        while True:
            taking = replica.origins[origin].taking
            if taking is not None:
                if not stages:
                    nursery.start_soon(ask)
                    with pytest.raises(ProtocolError) as caught:  # the origin back meanwhile
                        replica._claim(Hello(origin, "session", 0, False))
                    refused.append(caught.value)
                stages.append(len(taking.adopted))
            await trio.sleep(0)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(nsqd.run)
            assert len(replica.origins[origin].store.held) == RECORDS * PER_RECORD
            nursery.start_soon(watch, nursery)
            count = await replica.takeover(origin)
            while not answers:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    assert count == RECORDS * PER_RECORD
    assert nsqd.topics["t"].channels["c"].depth() == count
    # the loop ran while it adopted: another task saw it part done, more than once
    assert len(stages) > 10 and 0 < min(stages) < max(stages) <= count
    holding, ids = answers[0]
    assert set(ids) == everything and holding.node == origin
    assert [error.code for error in refused] == [E_TAKING_OVER]
    assert replica.origins[origin].taking is None and not replica.origins[origin].store.held
