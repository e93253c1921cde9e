"""nsqd/fastpath.py's reads and write, in C (nsqd/_speedups.c) and in Python: the same answers for the same bytes.

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
from protocol.frames import OK_FRAME

try:
    from nsqd import _speedups
except ImportError:  # not built here
    _speedups = None


class Twins:
    def __init__(self, module, prefix: str = "") -> None:
        self.read_pubs = getattr(module, prefix + "read_pubs", None)
        self.read_pubs_many = getattr(module, prefix + "read_pubs_many", None)
        self.write_oks = getattr(module, prefix + "write_oks", None)



IMPLEMENTATIONS = [
    pytest.param(Twins(fastpath, "_"), id="python"),
    pytest.param(Twins(_speedups), id="c", marks=pytest.mark.skipif(_speedups is None, reason="nsqd._speedups not built")),
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
    return impl.read_pubs(left.fileno(), LINE, max_size)


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
        impl.read_pubs(-1, LINE, 10)
    assert caught.value.errno == errno.EBADF


def test_write_oks_writes_each_socket_its_oks(impl, pair):
    other = socket.socketpair()
    try:
        assert impl.write_oks([pair[0].fileno(), other[0].fileno(), -1], [1, 70, 2]) == [(2, -errno.EBADF)]
        assert pair[1].recv(100) == OK_FRAME
        assert recv_all(other[1], 700) == OK_FRAME * 70  # more than the C side's static run
    finally:
        for sock in other:
            sock.close()
    with pytest.raises(ValueError):
        impl.write_oks([1], [])


def test_a_full_socket_takes_part_of_the_oks(impl, pair):
    left, _ = pair
    left.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    many = 1 << 18
    [(index, sent)] = impl.write_oks([left.fileno()], [many])
    assert index == 0 and 0 < sent < many * len(OK_FRAME)
    assert impl.write_oks([left.fileno()], [many]) == [(0, -errno.EAGAIN)]


def recv_all(sock, size: int) -> bytes:
    sock.setblocking(True)
    data = b""
    while len(data) < size:
        data += sock.recv(size - len(data))
    return data


# -- read_pubs_many: several connections in one call --------------------------------------------------

@pytest.fixture
def pairs():
    made = [socket.socketpair() for _ in range(3)]
    for left, right in made:
        left.setblocking(False)
    yield made
    for pair_ in made:
        for sock in pair_:
            sock.close()


def read_many(impl, pairs, datas, lines=None, topics=None, max_size=1 << 20):
    for (_, right), data in zip(pairs, datas):
        if data:
            right.sendall(data)
    fds = [left.fileno() for left, _ in pairs]
    return impl.read_pubs_many(fds, lines or [LINE] * len(fds), topics or [b"topic"] * len(fds), max_size)


def test_whole_pubs_of_several_connections_grouped_by_topic_in_read_order(impl, pairs):
    other = b"PUB other\n"
    datas = [encode_pub("topic", b"a1") + encode_pub("topic", b"a2"), encode_pub("other", b"b1"),
             encode_pub("topic", b"c1")]
    by_topic, results = read_many(impl, pairs, datas, lines=[LINE, other, LINE],
                                  topics=[b"topic", b"other", b"topic"])
    assert by_topic == {b"topic": [b"a1", b"a2", b"c1"], b"other": [b"b1"]}
    assert results == [(len(datas[0]), 2), (len(datas[1]), 1), (len(datas[2]), 1)]


@pytest.mark.parametrize("data", [
    encode_pub("topic", b"one") + b"NOP\n" + encode_pub("topic", b"two"),  # another command mid-stream
    encode_pub("topic", b"one") + encode_pub("topic", b"two")[:-1],  # trailing bytes: a PUB cut short
    encode_pub("topic", b"one") + b"PUB top",  # a line cut short
    encode_pub("other", b"one"),  # another topic
    b"PUB topic\n" + struct.pack(">i", 0),  # sizes the parser refuses (E_BAD_MESSAGE there)
    b"PUB topic\n" + struct.pack(">i", 11) + b"x" * 11,  # over max_size (10)
])
def test_anything_else_comes_back_intact_and_alone(impl, pairs, data):
    whole = encode_pub("topic", b"ok")
    by_topic, results = read_many(impl, pairs, [whole, data, whole], max_size=10)
    assert by_topic == {b"topic": [b"ok", b"ok"]}
    assert results == [(len(whole), 1), data, (len(whole), 1)]


def test_a_pub_byte_by_byte_comes_back_as_each_read(impl, pairs):
    data = encode_pub("topic", b"body")
    got = b""
    for byte in data:
        by_topic, results = read_many(impl, pairs[:1], [bytes([byte])])
        assert by_topic == {} and type(results[0]) is bytes
        got += results[0]
    assert got == data


def test_a_pub_across_two_reads_comes_back_as_read(impl, pairs):
    data = encode_pub("topic", b"x" * 300)
    first, second = data[:150], data[150:]
    assert read_many(impl, pairs[:1], [first]) == ({}, [first])
    assert read_many(impl, pairs[:1], [second]) == ({}, [second])
    # the general parser joins them; the next read of whole PUBs takes the fast path again
    assert read_many(impl, pairs[:1], [data]) == ({b"topic": [b"x" * 300]}, [(len(data), 1)])


def test_nothing_to_read_end_of_input_and_a_bad_descriptor(impl, pairs):
    pairs[1][1].shutdown(socket.SHUT_WR)
    by_topic, results = read_many(impl, pairs, [b"", b"", encode_pub("topic", b"z")])
    assert by_topic == {b"topic": [b"z"]}
    assert results[0] is None and results[1] == b""
    by_topic, results = impl.read_pubs_many([-1], [LINE], [b"topic"], 10)
    assert by_topic == {} and isinstance(results[0], OSError) and results[0].errno == errno.EBADF
    with pytest.raises(ValueError):
        impl.read_pubs_many([1], [], [], 10)


def test_a_reset_connection_is_its_own_error(impl):
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    healthy = socket.socketpair()
    try:
        server.setblocking(False)
        healthy[0].setblocking(False)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # an RST
        healthy[1].sendall(encode_pub("topic", b"fine"))
        by_topic, results = impl.read_pubs_many([server.fileno(), healthy[0].fileno()], [LINE, LINE],
                                                [b"topic", b"topic"], 10)
        assert isinstance(results[0], ConnectionResetError) and results[0].errno == errno.ECONNRESET
        assert by_topic == {b"topic": [b"fine"]} and results[1] == (len(encode_pub("topic", b"fine")), 1)
    finally:
        for sock in (listener, server, *healthy):
            sock.close()


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
