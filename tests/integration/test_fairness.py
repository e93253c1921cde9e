"""Fairness between channels: a channel's share of delivery must not depend on how many consumers it has.

One topic with a backlog, channel `many` with 50 consumers and channel `few` with 2. Every consumer FINs at once
and is never the bottleneck (the two `few` consumers together hold as large an in-flight window as the fifty).
Delivery is counted, not timed: when the total reaches STOP_AT the counts are frozen and compared.
"""

from __future__ import annotations

import uuid

import pytest
import trio

from tests.integration.bulk import FastConsumer, publish_bulk

BACKLOG = 400_000
STOP_AT = 300_000
MANY, FEW = 50, 2
READY_MANY = 100  # 50 x 100 = 5000 in flight at most
READY_FEW = 2500  # 2 x 2500 = 5000 in flight at most (the maximum RDY)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_backlogged_channels_get_equal_delivery_whatever_their_consumer_count(nsqd):
    topic = f"fair_{uuid.uuid4().hex[:10]}"
    counts = {"many": 0, "few": 0}
    frozen: dict[str, int] = {}
    reached = trio.Event()

    def on_message(consumer: FastConsumer, body: bytes) -> None:
        counts[consumer.channel] += 1
        if not frozen and counts["many"] + counts["few"] >= STOP_AT:
            frozen.update(counts)
            reached.set()

    many = [FastConsumer(nsqd.tcp, topic, "many", on_message) for _ in range(MANY)]
    few = [FastConsumer(nsqd.tcp, topic, "few", on_message) for _ in range(FEW)]

    async with trio.open_nursery() as nursery:
        # Both channels must exist before the backlog is published, so the topic copies it to each.
        await many[0].connect()
        await few[0].connect()
        await trio.to_thread.run_sync(publish_bulk, nsqd.tcp, topic, [b"f%06d" % i for i in range(BACKLOG)])
        for consumer in many[1:] + few[1:]:
            await consumer.connect()
        for consumer in many + few:
            nursery.start_soon(consumer.run)
        for a, b in zip(few, many, strict=False):  # interleave so neither channel gets a head start; the rest after
            await a.set_ready(READY_FEW)
            await b.set_ready(READY_MANY)
        for consumer in many[len(few) :]:
            await consumer.set_ready(READY_MANY)

        with trio.move_on_after(240) as waiting:
            await reached.wait()
        nursery.cancel_scope.cancel()

    errors = [e for c in many + few for e in c.errors]
    assert not errors, f"error frames during the run: {errors[:5]}"
    assert not waiting.cancelled_caught, f"only {counts} delivered within 240 s"
    a, b = frozen["many"], frozen["few"]
    print(f"delivered when the total reached {STOP_AT}: {frozen}")
    assert a and b, f"one channel was starved: {frozen}"
    difference = abs(a - b) / max(a, b)
    assert difference < 0.20, (
        f"channel with {MANY} consumers got {a}, channel with {FEW} got {b} ({difference:.0%} apart, limit 20%)"
    )
