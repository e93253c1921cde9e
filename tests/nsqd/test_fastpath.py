"""nsqd/fastpath.py's read and write, in C (nsqd/_speedups.c) and in Python: the same answers for the same bytes.

The C module is built by ``pip install -e .`` where a compiler is present; without it its cases are skipped (the
Python ones still run), and ``test_the_accelerator_is_built`` says so unless TRIONSQ_ALLOW_NO_SPEEDUPS=1."""

from __future__ import annotations

import errno
import os
import socket
import struct

import pytest

from nsqd import fastpath
from protocol.commands import encode_command, encode_pub

try:
    from nsqd import _speedups
except ImportError:  # not built here
    _speedups = None

IMPLEMENTATIONS = [
    pytest.param((fastpath._read_pubs, fastpath._write_many), id="python"),
    pytest.param((getattr(_speedups, "read_pubs", None), getattr(_speedups, "write_many", None)), id="c",
                 marks=pytest.mark.skipif(_speedups is None, reason="nsqd._speedups not built")),
]
LINE = b"PUB topic\n"


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request):
    return request.param


@pytest.fixture
def pair():
    left, right = socket.socketpair()
    left.setblocking(False)
    right.setblocking(False)
    yield left, right
    left.close()
    right.close()


def read(impl, pair, data: bytes, max_size: int = 1 << 20):
    left, right = pair
    if data:
        right.sendall(data)
    return impl[0](left.fileno(), LINE, max_size)


def test_the_accelerator_is_built():
    if _speedups is None and os.environ.get("TRIONSQ_ALLOW_NO_SPEEDUPS") != "1":
        pytest.fail("nsqd._speedups is not built: pip install -e . needs a C compiler and Python's headers")


def test_whole_pubs_of_the_line_come_back_as_bodies(impl, pair):
    data = encode_pub("topic", b"one") + encode_pub("topic", b"two" * 100) + encode_pub("topic", b"3")
    assert read(impl, pair, data) == (len(data), [b"one", b"two" * 100, b"3"])


@pytest.mark.parametrize("data", [
    encode_pub("topic", b"one") + b"NOP\n",  # another command after
    encode_pub("topic", b"one")[:-1],  # a body cut short
    encode_pub("topic", b"one") + b"PUB top",  # a line cut short
    encode_pub("other", b"one"),  # another topic
    encode_command(b"DPUB", b"topic", b"10", body=b"x"),
    b"PUB topic\n" + struct.pack(">i", 0),  # sizes the parser refuses
    b"PUB topic\n" + struct.pack(">i", -1) + b"x",
    b"PUB topic\n" + struct.pack(">i", 11) + b"x" * 11,  # over max_size (10)
    b"PUB topic\r\n" + struct.pack(">i", 1) + b"x",
])
def test_anything_else_comes_back_as_read(impl, pair, data):
    assert read(impl, pair, data, max_size=10) == data


def test_nothing_to_read_end_of_input_and_errors(impl, pair):
    assert read(impl, pair, b"") is None
    pair[1].shutdown(socket.SHUT_WR)
    assert read(impl, pair, b"") == b""
    with pytest.raises(OSError) as caught:
        impl[0](-1, LINE, 10)
    assert caught.value.errno == errno.EBADF


def test_write_many_writes_each_buffer_to_its_socket(impl, pair):
    other = socket.socketpair()
    try:
        result = impl[1]([pair[0].fileno(), other[0].fileno(), -1], [b"abc", b"de", b"f"])
        assert result == [3, 2, -errno.EBADF]
        assert pair[1].recv(10) == b"abc"
        assert other[1].recv(10) == b"de"
    finally:
        for sock in other:
            sock.close()
    with pytest.raises(ValueError):
        impl[1]([1], [])


def test_a_full_socket_takes_part(impl, pair):
    left, _ = pair
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = b"x" * (1 << 22)
    sent = impl[1]([left.fileno()], [big])[0]
    assert 0 < sent < len(big)
    assert impl[1]([left.fileno()], [big]) == [-errno.EAGAIN]


def test_the_choice_follows_the_environment(monkeypatch):
    import importlib

    monkeypatch.setenv("TRIONSQ_NO_SPEEDUPS", "1")
    module = importlib.reload(fastpath)
    try:
        assert not module.ACCELERATED and module.read_pubs is module._read_pubs
    finally:
        monkeypatch.delenv("TRIONSQ_NO_SPEEDUPS")
        module = importlib.reload(fastpath)
    assert module.ACCELERATED is (_speedups is not None)
