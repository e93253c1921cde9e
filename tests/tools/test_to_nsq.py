"""to_nsq end to end: the tool as a subprocess, stdin from the test, real nsqd subprocesses.

What arrived is read back with the raw V2 client of the test harness (or nsqd's /stats), independent of the
client package the tool publishes with.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest

from tests.integration.harness import RawClient, fin, free_port
from tests.tools.conftest import (
    ToolProcess,
    assert_bad_option,
    assert_fatal,
    assert_unknown_flag,
    assert_usage,
    run_tool,
    topic_depth,
    wait_for,
)

# NSQ-TOOLS-FACTS, to_nsq: name -> (Go's placeholder, default as -h prints it)
UPSTREAM_FLAGS = {
    "delimiter": ("string", '"\\n"'),
    "nsqd-tcp-address": ("value", None),
    "producer-opt": ("value", None),
    "rate": ("int", None),
    "topic": ("string", None),
}


def read_all(nsqd, topic: str, count: int, timeout: float = 30.0) -> list[bytes]:
    """Subscribe a raw consumer and take ``count`` messages (FIN'd), in the order nsqd sends them."""
    bodies = []
    with RawClient(nsqd.tcp, timeout=timeout) as client:
        client.subscribe(topic, "check", ready=min(count, 2500))
        deadline = time.monotonic() + timeout
        while len(bodies) < count:
            message = client.read_message(max(deadline - time.monotonic(), 0.01))
            client.send(fin(message.id))
            bodies.append(message.body)
            if len(bodies) % 2000 == 0 and len(bodies) < count:
                client.send(b"RDY %d\n" % min(count - len(bodies), 2500))
        assert client.poll_frame(0.2) is None, "more messages than published"
    return bodies


def to_nsq(*args: str, stdin: bytes, timeout: float = 60.0):
    return run_tool("to_nsq", *args, input=stdin, timeout=timeout)


def test_usage_lists_upstream_flags():
    assert_usage("to_nsq", UPSTREAM_FLAGS)


def test_unknown_flag_exits_2():
    assert_unknown_flag("to_nsq")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--topic required"),
        (["--topic=t", "--delimiter=ab"], "--delimiter must be a single byte"),
        (["--topic=t", "--delimiter=é"], "--delimiter must be a single byte"),  # two bytes in UTF-8
        (["--topic=t", "--delimiter="], "--delimiter must be a single byte"),
        (["--topic=t"], "--nsqd-tcp-address required"),
    ],
)
def test_bad_flags_end_as_log_fatal(args, message):
    assert_fatal(to_nsq(*args, stdin=b""), message)


def test_bad_producer_opt_is_a_flag_error(nsqd):
    assert_bad_option(
        "to_nsq",
        "--topic=t",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        flag="producer-opt",
        value="no_such_option,1",
        reason="invalid option no_such_option",
    )


def test_lines_arrive_in_order_and_empty_ones_are_skipped(nsqd, topic):
    result = to_nsq(f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}", stdin=b"one\ntwo\n\n\nthree\n")
    assert result.returncode == 0, result.stderr
    assert read_all(nsqd, topic, 3) == [b"one", b"two", b"three"]


def test_delimiter_splits_binary_input_and_the_last_piece_is_whole(nsqd, topic):
    pieces = [bytes(range(0, 124)), b"line\nwith\r\nnewlines", bytes(range(125, 256)), b"\x00tail\xff"]
    stdin = b"|".join(pieces)  # the last piece has no delimiter after it
    result = to_nsq(f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}", "--delimiter=|", stdin=stdin)
    assert result.returncode == 0, result.stderr
    assert read_all(nsqd, topic, len(pieces)) == pieces


def test_every_address_gets_every_message(nsqd_factory, topic):
    first, second = nsqd_factory(), nsqd_factory()
    stdin = b"".join(b"m%d\n" % i for i in range(100))
    result = to_nsq(
        f"--topic={topic}",
        f"--nsqd-tcp-address={first.tcp_address}",
        f"--nsqd-tcp-address={second.tcp_address}",
        stdin=stdin,
    )
    assert result.returncode == 0, result.stderr
    expected = [b"m%d" % i for i in range(100)]
    assert read_all(first, topic, 100) == expected
    assert read_all(second, topic, 100) == expected


def test_large_input_is_pipelined_and_keeps_its_order(nsqd, topic):
    count = 30000
    stdin = b"".join(b"message-%06d\n" % i for i in range(count))
    started = time.monotonic()
    result = to_nsq(f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}", stdin=stdin, timeout=120)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert topic_depth(nsqd, topic) == count
    assert read_all(nsqd, topic, count, timeout=60) == [b"message-%06d" % i for i in range(count)]
    # one PUB per round trip would need a round trip per message; pipelined it is far under a minute
    assert elapsed < 60, elapsed


def test_rate_throttles_and_everything_arrives(nsqd, topic):
    stdin = b"".join(b"r%d\n" % i for i in range(30))
    started = time.monotonic()
    result = to_nsq(f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}", "--rate=20", stdin=stdin)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert b"Throttling messages rate to max:20/second" in result.stderr
    # one token at the start, then one every 50 ms: 29 waits
    assert elapsed >= 1.3, elapsed
    assert read_all(nsqd, topic, 30) == [b"r%d" % i for i in range(30)]


def test_error_frame_is_fatal(nsqd):
    result = to_nsq("--topic=bad topic", f"--nsqd-tcp-address={nsqd.tcp_address}", stdin=b"x\n")
    assert_fatal(result, 'E_BAD_TOPIC PUB topic name "bad topic" is not valid')


def test_unreachable_nsqd_is_fatal():
    address = f"127.0.0.1:{free_port()}"
    result = to_nsq("--topic=t", f"--nsqd-tcp-address={address}", stdin=b"x\n")
    assert result.returncode == 1 and b"Traceback" not in result.stderr, result.stderr
    # the last line is the fatal one, naming the address (the reason's words are the client's)
    assert re.fullmatch(
        rb"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d .*" + re.escape(address.encode()) + rb".*", result.stderr.splitlines()[-1]
    ), result.stderr


def test_empty_input_exits_0(nsqd, topic):
    result = to_nsq(f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}", stdin=b"")
    assert result.returncode == 0, result.stderr
    assert topic_depth(nsqd, topic) is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_it_after_what_was_read(nsqd, topic, sig):
    with ToolProcess(
        "to_nsq", f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}", stdin=subprocess.PIPE
    ) as tool:
        tool.proc.stdin.write(b"a\nb\n")
        tool.proc.stdin.flush()
        wait_for(lambda: topic_depth(nsqd, topic) == 2, 20, message="two messages published")
        assert tool.stop(sig) == 0, tool.stderr
        tool.proc.stdin.close()
    assert b"Traceback" not in tool.stderr
    assert read_all(nsqd, topic, 2) == [b"a", b"b"]
