import pytest

from protocol.errors import ProtocolError
from protocol.frames import (
    CLOSE_WAIT_FRAME,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    Frame,
    FrameDecoder,
    encode_error_frame,
    encode_frame,
)

from .feeding import MODES, run

# (frame type, data, wire bytes written out by hand: size = 4 + len(data), then the type)
CASES = [
    pytest.param(0, b"OK", b"\x00\x00\x00\x06\x00\x00\x00\x00OK", id="ok"),
    pytest.param(0, b"_heartbeat_", b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_", id="heartbeat"),
    pytest.param(0, b"CLOSE_WAIT", b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT", id="close-wait"),
    pytest.param(1, b"E_INVALID x", b"\x00\x00\x00\x0f\x00\x00\x00\x01E_INVALID x", id="error"),
    pytest.param(2, b"m" * 30, b"\x00\x00\x00\x22\x00\x00\x00\x02" + b"m" * 30, id="message"),
    pytest.param(0, b"", b"\x00\x00\x00\x04\x00\x00\x00\x00", id="empty"),
    pytest.param(0, b"x" * 300, b"\x00\x00\x01\x30\x00\x00\x00\x00" + b"x" * 300, id="size-over-255"),
]


def test_frame_type_values():
    assert (FRAME_TYPE_RESPONSE, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE) == (0, 1, 2)


@pytest.mark.parametrize("frame_type, data, wire", CASES)
def test_encode(frame_type, data, wire):
    assert encode_frame(frame_type, data) == wire


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("frame_type, data, wire", CASES)
def test_decode(frame_type, data, wire, mode):
    dec = FrameDecoder()
    assert run(dec, dec.next_frame, wire, mode) == [Frame(frame_type, data)]
    assert dec.buffered_size() == 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("frame_type, data, wire", CASES)
def test_decode_with_trailing_bytes(frame_type, data, wire, mode):
    dec = FrameDecoder()
    got = run(dec, dec.next_frame, wire + b"\x00\x00\x00\x06\x00\x00\x00\x00OK\x00\x00", mode)
    assert got == [Frame(frame_type, data), Frame(0, b"OK")]
    assert dec.buffered_size() == 2


@pytest.mark.parametrize("mode", MODES)
def test_decode_all_cases_in_one_stream(mode):
    dec = FrameDecoder()
    stream = b"".join(c.values[2] for c in CASES)
    assert run(dec, dec.next_frame, stream, mode) == [Frame(c.values[0], c.values[1]) for c in CASES]


def test_preencoded_frames():
    assert OK_FRAME == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert HEARTBEAT_FRAME == b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    assert CLOSE_WAIT_FRAME == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"


def test_error_frame():
    err = ProtocolError("E_INVALID", "invalid command ")
    assert encode_error_frame(err) == b"\x00\x00\x00\x1e\x00\x00\x00\x01E_INVALID invalid command "


@pytest.mark.parametrize(
    "size_field, max_size",
    [
        (b"\x00\x00\x00\x03", 100),
        (b"\x00\x00\x00\x00", 100),
        (b"\xff\xff\xff\xff", 100),  # negative as int32
        (b"\x80\x00\x00\x00", 100),
        (b"\x00\x00\x00\x65", 100),  # 101 > max
        (b"\x04\x00\x00\x04", 64 * 1024 * 1024),  # default max 64 MiB
    ],
)
def test_bad_size_raises(size_field, max_size):
    dec = FrameDecoder(max_size)
    dec.receive_data(size_field + b"\x00\x00\x00\x00")
    with pytest.raises(ProtocolError) as info:
        dec.next_frame()
    assert info.value.code == "E_BAD_PROTOCOL"
    assert info.value.fatal


def test_size_at_max_is_accepted():
    dec = FrameDecoder(100)
    dec.receive_data(b"\x00\x00\x00\x64\x00\x00\x00\x00" + b"z" * 96)
    assert dec.next_frame() == Frame(0, b"z" * 96)


def test_large_frame_in_small_chunks():
    data = bytes(range(256)) * 4096  # 1 MiB
    wire = encode_frame(2, data)
    dec = FrameDecoder()
    got = []
    for i in range(0, len(wire), 4000):
        dec.receive_data(wire[i : i + 4000])
        while (f := dec.next_frame()) is not None:
            got.append(f)
    assert got == [Frame(2, data)]


def test_accepts_bytearray_and_memoryview():
    dec = FrameDecoder()
    dec.receive_data(bytearray(b"\x00\x00\x00\x06\x00\x00"))
    dec.receive_data(memoryview(b"\x00\x00OK"))
    frame = dec.next_frame()
    assert frame == Frame(0, b"OK") and type(frame.data) is bytes
