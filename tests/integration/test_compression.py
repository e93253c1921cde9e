"""snappy and deflate on the V2 connection (NSQ-FACTS 2.3, 2.4): negotiation, the upgrade, the exact OK bytes,
traffic in both directions, and corrupt input that must close only the guilty connection."""

from __future__ import annotations

import socket
import struct
import uuid
import zlib

import pytest
import snappy

from protocol.commands import encode_identify
from protocol.compression import masked_crc32c
from protocol.frames import OK_FRAME

from .features import FeatureClient
from .harness import RawClient, fin, mpub, pub, rdy, sub

pytestmark = pytest.mark.timeout(60)

SNAPPY_OK = b"\xff\x06\x00\x00sNaPpY" + b"\x01\x0e\x00\x00" + struct.pack("<I", masked_crc32c(OK_FRAME)) + OK_FRAME


def fresh() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def round_trip(client: FeatureClient, count: int = 30) -> None:
    """Publish (PUB and MPUB, one body above a snappy block) and consume everything on this connection."""
    topic = fresh()
    bodies = [b"body-%d " % i * (i + 1) for i in range(count)] + [b"x" * 70000 + b"end"]
    for body in bodies[: count // 2]:
        client.send(pub(topic, body))
        client.expect_ok()
    client.send(mpub(topic, bodies[count // 2 :]))
    client.expect_ok()
    client.send(sub(topic, "ch"))
    client.expect_ok()
    client.send(rdy(len(bodies)))
    received = []
    for _ in bodies:
        message = client.read_message()
        received.append(message.body)
        client.send(fin(message.id))
    assert sorted(received) == sorted(bodies)


def raw_upgrade(address, fields: dict) -> tuple[socket.socket, bytes]:
    """IDENTIFY on a bare socket; returns it and every byte received after the IDENTIFY response."""
    sock = socket.create_connection(address, timeout=10)
    sock.sendall(b"  V2" + encode_identify({"feature_negotiation": True, **fields}))
    data = b""
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        chunk = sock.recv(65536)
        assert chunk, "closed during IDENTIFY"
        data += chunk
    return sock, data[4 + int.from_bytes(data[:4], "big") :]


def recv_at_least(sock: socket.socket, data: bytes, n: int) -> bytes:
    while len(data) < n:
        chunk = sock.recv(65536)
        assert chunk, "closed early"
        data += chunk
    return data


# -- snappy ----------------------------------------------------------------------------------------------


def test_snappy_alone(module_nsqd):
    with FeatureClient(module_nsqd.tcp) as client:
        response = client.identify({"feature_negotiation": True, "snappy": True})
        assert (response["snappy"], response["deflate"], response["tls_v1"]) == (True, False, False)
        client.start_snappy()
        round_trip(client)


def test_snappy_ok_bytes_on_the_wire(module_nsqd):
    sock, after = raw_upgrade(module_nsqd.tcp, {"snappy": True})
    try:
        assert recv_at_least(sock, after, len(SNAPPY_OK))[: len(SNAPPY_OK)] == SNAPPY_OK
    finally:
        sock.close()


def test_snappy_commands_pipelined_with_identify(module_nsqd):
    """Compressed commands in the same segment as IDENTIFY belong to the snappy stream."""
    topic = fresh()
    sock = socket.create_connection(module_nsqd.tcp, timeout=10)
    try:
        compressed = snappy.StreamCompressor().add_chunk(pub(topic, b"early bird"))
        sock.sendall(b"  V2" + encode_identify({"feature_negotiation": True, "snappy": True}) + compressed)
        data = recv_at_least(sock, b"", 4)
        size = int.from_bytes(data[:4], "big")
        data = recv_at_least(sock, data, 4 + size)[4 + size :]
        decoder = snappy.StreamDecompressor()
        plain = b""
        while len(plain) < 2 * len(OK_FRAME):
            plain += decoder.decompress(data)
            data = sock.recv(65536) if len(plain) < 2 * len(OK_FRAME) else b""
        assert plain == OK_FRAME + OK_FRAME  # the upgrade's OK, then the PUB's
    finally:
        sock.close()
    with RawClient(module_nsqd.tcp) as consumer:
        consumer.subscribe(topic, "ch", ready=1)
        assert consumer.read_message().body == b"early bird"


# -- deflate ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("requested, negotiated", [(1, 1), (5, 5), (6, 6), (9, 6), (0, 6), (-3, 6)])
def test_deflate_levels_with_the_default_maximum(module_nsqd, requested, negotiated):
    with FeatureClient(module_nsqd.tcp) as client:
        response = client.identify({"feature_negotiation": True, "deflate": True, "deflate_level": requested})
        assert (response["deflate"], response["deflate_level"], response["max_deflate_level"]) == (True, negotiated, 6)
        client.start_deflate(negotiated)
        round_trip(client, count=6)


def test_deflate_level_up_to_a_raised_maximum(nsqd_factory):
    daemon = nsqd_factory("--max-deflate-level=9")
    with FeatureClient(daemon.tcp) as client:
        response = client.identify({"feature_negotiation": True, "deflate": True, "deflate_level": 9})
        assert (response["deflate_level"], response["max_deflate_level"]) == (9, 9)
        client.start_deflate(9)
        round_trip(client, count=4)


def test_deflate_level_shows_in_the_output(module_nsqd):
    """The server really compresses at the negotiated level: level 1 output of the same data is larger."""
    sizes = {}
    body = b"".join(b"%08d lorem ipsum dolor sit amet " % i for i in range(3000))
    expected = 2 * len(OK_FRAME) + 8 + 26 + len(body)  # upgrade OK, SUB OK, the message frame
    for level in (1, 6):
        topic = fresh()
        with RawClient(module_nsqd.tcp) as producer:
            producer.publish(topic, body)
        sock, after = raw_upgrade(module_nsqd.tcp, {"deflate": True, "deflate_level": level})
        try:
            compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
            sock.sendall(compressor.compress(sub(topic, "c") + rdy(1)) + compressor.flush(zlib.Z_SYNC_FLUSH))
            inflater = zlib.decompressobj(-15)
            plain, wire = inflater.decompress(after), len(after)
            while len(plain) < expected:
                chunk = sock.recv(65536)
                assert chunk
                wire += len(chunk)
                plain += inflater.decompress(chunk)
            assert plain[-len(body) :] == body
            sizes[level] = wire
        finally:
            sock.close()
    assert sizes[1] > sizes[6]


def test_deflate_ok_bytes_on_the_wire(module_nsqd):
    sock, after = raw_upgrade(module_nsqd.tcp, {"deflate": True})
    try:
        data = after
        while not data.endswith(b"\x00\x00\xff\xff"):
            data = recv_at_least(sock, data, len(data) + 1)
        assert zlib.decompressobj(-15).decompress(data) == OK_FRAME
    finally:
        sock.close()


# -- negotiation rules -----------------------------------------------------------------------------------


def test_both_compressions_requested(module_nsqd):
    with RawClient(module_nsqd.tcp) as client:
        client.send(encode_identify({"feature_negotiation": True, "snappy": True, "deflate": True}))
        client.expect_error(b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
        client.assert_closed()


def test_no_upgrade_without_feature_negotiation(module_nsqd):
    with RawClient(module_nsqd.tcp) as client:
        assert client.identify({"snappy": True, "deflate": True, "tls_v1": True}) == b"OK"
        client.publish(fresh(), b"plain")


def test_compression_disabled_by_flags(nsqd_factory):
    daemon = nsqd_factory("--snappy=false", "--deflate=false")
    with RawClient(daemon.tcp) as client:
        response = client.identify({"feature_negotiation": True, "snappy": True, "deflate": True})
        assert b'"deflate":false' in response and b'"snappy":false' in response
        client.publish(fresh(), b"plain")  # not E_IDENTIFY_FAILED: neither was negotiated


# -- corrupt input ---------------------------------------------------------------------------------------


def _bad_snappy_crc() -> bytes:
    data = pub("t", b"x")
    return (
        b"\xff\x06\x00\x00sNaPpY"
        + b"\x01"
        + (len(data) + 4).to_bytes(3, "little")
        + struct.pack("<I", masked_crc32c(data) ^ 1)
        + data
    )


BAD_STREAMS = [
    pytest.param({"snappy": True}, _bad_snappy_crc(), id="snappy-bad-crc"),
    pytest.param(
        {"snappy": True},
        b"\xff\x06\x00\x00sNaPpY" + b"\x00\x08\x00\x00\x00\x00\x00\x00\x0a\x01\x00\x00",
        id="snappy-corrupt-block",
    ),
    pytest.param({"snappy": True}, b"\xff\x06\x00\x00sNaPpY" + b"\x05\x01\x00\x00z", id="snappy-unknown-chunk"),
    pytest.param({"snappy": True}, b"NOP\n", id="snappy-expected-but-clear-text"),
    pytest.param({"deflate": True}, b"\xff" * 32, id="deflate-garbage"),
]


@pytest.mark.parametrize("fields, garbage", BAD_STREAMS)
def test_corrupt_compressed_input_closes_only_that_connection(module_nsqd, fields, garbage):
    topic = fresh()
    with RawClient(module_nsqd.tcp) as bystander:
        bystander.subscribe(topic, "ch", ready=5)
        mark = len(module_nsqd.lines)
        sock, _ = raw_upgrade(module_nsqd.tcp, fields)
        try:
            sock.sendall(garbage)
            sock.settimeout(10)
            while True:  # drain the upgrade's OK; then the server must close
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
        finally:
            sock.close()
        module_nsqd.wait_for_log(r"corrupt compressed stream, closing", 5, start=mark)
        with RawClient(module_nsqd.tcp) as producer:
            producer.publish(topic, b"business as usual")
        assert bystander.read_message().body == b"business as usual"
    module_nsqd.assert_running()


def test_stream_cut_inside_a_chunk_is_a_plain_disconnect(module_nsqd):
    sock, _ = raw_upgrade(module_nsqd.tcp, {"snappy": True})
    mark = len(module_nsqd.lines)
    sock.sendall(snappy.StreamCompressor().add_chunk(pub("t", b"y" * 500))[:-7])
    sock.close()
    module_nsqd.wait_for_log(r"exiting ioloop", 5, start=mark)
    module_nsqd.assert_running()
