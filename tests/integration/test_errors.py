"""nsqd's error frames over raw sockets: every error text, the state matrix, fatal vs non-fatal, and abuse.

Expected bytes come from NSQ v1.3.0's observed behaviour (shared NSQ-FACTS sections 1.5-1.7). A fatal error is
an error frame followed by the server closing the connection; E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED
leave the connection usable. After every test the shared daemon must still be alive and able to move a message.
"""

from __future__ import annotations

import struct
import uuid

import pytest

from tests.integration.harness import (
    CLS,
    FRAME_TYPE_ERROR,
    MAX_BODY_SIZE,
    MAX_MSG_SIZE,
    NOP,
    ConnectionClosed,
    Frame,
    RawClient,
    command,
    consumer,
    dpub,
    fin,
    identify,
    mpub,
    mpub_body,
    pub,
    rdy,
    req,
    sub,
    touch,
)

pytestmark = pytest.mark.timeout(60)

UNKNOWN_ID = b"0123456789abcdef"
NON_FATAL = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED")


def size(n: int) -> bytes:
    return struct.pack(">i", n)


def fresh_name(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


def assert_healthy(daemon) -> None:
    """The daemon is alive and a new producer and consumer still move a message end to end."""
    daemon.assert_running()
    name = fresh_name("health")
    with consumer(daemon.tcp, name, "ch", ready=1) as reader, RawClient(daemon.tcp) as writer:
        writer.publish(name, b"heartbeat of the suite")
        message = reader.read_message()
        assert message.body == b"heartbeat of the suite"
        assert message.attempts == 1
        reader.send(fin(message.id))
        reader.assert_open()


@pytest.fixture
def daemon(module_nsqd):
    yield module_nsqd
    assert_healthy(module_nsqd)


def open_in_state(daemon, state: str, topic: str) -> RawClient:
    """A connection in NSQ client state `init`, `subscribed` or `closing`."""
    client = RawClient(daemon.tcp)
    if state in ("subscribed", "closing"):
        client.subscribe(topic, "ch")
    if state == "closing":
        client.send(CLS)
        assert client.read_response() == b"CLOSE_WAIT"
    return client


def check_error(client: RawClient, expected: bytes) -> None:
    """The next frame is exactly `expected`; fatal codes close the connection, the three *_FAILED do not."""
    client.expect_error(expected)
    if expected.startswith(NON_FATAL):
        client.assert_open()
    else:
        client.assert_closed()


# --------------------------------------------------------------------------------------------------------------
# Every error text of the command reference. (state, bytes after the magic, expected error frame, half-close?)
# `{T}` in payloads and texts is replaced by a fresh topic name. Half-closing (SHUT_WR) makes the server's read
# fail mid-command, which NSQ answers with a "failed to read" error before closing.

BIG_PREFIX = 100_000_000
LONG_TOPIC = "a" * 10_000

ERROR_CASES = [
    # -- unknown commands
    ("init", b"FOO\n", b"E_INVALID invalid command FOO", False),
    ("init", b"\n", b"E_INVALID invalid command ", False),
    ("init", b"pub {T}\n", b"E_INVALID invalid command pub", False),
    ("init", b"\xde\xad\xbe\xef\x00 \x01\x02\n", b"E_INVALID invalid command \xde\xad\xbe\xef\x00", False),
    ("subscribed", b"BOGUS a b c\n", b"E_INVALID invalid command BOGUS", False),
    # -- IDENTIFY
    ("init", b"IDENTIFY\n" + size(MAX_BODY_SIZE + 1), b"E_BAD_BODY IDENTIFY body too big 5242881 > 5242880", False),
    ("init", b"IDENTIFY\n" + size(0), b"E_BAD_BODY IDENTIFY invalid body size 0", False),
    ("init", b"IDENTIFY\n" + size(-1), b"E_BAD_BODY IDENTIFY invalid body size -1", False),
    ("init", b"IDENTIFY\n\x00\x00", b"E_BAD_BODY IDENTIFY failed to read body size", True),
    ("init", b"IDENTIFY\n" + size(100) + b'{"client_id":', b"E_BAD_BODY IDENTIFY failed to read body", True),
    ("init", command("IDENTIFY", body=b"not json"), b"E_BAD_BODY IDENTIFY failed to decode JSON body", False),
    (
        "init",
        command("IDENTIFY", body=b'{"heartbeat_interval":"1000"}'),
        b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        False,
    ),
    (
        "init",
        command("IDENTIFY", body=b'{"feature_negotiation":"yes"}'),
        b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        False,
    ),
    (
        "init",
        identify({"feature_negotiation": True, "snappy": True, "deflate": True}),
        b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression",
        False,
    ),
    ("subscribed", identify({}), b"E_INVALID cannot IDENTIFY in current state", False),
    ("closing", identify({}), b"E_INVALID cannot IDENTIFY in current state", False),
    # -- AUTH (no --auth-http-address on this daemon)
    ("init", command("AUTH", body=b"secret"), b"E_AUTH_DISABLED AUTH disabled", False),
    ("init", b"AUTH extra\n", b"E_INVALID AUTH invalid number of parameters", False),
    ("init", b"AUTH\n" + size(MAX_BODY_SIZE + 1), b"E_BAD_BODY AUTH body too big 5242881 > 5242880", False),
    ("init", b"AUTH\n" + size(0), b"E_BAD_BODY AUTH invalid body size 0", False),
    ("init", b"AUTH\n\x00", b"E_BAD_BODY AUTH failed to read body size", True),
    ("init", b"AUTH\n" + size(6) + b"sec", b"E_BAD_BODY AUTH failed to read body", True),
    ("subscribed", command("AUTH", body=b"secret"), b"E_INVALID cannot AUTH in current state", False),
    # -- SUB
    ("init", b"SUB {T}\n", b"E_INVALID SUB insufficient number of parameters", False),
    ("init", b"SUB\n", b"E_INVALID SUB insufficient number of parameters", False),
    ("init", b"SUB bad! ch\n", b'E_BAD_TOPIC SUB topic name "bad!" is not valid', False),
    ("init", b"SUB a#b ch\n", b'E_BAD_TOPIC SUB topic name "a#b" is not valid', False),
    ("init", b"SUB " + b"x" * 65 + b" ch\n", b'E_BAD_TOPIC SUB topic name "' + b"x" * 65 + b'" is not valid', False),
    ("init", b"SUB {T} bad!\n", b'E_BAD_CHANNEL SUB channel name "bad!" is not valid', False),
    ("init", b"SUB {T}  ch\n", b'E_BAD_CHANNEL SUB channel name "" is not valid', False),
    (
        "init",
        b"SUB {T} ch#ephemeral#ephemeral\n",
        b'E_BAD_CHANNEL SUB channel name "ch#ephemeral#ephemeral" is not valid',
        False,
    ),
    ("subscribed", b"SUB {T} other\n", b"E_INVALID cannot SUB in current state", False),
    ("closing", b"SUB {T} other\n", b"E_INVALID cannot SUB in current state", False),
    # -- RDY
    ("init", b"RDY 1\n", b"E_INVALID cannot RDY in current state", False),
    ("subscribed", b"RDY abc\n", b"E_INVALID RDY could not parse count abc", False),
    ("subscribed", b"RDY -1\n", b"E_INVALID RDY could not parse count -1", False),
    ("subscribed", b"RDY +5\n", b"E_INVALID RDY could not parse count +5", False),
    ("subscribed", b"RDY 2501\n", b"E_INVALID RDY count 2501 out of range 0-2500", False),
    # -- FIN
    ("init", fin(UNKNOWN_ID), b"E_INVALID cannot FIN in current state", False),
    ("subscribed", b"FIN\n", b"E_INVALID FIN insufficient number of params", False),
    ("subscribed", b"FIN abc\n", b"E_INVALID invalid message ID", False),
    ("subscribed", b"FIN 0123456789abcdef0\n", b"E_INVALID invalid message ID", False),
    ("subscribed", fin(UNKNOWN_ID), b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight", False),
    ("subscribed", fin(b"zzzzzzzzzzzzzzzz"), b"E_FIN_FAILED FIN zzzzzzzzzzzzzzzz failed ID not in flight", False),
    ("closing", fin(UNKNOWN_ID), b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight", False),
    # -- REQ
    ("init", req(UNKNOWN_ID, 0), b"E_INVALID cannot REQ in current state", False),
    ("subscribed", b"REQ 0123456789abcdef\n", b"E_INVALID REQ insufficient number of params", False),
    ("subscribed", b"REQ abc 10\n", b"E_INVALID invalid message ID", False),
    ("subscribed", b"REQ 0123456789abcdef x\n", b"E_INVALID REQ could not parse timeout x", False),
    ("subscribed", b"REQ 0123456789abcdef -1\n", b"E_INVALID REQ could not parse timeout -1", False),
    ("subscribed", req(UNKNOWN_ID, 10), b"E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight", False),
    ("closing", req(UNKNOWN_ID, 0), b"E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight", False),
    # -- TOUCH
    ("init", touch(UNKNOWN_ID), b"E_INVALID cannot TOUCH in current state", False),
    ("subscribed", b"TOUCH\n", b"E_INVALID TOUCH insufficient number of params", False),
    ("subscribed", b"TOUCH abc\n", b"E_INVALID invalid message ID", False),
    ("subscribed", touch(UNKNOWN_ID), b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight", False),
    ("closing", touch(UNKNOWN_ID), b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight", False),
    # -- CLS
    ("init", CLS, b"E_INVALID cannot CLS in current state", False),
    ("closing", CLS, b"E_INVALID cannot CLS in current state", False),
    # -- PUB
    ("init", b"PUB\n", b"E_INVALID PUB insufficient number of parameters", False),
    ("init", b"PUB bad!\n", b'E_BAD_TOPIC PUB topic name "bad!" is not valid', False),
    (
        "init",
        b"PUB " + LONG_TOPIC.encode() + b"\n",
        b'E_BAD_TOPIC PUB topic name "' + LONG_TOPIC.encode() + b'" is not valid',
        False,
    ),
    ("init", b"PUB {T}\n\x00\x00", b"E_BAD_MESSAGE PUB failed to read message body size", True),
    ("init", b"PUB {T}\n" + size(0), b"E_BAD_MESSAGE PUB invalid message body size 0", False),
    ("init", b"PUB {T}\n" + size(-5), b"E_BAD_MESSAGE PUB invalid message body size -5", False),
    ("init", b"PUB {T}\n" + size(MAX_MSG_SIZE + 1), b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576", False),
    ("init", b"PUB {T}\n" + size(BIG_PREFIX), b"E_BAD_MESSAGE PUB message too big 100000000 > 1048576", False),
    ("init", b"PUB {T}\n" + size(10) + b"abc", b"E_BAD_MESSAGE PUB failed to read message body", True),
    ("subscribed", b"PUB {T}\n" + size(0), b"E_BAD_MESSAGE PUB invalid message body size 0", False),
    # -- MPUB
    ("init", b"MPUB\n", b"E_INVALID MPUB insufficient number of parameters", False),
    ("init", b"MPUB bad!\n", b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "bad!" is not valid', False),
    ("init", b"MPUB {T}\n\x00", b"E_BAD_BODY MPUB failed to read body size", True),
    ("init", b"MPUB {T}\n" + size(0), b"E_BAD_BODY MPUB invalid body size 0", False),
    ("init", b"MPUB {T}\n" + size(-1), b"E_BAD_BODY MPUB invalid body size -1", False),
    ("init", b"MPUB {T}\n" + size(MAX_BODY_SIZE + 1), b"E_BAD_BODY MPUB body too big 5242881 > 5242880", False),
    ("init", b"MPUB {T}\n" + size(100) + b"\x00\x00", b"E_BAD_BODY MPUB failed to read message count", True),
    ("init", b"MPUB {T}\n" + size(100) + size(0), b"E_BAD_BODY MPUB invalid message count 0", False),
    ("init", b"MPUB {T}\n" + size(100) + size(-3), b"E_BAD_BODY MPUB invalid message count -3", False),
    ("init", b"MPUB {T}\n" + size(100) + size(1048576), b"E_BAD_BODY MPUB invalid message count 1048576", False),
    (
        "init",
        b"MPUB {T}\n" + size(100) + size(2) + b"\x00",
        b"E_BAD_MESSAGE MPUB failed to read message(0) body size",
        True,
    ),
    (
        "init",
        b"MPUB {T}\n" + size(100) + size(2) + size(0),
        b"E_BAD_MESSAGE MPUB invalid message(0) body size 0",
        False,
    ),
    (
        "init",
        b"MPUB {T}\n" + size(100) + size(2) + size(1) + b"a" + size(-1),
        b"E_BAD_MESSAGE MPUB invalid message(1) body size -1",
        False,
    ),
    (
        "init",
        b"MPUB {T}\n" + size(100) + size(2) + size(MAX_MSG_SIZE + 1),
        b"E_BAD_MESSAGE MPUB message too big 1048577 > 1048576",
        False,
    ),
    (
        "init",
        b"MPUB {T}\n" + size(100) + size(1) + size(10) + b"abc",
        b"E_BAD_MESSAGE MPUB failed to read message body",
        True,
    ),
    # -- DPUB
    ("init", b"DPUB {T}\n", b"E_INVALID DPUB insufficient number of parameters", False),
    ("init", b"DPUB bad! 10\n", b'E_BAD_TOPIC DPUB topic name "bad!" is not valid', False),
    ("init", b"DPUB {T} abc\n", b"E_INVALID DPUB could not parse timeout abc", False),
    ("init", b"DPUB {T} -1\n", b"E_INVALID DPUB could not parse timeout -1", False),
    ("init", b"DPUB {T} 3600001\n", b"E_INVALID DPUB timeout 3600001 out of range 0-3600000", False),
    ("init", b"DPUB {T} 10\n\x00", b"E_BAD_MESSAGE DPUB failed to read message body size", True),
    ("init", b"DPUB {T} 10\n" + size(0), b"E_BAD_MESSAGE DPUB invalid message body size 0", False),
    ("init", b"DPUB {T} 10\n" + size(MAX_MSG_SIZE + 1), b"E_BAD_MESSAGE DPUB message too big 1048577 > 1048576", False),
    ("init", b"DPUB {T} 10\n" + size(10) + b"abc", b"E_BAD_MESSAGE DPUB failed to read message body", True),
]

# IDENTIFY range validation: 0 keeps the default, -1 has a meaning for some fields, anything else out of range.
IDENTIFY_RANGE_CASES = [
    ({"heartbeat_interval": 999}, b"heartbeat interval (999) is invalid"),
    ({"heartbeat_interval": 60001}, b"heartbeat interval (60001) is invalid"),
    ({"heartbeat_interval": -2}, b"heartbeat interval (-2) is invalid"),
    ({"output_buffer_timeout": 24}, b"output buffer timeout (24) is invalid"),
    ({"output_buffer_timeout": 30001}, b"output buffer timeout (30001) is invalid"),
    ({"output_buffer_timeout": -2}, b"output buffer timeout (-2) is invalid"),
    ({"output_buffer_size": 63}, b"output buffer size (63) is invalid"),
    ({"output_buffer_size": 65537}, b"output buffer size (65537) is invalid"),
    ({"output_buffer_size": -2}, b"output buffer size (-2) is invalid"),
    ({"sample_rate": -1}, b"sample rate (-1) is invalid"),
    ({"sample_rate": 100}, b"sample rate (100) is invalid"),
    ({"msg_timeout": 999}, b"msg timeout (999) is invalid"),
    ({"msg_timeout": 900001}, b"msg timeout (900001) is invalid"),
    ({"msg_timeout": -1}, b"msg timeout (-1) is invalid"),
    # validation order: heartbeat, output buffer timeout, output buffer size, sample rate, msg timeout
    ({"msg_timeout": 1, "heartbeat_interval": 5}, b"heartbeat interval (5) is invalid"),
    ({"output_buffer_size": 1, "output_buffer_timeout": 1}, b"output buffer timeout (1) is invalid"),
    ({"msg_timeout": 1, "sample_rate": 200, "output_buffer_size": 2}, b"output buffer size (2) is invalid"),
    ({"msg_timeout": 1, "sample_rate": 200}, b"sample rate (200) is invalid"),
]


def _case_id(case) -> str:
    state, payload, expected, half_close = case
    text = expected.decode("latin-1").split(" ", 1)[1][:40] if b" " in expected else expected.decode()
    head = payload.split(b"\n")[0][:12].decode("latin-1").strip() or "empty"
    return f"{state}-{head}-{text}".replace(" ", "_")


@pytest.mark.parametrize("state,payload,expected,half_close", ERROR_CASES, ids=[_case_id(c) for c in ERROR_CASES])
def test_error_frame(daemon, state, payload, expected, half_close):
    name = fresh_name()
    payload = payload.replace(b"{T}", name.encode())
    with open_in_state(daemon, state, name) as client:
        client.send(payload)
        if half_close:
            client.shutdown_write()
            client.expect_error(expected)
            client.assert_closed()
        else:
            check_error(client, expected)


@pytest.mark.parametrize("fields,reason", IDENTIFY_RANGE_CASES, ids=[r.decode() for _, r in IDENTIFY_RANGE_CASES])
def test_identify_out_of_range_is_fatal(daemon, fields, reason):
    with RawClient(daemon.tcp) as client:
        client.send(identify(fields))
        check_error(client, b"E_BAD_BODY IDENTIFY " + reason)


@pytest.mark.parametrize(
    "fields",
    [
        {"heartbeat_interval": -1},
        {"heartbeat_interval": 1000},
        {"heartbeat_interval": 60000},
        {"output_buffer_timeout": -1},
        {"output_buffer_timeout": 25},
        {"output_buffer_timeout": 30000},
        {"output_buffer_size": -1},
        {"output_buffer_size": 64},
        {"output_buffer_size": 65536},
        {"sample_rate": 0},
        {"sample_rate": 99},
        {"msg_timeout": 1000},
        {"msg_timeout": 900000},
        {"heartbeat_interval": 0, "output_buffer_size": 0, "output_buffer_timeout": 0, "msg_timeout": 0},
        {"deflate_level": 100},
        {"unknown_field": [1, 2, 3], "short_id": "legacy", "long_id": "legacy"},
    ],
)
def test_identify_boundary_values_are_accepted(daemon, fields):
    with RawClient(daemon.tcp) as client:
        assert client.identify(fields) == b"OK"
        client.assert_open()


def test_sub_refused_when_heartbeats_disabled(daemon):
    with RawClient(daemon.tcp) as client:
        assert client.identify({"heartbeat_interval": -1}) == b"OK"
        client.send(sub(fresh_name(), "ch"))
        check_error(client, b"E_INVALID cannot SUB with heartbeats disabled")


def test_fin_req_touch_of_message_owned_by_another_connection(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=1) as owner, consumer(daemon.tcp, name, "ch", ready=0) as other:
        with RawClient(daemon.tcp) as writer:
            writer.publish(name, b"mine")
        message = owner.read_message()
        for cmd, code in ((touch(message.id), "TOUCH"), (req(message.id, 0), "REQ"), (fin(message.id), "FIN")):
            other.send(cmd)
            other.expect_error(
                f"E_{code}_FAILED {code} ".encode() + message.id + b" failed client does not own message"
            )
        other.assert_open()
        owner.send(fin(message.id))
        owner.assert_open()


def test_fin_twice_second_is_not_in_flight(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=1) as client:
        client.publish(name, b"once")
        message = client.read_message()
        client.send(fin(message.id))
        client.send(fin(message.id))
        check_error(client, b"E_FIN_FAILED FIN " + message.id + b" failed ID not in flight")


def test_max_channel_consumers(nsqd_factory):
    daemon = nsqd_factory("--max-channel-consumers=1")
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch") as first, RawClient(daemon.tcp) as second:
        second.send(sub(name, "ch"))
        check_error(second, f"E_SUB_FAILED SUB failed consumers for {name}:ch exceeds limit of 1".encode())
        first.assert_open()
    with consumer(daemon.tcp, name, "other-channel") as third:
        third.assert_open()


def test_mpub_is_all_or_nothing(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=10) as reader, RawClient(daemon.tcp) as writer:
        bad = size(3) + size(3) + b"one" + size(3) + b"two" + size(0)  # third message has size 0
        writer.send(b"MPUB " + name.encode() + b"\n" + size(len(bad)) + bad)
        check_error(writer, b"E_BAD_MESSAGE MPUB invalid message(2) body size 0")
        with RawClient(daemon.tcp) as second_writer:
            second_writer.publish(name, b"after")
        assert reader.read_message().body == b"after", "messages of a rejected MPUB were delivered"


# --------------------------------------------------------------------------------------------------------------
# The state matrix (NSQ-FACTS 1.5): what each command does in init, subscribed and closing.

SILENT = "silent"  # no frame at all: a following PUB is answered first


def _matrix_cases():
    topic_ok = b"OK"
    cases = {
        "IDENTIFY": (
            identify({}),
            (
                ("response", b"OK"),
                ("fatal", b"E_INVALID cannot IDENTIFY in current state"),
                ("fatal", b"E_INVALID cannot IDENTIFY in current state"),
            ),
        ),
        "AUTH": (
            command("AUTH", body=b"s3cret"),
            (
                ("fatal", b"E_AUTH_DISABLED AUTH disabled"),
                ("fatal", b"E_INVALID cannot AUTH in current state"),
                ("fatal", b"E_INVALID cannot AUTH in current state"),
            ),
        ),
        "SUB": (
            b"SUB {T} second\n",
            (
                ("response", topic_ok),
                ("fatal", b"E_INVALID cannot SUB in current state"),
                ("fatal", b"E_INVALID cannot SUB in current state"),
            ),
        ),
        "RDY": (rdy(1), (("fatal", b"E_INVALID cannot RDY in current state"), (SILENT, None), (SILENT, None))),
        "FIN": (
            fin(UNKNOWN_ID),
            (
                ("fatal", b"E_INVALID cannot FIN in current state"),
                ("error", b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"),
                ("error", b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"),
            ),
        ),
        "REQ": (
            req(UNKNOWN_ID, 0),
            (
                ("fatal", b"E_INVALID cannot REQ in current state"),
                ("error", b"E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight"),
                ("error", b"E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight"),
            ),
        ),
        "TOUCH": (
            touch(UNKNOWN_ID),
            (
                ("fatal", b"E_INVALID cannot TOUCH in current state"),
                ("error", b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight"),
                ("error", b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight"),
            ),
        ),
        "CLS": (
            CLS,
            (
                ("fatal", b"E_INVALID cannot CLS in current state"),
                ("response", b"CLOSE_WAIT"),
                ("fatal", b"E_INVALID cannot CLS in current state"),
            ),
        ),
        "PUB": (b"PUB {T}\n" + size(5) + b"hello", (("response", topic_ok),) * 3),
        "MPUB": (
            b"MPUB {T}\n" + size(len(mpub_body([b"a", b"b"]))) + mpub_body([b"a", b"b"]),
            (("response", topic_ok),) * 3,
        ),
        "DPUB": (b"DPUB {T} 100\n" + size(5) + b"later", (("response", topic_ok),) * 3),
        "NOP": (NOP, ((SILENT, None),) * 3),
    }
    for name, (payload, outcomes) in cases.items():
        for state, outcome in zip(("init", "subscribed", "closing"), outcomes, strict=True):
            yield pytest.param(state, payload, outcome, id=f"{name}-{state}")


@pytest.mark.parametrize("state,payload,outcome", list(_matrix_cases()))
def test_state_matrix(daemon, state, payload, outcome):
    name = fresh_name()
    kind, data = outcome
    with open_in_state(daemon, state, name) as client:
        client.send(payload.replace(b"{T}", name.encode()))
        if kind == "response":
            assert client.read_response() == data
            client.assert_open()
        elif kind == SILENT:
            client.assert_open()  # the PUB's OK must be the very next frame
        elif kind == "error":
            client.expect_error(data)
            client.assert_open()
        else:
            client.expect_error(data)
            client.assert_closed()


def test_rdy_after_cls_is_ignored_and_nothing_more_is_delivered(daemon):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=0) as client:
        client.send(CLS)
        assert client.read_response() == b"CLOSE_WAIT"
        client.send(rdy(10))
        client.publish(name, b"not for a closing client")
        assert client.poll_frame(1.0) is None, "a closing client must not receive messages"


# --------------------------------------------------------------------------------------------------------------
# Connection start and abuse


@pytest.mark.parametrize("magic", [b"  V1", b"V2  ", b"GET / HTTP/1.1\r\n\r\n", b"\x00\x00\x00\x00"])
def test_bad_magic(daemon, magic):
    with RawClient(daemon.tcp, magic=False) as client:
        client.send(magic)
        frame = client.read_frame()
        assert frame == Frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL")
        client.assert_closed()


def test_client_closing_before_or_inside_the_magic(daemon):
    RawClient(daemon.tcp, magic=False).close()
    with RawClient(daemon.tcp, magic=False) as client:
        client.send(b"  ")
    daemon.assert_running()


@pytest.mark.parametrize(
    "partial",
    [
        pytest.param(lambda t: b"PUB " + t + b"\n" + size(100) + b"x" * 50, id="half-pub-body"),
        pytest.param(lambda t: b"PUB " + t + b"\n\x00\x00", id="half-pub-size"),
        pytest.param(lambda t: b"PUB " + t, id="half-command-line"),
        pytest.param(
            lambda t: b"MPUB " + t + b"\n" + size(40) + size(2) + size(4) + b"full" + size(9) + b"half", id="half-mpub"
        ),
        pytest.param(lambda t: b"DPUB " + t + b" 0\n" + size(20) + b"0123456789", id="half-dpub"),
    ],
)
def test_client_vanishing_mid_frame_publishes_nothing(daemon, partial):
    name = fresh_name()
    with consumer(daemon.tcp, name, "ch", ready=10) as reader:
        with RawClient(daemon.tcp) as vanishing:
            vanishing.send(partial(name.encode()))
        with RawClient(daemon.tcp) as writer:
            writer.publish(name, b"after")
        assert reader.read_message().body == b"after"


def test_garbage_bytes_without_newline_then_vanish(daemon):
    noise = bytes((i * 131 + 7) % 256 for i in range(5000)).replace(b"\n", b"\x01")
    with RawClient(daemon.tcp) as client:
        client.send(noise)
    daemon.assert_running()


def test_huge_size_prefix_is_refused_without_waiting_for_the_body(daemon):
    name = fresh_name()
    with RawClient(daemon.tcp) as client:
        client.send(b"PUB " + name.encode() + b"\n" + size(BIG_PREFIX))
        client.expect_error(b"E_BAD_MESSAGE PUB message too big 100000000 > 1048576", timeout=5)
        client.assert_closed()


def test_overlong_command_line_is_dropped_without_error(daemon):
    with RawClient(daemon.tcp) as client:
        try:
            client.send(b"PUB " + b"A" * 20_000)
        except (BrokenPipeError, ConnectionResetError):
            return  # dropped while we were still sending: no error frame either
        try:
            frame = client.read_frame(10)
        except ConnectionClosed:
            return
        raise AssertionError(f"expected the connection to be dropped silently, got {frame}")


def test_long_line_under_the_limit_is_parsed(daemon):
    with RawClient(daemon.tcp) as client:
        client.send(b"NOP" + b" x" * 5000 + b"\n")
        client.assert_open()


def test_pipelined_commands_in_one_write(daemon):
    name = fresh_name()
    with RawClient(daemon.tcp) as client:
        client.send(NOP + pub(name, b"1") + mpub(name, [b"2", b"3"]) + dpub(name, 0, b"4") + NOP + pub(name, b"5"))
        for _ in range(4):
            client.expect_ok()
        client.assert_open()


def test_crlf_line_endings_are_accepted(daemon):
    name = fresh_name()
    with RawClient(daemon.tcp) as client:
        client.send(b"PUB " + name.encode() + b"\r\n" + size(2) + b"hi")
        client.expect_ok()
        client.send(b"NOP\r\n")
        client.assert_open()


def test_commands_split_byte_by_byte(daemon):
    name = fresh_name()
    with RawClient(daemon.tcp, magic=False) as client:
        for byte in b"  V2" + pub(name, b"slowly"):
            client.send(bytes([byte]))
        client.expect_ok()
