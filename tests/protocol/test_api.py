"""Pins the public API of ``protocol`` (nsqd, the tests and the Spark connector build on it)."""

import os
import subprocess
import sys
import types
from pathlib import Path

import protocol

PUBLIC = {
    # errors
    "ProtocolError",
    "LineTooLong",
    "NON_FATAL_CODES",
    "E_INVALID",
    "E_BAD_BODY",
    "E_BAD_TOPIC",
    "E_BAD_CHANNEL",
    "E_BAD_MESSAGE",
    "E_BAD_PROTOCOL",
    "E_PUB_FAILED",
    "E_MPUB_FAILED",
    "E_DPUB_FAILED",
    "E_SUB_FAILED",
    "E_FIN_FAILED",
    "E_REQ_FAILED",
    "E_TOUCH_FAILED",
    "E_IDENTIFY_FAILED",
    "E_AUTH_FAILED",
    "E_AUTH_FIRST",
    "E_AUTH_DISABLED",
    "E_AUTH_ERROR",
    "E_UNAUTHORIZED",
    # names
    "MAX_NAME_LENGTH",
    "EPHEMERAL_SUFFIX",
    "is_valid_topic_name",
    "is_valid_channel_name",
    "is_valid_name_bytes",
    "is_ephemeral",
    "go_quote",
    "decode_name",
    "encode_name",
    # frames
    "FRAME_TYPE_RESPONSE",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "encode_frame",
    "encode_error_frame",
    "OK_FRAME",
    "HEARTBEAT_FRAME",
    "CLOSE_WAIT_FRAME",
    "Frame",
    "FrameDecoder",
    # message
    "MESSAGE_HEADER_SIZE",
    "MESSAGE_ID_LENGTH",
    "Message",
    "encode_message",
    "decode_message",
    "encode_message_frame",
    "message_id_from_int",
    "message_id_to_int",
    # commands
    "Command",
    "CommandParser",
    "parse_base10",
    "ms_to_go_duration",
    "MAGIC_V2",
    "NOP",
    "CLS",
    "encode_command",
    "encode_identify",
    "encode_auth",
    "encode_sub",
    "encode_rdy",
    "encode_fin",
    "encode_req",
    "encode_touch",
    "encode_pub",
    "encode_dpub",
    "encode_mpub",
    # identify
    "IdentifyLimits",
    "IdentifyResult",
    "negotiate",
}


def test_public_names():
    # Submodules show up as attributes once imported; they are not re-exports.
    exported = {n for n, v in vars(protocol).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert exported == PUBLIC


def test_each_module_all_matches_the_package():
    from protocol import commands, errors, frames, identify, message, names

    union = set()
    for module in (commands, errors, frames, identify, message, names):
        union |= set(module.__all__)
    assert union == PUBLIC


def test_imported_from_this_checkout():
    assert Path(protocol.__file__).resolve().parent == Path(__file__).resolve().parents[2] / "protocol"


def test_no_io_or_event_loop_imports():
    code = (
        "import sys; import protocol; "
        "print(sorted(m for m in ('trio', 'socket', 'asyncio', 'ssl', 'selectors') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
