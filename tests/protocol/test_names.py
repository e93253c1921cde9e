import pytest

from protocol.names import (
    MAX_NAME_LENGTH,
    decode_name,
    encode_name,
    go_quote,
    is_ephemeral,
    is_valid_channel_name,
    is_valid_name_bytes,
    is_valid_topic_name,
)

VALID = [
    "a",
    "A",
    "0",
    ".",
    "-",
    "_",
    "Az09.-_",
    "..",
    "x" * 64,
    "t#ephemeral",
    "x" * 54 + "#ephemeral",  # the suffix counts: exactly 64
    "archive.2024-01_x",
]
INVALID = [
    "",
    "x" * 65,
    "x" * 55 + "#ephemeral",  # 65 with the suffix
    "#ephemeral",
    "a#b",
    "a#",
    "a#ephemeral#ephemeral",
    "a#ephemeralx",
    "a#Ephemeral",
    "#ephemeral#ephemeral",
    "a b",
    " a",
    "a\n",  # a regex anchored with Python's $ would accept this
    "a\r",
    "a\x00",
    "a/b",
    "a:b",
    "a*",
    "t\u00f3pico",
    "\u0430",  # Cyrillic a
    "a\udcff",  # a raw 0xff byte from the wire
]


@pytest.mark.parametrize("name", VALID)
def test_valid(name):
    assert is_valid_topic_name(name)
    assert is_valid_channel_name(name)
    assert is_valid_name_bytes(encode_name(name))


@pytest.mark.parametrize("name", INVALID)
def test_invalid(name):
    assert not is_valid_topic_name(name)
    assert not is_valid_channel_name(name)
    assert not is_valid_name_bytes(encode_name(name))


def test_max_length_constant():
    assert MAX_NAME_LENGTH == 64


@pytest.mark.parametrize(
    "name, expected",
    [("t#ephemeral", True), ("x#ephemeral", True), ("t", False), ("t#ephemera", False), ("ephemeral", False)],
)
def test_is_ephemeral(name, expected):
    assert is_ephemeral(name) is expected


@pytest.mark.parametrize("raw", [b"topic", b"t\xff", b"\xc3\xa9", b"\xed\xa0\x80", b""])
def test_decode_encode_round_trip_any_bytes(raw):
    assert encode_name(decode_name(raw)) == raw


# Go's %q (strconv.Quote): backslash escapes, \xNN for control bytes and invalid UTF-8,
# printable Unicode as is, other runes as \uNNNN or \UNNNNNNNN.
GO_QUOTE = [
    ("x y", '"x y"'),
    ("", '""'),
    ('a"b', '"a\\"b"'),
    ("a\\b", '"a\\\\b"'),
    ("\a\b\f\n\r\t\v", '"\\a\\b\\f\\n\\r\\t\\v"'),
    ("\x00\x1b", '"\\x00\\x1b"'),
    ("\x7f", '"\\x7f"'),
    ("t\u00e9", '"t\u00e9"'),
    ("\u00a0", '"\\u00a0"'),  # no-break space: not printable for Go
    ("\u00ad", '"\\u00ad"'),  # soft hyphen
    ("\u2028", '"\\u2028"'),
    ("\U0001f600", '"\U0001f600"'),
    ("\U000e0001", '"\\U000e0001"'),
    ("'", '"\'"'),
]


@pytest.mark.parametrize("text, quoted", GO_QUOTE)
def test_go_quote(text, quoted):
    assert go_quote(text) == quoted


@pytest.mark.parametrize(
    "raw, quoted",
    [
        (b"t\xff", '"t\\xff"'),
        (b"\xed\xa0\x80", '"\\xed\\xa0\\x80"'),  # an encoded surrogate is invalid UTF-8 for Go too
        (b"\xc3", '"\\xc3"'),  # truncated sequence
        (b"ok\xc3\xa9", '"ok\u00e9"'),
    ],
)
def test_go_quote_of_wire_bytes(raw, quoted):
    assert go_quote(decode_name(raw)) == quoted
