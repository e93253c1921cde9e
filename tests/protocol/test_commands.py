"""The V2 command parser and the client encoders, from shared tables of wire bytes.

Wire bytes are written out by hand from the protocol description (sizes are 4-byte big-endian).
"""

import pytest

from protocol.commands import (
    CLS,
    MAGIC_V2,
    NOP,
    Command,
    CommandParser,
    encode_auth,
    encode_command,
    encode_dpub,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
    ms_to_go_duration,
    parse_base10,
)
from protocol.errors import LineTooLong, ProtocolError

from .feeding import BYTEWISE, MODES, WHOLE, pieces, run

ID = b"0a1b2c3d4e5f6789"


def size(n: int) -> bytes:
    return n.to_bytes(4, "big", signed=True)


def parse(data: bytes, mode: str, **limits) -> list[Command]:
    parser = CommandParser(**limits)
    return run(parser, parser.next_command, data, mode)


# -- valid commands: (wire bytes, expected command, the encoder call producing them or None) --

ENCODED = [
    pytest.param(b"NOP\n", Command(b"NOP", (), None), lambda: NOP, id="NOP"),
    pytest.param(b"CLS\n", Command(b"CLS", (), None), lambda: CLS, id="CLS"),
    pytest.param(b"RDY 100\n", Command(b"RDY", (b"100",), None), lambda: encode_rdy(100), id="RDY"),
    pytest.param(b"RDY 0\n", Command(b"RDY", (b"0",), None), lambda: encode_rdy(0), id="RDY-0"),
    pytest.param(b"FIN " + ID + b"\n", Command(b"FIN", (ID,), None), lambda: encode_fin(ID), id="FIN"),
    pytest.param(
        b"REQ " + ID + b" 5000\n", Command(b"REQ", (ID, b"5000"), None), lambda: encode_req(ID, 5000), id="REQ"
    ),
    pytest.param(b"TOUCH " + ID + b"\n", Command(b"TOUCH", (ID,), None), lambda: encode_touch(ID), id="TOUCH"),
    pytest.param(
        b"SUB events archive#ephemeral\n",
        Command(b"SUB", (b"events", b"archive#ephemeral"), None),
        lambda: encode_sub("events", "archive#ephemeral"),
        id="SUB",
    ),
    pytest.param(
        b"PUB events\n" + size(5) + b"hello",
        Command(b"PUB", (b"events",), b"hello"),
        lambda: encode_pub("events", b"hello"),
        id="PUB",
    ),
    pytest.param(
        b"PUB t#ephemeral\n" + size(3) + b"a\nb",
        Command(b"PUB", (b"t#ephemeral",), b"a\nb"),
        lambda: encode_pub("t#ephemeral", b"a\nb"),
        id="PUB-body-with-newline",
    ),
    pytest.param(
        b"PUB " + b"t" * 64 + b"\n" + size(1) + b"\x00",
        Command(b"PUB", (b"t" * 64,), b"\x00"),
        lambda: encode_pub("t" * 64, b"\x00"),
        id="PUB-64-byte-topic",
    ),
    pytest.param(
        b"DPUB events 1000\n" + size(2) + b"hi",
        Command(b"DPUB", (b"events", b"1000"), b"hi"),
        lambda: encode_dpub("events", 1000, b"hi"),
        id="DPUB",
    ),
    pytest.param(
        b"DPUB t 0\n" + size(1) + b"x",
        Command(b"DPUB", (b"t", b"0"), b"x"),
        lambda: encode_dpub("t", 0, b"x"),
        id="DPUB-0",
    ),
    pytest.param(
        b"DPUB t 3600000\n" + size(1) + b"x",
        Command(b"DPUB", (b"t", b"3600000"), b"x"),
        lambda: encode_dpub("t", 3600000, b"x"),
        id="DPUB-max",
    ),
    pytest.param(
        b"MPUB events\n" + size(15) + size(2) + size(1) + b"a" + size(2) + b"bc",
        Command(b"MPUB", (b"events",), [b"a", b"bc"]),
        lambda: encode_mpub("events", [b"a", b"bc"]),
        id="MPUB",
    ),
    pytest.param(
        b"MPUB t\n" + size(9) + size(1) + size(1) + b"\n",
        Command(b"MPUB", (b"t",), [b"\n"]),
        lambda: encode_mpub("t", [b"\n"]),
        id="MPUB-one",
    ),
    pytest.param(
        b"IDENTIFY\n" + size(2) + b"{}",
        Command(b"IDENTIFY", (), b"{}"),
        lambda: encode_identify({}),
        id="IDENTIFY",
    ),
    pytest.param(
        b"IDENTIFY\n" + size(45) + b'{"client_id":"c1","feature_negotiation":true}',
        Command(b"IDENTIFY", (), b'{"client_id":"c1","feature_negotiation":true}'),
        lambda: encode_identify({"client_id": "c1", "feature_negotiation": True}),
        id="IDENTIFY-json",
    ),
    pytest.param(
        b"AUTH\n" + size(6) + b"s3cr3t", Command(b"AUTH", (), b"s3cr3t"), lambda: encode_auth(b"s3cr3t"), id="AUTH"
    ),
    pytest.param(
        b"X a b\n", Command(b"X", (b"a", b"b"), None), lambda: encode_command(b"X", b"a", b"b"), id="unknown-command"
    ),
]

NOT_ENCODED = [
    pytest.param(b"NOP\r\n", Command(b"NOP", (), None), None, id="CRLF"),
    pytest.param(b"FIN x\r\r\n", Command(b"FIN", (b"x\r",), None), None, id="only-one-CR-stripped"),
    pytest.param(b"SUB t  c\n", Command(b"SUB", (b"t", b"", b"c"), None), None, id="two-spaces-empty-param"),
    pytest.param(b"RDY \n", Command(b"RDY", (b"",), None), None, id="trailing-space"),
    pytest.param(b" NOP\n", Command(b"", (b"NOP",), None), None, id="leading-space"),
    pytest.param(b"\n", Command(b"", (), None), None, id="empty-line"),
    pytest.param(b"\r\n", Command(b"", (), None), None, id="empty-CRLF-line"),
    pytest.param(b"nop\n", Command(b"nop", (), None), None, id="lowercase-is-another-name"),
    pytest.param(b"pub t\n", Command(b"pub", (b"t",), None), None, id="lowercase-pub-has-no-body"),
    pytest.param(b"NOP\tx\n", Command(b"NOP\tx", (), None), None, id="tab-is-not-a-separator"),
    pytest.param(b"PUB t\r\n" + size(1) + b"x", Command(b"PUB", (b"t",), b"x"), None, id="PUB-CRLF"),
    pytest.param(
        b"PUB t extra\n" + size(1) + b"x", Command(b"PUB", (b"t", b"extra"), b"x"), None, id="PUB-extra-param"
    ),
    pytest.param(
        b"DPUB t \n" + size(1) + b"x", Command(b"DPUB", (b"t", b""), b"x"), None, id="DPUB-empty-timeout-is-0"
    ),
    pytest.param(
        b"DPUB t 18446744073709551616\n" + size(1) + b"x",
        Command(b"DPUB", (b"t", b"18446744073709551616"), b"x"),
        None,
        id="DPUB-timeout-wraps-to-0-like-uint64",
    ),
    pytest.param(
        b"DPUB t 18446744073710\n" + size(1) + b"x",
        Command(b"DPUB", (b"t", b"18446744073710"), b"x"),
        None,
        id="DPUB-duration-wraps-into-range-like-go",  # 18446744073710 ms is 448384 ns after int64 overflow
    ),
    pytest.param(
        b"DPUB t 000000000000000000000000001\n" + size(1) + b"x",
        Command(b"DPUB", (b"t", b"000000000000000000000000001"), b"x"),
        None,
        id="DPUB-long-zero-padded-timeout",
    ),
    pytest.param(
        b"MPUB t\n" + size(1000) + size(1) + size(1) + b"x",
        Command(b"MPUB", (b"t",), [b"x"]),
        None,
        id="MPUB-body-size-not-reconciled",
    ),
    pytest.param(
        b"IDENTIFY\n" + size(5) + b'{"cli', Command(b"IDENTIFY", (), b'{"cli'), None, id="IDENTIFY-JSON-not-checked"
    ),
    pytest.param(
        b"IDENTIFY ignored params\n" + size(1) + b"x",
        Command(b"IDENTIFY", (b"ignored", b"params"), b"x"),
        None,
        id="IDENTIFY-params-kept",
    ),
    pytest.param(b"X" * 16383 + b"\n", Command(b"X" * 16383, (), None), None, id="line-at-the-16KiB-limit"),
]

VALID = ENCODED + NOT_ENCODED

TRAILER = b"NOP\nPUB t"  # a complete command and the start of another


@pytest.mark.parametrize("wire, expected, encoder", ENCODED)
def test_encoders(wire, expected, encoder):
    assert encoder() == wire


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("wire, expected, encoder", VALID)
def test_parse(wire, expected, encoder, mode):
    parser = CommandParser()
    got = run(parser, parser.next_command, wire, mode)
    assert got == [expected]
    assert parser.buffered_size() == 0
    assert parser.pending_eof_error() is None


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("wire, expected, encoder", VALID)
def test_parse_with_trailing_bytes(wire, expected, encoder, mode):
    parser = CommandParser()
    got = run(parser, parser.next_command, wire + TRAILER, mode)
    assert got == [expected, Command(b"NOP", (), None)]
    assert parser.pending_eof_error() is None  # stopped within a command line: NSQ closes silently


@pytest.mark.parametrize("mode", MODES)
def test_all_cases_in_one_stream_twice(mode):
    # Twice, so that repeated lines go through the parser's line cache and fast path.
    cases = VALID
    stream = b"".join(c.values[0] for c in cases) * 2
    assert parse(stream, mode) == [c.values[1] for c in cases] * 2


@pytest.mark.parametrize("mode", MODES)
def test_repeated_pub_line_with_varying_bodies(mode):
    bodies = [b"a", b"bb" * 50, b"c", b"\n" * 7, b"PUB t\n"]
    stream = b"".join(b"PUB t\n" + size(len(b)) + b for b in bodies) + b"RDY 1\n"
    stream += b"PUB t\n" + size(2) + b"zz"
    expected = [Command(b"PUB", (b"t",), b) for b in bodies]
    expected += [Command(b"RDY", (b"1",), None), Command(b"PUB", (b"t",), b"zz")]
    assert parse(stream, mode) == expected


@pytest.mark.parametrize("mode", MODES)
def test_unknown_and_lowercase_commands_take_no_body(mode):
    # Like NSQ, bytes after a line without a known body are read as the next lines.
    assert parse(b"pub t\n" + size(4) + b"NOP\n", mode) == [
        Command(b"pub", (b"t",), None),
        Command(b"\x00\x00\x00\x04NOP", (), None),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_size_limit_on_a_repeated_line(mode):
    # The second PUB reuses the first one's validated line; its size must still be checked.
    parser = CommandParser(max_msg_size=10)
    stream = b"PUB t\n" + size(10) + b"x" * 10 + b"PUB t\n" + size(11) + b"y" * 11
    with pytest.raises(ProtocolError) as info:
        run(parser, parser.next_command, stream, mode)
    assert info.value.payload() == b"E_BAD_MESSAGE PUB message too big 11 > 10"


@pytest.mark.parametrize("mode", MODES)
def test_repeated_line_waits_for_its_body(mode):
    parser = CommandParser()
    first = b"PUB t\n" + size(3) + b"abc"
    parser.receive_data(first + first[:-1])
    assert parser.next_command() == Command(b"PUB", (b"t",), b"abc")
    assert parser.next_command() is None
    assert parser.pending_eof_error().payload() == b"E_BAD_MESSAGE PUB failed to read message body"
    parser.receive_data(b"c")
    assert parser.next_command() == Command(b"PUB", (b"t",), b"abc")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("first", [b"", b"PUB t\n" + size(1) + b"z"])
def test_lines_that_could_confuse_the_repeated_line_path(first, mode):
    # Two empty lines, then a line made of what would be a size field and a body.
    stream = first + b"\n\n" + size(1) + b"x\n"
    expected = [Command(b"", (), None), Command(b"", (), None), Command(b"\x00\x00\x00\x01x", (), None)]
    if first:
        expected.insert(0, Command(b"PUB", (b"t",), b"z"))
    assert parse(stream, mode) == expected


def test_bodies_are_bytes():
    (pub,) = parse(b"PUB t\n" + size(1) + b"x", WHOLE)
    (mpub,) = parse(b"MPUB t\n" + size(9) + size(1) + size(1) + b"y", WHOLE)
    assert type(pub.body) is bytes and type(pub.params[0]) is bytes
    assert type(mpub.body) is list and type(mpub.body[0]) is bytes


def test_accepts_bytearray_and_memoryview():
    parser = CommandParser()
    parser.receive_data(bytearray(b"PUB t\n\x00\x00"))
    parser.receive_data(memoryview(b"\x00\x01x"))
    assert parser.next_command() == Command(b"PUB", (b"t",), b"x")


def test_large_body_in_small_chunks():
    body = bytes(range(256)) * 4096  # exactly the 1 MiB default limit
    wire = encode_pub("t", body) + NOP
    parser = CommandParser()
    got = []
    for i in range(0, len(wire), 1000):
        parser.receive_data(wire[i : i + 1000])
        while (cmd := parser.next_command()) is not None:
            got.append(cmd)
    assert got == [Command(b"PUB", (b"t",), body), Command(b"NOP", (), None)]


def test_large_mpub_in_small_chunks():
    bodies = [b"%05d" % i * (i % 7 + 1) for i in range(3000)]
    wire = encode_mpub("t", bodies) + NOP
    parser = CommandParser()
    got = []
    for i in range(0, len(wire), 777):
        parser.receive_data(wire[i : i + 777])
        while (cmd := parser.next_command()) is not None:
            got.append(cmd)
    assert got == [Command(b"MPUB", (b"t",), bodies), Command(b"NOP", (), None)]


@pytest.mark.parametrize("chunk", [1, 7, 50, 777, 4096])
def test_mpub_of_one_body_size_in_chunks(chunk):
    # runs of equal sizes are cut at fixed strides, as far as each buffer goes; a size change midway
    # and messages split between buffers go through the message-by-message path
    bodies = [b"%03d" % i * 10 for i in range(300)] + [b"odd"] + [b"%03d" % i * 10 for i in range(100)]
    wire = encode_mpub("t", bodies) + NOP
    parser = CommandParser()
    got = []
    for i in range(0, len(wire), chunk):
        parser.receive_data(wire[i : i + chunk])
        while (cmd := parser.next_command()) is not None:
            got.append(cmd)
    assert got == [Command(b"MPUB", (b"t",), bodies), Command(b"NOP", (), None)]


# -- errors: (the bytes that decide it, more bytes that may follow, NSQ's payload, limits) -----
# Fed one byte at a time, the error must appear exactly when the deciding bytes are complete.

M = 1048576  # default max-msg-size
B = 5242880  # default max-body-size

ERRORS = [
    # PUB
    pytest.param(b"PUB\n", size(1) + b"x", b"E_INVALID PUB insufficient number of parameters", {}, id="PUB-no-topic"),
    pytest.param(
        b"PUB bad!topic\n",
        size(1) + b"x",
        b'E_BAD_TOPIC PUB topic name "bad!topic" is not valid',
        {},
        id="PUB-bad-topic",
    ),
    pytest.param(b"PUB \n", b"", b'E_BAD_TOPIC PUB topic name "" is not valid', {}, id="PUB-empty-topic"),
    pytest.param(
        b"PUB " + b"t" * 65 + b"\n",
        b"",
        b'E_BAD_TOPIC PUB topic name "' + b"t" * 65 + b'" is not valid',
        {},
        id="PUB-topic-too-long",
    ),
    pytest.param(b"PUB t\xff\n", b"", b'E_BAD_TOPIC PUB topic name "t\\xff" is not valid', {}, id="PUB-odd-byte"),
    pytest.param(b"PUB t\r\r\n", b"", b'E_BAD_TOPIC PUB topic name "t\\r" is not valid', {}, id="PUB-CR-in-topic"),
    pytest.param(b"PUB t\n" + size(0), b"", b"E_BAD_MESSAGE PUB invalid message body size 0", {}, id="PUB-size-0"),
    pytest.param(b"PUB t\n" + size(-1), b"x", b"E_BAD_MESSAGE PUB invalid message body size -1", {}, id="PUB-size-neg"),
    pytest.param(
        b"PUB t\n" + size(M + 1),
        b"x" * 10,
        b"E_BAD_MESSAGE PUB message too big 1048577 > 1048576",
        {},
        id="PUB-too-big",
    ),
    pytest.param(
        b"PUB t\n" + size(100 * 1024 * 1024),
        b"x" * 10,
        b"E_BAD_MESSAGE PUB message too big 104857600 > 1048576",
        {},
        id="PUB-100MB-decided-by-its-size-field",
    ),
    pytest.param(
        b"PUB t\n" + size(11),
        b"x" * 11,
        b"E_BAD_MESSAGE PUB message too big 11 > 10",
        {"max_msg_size": 10},
        id="PUB-custom-max",
    ),
    # DPUB
    pytest.param(b"DPUB t\n", b"", b"E_INVALID DPUB insufficient number of parameters", {}, id="DPUB-no-timeout"),
    pytest.param(b"DPUB\n", b"", b"E_INVALID DPUB insufficient number of parameters", {}, id="DPUB-no-params"),
    pytest.param(b"DPUB a* 10\n", b"", b'E_BAD_TOPIC DPUB topic name "a*" is not valid', {}, id="DPUB-bad-topic"),
    pytest.param(
        b"DPUB a* x\n", b"", b'E_BAD_TOPIC DPUB topic name "a*" is not valid', {}, id="DPUB-topic-checked-first"
    ),
    pytest.param(b"DPUB t -1\n", b"", b"E_INVALID DPUB could not parse timeout -1", {}, id="DPUB-negative"),
    pytest.param(b"DPUB t 1.5\n", b"", b"E_INVALID DPUB could not parse timeout 1.5", {}, id="DPUB-fraction"),
    pytest.param(b"DPUB t +1\n", b"", b"E_INVALID DPUB could not parse timeout +1", {}, id="DPUB-plus"),
    pytest.param(b"DPUB t 1\xff\n", b"", b"E_INVALID DPUB could not parse timeout 1\xff", {}, id="DPUB-raw-bytes"),
    pytest.param(
        b"DPUB t 3600001\n",
        size(1) + b"x",
        b"E_INVALID DPUB timeout 3600001 out of range 0-3600000",
        {},
        id="DPUB-out-of-range",
    ),
    pytest.param(
        b"DPUB t 1001\n",
        b"",
        b"E_INVALID DPUB timeout 1001 out of range 0-1000",
        {"max_req_timeout_ms": 1000},
        id="DPUB-custom-max",
    ),
    pytest.param(
        b"DPUB t 18446744073709551615\n",
        b"",
        b"E_INVALID DPUB timeout 18446744073709551615 out of range 0-3600000",
        {},
        id="DPUB-uint64-max-is-negative-duration",
    ),
    pytest.param(
        b"DPUB t 9223372036855\n",
        b"",
        b"E_INVALID DPUB timeout 9223372036855 out of range 0-3600000",
        {},
        id="DPUB-duration-overflow",
    ),
    pytest.param(b"DPUB t 1\n" + size(0), b"", b"E_BAD_MESSAGE DPUB invalid message body size 0", {}, id="DPUB-size-0"),
    pytest.param(
        b"DPUB t 1\n" + size(M + 1),
        b"",
        b"E_BAD_MESSAGE DPUB message too big 1048577 > 1048576",
        {},
        id="DPUB-too-big",
    ),
    # MPUB
    pytest.param(b"MPUB\n", b"", b"E_INVALID MPUB insufficient number of parameters", {}, id="MPUB-no-topic"),
    pytest.param(
        b"MPUB x#y\n",
        size(9),
        b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "x#y" is not valid',
        {},
        id="MPUB-bad-topic-quirk",
    ),
    pytest.param(b"MPUB t\n" + size(0), b"", b"E_BAD_BODY MPUB invalid body size 0", {}, id="MPUB-body-0"),
    pytest.param(b"MPUB t\n" + size(-5), b"", b"E_BAD_BODY MPUB invalid body size -5", {}, id="MPUB-body-neg"),
    pytest.param(
        b"MPUB t\n" + size(B + 1), size(1), b"E_BAD_BODY MPUB body too big 5242881 > 5242880", {}, id="MPUB-body-big"
    ),
    pytest.param(
        b"MPUB t\n" + size(9) + size(0), b"", b"E_BAD_BODY MPUB invalid message count 0", {}, id="MPUB-count-0"
    ),
    pytest.param(
        b"MPUB t\n" + size(9) + size(-1), b"", b"E_BAD_BODY MPUB invalid message count -1", {}, id="MPUB-count-neg"
    ),
    pytest.param(
        b"MPUB t\n" + size(9) + size(1048576),
        b"",
        b"E_BAD_BODY MPUB invalid message count 1048576",
        {},
        id="MPUB-count-over-(max_body-4)/5",
    ),
    pytest.param(
        b"MPUB t\n" + size(9) + size(20),
        b"",
        b"E_BAD_BODY MPUB invalid message count 20",
        {"max_body_size": 103},
        id="MPUB-count-custom-max",
    ),
    pytest.param(
        b"MPUB t\n" + size(9) + size(1) + size(0),
        b"",
        b"E_BAD_MESSAGE MPUB invalid message(0) body size 0",
        {},
        id="MPUB-message-0-size-0",
    ),
    pytest.param(
        b"MPUB t\n" + size(20) + size(3) + size(1) + b"a" + size(-2),
        b"",
        b"E_BAD_MESSAGE MPUB invalid message(1) body size -2",
        {},
        id="MPUB-message-1-negative",
    ),
    pytest.param(
        b"MPUB t\n" + size(20) + size(3) + size(1) + b"a" + size(M + 1),
        b"",
        b"E_BAD_MESSAGE MPUB message too big 1048577 > 1048576",
        {},
        id="MPUB-message-too-big",
    ),
    # IDENTIFY
    pytest.param(b"IDENTIFY\n" + size(0), b"", b"E_BAD_BODY IDENTIFY invalid body size 0", {}, id="IDENTIFY-0"),
    pytest.param(b"IDENTIFY\n" + size(-1), b"", b"E_BAD_BODY IDENTIFY invalid body size -1", {}, id="IDENTIFY-neg"),
    pytest.param(
        b"IDENTIFY\n" + size(B + 1),
        b"{}",
        b"E_BAD_BODY IDENTIFY body too big 5242881 > 5242880",
        {},
        id="IDENTIFY-too-big",
    ),
    # AUTH
    pytest.param(b"AUTH x\n", size(1) + b"s", b"E_INVALID AUTH invalid number of parameters", {}, id="AUTH-param"),
    pytest.param(b"AUTH \n", b"", b"E_INVALID AUTH invalid number of parameters", {}, id="AUTH-empty-param"),
    pytest.param(b"AUTH\n" + size(0), b"", b"E_BAD_BODY AUTH invalid body size 0", {}, id="AUTH-0"),
    pytest.param(
        b"AUTH\n" + size(B + 1), b"", b"E_BAD_BODY AUTH body too big 5242881 > 5242880", {}, id="AUTH-too-big"
    ),
    pytest.param(
        b"AUTH\n" + size(101),
        b"",
        b"E_BAD_BODY AUTH body too big 101 > 100",
        {"max_body_size": 100},
        id="AUTH-custom-max",
    ),
]


def _raises(parser: CommandParser, data: bytes) -> ProtocolError | None:
    parser.receive_data(data)
    try:
        while parser.next_command() is not None:
            pass
    except ProtocolError as err:
        return err
    return None


@pytest.mark.parametrize("decisive, more, payload, limits", ERRORS)
def test_error_whole(decisive, more, payload, limits):
    err = _raises(CommandParser(**limits), decisive + more)
    assert err is not None and err.payload() == payload and err.fatal


@pytest.mark.parametrize("decisive, more, payload, limits", ERRORS)
def test_error_as_soon_as_decided(decisive, more, payload, limits):
    parser = CommandParser(**limits)
    for i, piece in enumerate(pieces(decisive, BYTEWISE)):
        err = _raises(parser, piece)
        if i < len(decisive) - 1:
            assert err is None, f"raised after {i + 1} of {len(decisive)} bytes"
    assert err is not None and err.payload() == payload


@pytest.mark.parametrize("decisive, more, payload, limits", ERRORS)
def test_error_with_trailing_bytes(decisive, more, payload, limits):
    parser = CommandParser(**limits)
    err = _raises(parser, b"NOP\n" + decisive + more + b"NOP\n")
    assert err is not None and err.payload() == payload


@pytest.mark.parametrize("decisive, more, payload, limits", ERRORS[:3])
def test_error_is_raised_again(decisive, more, payload, limits):
    parser = CommandParser(**limits)
    first = _raises(parser, decisive)
    parser.receive_data(b"NOP\n")
    with pytest.raises(ProtocolError) as info:
        parser.next_command()
    assert info.value is first
    assert parser.pending_eof_error() is None


def test_earlier_commands_are_returned_before_the_error():
    parser = CommandParser()
    parser.receive_data(b"NOP\nRDY 1\nPUB \n")
    assert parser.next_command() == Command(b"NOP", (), None)
    assert parser.next_command() == Command(b"RDY", (b"1",), None)
    with pytest.raises(ProtocolError):
        parser.next_command()


# -- the 16 KiB line limit ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_line_without_newline_at_the_limit(mode):
    parser = CommandParser(max_line_length=10)
    pieces_ = list(pieces(b"X" * 10, mode))
    for piece in pieces_[:-1]:
        parser.receive_data(piece)
        assert parser.next_command() is None
    parser.receive_data(pieces_[-1])
    with pytest.raises(LineTooLong):
        parser.next_command()
    assert parser.pending_eof_error() is None


@pytest.mark.parametrize("mode", MODES)
def test_line_with_newline_past_the_limit(mode):
    parser = CommandParser(max_line_length=10)
    with pytest.raises(LineTooLong):
        run(parser, parser.next_command, b"X" * 10 + b"\n", mode)


@pytest.mark.parametrize("mode", MODES)
def test_line_that_fits_with_its_newline(mode):
    assert parse(b"X" * 9 + b"\nNOP\n", mode, max_line_length=10) == [
        Command(b"X" * 9, (), None),
        Command(b"NOP", (), None),
    ]


def test_default_line_limit_is_16KiB():
    parser = CommandParser()
    parser.receive_data(b"X" * 16383)
    assert parser.next_command() is None
    parser.receive_data(b"X")
    with pytest.raises(LineTooLong):
        parser.next_command()


def test_long_body_is_not_a_long_line():
    body = b"y" * 40000
    assert parse(encode_pub("t", body), WHOLE, max_line_length=16) == [Command(b"PUB", (b"t",), body)]


# -- end of input ------------------------------------------------------------------------------

EOF_CASES = [
    pytest.param(b"", None, id="nothing"),
    pytest.param(b"PUB t", None, id="mid-line"),
    pytest.param(b"NOP\n", None, id="between-commands"),
    pytest.param(b"PUB t\n", b"E_BAD_MESSAGE PUB failed to read message body size", id="PUB-no-size"),
    pytest.param(b"PUB t\n\x00\x00", b"E_BAD_MESSAGE PUB failed to read message body size", id="PUB-half-size"),
    pytest.param(b"PUB t\n" + size(5) + b"he", b"E_BAD_MESSAGE PUB failed to read message body", id="PUB-mid-body"),
    pytest.param(b"PUB t\n" + size(5), b"E_BAD_MESSAGE PUB failed to read message body", id="PUB-no-body"),
    pytest.param(b"PUB t\n" + size(1) + b"x", None, id="PUB-complete"),
    pytest.param(b"DPUB t 5\n", b"E_BAD_MESSAGE DPUB failed to read message body size", id="DPUB-no-size"),
    pytest.param(b"DPUB t 5\n" + size(2) + b"a", b"E_BAD_MESSAGE DPUB failed to read message body", id="DPUB-mid"),
    pytest.param(b"IDENTIFY\n\x00", b"E_BAD_BODY IDENTIFY failed to read body size", id="IDENTIFY-no-size"),
    pytest.param(b"IDENTIFY\n" + size(2) + b"{", b"E_BAD_BODY IDENTIFY failed to read body", id="IDENTIFY-mid"),
    pytest.param(b"AUTH\n", b"E_BAD_BODY AUTH failed to read body size", id="AUTH-no-size"),
    pytest.param(b"AUTH\n" + size(2), b"E_BAD_BODY AUTH failed to read body", id="AUTH-no-body"),
    pytest.param(b"MPUB t\n", b"E_BAD_BODY MPUB failed to read body size", id="MPUB-no-body-size"),
    pytest.param(b"MPUB t\n" + size(9) + b"\x00", b"E_BAD_BODY MPUB failed to read message count", id="MPUB-no-count"),
    pytest.param(
        b"MPUB t\n" + size(9) + size(2), b"E_BAD_MESSAGE MPUB failed to read message(0) body size", id="MPUB-size-0"
    ),
    pytest.param(
        b"MPUB t\n" + size(9) + size(2) + size(1) + b"a" + b"\x00\x00",
        b"E_BAD_MESSAGE MPUB failed to read message(1) body size",
        id="MPUB-size-1",
    ),
    pytest.param(
        b"MPUB t\n" + size(9) + size(2) + size(3) + b"a",
        b"E_BAD_MESSAGE MPUB failed to read message body",
        id="MPUB-mid-message",
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("wire, payload", EOF_CASES)
def test_pending_eof_error(wire, payload, mode):
    parser = CommandParser()
    run(parser, parser.next_command, wire, mode)
    err = parser.pending_eof_error()
    if payload is None:
        assert err is None
    else:
        assert err is not None and err.payload() == payload and err.fatal


# -- the server's own line checks, unread bytes -------------------------------------------------


def test_line_check_sees_every_line_before_the_parsers_checks():
    seen = []

    def check(name, params):
        seen.append((name, params))
        if name == b"IDENTIFY":
            raise ProtocolError("E_INVALID", "cannot IDENTIFY in current state")

    parser = CommandParser(line_check=check)
    stream = encode_pub("t", b"a") + encode_pub("t", b"b") + NOP + b"IDENTIFY\n"
    got = []
    parser.receive_data(stream)
    for _ in range(3):
        got.append(parser.next_command())
    with pytest.raises(ProtocolError) as info:  # before any size bytes: NSQ checks state first
        parser.next_command()
    assert info.value.payload() == b"E_INVALID cannot IDENTIFY in current state"
    assert [c.body for c in got] == [b"a", b"b", None]
    assert seen == [(b"PUB", (b"t",)), (b"PUB", (b"t",)), (b"NOP", ()), (b"IDENTIFY", ())]


def _one_per_fin(commands: list[Command]) -> list[Command]:
    """The commands with each run of FIN lines (one command, its ids in ``body``) as one FIN per id."""
    out = []
    for command in commands:
        if command.name == b"FIN" and command.body is not None:
            out.extend(Command(b"FIN", (msg_id,), None) for msg_id in command.body)
        else:
            out.append(command)
    return out


FIN_IDS = [b"%016x" % n for n in range(5)]


@pytest.mark.parametrize("mode", MODES)
def test_fin_lines_read_together_come_as_one_command(mode):
    wire = b"".join(encode_fin(msg_id) for msg_id in FIN_IDS) + NOP + encode_fin(ID) + TRAILER
    got = parse(wire, mode)
    if mode == WHOLE:
        assert got[0] == Command(b"FIN", (FIN_IDS[0],), FIN_IDS)
        assert got[1:] == [Command(b"NOP", (), None), Command(b"FIN", (ID,), None), Command(b"NOP", (), None)]
    assert _one_per_fin(got) == [Command(b"FIN", (msg_id,), None) for msg_id in FIN_IDS] + [
        Command(b"NOP", (), None),
        Command(b"FIN", (ID,), None),
        Command(b"NOP", (), None),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_a_fin_run_stops_at_a_line_of_another_form(mode):
    odd = [b"FIN 0123456789abcde-\n", b"FIN 0123456789abcdef\r\n", b"FIN 0123456789abcdef extra\n", b"FIN short\n"]
    expected = [
        (b"FIN", (b"0123456789abcde-",)),
        (b"FIN", (b"0123456789abcdef",)),
        (b"FIN", (b"0123456789abcdef", b"extra")),
        (b"FIN", (b"short",)),
    ]
    for line, (name, params) in zip(odd, expected, strict=True):
        wire = encode_fin(FIN_IDS[0]) + encode_fin(FIN_IDS[1]) + line + encode_fin(FIN_IDS[2]) + encode_fin(FIN_IDS[3])
        got = parse(wire, mode)
        assert _one_per_fin(got) == [
            Command(b"FIN", (FIN_IDS[0],), None),
            Command(b"FIN", (FIN_IDS[1],), None),
            Command(name, params, None),
            Command(b"FIN", (FIN_IDS[2],), None),
            Command(b"FIN", (FIN_IDS[3],), None),
        ]
        if mode == WHOLE:
            assert [c.body for c in got] == [FIN_IDS[:2], None, FIN_IDS[2:4]]


def test_line_check_sees_a_fin_run_once():
    seen = []
    parser = CommandParser(line_check=lambda name, params: seen.append((name, params)))
    parser.receive_data(b"".join(encode_fin(msg_id) for msg_id in FIN_IDS) + NOP)
    assert parser.next_command() == Command(b"FIN", (FIN_IDS[0],), FIN_IDS)
    assert parser.next_command() == Command(b"NOP", (), None)
    assert seen == [(b"FIN", (FIN_IDS[0],)), (b"NOP", ())]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sizes", [[3, 3, 3, 3], [3, 3, 3, 4], [4, 3, 3, 3], [1], [2, 2]])
def test_mpub_bodies_of_one_size_and_of_mixed_sizes(sizes, mode):
    bodies = [bytes([65 + n]) * size_ for n, size_ in enumerate(sizes)]
    got = parse(encode_mpub("t", bodies) + TRAILER, mode)
    assert got == [Command(b"MPUB", (b"t",), bodies), Command(b"NOP", (), None)]


@pytest.mark.parametrize("count", [255, 256, 257, 1000, 20000])
def test_mpub_long_runs_of_one_size(count):
    # equal sizes are cut in runs of a bounded length: the boundaries between runs lose nothing
    bodies = [bytes([48 + n % 10]) * (1 + n // 10000) for n in range(count)]
    got = parse(encode_mpub("t", bodies) + TRAILER, WHOLE)
    assert got == [Command(b"MPUB", (b"t",), bodies), Command(b"NOP", (), None)]
    assert all(type(body) is bytes for body in got[0].body)


@pytest.mark.parametrize("bad", [0, -1, 1048577])
def test_mpub_equal_sizes_then_a_bad_one_fails_at_that_message(bad):
    wire = b"MPUB t\n" + size(100) + size(3) + (size(2) + b"ab") * 2 + size(bad) + b"abcd"
    err = _raises(CommandParser(), wire)
    if bad > 0:
        assert err.payload() == b"E_BAD_MESSAGE MPUB message too big 1048577 > 1048576"
    else:
        assert err.payload() == b"E_BAD_MESSAGE MPUB invalid message(2) body size %d" % bad


def test_line_check_error_wins_over_a_bad_topic():
    def check(name, params):
        raise ProtocolError("E_INVALID", f"cannot {name.decode()} in current state (TLS required)")

    parser = CommandParser(line_check=check)
    parser.receive_data(b"PUB bad!\n")
    with pytest.raises(ProtocolError) as info:
        parser.next_command()
    assert info.value.payload() == b"E_INVALID cannot PUB in current state (TLS required)"


@pytest.mark.parametrize("mode", MODES)
def test_take_unparsed_after_identify(mode):
    compressed = b"\xff\x06\x00\x00sNaPpY..."
    parser = CommandParser()
    stream = encode_identify({"snappy": True}) + compressed
    first = None
    for piece in pieces(stream, mode):
        parser.receive_data(piece)
        if first is None:
            first = parser.next_command()
    assert first is not None and first.name == b"IDENTIFY"
    assert parser.take_unparsed() == compressed
    assert parser.buffered_size() == 0
    assert parser.next_command() is None


def test_between_commands_only_where_the_unparsed_bytes_start_a_command():
    stream = encode_pub("t", b"body") + encode_pub("t", b"0123456789")
    first_end = len(encode_pub("t", b"body"))
    for cut in range(len(stream) + 1):
        parser = CommandParser()
        parser.receive_data(stream[:cut])
        taken = 0
        while parser.next_command() is not None:
            taken += 1
        if parser.between_commands():
            # another parser takes the stream from here: it reads the commands not taken yet, whole
            rest = CommandParser()
            rest.receive_data(parser.take_unparsed() + stream[cut:])
            names = []
            while (command := rest.next_command()) is not None:
                names.append(command.body)
            assert names == [b"body", b"0123456789"][taken:], cut
        else:  # a command's line was decoded and its body is still to come: the rest alone does not start one
            assert 0 < cut < len(stream) and cut != first_end, cut


# -- numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, value",
    [
        (b"0", 0),
        (b"7", 7),
        (b"007", 7),
        (b"3600000", 3600000),
        (b"", 0),  # like NSQ: no digits, no error
        (b"18446744073709551615", (1 << 64) - 1),
        (b"18446744073709551616", 0),
        (b"18446744073709551621", 5),
        (b"1" + b"0" * 5000, pow(10, 5000, 1 << 64)),
    ],
)
def test_parse_base10(raw, value):
    assert parse_base10(raw) == value


@pytest.mark.parametrize("raw", [b"-1", b"+1", b" 1", b"1 ", b"1_000", b"0x10", b"1.0", b"1e3", "\u0661".encode()])
def test_parse_base10_rejects(raw):
    with pytest.raises(ValueError):
        parse_base10(raw)


@pytest.mark.parametrize(
    "ms, ns",
    [
        (0, 0),
        (1, 1_000_000),
        (3600000, 3_600_000_000_000),
        ((1 << 64) - 1, -1_000_000),
        (9223372036855, 9223372036855_000_000 - (1 << 64)),
    ],
)
def test_ms_to_go_duration(ms, ns):
    assert ms_to_go_duration(ms) == ns


def test_magic_and_constants():
    assert MAGIC_V2 == b"  V2"
    assert NOP == b"NOP\n" and CLS == b"CLS\n"


def test_encode_command_shapes():
    assert encode_command(b"NOP") == b"NOP\n"
    assert encode_command(b"A", b"b", b"", b"c") == b"A b  c\n"
    assert encode_command(b"AUTH", body=b"") == b"AUTH\n\x00\x00\x00\x00"
    assert encode_mpub("t", []) == b"MPUB t\n\x00\x00\x00\x04\x00\x00\x00\x00"


def test_line_check_sees_every_repeated_pub_line_and_may_refuse_one():
    """A run of identical PUB lines takes the parser's fastest path; the server's check still sees each."""
    seen = []

    def check(name, params):
        seen.append((name, params))
        if len(seen) == 3:
            raise ProtocolError("E_INVALID", "cannot PUB in current state (TLS required)")

    parser = CommandParser(line_check=check)
    parser.receive_data(b"".join(encode_pub("t", bytes([i]) * 3) for i in range(4)))
    assert parser.next_command() == Command(b"PUB", (b"t",), b"\x00" * 3)
    assert parser.next_command() == Command(b"PUB", (b"t",), b"\x01" * 3)
    with pytest.raises(ProtocolError, match="TLS required"):
        parser.next_command()
    assert seen == [(b"PUB", (b"t",))] * 3
