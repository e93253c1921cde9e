"""The replication stream codec: every case encoded, then decoded whole, byte by byte and with trailing bytes;
every malformed frame gives its error code."""

import struct

import pytest

from protocol.errors import ProtocolError
from protocol.replication import (
    OP_CREATED,
    OP_DELETED,
    OP_EMPTIED,
    OP_LOG,
    OP_PAUSED,
    PROTOCOL_VERSION,
    Ack,
    Adopted,
    Ask,
    ChannelOp,
    Confirm,
    Confirmed,
    Error,
    Finished,
    Heartbeat,
    Hello,
    Holding,
    Messages,
    Ping,
    Pong,
    ReplicatedMessage,
    ReplicationDecoder,
    Requeued,
    Restore,
    Restored,
    Synced,
    Welcome,
    encode,
    encode_messages,
    encode_published,
    negotiate,
)

from .feeding import MODES, run

M1 = ReplicatedMessage(b"0123456789abcdef", 1_700_000_000_000_000_000, 1, 0, b"hello")
M2 = ReplicatedMessage(b"0123456789abcdee", 1_700_000_000_000_000_001, 0, 1_700_000_005_000_000_000, b"")
M3 = ReplicatedMessage(b"0123456789abcded", 5, 65535, 0, bytes(range(256)) * 3)

# (event, wire bytes written out by hand where short enough, else None: the round trip covers those)
CASES = [
    pytest.param(Heartbeat(), b"\x00\x00\x00\x01\x05", id="heartbeat"),
    pytest.param(Ack(7), b"\x00\x00\x00\x09\x82" + b"\x00" * 7 + b"\x07", id="ack"),
    pytest.param(Synced(258), b"\x00\x00\x00\x09\x06" + b"\x00" * 6 + b"\x01\x02", id="synced"),
    pytest.param(
        ChannelOp(1, "t", "c", OP_CREATED),
        b"\x00\x00\x00\x10\x04" + b"\x00" * 7 + b"\x01" + b"\x00\x01t" + b"\x00\x01c" + b"\x01",
        id="channel",
    ),
    pytest.param(ChannelOp(2, "t", "", OP_DELETED), None, id="topic-op"),
    pytest.param(ChannelOp(3, "t.x_y-z", "ch", OP_PAUSED), None, id="pause"),
    pytest.param(ChannelOp(3, "t", "ch", OP_EMPTIED), None, id="emptied"),
    pytest.param(ChannelOp(4, "t", "ch", OP_LOG), None, id="log"),
    pytest.param(
        Finished(9, "t", "c", (b"0123456789abcdef",)),
        b"\x00\x00\x00\x23\x03"
        + b"\x00" * 7
        + b"\x09"
        + b"\x00\x01t\x00\x01c"
        + b"\x00\x00\x00\x01"
        + b"0123456789abcdef",
        id="finished",
    ),
    pytest.param(Finished(10, "t", "c", ()), None, id="finished-none"),
    pytest.param(
        Requeued(11, "t", "c", ((b"0123456789abcdef", 2, 258),)),
        b"\x00\x00\x00\x2d\x09"
        + b"\x00" * 7
        + b"\x0b"
        + b"\x00\x01t\x00\x01c"
        + b"\x00\x00\x00\x01"
        + b"0123456789abcdef"
        + b"\x00\x02"
        + b"\x00" * 6
        + b"\x01\x02",
        id="requeued",
    ),
    pytest.param(
        Requeued(12, "t", "c", ((b"0123456789abcdef", 65535, 0), (b"0123456789abcdee", 1, 1 << 62))),
        None,
        id="requeued-two",
    ),
    pytest.param(
        Messages(1, "t", (M1,)),
        b"\x00\x00\x00\x3d\x07"
        + b"\x00" * 7
        + b"\x01"
        + b"\x00\x01t"
        + b"\x00\x00"
        + b"\x00\x00\x00\x01"
        + b"0123456789abcdef"
        + struct.pack(">q", M1.timestamp)
        + b"\x00\x01"
        + b"\x00" * 8
        + b"\x00\x00\x00\x05hello",
        id="one-message",
    ),
    pytest.param(
        Messages(2, "topic", (M1, M2, M3)),
        b"\x00\x00\x03\x8d\x07"
        + b"\x00" * 7
        + b"\x02"
        + b"\x00\x05topic"
        + b"\x00\x00"
        + b"\x00\x00\x00\x03"
        + M1.id
        + M2.id
        + M3.id
        + struct.pack(">3q", M1.timestamp, M2.timestamp, M3.timestamp)
        + struct.pack(">3H", 1, 0, 65535)
        + struct.pack(">3q", 0, M2.due_ns, 0)
        + struct.pack(">3I", 5, 0, 768)
        + b"hello"
        + M3.body,
        id="three-messages",
    ),
    pytest.param(Messages(0, "topic", (M1, M3), channel="ch"), None, id="backfill-messages-of-a-channel"),
    pytest.param(Messages(3, "topic", ()), None, id="no-message"),
    pytest.param(Hello("127.0.0.1:4150", "abc", 2, True, node_id=7), None, id="hello"),
    pytest.param(Hello("127.0.0.1:4150", "abc", version=3, min_version=2), None, id="hello-versions"),
    pytest.param(Ping(1 << 40), b"\x00\x00\x00\x09\x0a\x00\x00\x01" + b"\x00" * 5, id="ping"),
    pytest.param(Pong(258), b"\x00\x00\x00\x09\x86" + b"\x00" * 6 + b"\x01\x02", id="pong"),
    pytest.param(
        Synced(3, (("t", "c"), ("u", ""))),
        b"\x00\x00\x00\x18\x06"
        + b"\x00" * 7
        + b"\x03"
        + b"\x00\x00\x00\x02"
        + b"\x00\x01t\x00\x01c"
        + b"\x00\x01u\x00\x00",
        id="synced-damaged",
    ),
    pytest.param(Restore(0, "topic", (M1, M3), channel="ch"), None, id="restore"),
    pytest.param(Restored(4), b"\x00\x00\x00\x09\x88" + b"\x00" * 7 + b"\x04", id="restored"),
    pytest.param(Welcome("10.0.0.2:4150", "abc", 99, 2, 5), None, id="welcome"),
    pytest.param(Welcome("10.0.0.2:4150", "", 0, 3, 0, adopted=2), None, id="welcome-adopted"),
    pytest.param(
        Welcome("10.0.0.2:4150", topics={"t": {"paused": True, "channels": {"a": False, "b": True}}, "u": {}}),
        None,
        id="welcome-topics",
    ),
    pytest.param(
        Adopted((b"0123456789abcdef",)), b"\x00\x00\x00\x15\x84\x00\x00\x00\x01" + b"0123456789abcdef", id="adopted"
    ),
    pytest.param(Adopted(()), None, id="adopted-none"),
    pytest.param(
        Confirm("127.0.0.1:4150", "abc"),
        b"\x00\x00\x00\x2a\x08" + b'{"node":"127.0.0.1:4150","session":"abc"}',
        id="confirm",
    ),
    pytest.param(
        Confirmed("127.0.0.1:4150", "abc"),
        b"\x00\x00\x00\x2a\x85" + b'{"node":"127.0.0.1:4150","session":"abc"}',
        id="confirmed",
    ),
    pytest.param(Ask("127.0.0.1:4150"), b"\x00\x00\x00\x1a\x0b" + b'{"node":"127.0.0.1:4150"}', id="ask"),
    pytest.param(Holding("127.0.0.1:4150", True, 12, 3), None, id="holding"),
    pytest.param(
        Hello("127.0.0.1:4150", "abc", peers=("127.0.0.1:4151", "127.0.0.1:4152"), replica="127.0.0.1:4152"),
        None,
        id="hello-peers",
    ),
    pytest.param(Error("E_BAD_TOPIC", "replicated topic name 'x y' is not valid"), None, id="error"),
]


@pytest.mark.parametrize("event, wire", CASES)
def test_encode(event, wire):
    if wire is not None:
        assert encode(event) == wire


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("event, wire", CASES)
def test_decode(event, wire, mode):
    decoder = ReplicationDecoder()
    assert run(decoder, decoder.next_event, encode(event), mode) == [event]
    assert decoder.buffered_size() == 0
    assert decoder.last_frame == encode(event)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("event, wire", CASES)
def test_decode_with_trailing_bytes(event, wire, mode):
    decoder = ReplicationDecoder()
    trailing = encode(Ack(1))[:3]
    assert run(decoder, decoder.next_event, encode(event) + trailing, mode) == [event]
    assert decoder.buffered_size() == len(trailing)


def test_a_stream_of_every_case_decodes_in_order():
    events = [case.values[0] for case in CASES]
    decoder = ReplicationDecoder()
    for mode in MODES:
        assert run(decoder, decoder.next_event, b"".join(map(encode, events)), mode) == events


def test_encode_messages_matches_the_event_encoding():
    tuples = [(m.id, m.timestamp, m.attempts, m.due_ns, m.body) for m in (M1, M2, M3)]
    assert encode_messages(4, "t", tuples) == encode(Messages(4, "t", (M1, M2, M3)))
    assert encode_messages(0, "t", tuples, "c") == encode(Messages(0, "t", (M1, M2, M3), channel="c"))


def test_encode_published_is_a_batch_of_one_timestamp_and_due_time():
    ids, bodies = [M1.id, M2.id, M3.id], [b"a", b"", b"ccc"]
    expected = Messages(5, "t", tuple(ReplicatedMessage(i, 42, 0, 99, b) for i, b in zip(ids, bodies, strict=True)))
    assert encode_published(5, "t", ids, bodies, 42, 99) == encode(expected)
    assert encode_published(6, "t", [], [], 42) == encode(Messages(6, "t", ()))


def test_a_decoded_frame_gives_its_ids_and_body_bytes_before_its_messages():
    decoder = ReplicationDecoder()
    decoder.receive_data(encode(Messages(7, "t", (M1, M2, M3))))
    event = decoder.next_event()
    assert event.ids == (M1.id, M2.id, M3.id) and event.body_bytes == 5 + 0 + 768 and len(event) == 3
    assert event.messages == (M1, M2, M3)


def test_messages_as_earlier_versions_wrote_them_still_decode():
    rows = b"".join(
        struct.pack(">16sqHqI", m.id, m.timestamp, m.attempts, m.due_ns, len(m.body)) + m.body for m in (M1, M2, M3)
    )
    payload = struct.pack(">Q", 3) + b"\x00\x01t" + struct.pack(">I", 3) + rows
    decoder = ReplicationDecoder()
    decoder.receive_data(_frame(0x02, payload))
    event = decoder.next_event()
    assert event == Messages(3, "t", (M1, M2, M3)) and event.ids == (M1.id, M2.id, M3.id)
    decoder.receive_data(_frame(0x02, payload[:-1]))
    with pytest.raises(ProtocolError, match="MESSAGES frame cut short"):
        decoder.next_event()


def _error(data: bytes, max_frame_size: int = 1 << 20) -> ProtocolError:
    decoder = ReplicationDecoder(max_frame_size)
    decoder.receive_data(data)
    with pytest.raises(ProtocolError) as info:
        while decoder.next_event() is not None:
            pass
    return info.value


def _frame(frame_type: int, payload: bytes) -> bytes:
    return struct.pack(">IB", len(payload) + 1, frame_type) + payload


BAD = [
    pytest.param(b"\x00\x00\x00\x00\x05", "E_BAD_PROTOCOL", "invalid replication frame size 0", id="size-zero"),
    pytest.param(b"\x7f\x00\x00\x00\x05", "E_BAD_PROTOCOL", "invalid replication frame size", id="size-huge"),
    pytest.param(b"GET / HTTP/1.1\r\n", "E_BAD_PROTOCOL", "invalid replication frame size", id="garbage"),
    pytest.param(_frame(0x42, b""), "E_BAD_PROTOCOL", "unknown replication frame type 0x42", id="unknown-type"),
    pytest.param(_frame(0x05, b"x"), "E_BAD_PROTOCOL", "HEARTBEAT frame with a payload", id="heartbeat-payload"),
    pytest.param(_frame(0x82, b"\x00" * 7), "E_BAD_PROTOCOL", "ACK frame cut short", id="ack-short"),
    pytest.param(_frame(0x82, b"\x00" * 9), "E_BAD_PROTOCOL", "ACK frame has 1 extra byte(s)", id="ack-long"),
    pytest.param(
        _frame(0x07, b"\x00" * 8 + b"\x00\x03a b" + b"\x00\x00" + b"\x00\x00\x00\x00"),
        "E_BAD_TOPIC",
        "replicated topic name 'a b' is not valid",
        id="bad-topic",
    ),
    pytest.param(
        _frame(0x07, b"\x00" * 8 + b"\x00\x00" + b"\x00\x00\x00\x00"), "E_BAD_TOPIC", "not valid", id="empty-topic"
    ),
    pytest.param(
        _frame(0x07, b"\x00" * 8 + b"\x00\x0cx#ephemeral" + b"\x00\x00\x00\x00"),
        "E_BAD_TOPIC",
        "not valid",
        id="ephemeral-topic",
    ),
    pytest.param(
        _frame(0x07, b"\x00" * 8 + b"\x00\x01t\x00\x00" + b"\x00\x00\x00\x02" + b"0" * 42),
        "E_BAD_PROTOCOL",
        "MESSAGES frame cut short",
        id="messages-count-too-high",
    ),
    pytest.param(
        _frame(0x07, b"\x00" * 8 + b"\x00\x01t\x00\x00" + b"\xff\xff\xff\xff" + b"0" * 42),
        "E_BAD_PROTOCOL",
        "MESSAGES frame cut short",
        id="messages-count-huge",
    ),
    pytest.param(
        _frame(
            0x07, b"\x00" * 8 + b"\x00\x01t\x00\x00" + b"\x00\x00\x00\x01" + b"0" * 34 + b"\x00\x00\x00\x09" + b"x" * 8
        ),
        "E_BAD_PROTOCOL",
        "MESSAGES frame cut short",
        id="message-body-short",
    ),
    pytest.param(
        _frame(
            0x07, b"\x00" * 8 + b"\x00\x01t\x00\x00" + b"\x00\x00\x00\x01" + b"0" * 34 + b"\x00\x00\x00\x02" + b"xyz"
        ),
        "E_BAD_PROTOCOL",
        "MESSAGES frame has 1 extra byte(s)",
        id="message-body-long",
    ),
    pytest.param(
        _frame(0x07, b"\x00" * 8 + b"\x00\x01t\x00\x03c d" + b"\x00\x00\x00\x00"),
        "E_BAD_CHANNEL",
        "replicated channel name 'c d' is not valid",
        id="messages-bad-channel",
    ),
    pytest.param(
        _frame(0x03, b"\x00" * 8 + b"\x00\x01t\x00\x04c/\x00d" + b"\x00\x00\x00\x00"),
        "E_BAD_CHANNEL",
        "replicated channel name 'c/\\x00d' is not valid",
        id="bad-channel",
    ),
    pytest.param(
        _frame(0x03, b"\x00" * 8 + b"\x00\x01t\x00\x01c" + b"\x00\x00\x00\x02" + b"0" * 16),
        "E_BAD_PROTOCOL",
        "FINISHED frame cut short",
        id="finished-short",
    ),
    pytest.param(
        _frame(0x09, b"\x00" * 8 + b"\x00\x01t\x00\x01c" + b"\x00\x00\x00\x01" + b"0" * 25),
        "E_BAD_PROTOCOL",
        "REQUEUED frame cut short",
        id="requeued-short",
    ),
    pytest.param(
        _frame(0x09, b"\x00" * 8 + b"\x00\x01t\x00\x00" + b"\x00\x00\x00\x00"),
        "E_BAD_CHANNEL",
        "replicated channel name '' is not valid",
        id="requeued-no-channel",
    ),
    pytest.param(
        _frame(0x84, b"\x00\x00\x00\x02" + b"0" * 17), "E_BAD_PROTOCOL", "ADOPTED frame cut short", id="adopted-short"
    ),
    pytest.param(
        _frame(0x84, b"\x00\x00\x00\x01" + b"0" * 17),
        "E_BAD_PROTOCOL",
        "ADOPTED frame has 1 extra byte(s)",
        id="adopted-long",
    ),
    pytest.param(
        _frame(0x04, b"\x00" * 8 + b"\x00\x01t\x00\x01c\x09"), "E_BAD_PROTOCOL", "unknown op 9", id="unknown-op"
    ),
    pytest.param(
        _frame(0x04, b"\x00" * 8 + b"\x00\x01t\x00\x00\x05"), "E_BAD_PROTOCOL", "unknown op 5", id="topic-emptied"
    ),
    pytest.param(
        _frame(0x04, b"\x00" * 8 + b"\x00\x01t\x00\x00\x06"), "E_BAD_PROTOCOL", "unknown op 6", id="topic-log"
    ),
    pytest.param(_frame(0x01, b"not json"), "E_BAD_HELLO", "HELLO is not a JSON object", id="hello-not-json"),
    pytest.param(_frame(0x01, b"[1]"), "E_BAD_HELLO", "HELLO is not a JSON object", id="hello-not-object"),
    pytest.param(_frame(0x01, b'{"node": "nohost"}'), "E_BAD_HELLO", "is not HOST:PORT", id="hello-bad-node"),
    pytest.param(
        _frame(0x01, b'{"node": "h:1", "epoch": -1}'),
        "E_BAD_HELLO",
        "'epoch' must be a non-negative",
        id="hello-bad-epoch",
    ),
    pytest.param(
        _frame(0x01, b'{"node": "h:1", "durable": 1}'),
        "E_BAD_HELLO",
        "'durable' must be true or false",
        id="hello-bad-durable",
    ),
    pytest.param(_frame(0x01, b"\xff"), "E_BAD_HELLO", "HELLO is not a JSON object", id="hello-bad-utf8"),
    pytest.param(_frame(0x08, b"{"), "E_BAD_HELLO", "CONFIRM is not a JSON object", id="confirm-not-json"),
    pytest.param(
        _frame(0x85, b'{"node": "h:1", "session": 5}'),
        "E_BAD_HELLO",
        "CONFIRMED field 'session' must be a string",
        id="confirmed-bad-session",
    ),
    pytest.param(
        _frame(0x81, b'{"node": "h:1", "topics": ["t"]}'),
        "E_BAD_HELLO",
        "'topics' must be an object",
        id="welcome-topics-not-object",
    ),
    pytest.param(
        _frame(0x81, b'{"node": "h:1", "topics": {"t": {"channels": {"a b": false}}}}'),
        "E_BAD_HELLO",
        "bad entry for 't'",
        id="welcome-topics-bad-channel",
    ),
    pytest.param(
        _frame(0x81, b'{"node": "h:1", "topics": {"t#ephemeral": {}}}'),
        "E_BAD_HELLO",
        "bad entry for 't#ephemeral'",
        id="welcome-topics-ephemeral",
    ),
]


@pytest.mark.parametrize("data, code, text", BAD)
def test_malformed_frames_raise_their_error(data, code, text):
    error = _error(data)
    assert error.code == code
    assert text in error.description


def test_frame_over_the_limit_is_refused_before_its_payload_arrives():
    decoder = ReplicationDecoder(max_frame_size=100)
    decoder.receive_data(struct.pack(">IB", 101, 0x02))
    with pytest.raises(ProtocolError, match="invalid replication frame size 101"):
        decoder.next_event()


def test_encode_refuses_other_objects():
    with pytest.raises(TypeError):
        encode(object())


def test_a_hello_or_welcome_without_versions_is_version_1():
    # what a node of the first version sends: no min_version, and a WELCOME that always said 1
    decoder = ReplicationDecoder()
    for frame_type, payload in ((0x01, b'{"node":"h:1","session":"s"}'), (0x81, b'{"node":"h:2"}')):
        decoder.receive_data(struct.pack(">IB", len(payload) + 1, frame_type) + payload)
    hello, welcome = decoder.next_event(), decoder.next_event()
    assert (hello.version, hello.min_version, welcome.version) == (1, 1, 1)


@pytest.mark.parametrize(
    "speaks, peer, agreed",
    [
        ((1, 2), (1, 1), 1),  # an origin of version 1 in a ring of version 2
        ((1, 1), (1, 2), 1),
        ((1, 2), (1, 2), 2),
        ((1, 2), (1, 5), 2),  # a newer peer speaks this node's newest
        ((2, 3), (1, 3), 3),
    ],
)
def test_negotiation_takes_the_newest_version_both_speak(speaks, peer, agreed):
    assert negotiate(speaks[1], speaks[0], peer[1], peer[0]) == agreed
    assert negotiate(peer[1], peer[0], speaks[1], speaks[0]) == agreed


def test_negotiation_without_a_common_version_is_refused():
    with pytest.raises(ProtocolError) as caught:
        negotiate(3, 3, 2, 1)
    assert caught.value.code == "E_BAD_VERSION" and "3-3" in caught.value.description


@pytest.mark.parametrize(
    "event",
    [
        Ping(5),
        Pong(5),
        Restore(0, "t", (M1,), "c"),
        Restored(1),
        Synced(1, (("t", "c"),)),
        ChannelOp(4, "t", "c", OP_LOG),
    ],
    ids=["ping", "pong", "restore", "restored", "synced-damaged", "channel-op-log"],
)
def test_a_stream_of_version_1_refuses_the_frames_of_version_2(event):
    assert PROTOCOL_VERSION >= 2
    decoder = ReplicationDecoder(version=1)
    decoder.receive_data(encode(event))
    with pytest.raises(ProtocolError) as caught:
        decoder.next_event()
    assert caught.value.code == "E_BAD_PROTOCOL" and (
        "unknown replication frame type" in caught.value.description
        or "damaged" in caught.value.description
        or "unknown op" in caught.value.description
    )
    decoder = ReplicationDecoder(version=2)
    decoder.receive_data(encode(event))
    assert decoder.next_event() == event
