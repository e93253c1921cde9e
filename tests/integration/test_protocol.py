"""nsqd's successful paths over raw sockets: IDENTIFY negotiation, heartbeats, delivery, FIN/REQ/TOUCH,
timeouts, deferred publishing, sampling and ephemeral channels (shared NSQ-FACTS sections 1 and 2).

Waits are bounded reads on the socket; where a test must prove that nothing arrives, it polls for a short,
fixed window, so a slow machine can only make it pass late, never fail spuriously.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest

from tests.integration.harness import (
    CLS,
    DEFAULT_IDENTIFY_RESPONSE,
    FRAME_TYPE_RESPONSE,
    ConnectionClosed,
    Frame,
    RawClient,
    consumer,
    decode_message,
    dpub,
    fin,
    mpub,
    pub,
    rdy,
    req,
    touch,
)

pytestmark = pytest.mark.timeout(60)

IDENTIFY_KEYS = [
    "max_rdy_count",
    "version",
    "max_msg_timeout",
    "msg_timeout",
    "tls_v1",
    "deflate",
    "deflate_level",
    "max_deflate_level",
    "snappy",
    "sample_rate",
    "auth_required",
    "output_buffer_size",
    "output_buffer_timeout",
]


def fresh_name(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def daemon(module_nsqd):
    yield module_nsqd
    module_nsqd.assert_running()


def negotiated(overrides: dict) -> bytes:
    """The default IDENTIFY response with some values replaced, keeping NSQ's key order."""
    response = json.loads(DEFAULT_IDENTIFY_RESPONSE)
    response.update(overrides)
    assert list(response) == IDENTIFY_KEYS
    return json.dumps(response, separators=(",", ":")).encode()


# --------------------------------------------------------------------------------------------------------------
# IDENTIFY


def test_identify_default_response_is_byte_exact(daemon):
    with RawClient(daemon.tcp) as client:
        assert client.identify({"feature_negotiation": True}) == DEFAULT_IDENTIFY_RESPONSE
        client.assert_open()


def test_identify_without_negotiation_answers_ok_and_never_upgrades(daemon):
    with RawClient(daemon.tcp) as client:
        assert client.identify({"tls_v1": True, "snappy": True, "deflate": True, "client_id": "plain"}) == b"OK"
        client.assert_open()  # still speaking plain V2


def test_identify_keys_match_case_insensitively(daemon):
    with RawClient(daemon.tcp) as client:
        assert client.identify({"Feature_Negotiation": True, "MSG_TIMEOUT": 2000}) == negotiated({"msg_timeout": 2000})


@pytest.mark.parametrize(
    "fields,effective",
    [
        ({"msg_timeout": 5000}, {"msg_timeout": 5000}),
        ({"msg_timeout": 900000}, {"msg_timeout": 900000}),
        ({"sample_rate": 42}, {"sample_rate": 42}),
        (
            {"output_buffer_size": 1024, "output_buffer_timeout": 100},
            {"output_buffer_size": 1024, "output_buffer_timeout": 100},
        ),
        ({"output_buffer_size": -1}, {"output_buffer_size": 1, "output_buffer_timeout": 0}),
        ({"output_buffer_timeout": -1}, {"output_buffer_timeout": 0}),
        ({"heartbeat_interval": 2000, "client_id": "c", "hostname": "h", "user_agent": "ua/1.0"}, {}),
        ({"deflate_level": 3}, {}),  # deflate not requested: the level reported stays 6
        ({"tls_v1": False, "snappy": False, "deflate": False}, {}),
    ],
)
def test_identify_response_reports_effective_values(daemon, fields, effective):
    with RawClient(daemon.tcp) as client:
        assert client.identify({"feature_negotiation": True, **fields}) == negotiated(effective)
        client.assert_open()


def test_second_identify_is_accepted(daemon):
    # nsqd answers a repeated IDENTIFY with a bare OK and negotiates nothing more (NSQ-FACTS 2.6).
    with RawClient(daemon.tcp) as client:
        assert client.identify({"feature_negotiation": True}) == DEFAULT_IDENTIFY_RESPONSE
        assert client.identify({"feature_negotiation": True}) == b"OK"
        client.assert_open()


@pytest.mark.parametrize(
    "fields",
    [
        {"output_buffer_size": 1024, "output_buffer_timeout": 50},
        {"output_buffer_size": -1},
        {"output_buffer_timeout": -1},
        {"output_buffer_size": 64, "output_buffer_timeout": 25},
    ],
)
def test_output_buffer_settings_still_deliver(daemon, fields):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=100, identify_fields=fields) as reader:
        reader.publish_many(name, [b"%d" % i for i in range(50)])
        bodies = {reader.read_message().body for _ in range(50)}
        assert bodies == {b"%d" % i for i in range(50)}


# --------------------------------------------------------------------------------------------------------------
# Heartbeats


def test_silent_client_gets_heartbeat_and_is_closed(daemon):
    with RawClient(daemon.tcp) as client:
        assert client.identify({"heartbeat_interval": 1000}) == b"OK"
        first = client.read_frame(10, skip_heartbeats=False)
        assert first == Frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")
        deadline = time.monotonic() + 10
        while True:
            try:
                frame = client.read_frame(max(deadline - time.monotonic(), 0.01), skip_heartbeats=False)
            except ConnectionClosed:
                break
            except TimeoutError:
                raise AssertionError("a client that never answers heartbeats was not closed within 10 s") from None
            assert frame.is_heartbeat, f"unexpected frame {frame}"


def test_subscribed_consumer_answering_with_nop_stays_connected(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=1, identify_fields={"heartbeat_interval": 1000}) as client:
        for _ in range(4):  # four intervals: twice the read deadline
            frame = client.read_frame(10, skip_heartbeats=False)
            assert frame.is_heartbeat, f"unexpected frame {frame}"
            client.send(b"NOP\n")
        client.publish(name, b"still subscribed")
        assert client.read_message().body == b"still subscribed"


def test_heartbeats_reach_a_pure_producer(daemon):
    name = fresh_name()
    with RawClient(daemon.tcp) as client:
        client.identify({"heartbeat_interval": 1000})
        client.publish(name, b"x")
        assert client.read_frame(10, skip_heartbeats=False).is_heartbeat


# --------------------------------------------------------------------------------------------------------------
# Delivery


def test_message_frame_fields(daemon):
    name = fresh_name()
    body = bytes(range(256)) + b"\n\r\n  V2 PUB x\n"
    with consumer(daemon.tcp, name, "ch", ready=1) as client:
        before = time.time_ns()
        client.publish(name, body)
        message = client.read_message()
        after = time.time_ns()
    assert message.body == body
    assert message.attempts == 1
    assert re.fullmatch(rb"[0-9a-f]{16}", message.id), message.id
    # nanoseconds since the epoch, set at publish time (a minute of slack for clock granularity only)
    assert before - 60_000_000_000 <= message.timestamp <= after + 60_000_000_000


def test_ids_are_unique_within_a_topic(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=500) as client:
        client.publish_many(name, [b"m%d" % i for i in range(500)])
        messages = [client.read_message() for _ in range(500)]
    assert len({m.id for m in messages}) == 500
    assert {m.body for m in messages} == {b"m%d" % i for i in range(500)}


def test_largest_allowed_bodies(daemon):
    name = fresh_name()
    big = bytes(range(256)) * 4096  # exactly 1 MiB, the default --max-msg-size
    assert len(big) == 1048576
    with consumer(daemon.tcp, name, "ch", ready=10) as client:
        client.publish(name, big)
        assert client.read_message().body == big
        bodies = [bytes([i]) * 1_000_000 for i in range(5)]  # one MPUB body just under --max-body-size
        client.publish_many(name, bodies)
        received = sorted(client.read_message().body for _ in range(5))
        assert received == bodies


def test_topic_without_channels_keeps_messages_for_the_first_channel(daemon):
    name = fresh_name()
    with RawClient(daemon.tcp) as writer:
        writer.publish_many(name, [b"early-1", b"early-2", b"early-3"])
    with consumer(daemon.tcp, name, "late", ready=10) as reader:
        assert {reader.read_message().body for _ in range(3)} == {b"early-1", b"early-2", b"early-3"}


def test_every_channel_gets_a_copy(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "a", ready=5) as a, consumer(daemon.tcp, name, "b#ephemeral", ready=5) as b:
        a.publish(name, b"fan-out")
        got_a, got_b = a.read_message(), b.read_message()
    assert got_a.body == got_b.body == b"fan-out"
    assert got_a.id == got_b.id
    assert got_a.attempts == got_b.attempts == 1


def test_consumers_of_one_channel_share_the_messages(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=100) as one, consumer(daemon.tcp, name, "ch", ready=100) as two:
        with RawClient(daemon.tcp) as writer:
            writer.publish_many(name, [b"%d" % i for i in range(200)])
        seen: dict[RawClient, list[bytes]] = {one: [], two: []}
        deadline = time.monotonic() + 20
        while len(seen[one]) + len(seen[two]) < 200:
            assert time.monotonic() < deadline, f"only {len(seen[one]) + len(seen[two])} of 200 messages arrived"
            for client in (one, two):
                frame = client.poll_frame(0.05)
                if frame is not None:
                    message = decode_message(frame.data)
                    seen[client].append(message.body)
                    client.send(fin(message.id))
    assert sorted(seen[one] + seen[two], key=int) == [b"%d" % i for i in range(200)]
    assert seen[one] and seen[two], "one of two ready consumers received nothing"


def test_rdy_without_count_means_one(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch") as client:
        client.publish_many(name, [b"a", b"b"])
        client.send(b"RDY\n")
        first = client.read_message()
        assert client.poll_frame(0.5) is None, "RDY without a count allowed more than one message in flight"
        client.send(fin(first.id))
        second = client.read_message()
        assert {first.body, second.body} == {b"a", b"b"}


def test_rdy_is_an_in_flight_window_not_a_credit(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=2) as client:
        client.publish_many(name, [b"1", b"2", b"3"])
        first, second = client.read_message(), client.read_message()
        assert client.poll_frame(0.5) is None, "more messages in flight than the RDY count"
        client.send(fin(first.id))
        third = client.read_message()  # the window reopened without a new RDY
        assert {first.body, second.body, third.body} == {b"1", b"2", b"3"}


def test_rdy_zero_pauses_delivery(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=0) as client:
        client.publish(name, b"held")
        assert client.poll_frame(0.5) is None
        client.send(rdy(1))
        assert client.read_message().body == b"held"


def test_successful_touch_req_fin_send_nothing(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=1) as client:
        client.publish(name, b"quiet")
        message = client.read_message()
        client.send(touch(message.id))
        client.assert_open()  # the probe's OK is the next frame
        client.send(rdy(0))
        client.send(req(message.id, 0))
        client.assert_open()
        client.send(rdy(1))
        again = client.read_message()
        assert (again.id, again.attempts) == (message.id, 2)
        client.send(fin(again.id))
        client.assert_open()
        assert client.poll_frame(0.5) is None, "a finished message came back"


def test_req_zero_redelivers_with_attempts_incremented(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=1) as client:
        client.publish(name, b"retry me")
        first = client.read_message()
        client.send(req(first.id, 0))
        second = client.read_message()
    assert (second.id, second.body, second.timestamp) == (first.id, first.body, first.timestamp)
    assert (first.attempts, second.attempts) == (1, 2)


def test_req_with_delay_lets_later_messages_pass(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=1) as client:
        client.publish(name, b"deferred")
        first = client.read_message()
        client.send(req(first.id, 2000))
        client.publish(name, b"fresh")
        fresh = client.read_message()
        assert fresh.body == b"fresh", "a message requeued with a delay came back before it was due"
        client.send(fin(fresh.id))
        back = client.read_message(10)
        assert (back.id, back.body, back.attempts) == (first.id, b"deferred", 2)
        client.send(fin(back.id))
        client.assert_open()


def test_req_delay_beyond_the_maximum_is_clamped_not_refused(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=1) as client:
        client.publish(name, b"far future")
        message = client.read_message()
        client.send(req(message.id, 99_999_999))
        client.assert_open()
        assert client.poll_frame(1.0) is None


def test_dpub_delivers_after_the_delay(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=5) as client:
        client.send(dpub(name, 1500, b"later"))
        client.expect_ok()
        client.publish(name, b"now")
        now = client.read_message()
        assert now.body == b"now", "a deferred message overtook an immediate one"
        later = client.read_message(10)
        assert (later.body, later.attempts) == (b"later", 1)


def test_dpub_zero_and_maximum_delay(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=5) as client:
        client.send(dpub(name, 3600000, b"an hour"))
        client.expect_ok()
        client.send(dpub(name, 0, b"immediate"))
        client.expect_ok()
        assert client.read_message().body == b"immediate"
        assert client.poll_frame(0.5) is None


def test_msg_timeout_redelivers_with_attempts_incremented(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=1, identify_fields={"msg_timeout": 1000}) as client:
        client.publish(name, b"too slow")
        first = client.read_message()
        second = client.read_message(10)  # never finished: it times out and comes back
        assert (second.id, second.body) == (first.id, first.body)
        assert (first.attempts, second.attempts) == (1, 2)
        client.send(fin(second.id))
        client.assert_open()


def test_fin_after_timeout_fails_without_closing(daemon):
    name = fresh_name()
    with (
        consumer(daemon.tcp, name, "ch", ready=1, identify_fields={"msg_timeout": 1000}) as client,
        consumer(daemon.tcp, name, "ch", ready=0) as other,
    ):
        client.publish(name, b"expired")
        first = client.read_message()
        client.send(rdy(0))
        other.send(rdy(1))
        taken = other.read_message(10)  # redelivered to the other consumer after the timeout
        assert (taken.id, taken.attempts) == (first.id, 2)
        client.send(fin(first.id))
        client.expect_error(b"E_FIN_FAILED FIN " + first.id + b" failed client does not own message")
        client.assert_open()


def test_fins_sent_in_one_write_each_get_their_own_outcome(daemon):
    # a consumer answers a batch with one write of FIN lines; nsqd finishes them in one pass, and each
    # refused one still gets its own E_FIN_FAILED, in order, without closing the connection
    name = fresh_name()
    unknown = b"0123456789abcdef"
    with consumer(daemon.tcp, name, "ch", ready=3) as client, consumer(daemon.tcp, name, "ch", ready=0) as other:
        client.publish_many(name, [b"a", b"b", b"c"])
        ids = [client.read_message().id for _ in range(3)]
        other.send(rdy(1))
        client.publish(name, b"theirs")  # client has no room left: it goes to the other consumer
        theirs = other.read_message()
        client.send(fin(ids[0]) + fin(unknown) + fin(ids[1]) + fin(ids[1]) + fin(theirs.id) + fin(ids[2]))
        client.expect_error(b"E_FIN_FAILED FIN " + unknown + b" failed ID not in flight")
        client.expect_error(b"E_FIN_FAILED FIN " + ids[1] + b" failed ID not in flight")
        client.expect_error(b"E_FIN_FAILED FIN " + theirs.id + b" failed client does not own message")
        client.assert_open()
        # the three were finished: the consumer has room for three more, the other one still has none
        client.publish_many(name, [b"d", b"e", b"f"])
        assert sorted(client.read_message().body for _ in range(3)) == [b"d", b"e", b"f"]
        other.send(fin(theirs.id))
        other.assert_open()


def test_in_flight_of_a_vanished_consumer_comes_back_after_its_timeout(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=0) as survivor:
        with consumer(daemon.tcp, name, "ch", ready=1, identify_fields={"msg_timeout": 1000}) as leaver:
            leaver.publish(name, b"orphan")
            orphan = leaver.read_message()
        survivor.send(rdy(1))
        back = survivor.read_message(10)
    assert (back.id, back.body, back.attempts) == (orphan.id, b"orphan", 2)


def test_touch_keeps_a_message_in_flight(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=2, identify_fields={"msg_timeout": 1000}) as client:
        client.publish(name, b"long job")
        message = client.read_message()
        for _ in range(8):  # 3.2 s of work, touching every 0.4 s against a 1 s timeout
            frame = client.poll_frame(0.4)
            assert frame is None, f"message redelivered although it was touched: {frame}"
            client.send(touch(message.id))
        client.send(fin(message.id))
        client.assert_open()
        assert client.poll_frame(1.5) is None


def test_touch_cannot_extend_beyond_max_msg_timeout(nsqd_factory):
    daemon = nsqd_factory("--max-msg-timeout=2s")
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=2, identify_fields={"msg_timeout": 1000}) as client:
        client.publish(name, b"capped")
        message = client.read_message()
        deadline = time.monotonic() + 10
        while True:
            frame = client.poll_frame(0.3)
            if frame is not None:
                break
            assert time.monotonic() < deadline, "touching extended a message past --max-msg-timeout"
            client.send(touch(message.id))
        redelivered = decode_message(frame.data)
        assert (redelivered.id, redelivered.attempts) == (message.id, 2)


def test_cls_answers_close_wait_and_leaves_the_connection_open(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=1) as client:
        client.publish(name, b"in flight at CLS")
        message = client.read_message()
        client.send(CLS)
        assert client.read_response() == b"CLOSE_WAIT"
        client.send(fin(message.id))  # finishing in-flight work after CLS is allowed
        client.assert_open()
        client.publish(name, b"after CLS")
        assert client.poll_frame(1.0) is None, "a closing consumer received a new message"


def test_sample_rate_drops_most_messages(daemon):
    name = fresh_name()
    count = 400
    with consumer(daemon.tcp, name, "ch", ready=1000, identify_fields={"sample_rate": 10}) as client:
        client.publish_many(name, [b"%d" % i for i in range(count)])
        received = []
        while True:
            frame = client.poll_frame(1.5)
            if frame is None:
                break
            received.append(frame)
            client.send(fin(frame.data[10:26]))
    # about 11% expected (a message is kept when rand[0,100) <= 10); the bounds are many sigmas wide
    assert 5 <= len(received) <= 120, f"sample_rate 10 kept {len(received)} of {count}"


def test_sampled_out_messages_are_not_redelivered(daemon):
    name = fresh_name()
    with consumer(
        daemon.tcp, name, "ch", ready=1000, identify_fields={"sample_rate": 1, "msg_timeout": 1000}
    ) as client:
        client.publish_many(name, [b"%d" % i for i in range(200)])
        seen = []
        while True:
            frame = client.poll_frame(2.5)  # longer than msg_timeout: a redelivery would show up here
            if frame is None:
                break
            seen.append(frame.data[10:26])
            client.send(fin(frame.data[10:26]))
        assert len(seen) == len(set(seen)), "a sampled message was delivered twice"
        assert len(seen) < 50


def _first_body_for_new_consumer(daemon, topic: str, channel: str, probe: bytes, marker: bytes) -> bytes:
    """Publish `probe` with no consumer on `channel`, then subscribe and publish `marker`; return the first body."""
    with RawClient(daemon.tcp) as writer:
        writer.publish(topic, probe)
    with consumer(daemon.tcp, topic, channel, ready=100) as reader:
        writer_after = RawClient(daemon.tcp)
        with writer_after:
            writer_after.publish(topic, marker)
        return reader.read_message().body


def test_ephemeral_channel_is_deleted_when_its_last_consumer_leaves(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "keeper", ready=0):  # keeps the topic draining into a durable channel
        with consumer(daemon.tcp, name, "gone#ephemeral", ready=0):
            pass
        # Deletion follows the disconnect asynchronously and is not observable over TCP: retry with a growing
        # pause, each round leaving the channel again, until a new consumer finds a fresh, empty channel.
        deadline = time.monotonic() + 15
        for attempt in range(1000):
            time.sleep(min(0.05 * 2**attempt, 1.0))
            first = _first_body_for_new_consumer(
                daemon, name, "gone#ephemeral", b"probe%d" % attempt, b"marker%d" % attempt
            )
            if first == b"marker%d" % attempt:
                return
            assert time.monotonic() < deadline, "ephemeral channel kept messages after its last consumer left"


def test_durable_channel_keeps_messages_while_nobody_listens(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "keeper", ready=0):
        with consumer(daemon.tcp, name, "durable", ready=0):
            pass
        first = _first_body_for_new_consumer(daemon, name, "durable", b"probe", b"marker")
    assert first == b"probe"


def test_mpub_then_dpub_then_pub_on_one_connection(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=10) as client:
        client.send(mpub(name, [b"a", b"b"]) + dpub(name, 0, b"c") + pub(name, b"d"))
        oks, bodies = 0, set()
        while oks < 3 or len(bodies) < 4:
            frame = client.read_frame()
            if frame.frame_type == FRAME_TYPE_RESPONSE:
                assert frame.data == b"OK"
                oks += 1
            else:
                message = decode_message(frame.data)
                bodies.add(message.body)
                client.send(fin(message.id))
        assert (oks, bodies) == (3, {b"a", b"b", b"c", b"d"})
