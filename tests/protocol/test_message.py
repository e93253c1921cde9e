import pytest

from protocol.errors import ProtocolError
from protocol.frames import Frame, FrameDecoder
from protocol.message import (
    MESSAGE_HEADER_SIZE,
    Message,
    decode_message,
    encode_message,
    encode_message_frame,
    message_id_from_int,
    message_id_to_int,
)

from .feeding import MODES, run

ID = b"0123456789abcdef"

# (timestamp, attempts, id, body, encoding written out from the layout: ts(8) attempts(2) id(16) body)
CASES = [
    pytest.param(
        0x0102030405060708,
        0x090A,
        ID,
        b"xyz",
        bytes.fromhex("0102030405060708090a") + ID + b"xyz",
        id="fields-in-order",
    ),
    pytest.param(
        1700000000123456789,
        1,
        b"18a398c44e669000",
        b"hello",
        bytes.fromhex("17979cfe3d85cd150001") + b"18a398c44e669000hello",
        id="typical",
    ),
    pytest.param(0, 0, ID, b"", bytes(10) + ID, id="zero-and-empty-body"),
    pytest.param(-1, 65535, ID, b"\x00\n", b"\xff" * 10 + ID + b"\x00\n", id="negative-ts-max-attempts"),
]


def test_header_size():
    assert MESSAGE_HEADER_SIZE == 26


@pytest.mark.parametrize("ts, attempts, msg_id, body, wire", CASES)
def test_encode(ts, attempts, msg_id, body, wire):
    assert encode_message(Message(msg_id, body, ts, attempts)) == wire


@pytest.mark.parametrize("ts, attempts, msg_id, body, wire", CASES)
def test_decode(ts, attempts, msg_id, body, wire):
    msg = decode_message(wire)
    assert (msg.timestamp, msg.attempts, msg.id, msg.body) == (ts, attempts, msg_id, body)


@pytest.mark.parametrize("ts, attempts, msg_id, body, wire", CASES)
def test_encode_frame(ts, attempts, msg_id, body, wire):
    frame = encode_message_frame(Message(msg_id, body, ts, attempts))
    size = (4 + len(wire)).to_bytes(4, "big")
    assert frame == size + b"\x00\x00\x00\x02" + wire


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("ts, attempts, msg_id, body, wire", CASES)
def test_frames_decode_three_ways(ts, attempts, msg_id, body, wire, mode):
    frame = encode_message_frame(Message(msg_id, body, ts, attempts))
    dec = FrameDecoder()
    got = run(dec, dec.next_frame, frame + frame[:5], mode)  # trailing: the start of another frame
    assert got == [Frame(2, wire)]
    msg = decode_message(got[0].data)
    assert (msg.timestamp, msg.attempts, msg.id, msg.body) == (ts, attempts, msg_id, body)


@pytest.mark.parametrize("length", [0, 1, 25])
def test_decode_too_short(length):
    with pytest.raises(ProtocolError) as info:
        decode_message(b"\x00" * length)
    assert info.value.code == "E_BAD_MESSAGE"


def test_default_attempts_and_subclass_with_more_slots():
    class Delivery(Message):
        __slots__ = ("client",)

        def __init__(self, id, body, timestamp, attempts=0):
            super().__init__(id, body, timestamp, attempts)
            self.client = None

    m = Delivery(ID, b"b", 5)
    assert m.attempts == 0
    assert encode_message(m) == bytes.fromhex("00000000000000050000") + ID + b"b"
    with pytest.raises(AttributeError):
        Message(ID, b"", 0).extra = 1  # slotted: no per-message dict


# Message ids: the 8 big-endian bytes of the value in lowercase hex.
IDS = [
    (0x18A398C44E669000, b"18a398c44e669000"),
    (0, b"0000000000000000"),
    (1, b"0000000000000001"),
    (0xFFFFFFFFFFFFFFFF, b"ffffffffffffffff"),
    (0x00AB00CD00EF0012, b"00ab00cd00ef0012"),
]


@pytest.mark.parametrize("value, text", IDS)
def test_message_id_from_int(value, text):
    assert message_id_from_int(value) == text


@pytest.mark.parametrize("value, text", IDS)
def test_message_id_to_int(value, text):
    assert message_id_to_int(text) == value


def test_message_id_to_int_accepts_uppercase():
    assert message_id_to_int(b"18A398C44E669000") == 0x18A398C44E669000


@pytest.mark.parametrize("value", [-1, 1 << 64])
def test_message_id_from_int_out_of_range(value):
    with pytest.raises(ValueError):
        message_id_from_int(value)


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"18a398c44e66900",
        b"18a398c44e6690000",
        b"zzzzzzzzzzzzzzzz",
        b" 8a398c44e669000",
        b"+8a398c44e669000",
        b"18a398c4_e669000",
    ],
)
def test_message_id_to_int_rejects(text):
    with pytest.raises(ValueError):
        message_id_to_int(text)
