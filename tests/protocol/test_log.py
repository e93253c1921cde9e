"""protocol/log.py: the log commands' encoders and checks, the offsets answers, and the range layout, decoded
from a frame stream fed whole and byte by byte, and refused when cut short, trailing or inconsistent."""

from __future__ import annotations

import struct

import pytest

from protocol.errors import ProtocolError
from protocol.frames import FRAME_TYPE_RESPONSE, FrameDecoder, encode_frame
from protocol.log import (
    RANGE_HEADER_SIZE,
    Columns,
    decode_offsets,
    decode_range,
    encode_lcommit,
    encode_log,
    encode_lread,
    encode_lseek,
    encode_offsets,
    encode_range,
    parse_log_request,
)
from tests.protocol.feeding import MODES, run

IDS = [b"%016x" % i for i in range(5)]
STAMPS = [1_700_000_000_000_000_000 + i for i in range(5)]
ATTEMPTS = [0, 1, 2, 0, 65535]
BODIES = [b"a", b"", b"ccc", b"\x00\xff" * 100, b"e" * 7]


def sample() -> Columns:
    return Columns.from_messages(IDS, STAMPS, ATTEMPTS, BODIES)


def test_layout_bytes_are_the_documented_ones():
    data = encode_range(7, 20, [sample()])
    magic, count, first, end = struct.unpack_from(">4sIQQ", data)
    assert (magic, count, first, end) == (b"NLR1", 5, 7, 20)
    pos = RANGE_HEADER_SIZE
    assert struct.unpack_from(">5q", data, pos) == tuple(STAMPS)
    pos += 40
    assert data[pos : pos + 80] == b"".join(IDS)
    pos += 80
    assert struct.unpack_from(">5I", data, pos) == tuple(map(len, BODIES))
    pos += 20
    assert struct.unpack_from(">5H", data, pos) == tuple(ATTEMPTS)
    pos += 10
    assert data[pos:] == b"".join(BODIES)


@pytest.mark.parametrize("mode", MODES)
def test_range_through_a_frame_stream(mode):
    frames = encode_frame(FRAME_TYPE_RESPONSE, encode_range(3, 9, [sample().slice(0, 2), sample().slice(2, 5)]))
    frames += encode_frame(FRAME_TYPE_RESPONSE, encode_range(8, 8, []))
    decoder = FrameDecoder()
    got = run(decoder, decoder.next_frame, frames, mode)
    first, empty = (decode_range(frame.data) for frame in got)
    assert list(first.messages()) == list(zip(range(3, 8), IDS, STAMPS, ATTEMPTS, BODIES, strict=True))
    assert (first.first, first.end, first.count, first.next) == (3, 9, 5, 8)
    assert (empty.count, empty.next, list(empty.messages())) == (0, 8, [])


def test_columns_are_views_of_the_frame():
    data = encode_range(0, 5, [sample()])
    decoded = decode_range(data)
    assert isinstance(decoded.bodies, memoryview) and decoded.bodies.obj is data
    assert bytes(decoded.ids) == b"".join(IDS)


@pytest.mark.parametrize("cut", [0, 10, RANGE_HEADER_SIZE, RANGE_HEADER_SIZE + 39, -1])
def test_a_range_cut_short_is_refused(cut):
    data = encode_range(0, 5, [sample()])
    with pytest.raises(ProtocolError) as info:
        decode_range(data[:cut])
    assert info.value.code == "E_BAD_PROTOCOL"


def test_trailing_bytes_are_refused():
    with pytest.raises(ProtocolError, match="add up"):
        decode_range(encode_range(0, 5, [sample()]) + b"x")


def test_wrong_magic_and_a_range_past_its_end_are_refused():
    data = encode_range(0, 5, [sample()])
    with pytest.raises(ProtocolError, match="magic"):
        decode_range(b"XXXX" + data[4:])
    with pytest.raises(ProtocolError, match="past its end"):
        decode_range(encode_range(3, 5, [sample()]))


def test_lengths_that_do_not_add_up_are_refused():
    data = bytearray(encode_range(0, 5, [sample()]))
    struct.pack_into(">I", data, RANGE_HEADER_SIZE + 120, 2)  # first length 1 -> 2
    with pytest.raises(ProtocolError, match="add up"):
        decode_range(bytes(data))


def test_slicing_and_fitting():
    columns = sample()
    assert columns.size() == 30 * 5 + sum(map(len, BODIES))
    assert columns.fitting(0, 31) == 1  # 30 + 1
    assert columns.fitting(0, 30) == 0
    assert columns.fitting(1, 30) == 2  # the empty body fits alone
    part = columns.slice(2, 4)
    assert (part.count, part.id_list(), part.bodies) == (2, IDS[2:4], b"".join(BODIES[2:4]))


def test_command_lines():
    assert encode_log("t", "c") == b"LOG t c\n"
    assert encode_lseek("t", "c", 12) == b"LSEEK t c 12\n"
    assert encode_lread("t", "c", 1, 5) == b"LREAD t c 1 5\n"
    assert encode_lread("t", "c", 1, 5, 100) == b"LREAD t c 1 5 100\n"
    assert encode_lcommit("t", "c", 9) == b"LCOMMIT t c 9\n"


@pytest.mark.parametrize(
    "name,params,expected",
    [
        (b"LOG", [b"t", b"c"], ("LOG", "t", "c", ())),
        (b"LSEEK", [b"t", b"c", b"17"], ("LSEEK", "t", "c", (17,))),
        (b"LREAD", [b"t", b"c", b"1", b"2"], ("LREAD", "t", "c", (1, 2, None))),
        (b"LREAD", [b"t", b"c", b"1", b"2", b"3"], ("LREAD", "t", "c", (1, 2, 3))),
        (b"LCOMMIT", [b"t", b"c", b"0"], ("LCOMMIT", "t", "c", (0,))),
    ],
)
def test_requests_parse(name, params, expected):
    assert tuple(parse_log_request(name, params)) == expected


@pytest.mark.parametrize(
    "name,params,code,text",
    [
        (b"LOG", [b"t"], "E_INVALID", "LOG insufficient number of parameters"),
        (b"LREAD", [b"t", b"c", b"1"], "E_INVALID", "LREAD insufficient number of parameters"),
        (b"LOG", [b"t", b"c", b"x"], "E_INVALID", "LOG too many parameters"),
        (b"LREAD", [b"t", b"c", b"-1", b"2"], "E_INVALID", "LREAD could not parse from -1"),
        (
            b"LREAD",
            [b"t", b"c", b"1", b"9223372036854775808"],
            "E_INVALID",
            "LREAD could not parse to 9223372036854775808",
        ),
        (b"LCOMMIT", [b"t", b"c", b""], "E_INVALID", "LCOMMIT could not parse offset "),
        (b"LSEEK", [b"t", b"c", b"1e3"], "E_INVALID", "LSEEK could not parse timestamp 1e3"),
        (b"LOG", [b"t!", b"c"], "E_BAD_TOPIC", 'LOG topic name "t!" is not valid'),
        (b"LOG", [b"t", b"c c"], "E_BAD_CHANNEL", 'LOG channel name "c c" is not valid'),
        (b"LOG", [b"t", b"c#ephemeral"], "E_INVALID", "LOG ephemeral topic or channel t:c#ephemeral cannot be a log"),
    ],
)
def test_bad_requests(name, params, code, text):
    with pytest.raises(ProtocolError) as info:
        parse_log_request(name, params)
    assert (info.value.code, info.value.description) == (code, text)


def test_offsets_answers():
    data = encode_offsets(1, 2, 3, offset=2)
    assert decode_offsets(data) == {"start": 1, "committed": 2, "end": 3, "offset": 2}
    for bad in (b"OK", b"[]", b'{"start":1}', b'{"start":-1,"committed":0,"end":0}'):
        with pytest.raises(ProtocolError):
            decode_offsets(bad)
