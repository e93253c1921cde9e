"""Volume: 100,000 messages to one topic with three channels of four consumers each, everything finished."""

from __future__ import annotations

import uuid

import pytest
import trio

from tests.integration.bulk import FastConsumer, publish_bulk, stats_json

MESSAGES = 100_000
CHANNELS = ("alpha", "beta", "gamma")
CONSUMERS_PER_CHANNEL = 4
READY = 200
MSG_TIMEOUT_MS = 5000


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_every_channel_receives_every_message_and_nothing_stays_in_flight(nsqd):
    topic = f"volume_{uuid.uuid4().hex[:10]}"
    bodies = [b"v%06d" % i for i in range(MESSAGES)]
    seen: dict[str, set[bytes]] = {channel: set() for channel in CHANNELS}
    complete = trio.Event()

    def on_message(consumer: FastConsumer, body: bytes) -> None:
        bucket = seen[consumer.channel]
        bucket.add(body)
        if len(bucket) == MESSAGES and all(len(s) == MESSAGES for s in seen.values()):
            complete.set()

    consumers = [
        FastConsumer(nsqd.tcp, topic, channel, on_message, identify_fields={"msg_timeout": MSG_TIMEOUT_MS})
        for channel in CHANNELS
        for _ in range(CONSUMERS_PER_CHANNEL)
    ]
    async with trio.open_nursery() as nursery:
        for consumer in consumers:  # every channel exists before the first publish
            await consumer.connect()
            nursery.start_soon(consumer.run)
        for consumer in consumers:
            await consumer.set_ready(READY)
        await trio.to_thread.run_sync(publish_bulk, nsqd.tcp, topic, bodies)

        with trio.move_on_after(150) as waiting:
            await complete.wait()
        if waiting.cancelled_caught:
            missing = {channel: MESSAGES - len(s) for channel, s in seen.items()}
            pytest.fail(f"not every channel got every message within 150 s; missing per channel: {missing}")

        delivered_at_completion = sum(c.received for c in consumers)
        # Everything has been FINned as it arrived. Anything still in flight would time out and be redelivered
        # within msg_timeout plus the queue-scan interval: wait out that window and expect silence.
        await trio.sleep(MSG_TIMEOUT_MS / 1000 + 1.5)
        delivered_after_window = sum(c.received for c in consumers)
        nursery.cancel_scope.cancel()

    errors = [e for c in consumers for e in c.errors]
    assert not errors, f"error frames during the run (a FIN arriving after msg_timeout?): {errors[:5]}"
    assert delivered_after_window == delivered_at_completion, (
        f"{delivered_after_window - delivered_at_completion} messages were redelivered after all were finished"
    )
    per_channel = {channel: sum(c.received for c in consumers if c.channel == channel) for channel in CHANNELS}
    assert per_channel == {channel: MESSAGES for channel in CHANNELS}, f"duplicate deliveries: {per_channel}"
    expected = set(bodies)
    assert all(s == expected for s in seen.values())
    for channel in CHANNELS:
        share = [c.received for c in consumers if c.channel == channel]
        assert all(share), f"a ready consumer of {channel} received nothing: {share}"

    stats = await stats_json(nsqd.http(timeout=5), topic)
    assert stats is not None, "nsqd /stats did not answer"
    (topic_stats,) = stats["topics"]
    assert topic_stats["message_count"] == MESSAGES
    for channel in topic_stats["channels"]:
        assert channel["in_flight_count"] == 0, channel
        assert channel["deferred_count"] == 0, channel
        assert channel["depth"] == 0, channel
        assert channel["message_count"] == MESSAGES, channel
        assert channel["timeout_count"] == 0, channel
