"""The "  V1" lookupd protocol: lookupd's state machine, nsqd's encoders and response decoder.

One table of wire bytes feeds the encoders and the parser; every case is fed whole, one byte at a
time, and followed by more bytes.
"""

import json

import pytest

from protocol.errors import LineTooLong, ProtocolError
from protocol.lookup_v1 import (
    CLOSED,
    MAGIC_V1,
    NEED_DATA,
    PING,
    Identify,
    LookupdInfo,
    PeerFields,
    Ping,
    Register,
    ResponseDecoder,
    ServerProtocol,
    Unregister,
    decode_peer_info,
    encode_identify,
    encode_identify_response,
    encode_register,
    encode_response,
    encode_unregister,
    go_trim_space,
    parse_lookupd_info,
)

from .feeding import BYTEWISE, MODES, WHOLE, pieces

PEER = {"broadcast_address": "10.0.0.5", "hostname": "host-a", "http_port": 4151, "tcp_port": 4150, "version": "1.3.0"}
PEER_FIELDS = PeerFields("10.0.0.5", "host-a", 4150, 4151, "1.3.0")
IDENTIFY_BODY = (
    b'{"broadcast_address":"10.0.0.5","hostname":"host-a","http_port":4151,"tcp_port":4150,"version":"1.3.0"}'
)
IDENTIFY = b"IDENTIFY\n" + len(IDENTIFY_BODY).to_bytes(4, "big") + IDENTIFY_BODY


def size(n: int) -> bytes:
    return n.to_bytes(4, "big", signed=True)


def identify_with(body: bytes) -> bytes:
    return b"IDENTIFY\n" + size(len(body)) + body


class Run:
    """Events (and the error, if any) from feeding ``data`` to a fresh server protocol."""

    def __init__(self, data: bytes, mode: str, *, eof: bool = False, **options) -> None:
        self.protocol = ServerProtocol(**options)
        self.events: list = []
        self.error: Exception | None = None
        self.end = None
        try:
            for piece in pieces(data, mode):
                self.protocol.receive_data(piece)
                self._drain()
            if eof:
                self.protocol.receive_data(b"")
                self._drain()
        except (ProtocolError, LineTooLong) as exc:
            self.error = exc

    def _drain(self) -> None:
        while True:
            event = self.protocol.next_event()
            if event is NEED_DATA or event is CLOSED:
                self.end = event
                return
            self.events.append(event)


# -- valid exchanges: (bytes after the magic, events, encoder producing the same bytes or None) ----------------
VALID = [
    pytest.param(b"PING\n", [Ping()], lambda: PING, id="PING"),
    pytest.param(IDENTIFY, [Identify(PEER_FIELDS)], lambda: encode_identify(**PEER), id="IDENTIFY"),
    pytest.param(
        IDENTIFY + b"REGISTER events\n",
        [Identify(PEER_FIELDS), Register("events", "")],
        lambda: encode_identify(**PEER) + encode_register("events"),
        id="REGISTER-topic",
    ),
    pytest.param(
        IDENTIFY + b"REGISTER events archive#ephemeral\n",
        [Identify(PEER_FIELDS), Register("events", "archive#ephemeral")],
        lambda: encode_identify(**PEER) + encode_register("events", "archive#ephemeral"),
        id="REGISTER-channel",
    ),
    pytest.param(
        IDENTIFY + b"UNREGISTER events\nUNREGISTER events c\n",
        [Identify(PEER_FIELDS), Unregister("events", ""), Unregister("events", "c")],
        lambda: encode_identify(**PEER) + encode_unregister("events") + encode_unregister("events", "c"),
        id="UNREGISTER",
    ),
    pytest.param(
        b"PING\nPING\n" + IDENTIFY + b"PING\n",
        [Ping(), Ping(), Identify(PEER_FIELDS), Ping()],
        lambda: PING + PING + encode_identify(**PEER) + PING,
        id="PING-any-time",
    ),
    # the line is trimmed (Go's TrimSpace) before it is split on single spaces
    pytest.param(b"  PING \r\n", [Ping()], None, id="trimmed"),
    pytest.param(b"PING extra words\n", [Ping()], None, id="PING-ignores-params"),
    pytest.param(
        IDENTIFY + b"REGISTER t c extra\n", [Identify(PEER_FIELDS), Register("t", "c")], None, id="extra-params-ignored"
    ),
    pytest.param(
        b"IDENTIFY ignored\n" + size(len(IDENTIFY_BODY)) + IDENTIFY_BODY,
        [Identify(PEER_FIELDS)],
        None,
        id="IDENTIFY-params-ignored",
    ),
    pytest.param(
        identify_with(b'{"BROADCAST_ADDRESS":"h","Tcp_Port":1,"http_port":2,"version":"v","x":[1,{}]}'),
        [Identify(PeerFields("h", "", 1, 2, "v"))],
        None,
        id="IDENTIFY-keys-any-case-unknown-ignored",
    ),
    pytest.param(
        identify_with(
            b'{"broadcast_address":"a","broadcast_address":"b","tcp_port":1,"http_port":2,'
            b'"version":"v","hostname":null}'
        ),
        [Identify(PeerFields("b", "", 1, 2, "v"))],
        None,
        id="IDENTIFY-last-key-wins-null-ignored",
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("data,events,encoder", VALID)
def test_valid_exchanges(data, events, encoder, mode):
    result = Run(MAGIC_V1 + data, mode)
    assert result.error is None
    assert result.events == events
    assert result.end is NEED_DATA


@pytest.mark.parametrize("data,events,encoder", [case for case in VALID if case.values[2] is not None])
def test_encoders_produce_the_table_bytes(data, events, encoder):
    assert encoder() == data


@pytest.mark.parametrize("data,events,encoder", VALID)
def test_trailing_bytes_wait_for_more(data, events, encoder):
    # a partial next command after the case: the events are the same and the parser asks for more
    result = Run(MAGIC_V1 + data + b"REGI", WHOLE)
    assert result.error is None
    assert result.events == events
    assert result.end is NEED_DATA
    # and a partial command at the end of input is dropped silently, as lookupd does
    closed = Run(MAGIC_V1 + data + b"REGI", WHOLE, eof=True)
    assert closed.error is None and closed.end is CLOSED


# -- errors: (bytes after the magic, the exact text lookupd sends) -----------------------------------------------
ERRORS = [
    pytest.param(b"FOO\n", b"E_INVALID invalid command FOO", id="unknown-command"),
    pytest.param(b"ping\n", b"E_INVALID invalid command ping", id="names-are-case-sensitive"),
    pytest.param(b"\n", b"E_INVALID invalid command ", id="empty-line"),
    pytest.param(b"\x00\xff garbage\n", b"E_INVALID invalid command \x00\xff", id="garbage"),
    pytest.param(b"REGISTER t\n", b"E_INVALID client must IDENTIFY", id="REGISTER-before-IDENTIFY"),
    pytest.param(b"UNREGISTER t\n", b"E_INVALID client must IDENTIFY", id="UNREGISTER-before-IDENTIFY"),
    pytest.param(b"REGISTER bad!\n", b"E_INVALID client must IDENTIFY", id="IDENTIFY-checked-before-names"),
    pytest.param(IDENTIFY + b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params", id="no-topic"),
    pytest.param(
        IDENTIFY + b"UNREGISTER\n", b"E_INVALID UNREGISTER insufficient number of params", id="UNREGISTER-no-topic"
    ),
    pytest.param(
        IDENTIFY + b"REGISTER bad!topic\n", b"E_BAD_TOPIC REGISTER topic name 'bad!topic' is not valid", id="bad-topic"
    ),
    pytest.param(
        IDENTIFY + b"REGISTER  t\n", b"E_BAD_TOPIC REGISTER topic name '' is not valid", id="double-space-empty-topic"
    ),
    pytest.param(
        IDENTIFY + b"UNREGISTER t " + b"c" * 65 + b"\n",
        b"E_BAD_CHANNEL UNREGISTER channel name '" + b"c" * 65 + b"' is not valid",
        id="bad-channel",
    ),
    pytest.param(
        IDENTIFY + b"REGISTER t\xff c\n",
        b"E_BAD_TOPIC REGISTER topic name 't\xff' is not valid",
        id="raw-bytes-kept-in-error",
    ),
    pytest.param(IDENTIFY + IDENTIFY, b"E_INVALID cannot IDENTIFY again", id="IDENTIFY-twice"),
    pytest.param(IDENTIFY + b"IDENTIFY\n", b"E_INVALID cannot IDENTIFY again", id="IDENTIFY-twice-before-body"),
    pytest.param(identify_with(b"{not json"), b"E_BAD_BODY IDENTIFY failed to decode JSON body", id="bad-json"),
    pytest.param(identify_with(b""), b"E_BAD_BODY IDENTIFY failed to decode JSON body", id="empty-body"),
    pytest.param(identify_with(b"[1,2]"), b"E_BAD_BODY IDENTIFY failed to decode JSON body", id="json-array"),
    pytest.param(
        identify_with(b'{"tcp_port":"4150"}'), b"E_BAD_BODY IDENTIFY failed to decode JSON body", id="port-as-string"
    ),
    pytest.param(
        identify_with(b'{"tcp_port":4150.5}'), b"E_BAD_BODY IDENTIFY failed to decode JSON body", id="port-as-float"
    ),
    pytest.param(
        identify_with(b'{"tcp_port":99999999999999999999999}'),
        b"E_BAD_BODY IDENTIFY failed to decode JSON body",
        id="port-beyond-int64",
    ),
    pytest.param(
        identify_with(b'{"version":1}'), b"E_BAD_BODY IDENTIFY failed to decode JSON body", id="version-as-number"
    ),
    pytest.param(identify_with(b'{"x":NaN}'), b"E_BAD_BODY IDENTIFY failed to decode JSON body", id="NaN"),
    pytest.param(identify_with(b"[" * 100000), b"E_BAD_BODY IDENTIFY failed to decode JSON body", id="deep-nesting"),
    pytest.param(identify_with(b"null"), b"E_BAD_BODY IDENTIFY missing fields", id="null"),
    pytest.param(identify_with(b"{}"), b"E_BAD_BODY IDENTIFY missing fields", id="empty-object"),
    pytest.param(
        identify_with(json.dumps({**PEER, "http_port": 0}).encode()),
        b"E_BAD_BODY IDENTIFY missing fields",
        id="zero-http-port",
    ),
    pytest.param(
        identify_with(json.dumps({**PEER, "version": ""}).encode()),
        b"E_BAD_BODY IDENTIFY missing fields",
        id="empty-version",
    ),
    pytest.param(b"IDENTIFY\n" + size(-1), b"E_BAD_BODY IDENTIFY failed to read body size", id="negative-size"),
    pytest.param(b"IDENTIFY\n" + size(0x7FFFFFFF), b"E_BAD_BODY IDENTIFY failed to read body", id="huge-size"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("data,text", ERRORS)
def test_errors_have_lookupds_texts(data, text, mode):
    if mode == BYTEWISE and len(data) > 5000:
        mode = WHOLE  # the deep-nesting body: one byte at a time adds nothing but time
    result = Run(MAGIC_V1 + data + b"PING\n", mode)
    assert isinstance(result.error, ProtocolError), result.events
    assert result.error.payload() == text
    assert result.error.fatal
    # the protocol is finished: it keeps raising the same error
    with pytest.raises(ProtocolError):
        result.protocol.next_event()


@pytest.mark.parametrize("magic", [b"  V2", b"GET ", b"\x00\x00\x00\x00"])
def test_wrong_magic(magic):
    for mode in MODES:
        result = Run(magic + b"PING\n", mode)
        assert isinstance(result.error, ProtocolError)
        assert result.error.payload() == b"E_BAD_PROTOCOL"
        assert result.protocol.magic == magic


def test_magic_alone_then_eof_closes():
    result = Run(MAGIC_V1, BYTEWISE, eof=True)
    assert result.error is None and result.end is CLOSED and result.events == []
    assert not result.protocol.magic_pending
    partial = Run(b"  V", WHOLE, eof=True)
    assert partial.end is CLOSED and partial.protocol.magic_pending


@pytest.mark.parametrize(
    "cut,text",
    [
        (b"IDENTIFY\n", b"E_BAD_BODY IDENTIFY failed to read body size"),
        (b"IDENTIFY\n\x00\x00", b"E_BAD_BODY IDENTIFY failed to read body size"),
        (b"IDENTIFY\n" + size(10) + b"{}", b"E_BAD_BODY IDENTIFY failed to read body"),
    ],
)
def test_end_of_input_inside_identify(cut, text):
    result = Run(MAGIC_V1 + cut, WHOLE, eof=True)
    assert isinstance(result.error, ProtocolError)
    assert result.error.payload() == text


def test_line_length_is_bounded():
    result = Run(MAGIC_V1 + b"x" * 200, BYTEWISE, max_line_length=100)
    assert isinstance(result.error, LineTooLong)
    whole = Run(MAGIC_V1 + b"x" * 200 + b"\n", WHOLE, max_line_length=100)
    assert isinstance(whole.error, LineTooLong)
    fits = Run(MAGIC_V1 + b"P" * 98 + b"\n", WHOLE, max_line_length=100)
    assert fits.error.payload() == b"E_INVALID invalid command " + b"P" * 98


def test_identify_body_limit_is_configurable():
    body = json.dumps({**PEER, "hostname": "h" * 500}).encode()
    assert Run(MAGIC_V1 + identify_with(body), WHOLE, max_identify_body=len(body)).events[0].peer.hostname == "h" * 500
    over = Run(MAGIC_V1 + identify_with(body), WHOLE, max_identify_body=len(body) - 1)
    assert over.error.payload() == b"E_BAD_BODY IDENTIFY failed to read body"


def test_identified_flag():
    protocol = ServerProtocol()
    protocol.receive_data(MAGIC_V1 + IDENTIFY[:-1])
    assert protocol.next_event() is NEED_DATA and not protocol.identified
    protocol.receive_data(IDENTIFY[-1:])
    assert isinstance(protocol.next_event(), Identify) and protocol.identified


def test_go_trim_space():
    assert go_trim_space("\t\v\f\r\n PING \u00a0\u3000") == "PING"
    assert go_trim_space("\x1cPING\x1f") == "\x1cPING\x1f"  # Python's strip() would remove these
    assert go_trim_space("\udc85PING") == "\udc85PING"  # a raw 0x85 byte is not U+0085


# -- peer info decoding -------------------------------------------------------------------------------------------
def test_decode_peer_info_types():
    assert decode_peer_info(b'{"tcp_port":-0,"http_port":-5}') == {"tcp_port": 0, "http_port": -5}
    assert decode_peer_info(b'{"remote_address":"x"}') == {"remote_address": "x"}
    assert decode_peer_info(b'{"other":123456789012345678901234567890}') == {}
    assert decode_peer_info(b'{"hostname":"\xff"}') == {"hostname": "\ufffd"}
    assert decode_peer_info(b'{"TCP_PORT":1, "\xc5\xbftcp":2}') == {"tcp_port": 1}
    for bad in (
        b'{"tcp_port":1e3}',
        b'{"tcp_port":true}',
        b'{"hostname":["x"]}',
        b'"text"',
        b'{"a":Infinity}',
        b'{"a":1} x',
    ):
        with pytest.raises(ValueError):
            decode_peer_info(bad)


# -- responses ----------------------------------------------------------------------------------------------------
def test_encode_response():
    assert encode_response(b"OK") == b"\x00\x00\x00\x02OK"
    assert encode_response(b"") == b"\x00\x00\x00\x00"


def test_identify_response_has_sorted_keys():
    data = encode_identify_response(
        broadcast_address="lookup-1", hostname="h", http_port=4161, tcp_port=4160, version="1.3.0"
    )
    assert data == (
        b'{"broadcast_address":"lookup-1","hostname":"h","http_port":4161,"tcp_port":4160,"version":"1.3.0"}'
    )
    assert parse_lookupd_info(data) == LookupdInfo(4160, 4161, "1.3.0", "lookup-1")


def test_parse_lookupd_info_rejects_what_nsqd_rejects():
    assert parse_lookupd_info(b"{}") == LookupdInfo(0, 0, "", "")
    for bad in (b"OK", b"E_INVALID", b"[]", b'{"tcp_port":"1"}', b'{"version":2}'):
        with pytest.raises(ValueError):
            parse_lookupd_info(bad)


RESPONSES = b"\x00\x00\x00\x02OK" + encode_response(b'{"a":1}') + b"\x00\x00\x00\x00"


@pytest.mark.parametrize("mode", MODES)
def test_response_decoder(mode):
    decoder = ResponseDecoder()
    out = []
    for piece in pieces(RESPONSES + b"\x00\x00", mode):
        decoder.receive_data(piece)
        while (response := decoder.next_response()) is not None:
            out.append(response)
    assert out == [b"OK", b'{"a":1}', b""]
    assert decoder.buffered_size() == 2


def test_response_decoder_bounds_the_size():
    decoder = ResponseDecoder(max_size=10)
    decoder.receive_data(size(11))
    with pytest.raises(ProtocolError, match=r"response body size \(11\) is greater than limit \(10\)"):
        decoder.next_response()
    negative = ResponseDecoder()
    negative.receive_data(size(-1))
    with pytest.raises(ProtocolError):
        negative.next_response()


def test_register_encoders_keep_raw_bytes():
    assert encode_register("t", "c") == b"REGISTER t c\n"
    assert encode_unregister("t") == b"UNREGISTER t\n"
    assert encode_register("t\udcff") == b"REGISTER t\xff\n"
