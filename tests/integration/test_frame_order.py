"""Frame order on a connection that consumes and publishes: the answer to a PUB, MPUB or DPUB leaves before any
message frame that this publish delivers to the same connection (nsqd does so in nearly every case; here always,
although a publish to a quiet channel delivers at once, inside the command). Messages of an earlier publish may
still arrive after a later answer. Covered: plain TCP read by the read poller and by the connection's own task
(commands pipelined behind IDENTIFY), TLS, snappy, deflate, and several commands in one write."""

from __future__ import annotations

import uuid

import pytest

from tests.integration.features import FeatureClient, make_certificates
from tests.integration.harness import (
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    MAGIC_V2,
    Frame,
    FrameClient,
    NsqdProcess,
    RawClient,
    decode_message,
    dpub,
    identify,
    mpub,
    pub,
    rdy,
    stop_all,
    sub,
)
from tests.integration.persistence_helpers import limited_process_class

pytestmark = pytest.mark.timeout(60)

OK = Frame(FRAME_TYPE_RESPONSE, b"OK")


def fresh() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_nsqd(certs, tmp_path_factory):
    daemon = NsqdProcess(tmp_path_factory.mktemp("nsqd-tls"), certs.daemon_args())
    daemon.start()
    yield daemon
    stop_all([daemon])


def exchange(
    client: FrameClient, commands: list[tuple[bytes, list[bytes]]], before: bytes = b"", answers_before: int = 0
) -> list[Frame]:
    """Send ``commands`` (each with the bodies it publishes to the connection's own channel) in one write, behind
    ``before``, and read every frame they bring, in the order they came, after the ``answers_before`` OKs that
    answer ``before``."""
    client.send(before + b"".join(data for data, _ in commands))
    for _ in range(answers_before):
        assert client.read_frame() == OK
    return [client.read_frame() for _ in range(sum(1 + len(bodies) for _, bodies in commands))]


def assert_answered_first(frames: list[Frame], commands: list[tuple[bytes, list[bytes]]]) -> None:
    """The n-th OK answers the n-th command: it comes before every message that command published."""
    answers = [index for index, frame in enumerate(frames) if frame.frame_type != FRAME_TYPE_MESSAGE]
    assert [frames[index] for index in answers] == [OK] * len(commands), frames
    arrived = {
        decode_message(frame.data).body: index
        for index, frame in enumerate(frames)
        if frame.frame_type == FRAME_TYPE_MESSAGE
    }
    assert sorted(arrived) == sorted(body for _, bodies in commands for body in bodies)
    for answer, (data, bodies) in zip(answers, commands, strict=True):
        for body in bodies:
            assert arrived[body] > answer, f"{body!r} arrived before the answer to {data[:20]!r}: {frames}"


def check_publishing_consumer(client: FrameClient, topic: str) -> None:
    """On a connection subscribed to ``topic`` with a window larger than what it publishes there: every kind of
    publish, alone and pipelined."""
    client.send(sub(topic, "ch"))
    client.expect_ok()
    client.send(rdy(100))
    first = exchange(client, [(pub(topic, b"single"), [b"single"])])
    assert first[0] == OK, f"the first frame after a PUB is {first[0]}, not its OK"
    cases = [
        [(mpub(topic, [b"m1", b"m2", b"m3"]), [b"m1", b"m2", b"m3"])],
        [(dpub(topic, 0, b"deferred by 0"), [b"deferred by 0"])],
        [(pub(topic, b"p%d" % i), [b"p%d" % i]) for i in range(4)],
        [
            (pub(topic, b"a"), [b"a"]),
            (mpub(topic, [b"b1", b"b2"]), [b"b1", b"b2"]),
            (dpub(topic, 0, b"c"), [b"c"]),
            (pub(fresh(), b"elsewhere"), []),
        ],
    ]
    for commands in cases:
        assert_answered_first(exchange(client, commands), commands)


def test_plain_connection_read_by_the_poller(module_nsqd):
    with RawClient(module_nsqd.tcp) as client:
        check_publishing_consumer(client, fresh())


def test_plain_connection_read_by_its_own_task(module_nsqd):
    """Commands behind an IDENTIFY in the same write are run by the connection's task, which awaited IDENTIFY.
    The channel exists and is quiet before (a new channel's first turn would come after the commands)."""
    topic = fresh()
    commands = [
        (pub(topic, b"first"), [b"first"]),
        (mpub(topic, [b"x", b"y"]), [b"x", b"y"]),
        (dpub(topic, 0, b"z"), [b"z"]),
    ]
    with RawClient(module_nsqd.tcp) as idle, RawClient(module_nsqd.tcp, magic=False) as client:
        idle.subscribe(topic, "ch")  # no RDY: the channel exists and has nothing to do
        idle.assert_open()
        # IDENTIFY without feature negotiation and SUB: two OKs
        frames = exchange(
            client,
            commands,
            MAGIC_V2 + identify({"client_id": "own-task"}) + sub(topic, "ch") + rdy(10),
            answers_before=2,
        )
    assert frames[0] == OK
    assert_answered_first(frames, commands)


def test_tls_connection(tls_nsqd, certs):
    with FeatureClient(tls_nsqd.tcp) as client:
        assert client.identify({"feature_negotiation": True, "tls_v1": True})["tls_v1"] is True
        client.start_tls(certs.client_context())
        check_publishing_consumer(client, fresh())


@pytest.mark.parametrize("layer", ["snappy", "deflate"])
def test_compressed_connection(module_nsqd, layer):
    with FeatureClient(module_nsqd.tcp) as client:
        assert client.identify({"feature_negotiation": True, layer: True})[layer] is True
        if layer == "snappy":
            client.start_snappy()
        else:
            client.start_deflate(6)
        check_publishing_consumer(client, fresh())


def test_tls_and_snappy_connection(tls_nsqd, certs):
    with FeatureClient(tls_nsqd.tcp) as client:
        client.identify({"feature_negotiation": True, "tls_v1": True, "snappy": True})
        client.start_tls(certs.client_context())
        client.start_snappy()
        check_publishing_consumer(client, fresh())


# with several workers the first publish the owner's disk refuses was acknowledged already, by design
# (kept in memory, and the topic's next publishes refused: docs/nsqd.md)
@pytest.mark.one_worker
def test_a_failed_publish_of_a_consuming_connection_is_answered_by_its_error_alone(tmp_path):
    """The OK queued ahead of a publish is taken back when the publish fails: here a full disk (RLIMIT_FSIZE on
    the topic's queue file with --mem-queue-size=0), whose E_PUB_FAILED is fatal."""
    body = b"f" * 1000
    record = 4 + 26 + len(body)
    daemon = limited_process_class(20 * 1024)(tmp_path, ["--mem-queue-size=0"]).start()
    try:
        with RawClient(daemon.tcp) as client:
            topic = fresh()
            client.subscribe(topic, "ch")  # no RDY: only answers come back
            acked = 0
            while True:
                client.send(pub(topic, body))
                frame = client.read_frame()
                if frame != OK:
                    break
                acked += 1
                assert acked < 100, "the file size limit never bit"
            assert frame.data.startswith(b"E_PUB_FAILED PUB failed "), frame
            client.assert_closed()
        assert acked == (20 * 1024) // record
    finally:
        stop_all([daemon])
