"""nsq_to_nsq end to end: the tool as a subprocess between two real nsqd, messages published to the source with the
raw test client (MPUB) and read back from the destination with it, so the tool is checked by code that is not the
client library it runs on."""

from __future__ import annotations

import json
import re
import signal
from collections import Counter

import pytest

from tests.integration.harness import RawClient, consumer, fin
from tests.tools.conftest import ToolProcess, assert_bad_option, assert_unknown_flag, assert_usage, run_tool, wait_for
from tests.tools.relay_checks import (
    FAST_RETRY,
    channel_stats,
    fatal_text,
    published_count,
    topic_stats,
    wait_drained,
)

# NSQ 1.3.0's `nsq_to_nsq -h` (NSQ-TOOLS-FACTS): name -> (kind, default)
NSQ_FLAGS = {
    "channel": ("string", '"nsq_to_nsq"'),
    "consumer-opt": ("value", None),
    "destination-nsqd-tcp-address": ("value", None),
    "destination-topic": ("string", "is consumed topic name"),
    "lookupd-http-address": ("value", None),
    "max-in-flight": ("int", "200"),
    "mode": ("string", '"hostpool"'),
    "nsqd-tcp-address": ("value", None),
    "producer-opt": ("value", None),
    "require-json-field": ("string", None),
    "require-json-value": ("string", None),
    "status-every": ("int", "250"),
    "topic": ("value", None),
    "version": ("bool", None),
    "whitelist-json-field": ("value", None),
}


def channel(nsqd, topic: str, name: str = "nsq_to_nsq") -> dict | None:
    return channel_stats(nsqd, topic, name)


def drained(nsqd, topic: str) -> dict:
    return wait_drained(nsqd, topic, "nsq_to_nsq")


def read_bodies(nsqd, topic: str, count: int, channel: str = "check") -> list[bytes]:
    """``count`` messages of ``topic`` read (and FIN'd) on a channel of their own, with the raw client."""
    bodies = []
    # RDY stays within nsqd's --max-rdy-count (2500); FINs free the slots for the rest
    with consumer(nsqd.tcp, topic, channel, ready=max(1, min(count, 2500))) as client:
        while len(bodies) < count:
            message = client.read_message(timeout=10)
            bodies.append(message.body)
            client.send(fin(message.id))
    return bodies


def publish(nsqd, topic: str, bodies: list[bytes]) -> None:
    with RawClient(nsqd.tcp) as client:
        for start in range(0, len(bodies), 500):
            client.publish_many(topic, bodies[start : start + 500])


@pytest.fixture
def source(nsqd_factory):
    return nsqd_factory()


@pytest.fixture
def destination(nsqd_factory):
    return nsqd_factory()


def relay(source, destination, *args: str) -> ToolProcess:
    return ToolProcess(
        "nsq_to_nsq",
        f"--nsqd-tcp-address={source.tcp_address}",
        f"--destination-nsqd-tcp-address={destination.tcp_address}",
        *args,
    )


# --- flags and start-up checks ---------------------------------------------------------------------------------------


def test_usage_lists_nsq_flags():
    assert_usage("nsq_to_nsq", NSQ_FLAGS)


def test_unknown_flag_exits_2_with_usage():
    assert_unknown_flag("nsq_to_nsq")


def test_bad_flag_value_exits_2():
    result = run_tool("nsq_to_nsq", "--status-every=often")
    assert result.returncode == 2
    assert b'invalid value "often" for flag -status-every' in result.stderr


NSQD = "--nsqd-tcp-address=127.0.0.1:4150"
DEST = "--destination-nsqd-tcp-address=127.0.0.1:4250"


@pytest.mark.parametrize(
    "args, text",
    [
        ((NSQD, DEST), "--topic and --channel are required"),
        (("--topic=t", "--channel=", NSQD, DEST), "--topic and --channel are required"),
        (("--topic=t", "--topic=bad topic", NSQD, DEST), "--topic is invalid"),
        (("--topic=t", "--destination-topic=a/b", NSQD, DEST), "--destination-topic is invalid"),
        (("--topic=t", "--channel=c!", NSQD, DEST), "--channel is invalid"),
        (("--topic=t", DEST), "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ("--topic=t", NSQD, "--lookupd-http-address=127.0.0.1:4161", DEST),
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (("--topic=t", NSQD), "--destination-nsqd-tcp-address required"),
        (
            ("--topic=t", NSQD, DEST, "--mode=random"),
            '--mode must be one of round-robin, hostpool, epsilon-greedy (got "random")',
        ),
    ],
)
def test_start_up_checks_exit_1_with_a_fatal_line(args, text):
    assert fatal_text("nsq_to_nsq", *args) == text


@pytest.mark.parametrize(
    "flag, value, reason",
    [
        ("producer-opt", "bogus,1", "invalid option bogus"),
        (
            "consumer-opt",
            "max_in_flight,lots",
            'failed to coerce option max_in_flight (lots) - strconv.ParseInt: parsing "lots": invalid syntax',
        ),
        ("consumer-opt", "rdy_redistribute_interval,10s", "invalid rdy_redistribute_interval ! 10s > 5s"),
        ("consumer-opt", "low_rdy_timeout", "failed to coerce option low_rdy_timeout (true) - invalid value type"),
    ],
)
def test_bad_option_is_a_flag_error(flag, value, reason):
    # checked while the flags are parsed, before the start-up checks (no --topic here)
    assert_bad_option("nsq_to_nsq", NSQD, DEST, flag=flag, value=value, reason=reason)


@pytest.mark.parametrize("args", [("--nsqd-tcp-address=nohostport", DEST), (NSQD, "--destination-nsqd-tcp-address=x")])
def test_a_bad_address_is_a_fatal_line(args):
    line = fatal_text("nsq_to_nsq", "--topic=t", *args)
    assert "nohostport" in line if "nohostport" in args[0] else "'x'" in line


# --- end to end ------------------------------------------------------------------------------------------------------


def test_copies_every_message_to_the_destination_intact(source, destination):
    bodies = [b"plain", b"\x00\x01binary\xff\n\r\n", "\u00e9t\u00e9".encode(), b"x" * 100_000] + [
        f"n{i}".encode() for i in range(500)
    ]
    publish(source, "events", bodies)
    with relay(source, destination, "--topic=events") as tool:
        drained(source, "events")
        wait_for(lambda: published_count(destination, "events") >= len(bodies), 20, 0.1, "copies")
        assert tool.stop() == 0
    assert published_count(destination, "events") == len(bodies)  # none twice
    assert Counter(read_bodies(destination, "events", len(bodies))) == Counter(bodies)


def test_destination_topic_gathers_several_topics(source, destination):
    publish(source, "alpha", [b"a1", b"a2"])
    publish(source, "beta", [b"b1"])
    with relay(
        source, destination, "--topic=alpha", "--topic=beta", "--destination-topic=merged", "--channel=copy"
    ) as tool:
        wait_for(lambda: published_count(destination, "merged") >= 3, 20, 0.1, "copies")
        assert tool.stop() == 0
    assert sorted(read_bodies(destination, "merged", 3)) == [b"a1", b"a2", b"b1"]
    assert topic_stats(destination, "alpha") is None and topic_stats(destination, "beta") is None
    assert channel(source, "alpha", "copy")["depth"] == 0


def test_whitelist_json_fields(source, destination):
    bodies = [
        b'{"id": 1, "user": "ann", "secret": "x", "score": 2.5}',
        b'{"id": 2.0, "secret": "y", "nested": {"n": 1.0}, "tag": "<b>"}',
        b'{"other": true}',
        b"not json",
        b"[1, 2]",
    ]
    publish(source, "j", bodies)
    with relay(
        source,
        destination,
        "--topic=j",
        "--whitelist-json-field=id",
        "--whitelist-json-field=user",
        "--whitelist-json-field=nested",
        "--whitelist-json-field=tag",
        "--whitelist-json-field=score",
    ) as tool:
        drained(source, "j")
        wait_for(lambda: published_count(destination, "j") >= 3, 20, 0.1, "copies")
        tool.wait_for_stderr(rb"ERROR: Unable to decode json: not json")
        assert tool.stop() == 0
    assert published_count(destination, "j") == 3  # the two that are not objects are dropped
    assert sorted(read_bodies(destination, "j", 3)) == sorted(
        [
            b'{"id":1,"score":2.5,"user":"ann"}',
            b'{"id":2,"nested":{"n":1},"tag":"\\u003cb\\u003e"}',
            b"{}",
        ]
    )


def test_require_json_field_and_value(source, destination):
    passing = [b'{"kind": "click", "n": 1}', b'{"kind":"click"}']
    fin_dropped = [b'{"kind": "view"}', b'{"kind": 5}', b"garbage"]
    missing = [b'{"n": 3}']
    publish(source, "r", passing + fin_dropped + missing)
    with relay(
        source,
        destination,
        "--topic=r",
        "--require-json-field=kind",
        "--require-json-value=click",
        "--consumer-opt=max_attempts,3",
        *FAST_RETRY,
    ) as tool:
        drained(source, "r")
        tool.wait_for_stderr(rb"ERROR: missing field to check required value")
        assert tool.stop() == 0
    assert sorted(read_bodies(destination, "r", 2)) == sorted(passing)  # published untouched
    assert published_count(destination, "r") == 2
    # the message without the field was requeued until the consumer gave up on it after max_attempts
    assert channel(source, "r")["requeue_count"] >= 2


def test_require_json_field_without_value(source, destination):
    publish(source, "rf", [b'{"kind": 1}', b'{"other": 1}', b'{"kind": null}'])
    with relay(source, destination, "--topic=rf", "--require-json-field=kind") as tool:
        chan = drained(source, "rf")
        assert tool.stop() == 0
    assert chan["requeue_count"] == 0
    assert sorted(read_bodies(destination, "rf", 2)) == [b'{"kind": 1}', b'{"kind": null}']
    assert published_count(destination, "rf") == 2


def test_round_robin_over_two_destinations(source, destination, nsqd_factory):
    second = nsqd_factory()
    bodies = [f"m{i}".encode() for i in range(40)]
    publish(source, "rr", bodies)
    with ToolProcess(
        "nsq_to_nsq",
        f"--nsqd-tcp-address={source.tcp_address}",
        "--topic=rr",
        f"--destination-nsqd-tcp-address={destination.tcp_address}",
        f"--destination-nsqd-tcp-address={second.tcp_address}",
        "--mode=round-robin",
        "--status-every=20",
    ) as tool:
        drained(source, "rr")
        tool.wait_for_stderr(
            rb"\[aggregate\]: finished 20 - 99th: \d+\.\d\dms - 95th: \d+\.\d\dms - avg: "
            rb"\d+\.\d\dms"
        )
        tool.wait_for_stderr(re.escape(f"[{second.tcp_address}]: finished 20 ".encode()))
        assert tool.stop() == 0
    assert published_count(destination, "rr") == published_count(second, "rr") == 20
    assert sorted(read_bodies(destination, "rr", 20) + read_bodies(second, "rr", 20)) == sorted(bodies)


def test_unreachable_destination_requeues_and_loses_nothing(source, nsqd_factory):
    bodies = [f"wait{i}".encode() for i in range(5)]
    publish(source, "down", bodies)
    destination = nsqd_factory()
    destination.stop()
    with ToolProcess(
        "nsq_to_nsq",
        f"--nsqd-tcp-address={source.tcp_address}",
        "--topic=down",
        f"--destination-nsqd-tcp-address={destination.tcp_address}",
        *FAST_RETRY,
    ) as tool:
        wait_for(lambda: (channel(source, "down") or {}).get("requeue_count", 0) >= 5, 20, 0.1, "requeues")
        assert tool.stop() == 0
    chan = channel(source, "down")
    assert chan["depth"] + chan["deferred_count"] == len(bodies) and chan["in_flight_count"] == 0


def test_sigterm_mid_stream_loses_nothing(source, destination):
    total = 20_000
    bodies = [json.dumps({"seq": i}).encode() for i in range(total)]
    publish(source, "stream", bodies)
    with relay(source, destination, "--topic=stream", "--max-in-flight=50") as tool:
        wait_for(lambda: published_count(destination, "stream") >= 500, 30, 0.02, "the copy under way")
        assert tool.stop(signal.SIGTERM) == 0
        stderr = tool.stderr.decode(errors="replace")
    copied = published_count(destination, "stream")
    assert copied < total, "the stop came too late to test anything"
    # the tool answered every message it received before it closed, late ones included (REQ'd): nsqd holds an
    # unanswered one until its --msg-timeout (60 s), so this waits only for nsqd to read the last answers
    chan = wait_for(
        lambda: (lambda c: c if c["in_flight_count"] == 0 else None)(channel(source, "stream")),
        10,
        0.05,
        "nothing in flight on the source",
    )
    left = chan["depth"] + chan["deferred_count"]
    seen = Counter(read_bodies(destination, "stream", copied) + read_bodies(source, "stream", left, "nsq_to_nsq"))
    missing = Counter(bodies) - seen
    extra = seen - Counter(bodies)
    assert not missing and not extra, (
        f"copied {copied}, left {left} of {total}: {sum(missing.values())} lost, "
        f"{sum(extra.values())} twice; the tool said:\n{stderr[-3000:]}"
    )
