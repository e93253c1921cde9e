"""nsqd/fastpath.py's reads, writes and counts, in C (nsqd/_speedups.c) and in Python: the same answers for the same
bytes.

The C module is built by ``pip install -e .`` where a compiler is present; without it its cases are skipped (the
Python ones still run), and ``test_the_accelerator_is_built`` says so unless TRIONSQ_ALLOW_NO_SPEEDUPS=1."""

from __future__ import annotations

import ctypes
import errno
import math
import os
import select
import socket
import struct

import pytest
import trio

from nsqd import fastpath
from nsqd.client import Client
from protocol.commands import encode_command, encode_pub
from protocol.frames import OK_FRAME

try:
    from nsqd import _speedups
except ImportError:  # not built here
    _speedups = None


class Twins:
    def __init__(self, module, prefix: str = "", uring: bool = True) -> None:
        self.module = module
        self.uring = uring  # the C module's reads and writes through its io_uring, or one system call each
        self.read_pubs = getattr(module, prefix + "read_pubs", None)
        self.read_producers = getattr(module, prefix + "read_producers", None)
        self.poll_producers = getattr(module, prefix + "poll_producers", None)
        self.count_published = getattr(module, prefix + "count_published", None)
        self.write_oks = getattr(module, prefix + "write_oks", None)


NOT_BUILT = pytest.mark.skipif(_speedups is None, reason="nsqd._speedups not built")
IMPLEMENTATIONS = [
    pytest.param(Twins(fastpath, "_"), id="python"),
    pytest.param(Twins(_speedups), id="c", marks=NOT_BUILT),
    pytest.param(Twins(_speedups, uring=False), id="c-syscalls", marks=NOT_BUILT),
]
LINE = b"PUB topic\n"


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request):
    twins = request.param
    if twins.module is _speedups:
        _speedups.use_uring(twins.uring)
    yield twins
    if twins.module is _speedups:
        _speedups.use_uring(True)


def kernel_gives_a_ring() -> bool:
    """Whether io_uring_setup(2) works for this process (a kernel with io_uring, not turned off, no seccomp
    profile refusing it), asked without the module under test."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    fd = libc.syscall(425, 4, params)  # __NR_io_uring_setup on x86-64 and arm64
    if fd < 0:
        return False
    os.close(fd)
    return True


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


@NOT_BUILT
def test_the_ring_is_used_where_the_kernel_gives_one():
    assert _speedups.use_uring(True) is kernel_gives_a_ring()
    assert _speedups.use_uring(False) is False and _speedups.use_uring() is False  # given up until asked again
    assert _speedups.use_uring(True) is kernel_gives_a_ring()


def test_whole_pubs_of_the_line_come_back_as_bodies(impl, pair):
    data = encode_pub("topic", b"one") + encode_pub("topic", b"two" * 100) + encode_pub("topic", b"3")
    assert read(impl, pair, data) == (len(data), [b"one", b"two" * 100, b"3"])


@pytest.mark.parametrize(
    "data",
    [
        encode_pub("topic", b"one") + b"NOP\n",  # another command after
        encode_pub("topic", b"one")[:-1],  # a body cut short
        encode_pub("topic", b"one") + b"PUB top",  # a line cut short
        encode_pub("other", b"one"),  # another topic
        encode_command(b"DPUB", b"topic", b"10", body=b"x"),
        b"PUB topic\n" + struct.pack(">i", 0),  # sizes the parser refuses
        b"PUB topic\n" + struct.pack(">i", -1) + b"x",
        b"PUB topic\n" + struct.pack(">i", 11) + b"x" * 11,  # over max_size (10)
        b"PUB topic\r\n" + struct.pack(">i", 1) + b"x",
    ],
)
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


# -- a step's producers: read_producers and poll_producers ---------------------------------------------


class Producer:
    """What the step's reads look at and set on a connection (``Connection`` in nsqd/tcp.py has these names):
    the cached line of its PUBs, its client (the output, the published counts), the writer's lock, the size of
    its last read, when its read deadline moves and its place in the poller's order."""

    def __init__(self, sock, line: bytes | None = LINE, topic: bytes = b"topic") -> None:
        self.sock = sock
        self.fast_line = (line, topic) if line is not None else None
        self.client = Client(
            1,
            "127.0.0.1:1",
            msg_timeout=60.0,
            heartbeat_interval=30.0,
            output_buffer_size=16384,
            output_buffer_timeout=0.25,
        )
        self._send_lock = trio.Lock()
        self.last_read = 0
        self._read_moves_at = math.inf
        self.poll_actor = None

    def __repr__(self) -> str:
        return f"Producer({self.sock.fileno()})"


@pytest.fixture
def pairs():
    made = [socket.socketpair() for _ in range(3)]
    for left, _ in made:
        left.setblocking(False)
    yield made
    for pair_ in made:
        for sock in pair_:
            sock.close()


def producers_of(pairs, lines=None, topics=None) -> list[Producer]:
    lines = lines or [LINE] * len(pairs)
    topics = topics or [b"topic"] * len(pairs)
    return [Producer(left, line, topic) for (left, _), line, topic in zip(pairs, lines, topics, strict=True)]


def read_many(impl, pairs, datas, producers=None, max_size=1 << 20, step_time=0.0):
    """``read_producers`` over the pairs' left ends, after the right ends sent ``datas``: (groups, rest, others,
    late)."""
    producers = producers or producers_of(pairs)
    for (_, right), data in zip(pairs, datas, strict=True):
        if data:
            right.sendall(data)
    members = {producer.sock.fileno(): producer for producer in producers}
    groups: dict = {}
    rest, others, late = impl.read_producers([left.fileno() for left, _ in pairs], members, max_size, groups, step_time)
    return groups, rest, others, late


def test_whole_pubs_of_several_connections_grouped_by_topic_in_read_order(impl, pairs):
    other = b"PUB other\n"
    producers = producers_of(pairs, lines=[LINE, other, LINE], topics=[b"topic", b"other", b"topic"])
    datas = [
        encode_pub("topic", b"a1") + encode_pub("topic", b"a2"),
        encode_pub("other", b"b1"),
        encode_pub("topic", b"c1"),
    ]
    groups, rest, others, late = read_many(impl, pairs, datas, producers)
    fds = [left.fileno() for left, _ in pairs]
    assert groups == {
        b"topic": [[b"a1", b"a2", b"c1"], [producers[0], producers[2]], [fds[0], fds[2]], [2, 1]],
        b"other": [[b"b1"], [producers[1]], [fds[1]], [1]],
    }
    assert (rest, others, late) == ([], [], [])
    assert [producer.last_read for producer in producers] == [len(data) for data in datas]


def test_a_step_adds_to_the_groups_it_is_given(impl, pairs):
    producers = producers_of(pairs)
    groups = {b"topic": [[b"before"], ["someone"], [99], [1]]}
    pairs[0][1].sendall(encode_pub("topic", b"after"))
    impl.read_producers([pairs[0][0].fileno()], {pairs[0][0].fileno(): producers[0]}, 100, groups, 0.0)
    assert groups == {b"topic": [[b"before", b"after"], ["someone", producers[0]], [99, pairs[0][0].fileno()], [1, 1]]}


@pytest.mark.parametrize(
    "data",
    [
        encode_pub("topic", b"one") + b"NOP\n" + encode_pub("topic", b"two"),  # another command mid-stream
        encode_pub("topic", b"one") + encode_pub("topic", b"two")[:-1],  # trailing bytes: a PUB cut short
        encode_pub("topic", b"one") + b"PUB top",  # a line cut short
        encode_pub("other", b"one"),  # another topic
        b"PUB topic\n" + struct.pack(">i", 0),  # sizes the parser refuses (E_BAD_MESSAGE there)
        b"PUB topic\n" + struct.pack(">i", 11) + b"x" * 11,  # over max_size (10)
    ],
)
def test_anything_else_comes_back_intact_and_alone(impl, pairs, data):
    whole = encode_pub("topic", b"ok")
    producers = producers_of(pairs)
    groups, rest, others, late = read_many(impl, pairs, [whole, data, whole], producers, max_size=10)
    assert groups[b"topic"][0] == [b"ok", b"ok"] and groups[b"topic"][1] == [producers[0], producers[2]]
    assert others == [(producers[1], data)] and rest == [] and late == []
    assert producers[1].last_read == 0  # the parser's read sets it (Connection.poll_data)


def test_a_pub_byte_by_byte_comes_back_as_each_read(impl, pairs):
    data = encode_pub("topic", b"body")
    producers = producers_of(pairs[:1])
    got = b""
    for byte in data:
        groups, rest, others, _ = read_many(impl, pairs[:1], [bytes([byte])], producers)
        assert groups == {} and rest == [] and others[0][0] is producers[0] and type(others[0][1]) is bytes
        got += others[0][1]
    assert got == data


def test_a_pub_across_two_reads_comes_back_as_read(impl, pairs):
    data = encode_pub("topic", b"x" * 300)
    producers = producers_of(pairs[:1])
    first, second = data[:150], data[150:]
    assert read_many(impl, pairs[:1], [first], producers)[:3] == ({}, [], [(producers[0], first)])
    assert read_many(impl, pairs[:1], [second], producers)[:3] == ({}, [], [(producers[0], second)])
    # the general parser joins them; the next read of whole PUBs takes the fast path again
    groups = read_many(impl, pairs[:1], [data], producers)[0]
    assert groups[b"topic"][0] == [b"x" * 300]


def test_nothing_to_read_end_of_input_and_a_bad_descriptor(impl, pairs):
    producers = producers_of(pairs)
    pairs[1][1].shutdown(socket.SHUT_WR)
    groups, rest, others, _ = read_many(impl, pairs, [b"", b"", encode_pub("topic", b"z")], producers)
    assert groups[b"topic"][0] == [b"z"] and groups[b"topic"][1] == [producers[2]]
    assert rest == [] and others == [(producers[1], b"")]  # nothing to read: nothing to say
    closed = Producer(pairs[0][0])
    rest, others, late = impl.read_producers([-1], {-1: closed}, 10, {}, 0.0)
    assert rest == [] and late == [] and others[0][0] is closed
    assert isinstance(others[0][1], OSError) and others[0][1].errno == errno.EBADF


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
        reset, fine = Producer(server), Producer(healthy[0])
        groups: dict = {}
        rest, others, _ = impl.read_producers(
            [server.fileno(), healthy[0].fileno()], {server.fileno(): reset, healthy[0].fileno(): fine}, 10, groups, 0.0
        )
        [(who, error)] = others
        assert who is reset and isinstance(error, ConnectionResetError) and error.errno == errno.ECONNRESET
        assert groups[b"topic"][:2] == [[b"fine"], [fine]] and rest == []
    finally:
        for sock in (listener, server, *healthy):
            sock.close()


def test_members_that_must_go_through_the_parser_are_left_unread(impl, pairs):
    producers = producers_of(pairs, lines=[None, LINE, LINE])  # the first has no PUB line to skip the parser with
    producers[1].client.out.append(b"an answer not yet sent")
    no_connection = type("Acks", (), {})()  # a member that is no connection (a replication peer's ACKs)
    left_over = socket.socketpair()
    try:
        left_over[0].setblocking(False)
        data = encode_pub("topic", b"x")
        for _, right in (*pairs, left_over):
            right.sendall(data)
        fds = [left.fileno() for left, _ in pairs]
        members = {fds[0]: producers[0], fds[1]: producers[1], fds[2]: no_connection}
        fds.append(left_over[0].fileno())  # no member at all (it left earlier in the step)
        groups: dict = {}
        assert impl.read_producers(fds, members, 100, groups, 0.0) == (fds, [], [])
        assert groups == {}
        for left, _ in (*pairs, left_over):
            assert left.recv(100) == data  # still there, for the member's own read
    finally:
        for sock in left_over:
            sock.close()


async def test_a_write_under_way_leaves_the_producer_unread(impl, pairs):
    producers = producers_of(pairs[:1])
    async with producers[0]._send_lock:
        groups, rest, others, _ = read_many(impl, pairs[:1], [encode_pub("topic", b"x")], producers)
    assert (groups, rest, others) == ({}, [pairs[0][0].fileno()], [])
    assert fastpath.fast_line_of(producers[0]) == (LINE, b"topic")  # and once the write is done, it may


def test_a_read_past_the_deadline_mark_is_listed(impl, pairs):
    producers = producers_of(pairs)
    producers[0]._read_moves_at = 5.0
    producers[1]._read_moves_at = 15.0
    data = encode_pub("topic", b"x")
    _, _, _, late = read_many(impl, pairs, [data, data, data], producers, step_time=10.0)
    assert late == [producers[0]]


def test_poll_producers_reads_the_ready_light_producers_and_returns_the_rest(impl, pairs):
    more = [socket.socketpair() for _ in range(3)]
    epoll = select.epoll()
    try:
        for left, _ in more:
            left.setblocking(False)
        producers = producers_of(pairs)
        consumer, heavy, unchecked = Producer(more[0][0]), Producer(more[1][0]), Producer(more[2][0], None)
        consumer.poll_actor = object()  # a consumer: ranked by its channel, served by the poller's own order
        heavy.last_read = 4096  # an MPUB producer: served after the light ones
        members = {member.sock.fileno(): member for member in (*producers, consumer, heavy, unchecked)}
        idle = socket.socketpair()
        for left, _ in (*pairs, *more, idle):
            epoll.register(left.fileno(), select.EPOLLIN)
        members[idle[0].fileno()] = Producer(idle[0])  # registered, nothing sent: not ready
        data = encode_pub("topic", b"x")
        for _, right in (*pairs, *more):
            right.sendall(data)
        groups: dict = {}
        events, taken, others, late = impl.poll_producers(epoll, members, 2048, 100, groups, 0.0)
        assert sorted(taken) == sorted(left.fileno() for left, _ in pairs)
        assert sorted(events) == sorted((left.fileno(), select.EPOLLIN) for left, _ in more)
        assert others == [] and late == []
        assert groups[b"topic"][0] == [b"x"] * 3 and set(groups[b"topic"][1]) == set(producers)
        # nothing ready: nothing read, nothing returned
        assert impl.poll_producers(epoll, members, 2048, 100, {}, 0.0)[:2] == (events, [])
    finally:
        epoll.close()
        for pair_ in (*more, idle):
            for sock in pair_:
                sock.close()


def test_more_connections_than_one_ring_holds(impl):
    """A step of 150 producers: the C module reads and writes them in several batches of its ring (64 each);
    same answers, in order."""
    made = [socket.socketpair() for _ in range(150)]
    epoll = select.epoll()
    try:
        producers = []
        for index, (left, right) in enumerate(made):
            left.setblocking(False)
            epoll.register(left.fileno(), select.EPOLLIN)
            producers.append(Producer(left))
            right.sendall(encode_pub("topic", b"%d" % index) if index % 7 else b"NOP\n")
        members = {producer.sock.fileno(): producer for producer in producers}
        groups: dict = {}
        events, taken, others, late = impl.poll_producers(epoll, members, 2048, 100, groups, 0.0)
        assert events == [] and late == [] and len(taken) == 150
        assert others == [(producers[index], b"NOP\n") for index in range(0, 150, 7)]
        bodies, readers, fds, counts = (list(column) for column in groups[b"topic"])
        assert sorted(bodies, key=int) == [b"%d" % index for index in range(150) if index % 7]
        assert [int(body) for body in bodies] == [producers.index(reader) for reader in readers]
        for index, (_, right) in enumerate(made):
            if index % 7:
                right.sendall(encode_pub("topic", b"again"))
        rest, others, _ = impl.read_producers([left.fileno() for left, _ in made], members, 100, groups, 0.0)
        assert rest == [] and others == []
        assert groups[b"topic"][0].count(b"again") == len(bodies)
        assert impl.write_oks(fds, [index % 3 + 1 for index in range(len(fds))]) == []
        for index, reader in enumerate(readers):
            assert recv_all(made[producers.index(reader)][1], 10 * (index % 3 + 1)) == OK_FRAME * (index % 3 + 1)
    finally:
        epoll.close()
        for pair_ in made:
            for sock in pair_:
                sock.close()


def test_count_published_adds_to_each_producers_figures(impl, pairs):
    producers = producers_of(pairs[:2])
    producers[0].client.published("topic", 5)
    impl.count_published(producers, [2, 3], "topic")
    assert [producer.client.pub_counts for producer in producers] == [{"topic": 7}, {"topic": 3}]
    with pytest.raises(ValueError):
        impl.count_published(producers, [1], "topic")


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
