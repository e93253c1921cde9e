"""trionsq's sans-IO core, Config and Message, without sockets.

The server side of each exchange is built with ``protocol``'s own encoders (frames, the IDENTIFY
negotiation, the snappy and deflate streams), and every stream is fed whole, one byte at a time,
and followed by the frames of the next step, as the protocol package's codec tests do.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import types

import pytest

import trionsq
from protocol.commands import CommandParser, encode_pub
from protocol.compression import DeflateDecoder, DeflateEncoder, SnappyDecoder, SnappyEncoder
from protocol.frames import (
    CLOSE_WAIT_FRAME,
    FRAME_TYPE_ERROR,
    HEARTBEAT_FRAME,
    OK_FRAME,
    encode_frame,
)
from protocol.identify import IdentifyLimits, negotiate
from protocol.message import Message as WireMessage
from protocol.message import encode_message_frame
from tests.protocol.feeding import MODES, pieces
from trionsq import Config, ConnectError, ConnectionClosed, Message, NSQError
from trionsq._core import (
    HEARTBEAT,
    NEED_DATA,
    START_TLS,
    ClientCore,
    Connected,
    ErrorReply,
    Features,
    Reply,
    Send,
    identify_body,
    split_address,
)

ADDRESS = "127.0.0.1:4150"


def identify_response(**fields) -> bytes:
    base = {
        "max_rdy_count": 2500,
        "version": "1.3.0",
        "max_msg_timeout": 900000,
        "msg_timeout": 60000,
        "tls_v1": False,
        "deflate": False,
        "deflate_level": 6,
        "max_deflate_level": 6,
        "snappy": False,
        "sample_rate": 0,
        "auth_required": False,
        "output_buffer_size": 16384,
        "output_buffer_timeout": 250,
    }
    base.update(fields)
    return encode_frame(0, json.dumps(base).encode())


class Responder:
    """Records what messages ask their connection to send."""

    def __init__(self, config: Config | None = None) -> None:
        self.config = config or Config()
        self.sent: list[tuple[str, bytes, bool | None]] = []

    def _message_finished(self, message, data):
        self.sent.append(("fin", data, None))

    def _message_requeued(self, message, data, backoff):
        self.sent.append(("req", data, backoff))

    def _message_touched(self, message, data):
        self.sent.append(("touch", data, None))


def drain(core: ClientCore, events: list) -> None:
    while (event := core.next_event()) is not NEED_DATA:
        events.append(event)
        if event is START_TLS:
            core.tls_started()


def feed(core: ClientCore, data: bytes, mode: str) -> list:
    events: list = []
    for piece in pieces(data, mode):
        core.receive_data(piece)
        drain(core, events)
    return events


def new_core(**config) -> ClientCore:
    core = ClientCore(Config(**config), ADDRESS, responder=Responder())
    core.handshake_bytes()
    return core


# -- IDENTIFY ---------------------------------------------------------------------------------


def test_handshake_bytes_are_magic_and_a_valid_identify():
    config = Config(
        client_id="c1",
        hostname="h.example",
        heartbeat_interval=5,
        msg_timeout=12.5,
        output_buffer_timeout=0.1,
        output_buffer_size=4096,
        sample_rate=7,
        snappy=True,
    )
    data = ClientCore(config, ADDRESS).handshake_bytes()
    assert data.startswith(b"  V2")
    parser = CommandParser()
    parser.receive_data(data[4:])
    command = parser.next_command()
    assert command.name == b"IDENTIFY"
    result = negotiate(command.body, IdentifyLimits())  # what nsqd would make of it
    assert (result.client_id, result.hostname, result.user_agent) == ("c1", "h.example", config.user_agent)
    assert result.heartbeat_interval_ms == 5000
    assert result.msg_timeout_ms == 12500
    assert (result.output_buffer_size, result.output_buffer_timeout_ms) == (4096, 100)
    assert result.sample_rate == 7
    assert result.snappy and not result.deflate and result.feature_negotiation


def test_identify_body_disabled_and_default_values():
    body = identify_body(Config(heartbeat_interval=0, output_buffer_timeout=-1, hostname="a.b.c"))
    assert body["heartbeat_interval"] == -1
    assert body["output_buffer_timeout"] == -1
    assert body["msg_timeout"] == 0  # nsqd's own --msg-timeout
    assert body["client_id"] == "a"  # the short hostname, as go-nsq
    assert body["user_agent"].startswith("trionsq/")


@pytest.mark.parametrize("mode", MODES)
def test_plain_handshake(mode):
    core = new_core()
    events = feed(core, identify_response(max_rdy_count=100, msg_timeout=30000), mode)
    assert [type(e) for e in events] == [Connected]
    features = events[0].features
    assert features is core.features and core.connected
    assert (features.max_rdy_count, features.msg_timeout, features.version) == (100, 30.0, "1.3.0")
    assert features.feature_negotiation and not (features.tls_v1 or features.snappy or features.deflate)


@pytest.mark.parametrize("mode", MODES)
def test_plain_handshake_with_trailing_frames(mode):
    core = new_core()
    core.expect_reply("pub")
    events = feed(core, identify_response() + OK_FRAME + HEARTBEAT_FRAME + b"\x00\x00", mode)
    assert type(events[0]) is Connected
    assert type(events[1]) is Reply and (events[1].token, events[1].data) == ("pub", b"OK")
    assert events[2] is HEARTBEAT
    assert len(events) == 3


def test_server_without_feature_negotiation_answers_ok():
    core = new_core()
    events = feed(core, OK_FRAME, "whole")
    assert type(events[0]) is Connected
    assert events[0].features == Features()
    assert not events[0].features.feature_negotiation


@pytest.mark.parametrize("mode", MODES)
def test_identify_error_frame(mode):
    core = new_core()
    frame = encode_frame(FRAME_TYPE_ERROR, b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
    with pytest.raises(NSQError) as info:
        feed(core, frame, mode)
    assert info.value.code == "E_IDENTIFY_FAILED"
    assert str(info.value) == "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
    assert info.value.fatal


def test_identify_response_not_json():
    core = new_core()
    with pytest.raises(ConnectError, match="invalid IDENTIFY response"):
        feed(core, encode_frame(0, b"{not json"), "whole")


# -- upgrades -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tls_upgrade(mode):
    core = new_core(tls_v1=True)
    events = feed(core, identify_response(tls_v1=True), mode)
    assert events == [START_TLS]
    core.expect_reply("sub")
    # after the TLS handshake (done by the driver), nsqd's OK arrives over TLS
    events = feed(core, OK_FRAME + OK_FRAME, mode)
    assert type(events[0]) is Connected and events[0].features.tls_v1
    assert type(events[1]) is Reply and events[1].token == "sub"


def test_tls_upgrade_refuses_bytes_before_the_handshake():
    core = new_core(tls_v1=True)
    with pytest.raises(ConnectError, match="before the TLS handshake"):
        feed(core, identify_response(tls_v1=True) + OK_FRAME, "whole")


def test_tls_upgrade_needs_ok():
    core = new_core(tls_v1=True)
    feed(core, identify_response(tls_v1=True), "whole")
    with pytest.raises(ConnectError, match="invalid response from TLS upgrade"):
        feed(core, encode_frame(0, b"NOPE"), "whole")


CODECS = [
    pytest.param("snappy", SnappyEncoder, SnappyDecoder, id="snappy"),
    pytest.param("deflate", DeflateEncoder, DeflateDecoder, id="deflate"),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name, encoder_type, decoder_type", CODECS)
def test_compression_upgrade(mode, name, encoder_type, decoder_type):
    core = new_core(**{name: True})
    server_out = encoder_type()
    core.expect_reply("pub")
    # the compressed OK and a reply travel in the same reads as the plain IDENTIFY response
    stream = identify_response(**{name: True}) + server_out.encode(OK_FRAME) + server_out.encode(OK_FRAME)
    events = feed(core, stream, mode)
    assert type(events[0]) is Connected and getattr(events[0].features, name)
    assert type(events[1]) is Reply and events[1].token == "pub"
    assert len(events) == 2
    # the client's commands are compressed; nsqd's side decodes them
    wire = core.wire_bytes(encode_pub("t", b"x" * 1000))
    assert len(wire) < 200
    assert decoder_type().decode(wire) == encode_pub("t", b"x" * 1000)


@pytest.mark.parametrize("mode", MODES)
def test_tls_then_snappy(mode):
    core = new_core(tls_v1=True, snappy=True)
    assert feed(core, identify_response(tls_v1=True, snappy=True), mode) == [START_TLS]
    server_out = SnappyEncoder()
    events = feed(core, OK_FRAME + server_out.encode(OK_FRAME + HEARTBEAT_FRAME), mode)
    assert type(events[0]) is Connected
    assert events[1] is HEARTBEAT


def test_compression_upgrade_needs_ok():
    core = new_core(deflate=True)
    with pytest.raises(ConnectError, match="invalid response from Deflate upgrade"):
        feed(core, identify_response(deflate=True) + DeflateEncoder().encode(CLOSE_WAIT_FRAME), "whole")


def test_corrupt_compressed_stream_closes():
    core = new_core(snappy=True)
    with pytest.raises(ConnectionClosed, match="corrupt compressed stream"):
        feed(core, identify_response(snappy=True) + b"\x00\x05\x00\x00junk", "whole")


# -- AUTH ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_auth(mode):
    core = new_core(auth_secret="s3cret")
    events = feed(core, identify_response(auth_required=True), mode)
    assert len(events) == 1 and type(events[0]) is Send
    assert events[0].data == b"AUTH\n\x00\x00\x00\x06s3cret"
    answer = json.dumps({"identity": "me", "identity_url": "http://x", "permission_count": 2})
    events = feed(core, encode_frame(0, answer.encode()) + HEARTBEAT_FRAME, mode)
    assert type(events[0]) is Connected
    assert (events[0].auth.identity, events[0].auth.permission_count) == ("me", 2)
    assert core.auth == events[0].auth
    assert events[1] is HEARTBEAT


def test_auth_after_deflate_is_compressed():
    core = new_core(auth_secret="s", deflate=True)
    server_out = DeflateEncoder()
    events = feed(core, identify_response(auth_required=True, deflate=True) + server_out.encode(OK_FRAME), "whole")
    assert type(events[0]) is Send
    assert DeflateDecoder().decode(events[0].data) == b"AUTH\n\x00\x00\x00\x01s"


def test_auth_required_without_secret():
    core = new_core()
    with pytest.raises(ConnectError, match="requires authorization"):
        feed(core, identify_response(auth_required=True), "whole")


def test_auth_refused():
    core = new_core(auth_secret="bad")
    feed(core, identify_response(auth_required=True), "whole")
    with pytest.raises(NSQError) as info:
        feed(core, encode_frame(FRAME_TYPE_ERROR, b"E_AUTH_FAILED AUTH failed"), "whole")
    assert info.value.code == "E_AUTH_FAILED"


# -- connected ----------------------------------------------------------------------------------


def connected_core(**config) -> ClientCore:
    core = new_core(**config)
    assert type(feed(core, identify_response(), "whole")[0]) is Connected
    return core


@pytest.mark.parametrize("mode", MODES)
def test_frames_become_events(mode):
    core = connected_core()
    for token in ("a", "b", "c"):
        core.expect_reply(token)
    wire_message = WireMessage(b"0123456789abcdef", b"hello", 1_700_000_000_000_000_000, 3)
    stream = (
        OK_FRAME
        + encode_message_frame(wire_message)
        + HEARTBEAT_FRAME
        + encode_frame(FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0123456789abcdef failed")
        + encode_frame(FRAME_TYPE_ERROR, b'E_BAD_TOPIC PUB topic name "a b" is not valid')
        + CLOSE_WAIT_FRAME
    )
    events = feed(core, stream, mode)
    assert type(events[0]) is Reply and (events[0].token, events[0].data) == ("a", b"OK")
    message = events[1]
    assert type(message) is Message
    assert (message.id, message.body, message.attempts) == (b"0123456789abcdef", b"hello", 3)
    assert message.timestamp == 1_700_000_000_000_000_000
    assert message.nsqd_address == ADDRESS
    assert events[2] is HEARTBEAT
    # E_FIN_FAILED answers no waiting command
    assert type(events[3]) is ErrorReply and events[3].token is None
    assert events[3].error.code == "E_FIN_FAILED" and not events[3].error.fatal
    assert type(events[4]) is ErrorReply and events[4].token == "b"
    assert events[4].error.code == "E_BAD_TOPIC" and events[4].error.fatal
    assert events[4].error.description == 'PUB topic name "a b" is not valid'
    assert type(events[5]) is Reply and (events[5].token, events[5].data) == ("c", b"CLOSE_WAIT")
    assert core.pending_count == 0


def test_pending_tokens_are_taken_in_order():
    core = connected_core()
    for token in range(5):
        core.expect_reply(token)
    feed(core, OK_FRAME, "whole")
    assert core.pending_tokens() == [1, 2, 3, 4]
    assert core.pending_tokens() == []


def test_reply_without_waiting_command_has_no_token():
    core = connected_core()
    events = feed(core, OK_FRAME, "whole")
    assert type(events[0]) is Reply and events[0].token is None


@pytest.mark.parametrize(
    "data, match",
    [
        (b"\x00\x00\x00\x02\x00\x00\x00\x00", "invalid frame size"),
        (encode_frame(7, b"x"), "unknown frame type 7"),
        (encode_frame(2, b"short"), "corrupt message"),
    ],
)
def test_corrupt_stream_closes(data, match):
    core = connected_core()
    with pytest.raises(ConnectionClosed, match=match):
        feed(core, data, "whole")


def test_wire_bytes_without_compression_is_identity():
    core = connected_core()
    data = encode_pub("t", b"x")
    assert core.wire_bytes(data) is data


# -- Message ------------------------------------------------------------------------------------


def make_message(attempts: int = 1, **config) -> tuple[Message, Responder]:
    responder = Responder(Config(**config))
    return Message(b"0123456789abcdef", b"b", 0, attempts, ADDRESS, responder), responder


def test_message_finish_once():
    message, responder = make_message()
    assert not message.has_responded
    message.finish()
    message.finish()
    message.requeue()
    message.touch()
    assert responder.sent == [("fin", b"FIN 0123456789abcdef\n", None)]
    assert message.has_responded


def test_message_touch_then_requeue():
    message, responder = make_message(attempts=3, default_requeue_delay=2.0, max_requeue_delay=5.0)
    message.touch()
    message.requeue()  # 2.0 * 3 attempts, capped at 5 s
    assert responder.sent == [
        ("touch", b"TOUCH 0123456789abcdef\n", None),
        ("req", b"REQ 0123456789abcdef 5000\n", True),
    ]


def test_message_requeue_explicit_delay_without_backoff():
    message, responder = make_message()
    message.requeue(1.5, backoff=False)
    assert responder.sent == [("req", b"REQ 0123456789abcdef 1500\n", False)]


def test_message_auto_response_flag():
    message, _ = make_message()
    assert not message.auto_response_disabled
    message.disable_auto_response()
    assert message.auto_response_disabled


# -- Config -------------------------------------------------------------------------------------


def test_config_set_go_values():
    config = Config()
    config.set("read-timeout", "30s")
    config.set("max_in_flight", "200")
    config.set("snappy", "true")
    config.set("lookupd_poll_jitter", "0.5")
    config.set("msg_timeout", "1m30s")
    config.set("user_agent", "tool/1")
    assert (config.read_timeout, config.max_in_flight, config.snappy) == (30.0, 200, True)
    assert (config.lookupd_poll_jitter, config.msg_timeout, config.user_agent) == (0.5, 90.0, "tool/1")


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("no_such_option", "1", "invalid option no_such_option"),
        (
            "max_in_flight",
            "x",
            'failed to coerce option max_in_flight (x) - strconv.ParseInt: parsing "x": invalid syntax',
        ),
        ("snappy", "yes", 'failed to coerce option snappy (yes) - strconv.ParseBool: parsing "yes": invalid syntax'),
        ("read_timeout", "30", 'failed to coerce option read_timeout (30) - time: missing unit in duration "30"'),
        ("read_timeout", "50ms", "invalid read_timeout ! 50ms < 100ms"),
        ("deflate_level", "10", "invalid deflate_level ! 10 > 9"),
        ("sample_rate", "-1", "invalid sample_rate ! -1 < 0"),
        ("lookupd_poll_jitter", "1.5", "invalid lookupd_poll_jitter ! 1.5 > 1"),
        ("tls_root_ca_file", "/no/such/file.pem", "failed to read custom Certificate Authority file"),
    ],
)
def test_config_set_refuses(name, value, message):
    config = Config()
    with pytest.raises(ValueError) as info:
        config.set(name, value)
    assert message in str(info.value)
    assert config == Config()


# go-nsq v1.1.0's Config options (opt tags) with the default each has there, as text; "" = Go's zero value or a
# default computed at run time (client_id, hostname, user_agent). tls_config is a *tls.Config, not text.
GO_NSQ_OPTIONS = {
    "dial_timeout": "1s",
    "read_timeout": "1m0s",
    "write_timeout": "1s",
    "local_addr": "",
    "lookupd_poll_interval": "1m0s",
    "lookupd_poll_jitter": "0.3",
    "lookupd_poll_timeout": "1m0s",
    "max_requeue_delay": "15m0s",
    "default_requeue_delay": "1m30s",
    "backoff_strategy": "exponential",
    "max_backoff_duration": "2m0s",
    "backoff_multiplier": "1s",
    "max_attempts": "5",
    "low_rdy_idle_timeout": "10s",
    "low_rdy_timeout": "30s",
    "rdy_redistribute_interval": "5s",
    "client_id": "",
    "hostname": "",
    "user_agent": "",
    "heartbeat_interval": "30s",
    "sample_rate": "0",
    "tls_v1": "false",
    "deflate": "false",
    "deflate_level": "6",
    "snappy": "false",
    "output_buffer_size": "16384",
    "output_buffer_timeout": "250ms",
    "max_in_flight": "1",
    "msg_timeout": "",
    "auth_secret": "",
    "skip_lookupd_authorization": "true",
    "tls_insecure_skip_verify": "false",
    "tls_cert": "",
    "tls_key": "",
    "tls_min_version": "tls1.0",
}


def test_config_takes_every_go_nsq_option_with_its_default():
    for name, default in GO_NSQ_OPTIONS.items():
        config = Config()
        if default:
            config.set(name, default)  # accepted, and it is already the default here
            if name != "tls_min_version":  # go-nsq sets TLS 1.0 as the floor; here None: ssl's own floor
                assert config == Config(), name
    with pytest.raises(ValueError, match="tls_config takes an ssl.SSLContext"):
        Config().set("tls_config", "x")


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("rdy_redistribute_interval", "6s", "invalid rdy_redistribute_interval ! 6s > 5s"),
        ("rdy_redistribute_interval", "0s", "invalid rdy_redistribute_interval ! 0s < 1ms"),
        ("low_rdy_timeout", "500ms", "invalid low_rdy_timeout ! 500ms < 1s"),
        ("low_rdy_timeout", "6m", "invalid low_rdy_timeout ! 6m0s > 5m0s"),
        ("backoff_strategy", "linear", "failed to coerce option backoff_strategy (linear) - invalid value type"),
        (
            "max_attempts",
            "-1",
            'failed to coerce option max_attempts (-1) - strconv.ParseUint: parsing "-1": invalid syntax',
        ),
        (
            "local_addr",
            "127.0.0.1",
            "failed to coerce option local_addr (127.0.0.1) - address 127.0.0.1: missing port in address",
        ),
        ("tls_min_version", "tls2", "ERROR: tls2 is not a tls version"),
    ],
)
def test_config_set_refuses_go_nsq_ranges(name, value, message):
    config = Config()
    with pytest.raises(ValueError) as info:
        config.set(name, value)
    assert str(info.value) == message


def test_config_new_options_values():
    config = Config()
    for text in (
        "backoff_strategy,full_jitter",
        "rdy_redistribute_interval,250ms",
        "low_rdy_timeout,2s",
        "lookupd_poll_timeout,3s",
        "local_addr,127.0.0.1:0",
        "skip_lookupd_authorization,false",
    ):
        config.set_option_text(text)
    assert (config.backoff_strategy, config.rdy_redistribute_interval, config.low_rdy_timeout) == (
        "full_jitter",
        0.25,
        2.0,
    )
    assert (config.lookupd_poll_timeout, config.local_addr, config.skip_lookupd_authorization) == (
        3.0,
        "127.0.0.1:0",
        False,
    )
    config.set("backoff_strategy", "")  # go-nsq: empty means exponential
    assert config.backoff_strategy == "exponential"


def test_config_option_text():
    config = Config()
    config.set_option_text("deflate")
    config.set_option_text("max_attempts,10")
    config.set_option_text("user_agent,a,b")
    assert (config.deflate, config.max_attempts, config.user_agent) == (True, 10, "a,b")
    with pytest.raises(ValueError, match=r"failed to coerce option max_in_flight \(true\) - invalid value type"):
        config.set_option_text("max_in_flight")


def test_config_set_boolean_values():
    # True and False set a boolean option as the text "true" and "false" do; other options refuse both
    config = Config(deflate=True)
    config.set("deflate", False)
    config.set("snappy", True)
    assert (config.deflate, config.snappy) == (False, True)
    with pytest.raises(ValueError, match=r"failed to coerce option max_in_flight \(false\) - invalid value type"):
        config.set("max_in_flight", False)


def test_config_ssl_context(certs):
    config = Config(tls_v1=True)
    config.set("tls_root_ca_file", str(certs.ca_file))
    context = config.ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert config.ssl_context() is context  # built once
    config.set("tls_insecure_skip_verify", "true")
    config.set("tls_min_version", "tls1.2")
    context = config.ssl_context()
    assert context.verify_mode == ssl.CERT_NONE and not context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    given = ssl.create_default_context()
    assert Config(tls_context=given).ssl_context() is given


def test_config_ssl_context_bad_files(tmp_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ValueError, match="cannot set up TLS"):
        Config(tls_v1=True, tls_cert=str(bad), tls_key=str(bad)).ssl_context()
    with pytest.raises(ValueError, match="tls_min_version"):
        Config(tls_v1=True, tls_min_version="tls9").ssl_context()


def test_take_unparsed_and_decompress_hand_over_the_stream():
    core = new_core(snappy=True)
    server_out = SnappyEncoder()
    stream = identify_response(snappy=True) + server_out.encode(OK_FRAME + HEARTBEAT_FRAME[:5])
    events = feed(core, stream, "whole")
    assert type(events[0]) is Connected
    assert core.take_unparsed() == HEARTBEAT_FRAME[:5]  # decompressed, frames not yet complete
    assert core.decompress(server_out.encode(HEARTBEAT_FRAME[5:])) == HEARTBEAT_FRAME[5:]


# -- addresses and the package ------------------------------------------------------------------


@pytest.mark.parametrize(
    "address, expected",
    [("127.0.0.1:4150", ("127.0.0.1", 4150)), ("[::1]:4150", ("::1", 4150)), ("nsqd.example:1", ("nsqd.example", 1))],
)
def test_split_address(address, expected):
    assert split_address(address) == expected


@pytest.mark.parametrize("address", ["localhost", ":4150", "h:0", "h:65536", "h:x", "h:"])
def test_split_address_refuses(address):
    with pytest.raises(ValueError, match="invalid nsqd address"):
        split_address(address)


def test_public_api():
    # submodules imported elsewhere (trionsq.blocking by its tests) show up as attributes: not re-exports
    public = {
        name
        for name in dir(trionsq)
        if not name.startswith("_") and not isinstance(getattr(trionsq, name), types.ModuleType)
    }
    assert public == {
        "AuthResult",
        "Config",
        "ConnectError",
        "Connection",
        "ConnectionClosed",
        "Consumer",
        "ConsumerStats",
        "Features",
        "LookupdError",
        "Message",
        "NSQError",
        "NoAvailableNsqd",
        "Producer",
        "ProducerStats",
        "lookup",
        "open_connection",
    }
    for name in public:
        assert getattr(trionsq, name).__module__.startswith("trionsq.") or name == "lookup"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        trionsq.Nope  # noqa: B018


def test_importing_the_package_does_not_import_trio():
    code = "import sys, trionsq, trionsq._core; assert 'trio' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
