"""nsq_to_http end to end: the tool as a subprocess, a real nsqd, messages published over nsqd's HTTP /pub and
/mpub, and a real HTTP server in the test process (``HttpSink``) recording what the tool sends."""

from __future__ import annotations

import re
import signal
import uuid
from collections import Counter
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.integration.harness import free_port
from tests.integration.http_helpers import post
from tests.tools.conftest import ToolProcess, assert_bad_option, assert_unknown_flag, assert_usage, run_tool, wait_for
from tests.tools.http_sink import HttpSink
from tests.tools.relay_checks import FAST_RETRY, channel_stats, fatal_text, wait_drained

# NSQ 1.3.0's `nsq_to_http -h` (NSQ-TOOLS-FACTS): name -> (kind, default)
NSQ_FLAGS = {
    "channel": ("string", '"nsq_to_http"'),
    "consumer-opt": ("value", None),
    "content-type": ("string", '"application/octet-stream"'),
    "get": ("value", None),
    "header": ("value", None),
    "http-client-connect-timeout": ("duration", "2s"),
    "http-client-request-timeout": ("duration", "20s"),
    "lookupd-http-address": ("value", None),
    "max-in-flight": ("int", "200"),
    "mode": ("string", '"hostpool"'),
    "n": ("int", "100"),
    "nsqd-tcp-address": ("value", None),
    "post": ("value", None),
    "sample": ("float", "1"),
    "status-every": ("int", "250"),
    "topic": ("string", None),
    "version": ("bool", None),
}


def publish(nsqd, topic: str, bodies: list[bytes]) -> None:
    for body in bodies:
        assert post(nsqd.http(), f"/pub?topic={topic}", body).status == 200


def channel(nsqd, topic: str) -> dict | None:
    return channel_stats(nsqd, topic, "nsq_to_http")


def drained(nsqd, topic: str) -> dict:
    return wait_drained(nsqd, topic, "nsq_to_http")


# --- flags and start-up checks ---------------------------------------------------------------------------------------


def test_usage_lists_nsq_flags():
    assert_usage("nsq_to_http", NSQ_FLAGS)


def test_unknown_flag_exits_2_with_usage():
    assert_unknown_flag("nsq_to_http")


def test_bad_flag_value_exits_2():
    result = run_tool("nsq_to_http", "--sample=lots")
    assert result.returncode == 2
    assert b'invalid value "lots" for flag -sample' in result.stderr


def test_version():
    result = run_tool("nsq_to_http", "--version")
    assert result.returncode == 0
    assert result.stdout.startswith(b"nsq_to_http v1.3.0 (built w/python")


NSQD = "--nsqd-tcp-address=127.0.0.1:4150"
POST = "--post=http://127.0.0.1:1/"


@pytest.mark.parametrize(
    "args, text",
    [
        ((NSQD, POST), "--topic and --channel are required"),
        (("--topic=t", "--channel=", NSQD, POST), "--topic and --channel are required"),
        (
            ("--topic=t", NSQD, "--get=http://h/?m=%s", "--content-type=text/plain"),
            "--content-type only used with --post",
        ),
        (("--topic=t", NSQD, POST, "--content-type="), "--content-type requires a value when used"),
        (("--topic=t", POST), "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ("--topic=t", NSQD, "--lookupd-http-address=127.0.0.1:4161", POST),
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (("--topic=t", NSQD), "--get or --post required"),
        (("--topic=t", NSQD, POST, "--get=http://h/?m=%s"), "use --get or --post not both"),
        (("--topic=t", NSQD, "--get=http://h/"), "invalid GET address - must be a printf string"),
        (("--topic=t", NSQD, "--get=http://h/?a=%s&b=%s"), "invalid GET address - must be a printf string"),
        (
            ("--topic=t", NSQD, POST, "--mode=multicast"),
            '--mode must be one of round-robin, hostpool, epsilon-greedy (got "multicast")',
        ),
        (("--topic=t", NSQD, POST, "--sample=1.5"), "ERROR: --sample must be between 0.0 and 1.0"),
        (("--topic=t", NSQD, POST, "--sample=-0.1"), "ERROR: --sample must be between 0.0 and 1.0"),
        (("--topic=t", NSQD, POST, "--header=X-Empty:"), 'could not parse custom headers: Invalid header: "X-Empty:"'),
        (("--topic=t", NSQD, POST, "--header=: value"), 'could not parse custom headers: Invalid header: ": value"'),
        (("--topic=t", NSQD, POST, "--header=novalue"), 'could not parse custom headers: Invalid header: "novalue"'),
        (("--topic=a b", NSQD, POST), "invalid topic name"),
        (("--topic=t", "--channel=c/d", NSQD, POST), "invalid channel name"),
    ],
)
def test_start_up_checks_exit_1_with_a_fatal_line(args, text):
    assert fatal_text("nsq_to_http", *args) == text


def test_bad_consumer_opt_is_a_flag_error():
    assert_bad_option(
        "nsq_to_http",
        "--topic=t",
        NSQD,
        POST,
        flag="consumer-opt",
        value="no_such_option,1",
        reason="invalid option no_such_option",
    )


@pytest.mark.parametrize("address", ["--nsqd-tcp-address=nohostport", "--lookupd-http-address=::bad"])
def test_a_bad_address_is_a_fatal_line(address):
    assert ("nohostport" if "nsqd" in address else "::bad") in fatal_text("nsq_to_http", "--topic=t", address, POST)


def test_content_type_equal_to_the_default_is_allowed_with_get():
    # NSQ compares the value with the default, not whether the flag was given; the run then fails on --topic
    assert (
        fatal_text("nsq_to_http", NSQD, "--get=http://h/?m=%s", "--content-type=application/octet-stream")
        == "--topic and --channel are required"
    )


# --- end to end ------------------------------------------------------------------------------------------------------


def test_post_sends_each_message_once_with_headers_and_content_type(module_nsqd, topic):
    bodies = [f"message {i} \u00e9\n&x=1".encode() for i in range(60)]
    publish(module_nsqd, topic, bodies)
    with (
        HttpSink() as sink,
        ToolProcess(
            "nsq_to_http",
            f"--topic={topic}",
            f"--nsqd-tcp-address={module_nsqd.tcp_address}",
            f"--post={sink.url}/hook?src=nsq",
            "--content-type=text/plain; charset=utf-8",
            "--header=X-Test: yes",
            "--header=Authorization:Bearer abc",
            "-n",
            "8",
        ) as tool,
    ):
        sink.wait_for(lambda requests: len(requests) >= len(bodies))
        drained(module_nsqd, topic)
        assert tool.stop(signal.SIGTERM) == 0
    requests = sink.snapshot()
    assert Counter(r.body for r in requests) == Counter(bodies)  # each exactly once
    for request in requests:
        assert request.method == "POST" and request.path == "/hook?src=nsq"
        assert request.headers["content-type"] == "text/plain; charset=utf-8"
        assert request.headers["x-test"] == "yes"
        assert request.headers["authorization"] == "Bearer abc"
        assert request.headers["user-agent"] == "nsq_to_http v1.3.0"


def test_get_puts_the_query_escaped_body_in_the_url(module_nsqd, topic):
    bodies = [b"plain", b"with space", b"a&b=c?d#e/f%g+h", "caf\u00e9".encode(), b"line\nbreak"]
    publish(module_nsqd, topic, bodies)
    with (
        HttpSink() as sink,
        ToolProcess(
            "nsq_to_http",
            f"--topic={topic}",
            f"--nsqd-tcp-address={module_nsqd.tcp_address}",
            f"--get={sink.url}/track?v=1&data=%s",
            "--header=X-From: tool",
        ) as tool,
    ):
        requests = sink.wait_for(lambda requests: len(requests) >= len(bodies))
        drained(module_nsqd, topic)
        assert tool.stop() == 0
    received = []
    for request in requests:
        parts = urlsplit(request.path)
        assert request.method == "GET" and parts.path == "/track"
        query = parse_qs(parts.query, keep_blank_values=True, encoding="utf-8")
        assert query["v"] == ["1"]
        received.append(query["data"][0].encode())
        assert request.headers["x-from"] == "tool"
        assert "content-type" not in request.headers
    assert sorted(received) == sorted(bodies)
    # Go's url.QueryEscape: a space is "+", reserved characters are %XX
    assert any(r.path.endswith("data=with+space") for r in requests)
    assert any(r.path.endswith("data=a%26b%3Dc%3Fd%23e%2Ff%25g%2Bh") for r in requests)


def test_failed_requests_are_requeued_and_delivered_later(module_nsqd, topic):
    bodies = [f"retry-{i}".encode() for i in range(10)]
    publish(module_nsqd, topic, bodies)
    with (
        HttpSink(fail_first=2) as sink,
        ToolProcess(
            "nsq_to_http",
            f"--topic={topic}",
            f"--nsqd-tcp-address={module_nsqd.tcp_address}",
            f"--post={sink.url}/",
            *FAST_RETRY,
        ) as tool,
    ):
        requests = sink.wait_for(lambda requests: sum(r.status == 200 for r in requests) >= len(bodies), 40)
        chan = drained(module_nsqd, topic)
        assert tool.stop() == 0
    attempts = Counter(r.body for r in requests)
    assert attempts == Counter({body: 3 for body in bodies})  # 500, 500, then 200
    assert Counter(r.body for r in requests if r.status == 200) == Counter(bodies)
    assert chan["requeue_count"] >= 2 * len(bodies)


def test_unreachable_endpoint_loses_nothing(module_nsqd, topic):
    bodies = [f"kept-{i}".encode() for i in range(5)]
    publish(module_nsqd, topic, bodies)
    port = free_port()
    with ToolProcess(
        "nsq_to_http",
        f"--topic={topic}",
        f"--nsqd-tcp-address={module_nsqd.tcp_address}",
        f"--post=http://127.0.0.1:{port}/",
        *FAST_RETRY,
    ) as tool:
        wait_for(lambda: (channel(module_nsqd, topic) or {}).get("requeue_count", 0) >= 5, 20, 0.1, "requeues")
        assert tool.stop() == 0
    chan = channel(module_nsqd, topic)
    assert chan["depth"] + chan["deferred_count"] == len(bodies) and chan["in_flight_count"] == 0
    # and they go out once the endpoint is there
    with (
        HttpSink() as sink,
        ToolProcess(
            "nsq_to_http",
            f"--topic={topic}",
            f"--nsqd-tcp-address={module_nsqd.tcp_address}",
            f"--post={sink.url}/",
            *FAST_RETRY,
        ) as tool,
    ):
        sink.wait_for(lambda requests: len(requests) >= len(bodies))
        drained(module_nsqd, topic)
        assert tool.stop() == 0
    assert sorted(r.body for r in sink.snapshot()) == sorted(bodies)


def test_sample_sends_a_fraction_and_fins_the_rest(module_nsqd, topic):
    total = 300
    assert (
        post(module_nsqd.http(), f"/mpub?topic={topic}", b"\n".join(f"s{i}".encode() for i in range(total))).status
        == 200
    )
    with (
        HttpSink() as sink,
        ToolProcess(
            "nsq_to_http",
            f"--topic={topic}",
            f"--nsqd-tcp-address={module_nsqd.tcp_address}",
            f"--post={sink.url}/",
            "--sample=0.5",
        ) as tool,
    ):
        chan = drained(module_nsqd, topic)
        assert tool.stop() == 0
    sent = len(sink.snapshot())
    assert chan["message_count"] == total and chan["requeue_count"] == 0
    assert 0 < sent < total
    assert 90 <= sent <= 210  # binomial(300, 0.5): mean 150, sd 8.7


def test_round_robin_spreads_messages_over_the_urls(module_nsqd, topic):
    bodies = [f"rr-{i}".encode() for i in range(20)]
    publish(module_nsqd, topic, bodies)
    with (
        HttpSink() as one,
        HttpSink() as two,
        ToolProcess(
            "nsq_to_http",
            f"--topic={topic}",
            f"--nsqd-tcp-address={module_nsqd.tcp_address}",
            f"--post={one.url}/",
            f"--post={two.url}/",
            "--mode=round-robin",
            "--status-every=10",
        ) as tool,
    ):
        wait_for(lambda: len(one.snapshot()) + len(two.snapshot()) >= len(bodies), 20, 0.05, "requests")
        drained(module_nsqd, topic)
        # --status-every with two URLs: the aggregate line and one per URL
        tool.wait_for_stderr(
            rb"\[aggregate\]: finished 10 - 99th: \d+\.\d\dms - 95th: \d+\.\d\dms - avg: "
            rb"\d+\.\d\dms"
        )
        tool.wait_for_stderr(re.escape(f"[{one.url}/]: finished 10 ".encode()))
        assert tool.stop() == 0
    assert len(one.snapshot()) == len(two.snapshot()) == 10
    assert sorted(r.body for r in one.snapshot() + two.snapshot()) == sorted(bodies)


def test_hostpool_moves_away_from_a_failing_url(module_nsqd, topic):
    bodies = [f"hp-{i}".encode() for i in range(30)]
    publish(module_nsqd, topic, bodies)
    dead = f"http://127.0.0.1:{free_port()}/"
    with (
        HttpSink() as sink,
        ToolProcess(
            "nsq_to_http",
            f"--topic={topic}",
            f"--nsqd-tcp-address={module_nsqd.tcp_address}",
            f"--post={dead}",
            f"--post={sink.url}/",
            "-n",
            "1",
            *FAST_RETRY,
        ) as tool,
    ):
        chan = drained(module_nsqd, topic)
        assert tool.stop() == 0
    assert sorted(r.body for r in sink.snapshot()) == sorted(bodies)
    # one request at a time: the refused URL gets the first message, then is skipped for its 30s retry delay
    assert chan["requeue_count"] == 1


def test_lookupd_discovery(lookupd, lookupd_nsqd):
    topic = f"t_{uuid.uuid4().hex[:12]}"
    publish(lookupd_nsqd, topic, [b"found via lookupd"])
    with (
        HttpSink() as sink,
        ToolProcess(
            "nsq_to_http",
            f"--topic={topic}",
            "--lookupd-http-address={}:{}".format(*lookupd.http_address),
            f"--post={sink.url}/",
        ) as tool,
    ):
        sink.wait_for(lambda requests: len(requests) >= 1, 30)
        assert tool.stop() == 0
    assert [r.body for r in sink.snapshot()] == [b"found via lookupd"]
