"""nsq_tail end to end: the tool as a subprocess against real nsqd and nsqlookupd subprocesses.

Messages are published by the tests over plain HTTP (/pub, /mpub), independent of the client package the tool
consumes with; the tool is seen subscribed through nsqd's /stats before anything is published, since its
ephemeral channel only gets what is published after it exists.
"""

from __future__ import annotations

import re
import signal

import pytest

from tests.integration.harness import mpub_body
from tests.integration.http_helpers import post, stats
from tests.integration.lookupd_harness import wait_for_producers
from tests.tools.conftest import (
    ToolProcess,
    assert_bad_option,
    assert_fatal,
    assert_unknown_flag,
    assert_usage,
    run_tool,
    wait_for,
)

# NSQ-TOOLS-FACTS, nsq_tail: name -> (Go's placeholder, default as -h prints it)
UPSTREAM_FLAGS = {
    "channel": ("string", None),
    "consumer-opt": ("value", None),
    "lookupd-http-address": ("value", None),
    "max-in-flight": ("int", "200"),
    "n": ("int", None),
    "nsqd-tcp-address": ("value", None),
    "print-topic": ("bool", None),
    "topic": ("value", None),
    "version": ("bool", None),
}

CHANNEL = re.compile(r"tail\d{6}#ephemeral")


def channels(nsqd, topic: str) -> dict[str, dict]:
    for entry in stats(nsqd.http(), f"topic={topic}")["topics"] or []:
        if entry["topic_name"] == topic:
            return {channel["channel_name"]: channel for channel in entry["channels"] or []}
    return {}


def wait_subscribed(nsqd, topic: str, clients: int = 1) -> str:
    """The tail channel's name once it has ``clients`` consumers."""

    def check():
        for name, channel in channels(nsqd, topic).items():
            if CHANNEL.fullmatch(name) and channel["client_count"] == clients:
                return name
        return None

    return wait_for(check, 20, message=f"a tail channel with {clients} client(s) on {topic}")


def publish(nsqd, topic: str, *bodies: bytes) -> None:
    if len(bodies) == 1:
        assert post(nsqd.http(), f"/pub?topic={topic}", bodies[0]).status == 200
    else:
        assert post(nsqd.http(), f"/mpub?topic={topic}&binary=true", mpub_body(list(bodies))).status == 200


def test_usage_lists_upstream_flags():
    assert_usage("nsq_tail", UPSTREAM_FLAGS)


def test_unknown_flag_exits_2():
    assert_unknown_flag("nsq_tail")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--nsqd-tcp-address or --lookupd-http-address required"),
        (["--topic=t"], "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ["--nsqd-tcp-address=a:1", "--lookupd-http-address=b:2", "--topic=t"],
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (["--nsqd-tcp-address=a:1"], "--topic required"),
        (["--nsqd-tcp-address=a:1", "--topic=bad topic"], "invalid topic name"),
        (["--nsqd-tcp-address=a:1", "--topic=t", "--channel=bad channel"], "invalid channel name"),
    ],
)
def test_bad_flags_end_as_log_fatal(args, message):
    assert_fatal(run_tool("nsq_tail", *args), message)


def test_bad_consumer_opt_is_a_flag_error(nsqd):
    assert_bad_option(
        "nsq_tail",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        "--topic=t",
        flag="consumer-opt",
        value="no_such_option,1",
        reason="invalid option no_such_option",
    )


def test_n_messages_then_exit_0(nsqd, topic):
    with ToolProcess("nsq_tail", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--topic={topic}", "-n", "3") as tool:
        channel = wait_subscribed(nsqd, topic)
        # -n 3 lowers max-in-flight (200) to 3: the consumer's RDY
        wait_for(
            lambda: [c["ready_count"] for c in channels(nsqd, topic)[channel]["clients"]] == [3], 10, message="RDY 3"
        )
        publish(nsqd, topic, *[b"m%d" % i for i in range(5)])
        assert tool.wait() == 0, tool.stderr
    assert tool.stdout == b"m0\nm1\nm2\n"
    assert f"Adding consumer for topic: {topic}".encode() in tool.stderr


def test_bodies_are_written_as_they_are(nsqd, topic):
    body = bytes(range(256)) + b"\n\r\n"
    with ToolProcess("nsq_tail", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--topic={topic}", "-n=1") as tool:
        wait_subscribed(nsqd, topic)
        publish(nsqd, topic, body)
        assert tool.wait() == 0, tool.stderr
    assert tool.stdout == body + b"\n"


def test_print_topic_with_two_topics_counts_each_topic(nsqd, topic):
    """One consumer per topic, as upstream; its -n counts per topic (the tool ends when one topic reaches it)."""
    other = topic + "_b"
    with ToolProcess(
        "nsq_tail",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--topic={topic}",
        f"--topic={other}",
        "--print-topic",
        "-n",
        "2",
    ) as tool:
        channel = wait_subscribed(nsqd, topic)
        assert wait_subscribed(nsqd, other) == channel  # one channel name for every topic
        publish(nsqd, topic, b"first")
        tool.wait_for_stdout(re.escape(f"{topic} | first\n".encode()))
        publish(nsqd, other, b"x", b"y", b"z")
        assert tool.wait() == 0, tool.stderr
    assert tool.stdout == f"{topic} | first\n{other} | x\n{other} | y\n".encode()
    for name in (topic, other):
        assert f"Adding consumer for topic: {name}".encode() in tool.stderr


def test_given_channel_and_lookupd_discovery(lookupd, lookupd_nsqd, topic):
    assert post(lookupd_nsqd.http(), f"/topic/create?topic={topic}").status == 200
    wait_for_producers(lookupd, topic, {lookupd_nsqd.tcp[1]})
    with ToolProcess(
        "nsq_tail",
        "--lookupd-http-address={}:{}".format(*lookupd.http_address),
        f"--topic={topic}",
        "--channel=watch",
        "-n",
        "2",
    ) as tool:
        wait_for(
            lambda: channels(lookupd_nsqd, topic).get("watch", {}).get("client_count") == 1,
            20,
            message="subscribed through lookupd",
        )
        publish(lookupd_nsqd, topic, b"a", b"b")
        assert tool.wait() == 0, tool.stderr
    assert tool.stdout == b"a\nb\n"
    # the two shown were finished: nothing waits or is in flight on the channel afterwards
    wait_for(lambda: channels(lookupd_nsqd, topic)["watch"]["client_count"] == 0, 10, message="disconnected")
    channel = channels(lookupd_nsqd, topic)["watch"]
    assert (channel["depth"], channel["in_flight_count"], channel["message_count"]) == (0, 0, 2)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_it_cleanly(nsqd, topic, sig):
    with ToolProcess("nsq_tail", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--topic={topic}") as tool:
        channel = wait_subscribed(nsqd, topic)
        publish(nsqd, topic, b"one", b"two")
        tool.wait_for_stdout(b"one\ntwo\n")
        assert tool.stop(sig) == 0, tool.stderr
    assert b"Traceback" not in tool.stderr
    # the ephemeral channel goes with its last consumer
    wait_for(lambda: channel not in channels(nsqd, topic), 10, message="ephemeral channel removed")


def test_unreachable_nsqd_is_fatal(topic):
    from tests.integration.harness import free_port

    address = f"127.0.0.1:{free_port()}"
    result = run_tool("nsq_tail", f"--nsqd-tcp-address={address}", f"--topic={topic}")
    assert result.returncode == 1 and b"Traceback" not in result.stderr, result.stderr
    assert re.fullmatch(
        rb"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d .*" + re.escape(address.encode()) + rb".*", result.stderr.splitlines()[-1]
    ), result.stderr
