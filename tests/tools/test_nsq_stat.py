"""nsq_stat end to end: the tool as a subprocess against real nsqd and nsqlookupd subprocesses.

The figures are made by the tests with plain HTTP (/mpub, /channel/create) and a raw V2 consumer, so what the
tool prints is checked against something independent of it and of the client package.
"""

from __future__ import annotations

import re
import signal

import pytest

from tests.integration.harness import RawClient, fin, rdy
from tests.integration.http_helpers import post
from tests.integration.lookupd_harness import wait_for_producers
from tests.tools.conftest import (
    ToolProcess,
    assert_fatal,
    assert_unknown_flag,
    assert_usage,
    run_tool,
    wait_for,
)

HEADER = [
    "------rate------+----------------depth----------------+--------------metadata---------------",
    "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients",
]

# NSQ-TOOLS-FACTS, nsq_stat: name -> (Go's placeholder, default as -h prints it)
UPSTREAM_FLAGS = {
    "channel": ("string", None),
    "count": ("value", None),
    "http-client-connect-timeout": ("duration", "2s"),
    "http-client-request-timeout": ("duration", "5s"),
    "interval": ("duration", "2s"),
    "lookupd-http-address": ("value", None),
    "nsqd-http-address": ("value", None),
    "topic": ("string", None),
    "version": ("bool", None),
}


def line(*numbers: int) -> str:
    """One data line built from its eleven numbers, with upstream's widths."""
    widths = (7, 7, 7, 7, 7, 5, 5, 7, 7, 12, 7)
    cells = [f"{n:{w}d}" for n, w in zip(numbers, widths, strict=True)]
    return " ".join(cells[:2]) + " | " + " ".join(cells[2:7]) + " | " + " ".join(cells[7:])


def fill(nsqd, topic: str, channel: str, count: int) -> None:
    """``count`` messages on the topic (and so on the channel, created first)."""
    address = nsqd.http()
    assert post(address, f"/topic/create?topic={topic}").status == 200
    assert post(address, f"/channel/create?topic={topic}&channel={channel}").status == 200
    if count:
        body = b"\n".join(b"m%d" % i for i in range(count))
        assert post(address, f"/mpub?topic={topic}", body).status == 200


@pytest.fixture
def node(nsqd_factory):
    """An nsqd whose /info names 127.0.0.1 (upstream's nsq_stat polls each producer's broadcast address)."""
    return nsqd_factory("--broadcast-address=127.0.0.1")


def http_address(daemon) -> str:
    host, port = daemon.http()
    return f"{host}:{port}"


def test_usage_lists_upstream_flags():
    assert_usage("nsq_stat", UPSTREAM_FLAGS)


def test_unknown_flag_exits_2():
    assert_unknown_flag("nsq_stat")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--topic and --channel are required"),
        (["--topic=t"], "--topic and --channel are required"),
        (["--topic=t", "--channel=c", "--interval=0s"], "--interval should be positive"),
        (
            ["--topic=t", "--channel=c", "--http-client-connect-timeout=-1s"],
            "--http-client-connect-timeout should be positive",
        ),
        (
            ["--topic=t", "--channel=c", "--http-client-request-timeout=0"],
            "--http-client-request-timeout should be positive",
        ),
        (["--topic=t", "--channel=c", "--count=0"], "--count should be positive"),
        (["--topic=t", "--channel=c"], "--nsqd-http-address or --lookupd-http-address required"),
        (
            ["--topic=t", "--channel=c", "--nsqd-http-address=a:1", "--lookupd-http-address=b:2"],
            "use --nsqd-http-address or --lookupd-http-address not both",
        ),
        (
            ["--topic=t", "--channel=c", "--nsqd-http-address=http://a:1"],
            "--nsqd-http-address error - address should not contain scheme",
        ),
        (
            ["--topic=t", "--channel=c", "--lookupd-http-address=https://b:2"],
            "--lookupd-http-address error - address should not contain scheme",
        ),
    ],
)
def test_bad_flags_end_as_log_fatal(args, message):
    assert_fatal(run_tool("nsq_stat", *args), message)


def test_count_takes_a_32_bit_integer():
    result = run_tool("nsq_stat", "--count=4294967296")
    assert result.returncode == 2
    assert result.stderr.decode().startswith(
        'invalid value "4294967296" for flag -count: strconv.ParseInt: parsing "4294967296": value out of range\n'
    )


def test_known_depth_prints_the_header_and_count_lines(node, topic):
    fill(node, topic, "ch", 50)
    result = run_tool(
        "nsq_stat",
        f"--topic={topic}",
        "--channel=ch",
        "--count=3",
        "--interval=100ms",
        f"--nsqd-http-address={http_address(node)}",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().splitlines() == HEADER + [line(0, 0, 50, 50, 0, 0, 0, 0, 0, 50, 0)] * 3
    assert result.stderr == b""


def test_header_repeats_every_25_polls(node, topic):
    fill(node, topic, "ch", 2)
    result = run_tool(
        "nsq_stat",
        f"--topic={topic}",
        "--channel=ch",
        "--count=30",
        "--interval=1ms",
        f"--nsqd-http-address={http_address(node)}",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    data = line(0, 0, 2, 2, 0, 0, 0, 0, 0, 2, 0)
    # the first poll only takes a reference; the 25th poll prints the header again before its line
    assert result.stdout.decode().splitlines() == HEADER + [data] * 24 + HEADER + [data] * 6


def test_rates_and_sums_over_the_producers_found_through_lookupd(lookupd, nsqd_factory, topic):
    """Two nsqd found through lookupd: depths summed, then ingress and egress from the changes between polls."""
    registered = [f"--lookupd-tcp-address={lookupd.tcp_address}", "--broadcast-address=127.0.0.1"]
    first, second = nsqd_factory(*registered), nsqd_factory(*registered)
    fill(first, topic, "ch", 5)
    fill(second, topic, "ch", 7)
    wait_for_producers(lookupd, topic, {first.tcp[1], second.tcp[1]})
    lookupd_http = "{}:{}".format(*lookupd.http_address)
    with ToolProcess(
        "nsq_stat",
        f"--topic={topic}",
        "--channel=ch",
        "--count=2",
        "--interval=2s",
        f"--lookupd-http-address={lookupd_http}",
    ) as tool:
        tool.wait_for_stdout(re.escape(HEADER[1].encode()) + b"\n")  # the reference poll is done
        fill(first, topic, "ch", 20)
        fill(second, topic, "ch", 10)
        tool.wait_for_stdout(b"\n( +[0-9]+ +){2}\\|[^\n]*\n")
        # a consumer takes 8 of second's messages and finishes them before the next poll
        with RawClient(second.tcp) as consumer:
            consumer.subscribe(topic, "ch", ready=8)
            ids = [consumer.read_message().id for _ in range(8)]
            consumer.send(rdy(0) + b"".join(fin(message_id) for message_id in ids))
            wait_for(lambda: _in_flight(second, topic) == 0, 5, message="FINs taken")
            assert tool.wait() == 0
    lines = tool.stdout.decode().splitlines()
    assert lines == HEADER + [
        line(30 // 2, 0, 42, 42, 0, 0, 0, 0, 0, 42, 0),
        line(0, 8 // 2, 34, 34, 0, 0, 0, 0, 0, 42, 1),
    ]


def _in_flight(daemon, topic: str) -> int:
    from tests.integration.http_helpers import stats

    for entry in stats(daemon.http(), f"topic={topic}")["topics"]:
        for channel in entry["channels"]:
            return channel["in_flight_count"]
    return -1


def test_missing_channel_is_fatal(node, topic):
    fill(node, topic, "other", 1)
    result = run_tool("nsq_stat", f"--topic={topic}", "--channel=ch", f"--nsqd-http-address={http_address(node)}")
    assert_fatal(result, f"ERROR: failed to find channel(ch) in stats metadata for topic({topic})")


def test_topic_on_no_nsqd_is_fatal(node, topic):
    result = run_tool("nsq_stat", f"--topic={topic}", "--channel=ch", f"--nsqd-http-address={http_address(node)}")
    assert_fatal(result, "ERROR: failed to get nsqd stats - failed to query any nsqd: ")


def test_unknown_topic_at_lookupd_is_fatal(lookupd, topic):
    result = run_tool(
        "nsq_stat", f"--topic={topic}", "--channel=ch", "--lookupd-http-address={}:{}".format(*lookupd.http_address)
    )
    assert_fatal(
        result,
        "ERROR: failed to get topic producers - failed to query any nsqlookupd: "
        'got response 404 Not Found "{\\"message\\":\\"TOPIC_NOT_FOUND\\"}"',
    )


def test_unreachable_nsqd_is_fatal_within_the_connect_timeout():
    from tests.integration.harness import free_port

    result = run_tool(
        "nsq_stat",
        "--topic=t",
        "--channel=c",
        f"--nsqd-http-address=127.0.0.1:{free_port()}",
        "--http-client-connect-timeout=500ms",
    )
    assert result.returncode == 1
    assert b"ERROR: failed to get topic producers - failed to query any nsqd: " in result.stderr
    assert b"connection refused" in result.stderr and b"Traceback" not in result.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_it_with_exit_0(node, topic, sig):
    fill(node, topic, "ch", 1)
    with ToolProcess(
        "nsq_stat", f"--topic={topic}", "--channel=ch", "--interval=50ms", f"--nsqd-http-address={http_address(node)}"
    ) as tool:
        tool.wait_for_stdout(re.escape(line(0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 0).encode()))
        assert tool.stop(sig) == 0
    assert b"Traceback" not in tool.stderr
