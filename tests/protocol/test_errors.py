import pickle

import pytest

from protocol import errors
from protocol.errors import LineTooLong, ProtocolError

# NSQ's list (the only non-fatal ones are the three "failed" answers to FIN, REQ and TOUCH).
FATAL = [
    "E_INVALID",
    "E_BAD_BODY",
    "E_BAD_TOPIC",
    "E_BAD_CHANNEL",
    "E_BAD_MESSAGE",
    "E_PUB_FAILED",
    "E_MPUB_FAILED",
    "E_DPUB_FAILED",
    "E_SUB_FAILED",
    "E_IDENTIFY_FAILED",
    "E_AUTH_FAILED",
    "E_AUTH_FIRST",
    "E_AUTH_DISABLED",
    "E_AUTH_ERROR",
    "E_UNAUTHORIZED",
    "E_BAD_PROTOCOL",
]
NON_FATAL = ["E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"]


@pytest.mark.parametrize("code", FATAL + NON_FATAL)
def test_each_code_has_a_constant_spelled_as_itself(code):
    assert getattr(errors, code) == code


@pytest.mark.parametrize("code", FATAL)
def test_fatal_by_default(code):
    assert ProtocolError(code, "x").fatal is True


@pytest.mark.parametrize("code", NON_FATAL)
def test_non_fatal_by_default(code):
    assert ProtocolError(code, "x").fatal is False


def test_non_fatal_set():
    assert frozenset(NON_FATAL) == errors.NON_FATAL_CODES


def test_explicit_fatal_flag_wins():
    assert ProtocolError("E_FIN_FAILED", "x", fatal=True).fatal is True
    assert ProtocolError("E_INVALID", "x", fatal=False).fatal is False


@pytest.mark.parametrize(
    "code, description, payload",
    [
        ("E_BAD_PROTOCOL", "", b"E_BAD_PROTOCOL"),
        ("E_INVALID", "invalid command ", b"E_INVALID invalid command "),
        ("E_INVALID", "invalid command NOPE", b"E_INVALID invalid command NOPE"),
        (
            "E_BAD_TOPIC",
            'PUB topic name "t\u00e9" is not valid',
            b'E_BAD_TOPIC PUB topic name "t\xc3\xa9" is not valid',
        ),
        # raw wire bytes decoded with surrogateescape come back unchanged
        ("E_INVALID", "RDY could not parse count \udcff", b"E_INVALID RDY could not parse count \xff"),
    ],
)
def test_payload(code, description, payload):
    err = ProtocolError(code, description)
    assert err.payload() == payload
    assert err.code == code and err.description == description


def test_str_is_the_wire_text():
    assert str(ProtocolError("E_INVALID", "nope")) == "E_INVALID nope"
    assert str(ProtocolError("E_BAD_PROTOCOL")) == "E_BAD_PROTOCOL"


def test_pickle_keeps_every_field():
    err = pickle.loads(pickle.dumps(ProtocolError("E_FIN_FAILED", "FIN x failed", fatal=True)))
    assert (err.code, err.description, err.fatal) == ("E_FIN_FAILED", "FIN x failed", True)


def test_line_too_long_is_not_a_protocol_error():
    # The connection loop sends an error frame for every ProtocolError; a long line gets none.
    assert not issubclass(LineTooLong, ProtocolError)
    assert LineTooLong(16384).limit == 16384
