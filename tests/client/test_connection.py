"""trionsq.Connection against real nsqd subprocesses (and a scripted listener for failures nsqd
does not produce on demand)."""

from __future__ import annotations

import pytest
import trio

import trionsq
from protocol.frames import OK_FRAME, encode_frame
from tests.integration.harness import NsqdProcess, free_port, stop_all

from .conftest import producer_entries, topic_message_count

pytestmark = pytest.mark.timeout(60)


async def receive(conn: trionsq.Connection, topic: str, count: int, inbox: list) -> None:
    """Subscribe and wait (bounded) until ``count`` messages are in ``inbox``."""
    await conn.subscribe(topic, "ch")
    conn.ready(min(count, 100))
    with trio.fail_after(10):
        while len(inbox) < count:
            await trio.sleep(0.01)


def collecting(inbox: list, finish: bool = True):
    def on_message(message: trionsq.Message) -> None:
        inbox.append(message)
        if finish:
            message.finish()

    return on_message


# -- publish and subscribe ----------------------------------------------------------------------


async def test_publish_subscribe_round_trip(module_nsqd, topic):
    inbox: list[trionsq.Message] = []
    responses = []
    async with trionsq.Connection(module_nsqd.tcp_address) as producer:
        assert producer.features.version == "1.3.0" and producer.features.feature_negotiation
        await producer.publish(topic, b"one")
        await producer.multi_publish(topic, [b"two", b"three"])
        await producer.deferred_publish(topic, 0.05, b"four")
    assert producer.closed and producer.close_reason == "closed by the client"
    async with trionsq.Connection(
        module_nsqd.tcp_address,
        on_message=collecting(inbox),
        on_response=lambda m, finished, backoff: responses.append((m.body, finished)),
    ) as consumer:
        await receive(consumer, topic, 4, inbox)
        assert sorted(m.body for m in inbox) == [b"four", b"one", b"three", b"two"]
        assert all(m.attempts == 1 and m.nsqd_address == module_nsqd.tcp_address for m in inbox)
        assert consumer.in_flight == 0 and consumer.messages_received == 4
        assert sorted(responses) == sorted((m.body, True) for m in inbox)


async def test_pipelined_publishes_share_writes(module_nsqd, topic):
    async with trionsq.Connection(module_nsqd.tcp_address) as conn:
        async with trio.open_nursery() as nursery:
            for i in range(2000):
                nursery.start_soon(conn.publish, topic, b"m%d" % i)
        # each write carries every command queued meanwhile, so 2000 publishes take few writes
        assert conn.writes < 200, conn.writes
    assert topic_message_count(module_nsqd, topic) == 2000


async def test_requeue_redelivers(module_nsqd, topic):
    inbox: list[trionsq.Message] = []

    def on_message(message):
        inbox.append(message)
        if message.attempts == 1:
            message.requeue(0, backoff=False)
        else:
            message.finish()

    async with trionsq.Connection(module_nsqd.tcp_address, on_message=on_message) as conn:
        await conn.publish(topic, b"again")
        await receive(conn, topic, 2, inbox)
    assert [(m.body, m.attempts) for m in inbox] == [(b"again", 1), (b"again", 2)]
    assert inbox[0].id == inbox[1].id


async def test_cancelled_publish_keeps_replies_in_order(module_nsqd, topic):
    async with trionsq.Connection(module_nsqd.tcp_address) as conn:
        with trio.CancelScope() as scope:
            scope.cancel()
            await conn.publish(topic, b"sent anyway")  # queued, then its caller gives up
        assert scope.cancelled_caught
        await conn.publish(topic, b"second")  # gets its own OK, not the abandoned one's
        with pytest.raises(trionsq.NSQError) as info:
            await conn.publish(topic, b"x" * (1024 * 1024 + 1))  # nsqd's --max-msg-size
        assert info.value.code == "E_BAD_MESSAGE"
        assert str(info.value) == "E_BAD_MESSAGE PUB message too big 1048577 > 1048576"
        with trio.fail_after(5):  # a fatal error: nsqd closes the connection
            while not conn.closed:
                await trio.sleep(0.01)
        with pytest.raises(trionsq.ConnectionClosed):
            await conn.publish(topic, b"after")
    assert topic_message_count(module_nsqd, topic) == 2


async def test_bad_names_are_refused_with_nsqds_texts(module_nsqd, topic):
    async with trionsq.Connection(module_nsqd.tcp_address) as conn:
        with pytest.raises(trionsq.NSQError) as info:
            await conn.publish("bad topic", b"x")
        assert (info.value.code, str(info.value)) == (
            "E_BAD_TOPIC",
            'E_BAD_TOPIC PUB topic name "bad topic" is not valid',
        )
        with pytest.raises(trionsq.NSQError, match="E_BAD_CHANNEL SUB channel name"):
            await conn.subscribe(topic, "a/b")
        with pytest.raises(ValueError, match="at least one"):
            await conn.multi_publish(topic, [])
        with pytest.raises(ValueError, match="RDY count 2501 out of range"):
            conn.ready(2501)
        await conn.publish(topic, b"still usable")
    assert topic_message_count(module_nsqd, topic) == 1


# -- connecting ---------------------------------------------------------------------------------


async def test_connect_refused():
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(trionsq.ConnectError, match=f"cannot connect to nsqd {address}"):
        async with trionsq.Connection(address):
            pass


def test_bad_address():
    with pytest.raises(ValueError, match="invalid nsqd address"):
        trionsq.Connection("localhost")


async def test_open_connection_in_a_nursery(module_nsqd, topic):
    closed = []
    async with trio.open_nursery() as nursery:
        conn = await trionsq.open_connection(module_nsqd.tcp_address, nursery=nursery, on_close=closed.append)
        await conn.publish(topic, b"x")
        await conn.close()
        await conn.close()  # idempotent
    assert closed == [conn]


async def test_identify_settings_reach_nsqd(module_nsqd, topic):
    config = trionsq.Config(
        client_id="probe",
        hostname="probe.example",
        user_agent="tests/1",
        sample_rate=40,
        msg_timeout=12.0,
        output_buffer_size=8192,
        output_buffer_timeout=0.05,
        heartbeat_interval=5.0,
    )
    async with trionsq.Connection(module_nsqd.tcp_address, config) as conn:
        features = conn.features
        assert (features.msg_timeout, features.sample_rate) == (12.0, 40)
        assert (features.output_buffer_size, features.output_buffer_timeout) == (8192, 0.05)
        await conn.publish(topic, b"x")
        [entry] = [e for e in producer_entries(module_nsqd) if e["client_id"] == "probe"]
        assert (entry["hostname"], entry["user_agent"], entry["sample_rate"]) == ("probe.example", "tests/1", 40)


async def test_heartbeats_are_answered(module_nsqd, topic):
    config = trionsq.Config(heartbeat_interval=1.0, read_timeout=3.0)
    async with trionsq.Connection(module_nsqd.tcp_address, config) as conn:
        # nsqd drops a client silent for two heartbeat intervals, and we would time out after
        # 3 s without its heartbeats: after 3.5 s idle, both sides kept the connection
        await trio.sleep(3.5)
        assert not conn.closed
        await conn.publish(topic, b"x")


async def test_read_timeout_closes(fake_nsqd):
    async def silent(stream, rest):
        await stream.send_all(OK_FRAME)  # IDENTIFY answered, then nothing
        await trio.sleep_forever()

    closed = trio.Event()
    conn = trionsq.Connection(
        await fake_nsqd(silent), trionsq.Config(read_timeout=0.3), on_close=lambda c: closed.set()
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        assert not conn.features.feature_negotiation
        with trio.fail_after(5):
            await closed.wait()
    assert conn.closed and "read_timeout" in conn.close_reason


async def test_pending_requests_fail_when_the_connection_drops(fake_nsqd):
    async def drop_after_first_command(stream, rest):
        await stream.send_all(OK_FRAME)
        if not rest:
            await stream.receive_some(65536)
        # the connection ends with the publishes unanswered

    conn = trionsq.Connection(await fake_nsqd(drop_after_first_command))
    failures = []

    async def publish(i):
        try:
            await conn.publish("t", b"%d" % i)
        except trionsq.ConnectionClosed as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        with trio.fail_after(5):
            async with trio.open_nursery() as publishers:
                for i in range(10):
                    publishers.start_soon(publish, i)
    assert len(failures) == 10
    assert "nsqd closed the connection" in str(failures[0])


async def test_handshake_error_frame_is_raised(fake_nsqd):
    async def refuse(stream, rest):
        await stream.send_all(encode_frame(1, b"E_BAD_BODY IDENTIFY heartbeat interval (1) is invalid"))

    with pytest.raises(trionsq.NSQError) as info:
        async with trionsq.Connection(await fake_nsqd(refuse)):
            pass
    assert info.value.code == "E_BAD_BODY"


async def test_a_body_exception_leaves_the_block_as_itself(module_nsqd):
    with pytest.raises(KeyError):
        async with trionsq.Connection(module_nsqd.tcp_address) as conn:
            raise KeyError("mine")
    assert conn.closed


# -- upgrades -----------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compression(module_nsqd, topic, compression):
    inbox: list[trionsq.Message] = []
    config = trionsq.Config(**{compression: True}, client_id=f"c-{compression}")
    big = bytes(range(256)) * 800  # 200 KiB: several snappy chunks, several deflate reads
    async with trionsq.Connection(module_nsqd.tcp_address, config, on_message=collecting(inbox)) as conn:
        assert getattr(conn.features, compression)
        await conn.publish(topic, big)
        await conn.multi_publish(topic, [b"small"] * 50)
        entry = [e for e in producer_entries(module_nsqd) if e["client_id"] == f"c-{compression}"][0]
        assert entry[compression] is True
        await receive(conn, topic, 51, inbox)
    assert inbox[0].body == big
    assert [m.body for m in inbox[1:]] == [b"small"] * 50


@pytest.fixture(scope="module")
def tls_nsqd(certs, tmp_path_factory):
    daemon = NsqdProcess(tmp_path_factory.mktemp("nsqd-tls"), certs.daemon_args())
    daemon.start()
    yield daemon
    stop_all([daemon])


@pytest.mark.parametrize("compression", [None, "snappy", "deflate"])
async def test_tls(tls_nsqd, certs, topic, compression):
    config = trionsq.Config(tls_v1=True, client_id="tls-client")
    config.set("tls_root_ca_file", str(certs.ca_file))
    if compression:
        config.set(compression, "true")
    inbox: list[trionsq.Message] = []
    async with trionsq.Connection(tls_nsqd.tcp_address, config, on_message=collecting(inbox)) as conn:
        assert conn.features.tls_v1
        await conn.publish(topic, b"secret")
        entry = [e for e in producer_entries(tls_nsqd) if e["client_id"] == "tls-client"][0]
        assert entry["tls"] is True and entry["tls_version"].startswith("TLS")
        await receive(conn, topic, 1, inbox)
    assert inbox[0].body == b"secret"


async def test_tls_certificate_not_trusted(tls_nsqd):
    config = trionsq.Config(tls_v1=True)  # the system's CAs do not know the test CA
    with pytest.raises(trionsq.ConnectError, match="handshake with nsqd .* failed"):
        async with trionsq.Connection(tls_nsqd.tcp_address, config):
            pass
    config = trionsq.Config(tls_v1=True, tls_insecure_skip_verify=True)
    async with trionsq.Connection(tls_nsqd.tcp_address, config) as conn:
        assert conn.features.tls_v1


@pytest.fixture(scope="module")
def auth_nsqd(auth_server, tmp_path_factory):
    daemon = NsqdProcess(tmp_path_factory.mktemp("nsqd-auth"), [f"--auth-http-address={auth_server.address}"])
    daemon.start()
    yield daemon
    stop_all([daemon])


async def test_auth(auth_nsqd, topic):
    config = trionsq.Config(auth_secret="everything", snappy=True)
    async with trionsq.Connection(auth_nsqd.tcp_address, config) as conn:
        assert conn.features.auth_required
        assert (conn.auth.identity, conn.auth.identity_url) == ("alice", "https://example.invalid/alice")
        assert conn.auth.permission_count == 1
        await conn.publish(topic, b"authorised")
    assert topic_message_count(auth_nsqd, topic) == 1


async def test_auth_refused(auth_nsqd, topic):
    with pytest.raises(trionsq.NSQError) as info:
        async with trionsq.Connection(auth_nsqd.tcp_address, trionsq.Config(auth_secret="wrong")):
            pass
    assert info.value.code == "E_AUTH_FAILED"
    with pytest.raises(trionsq.ConnectError, match="requires authorization"):
        async with trionsq.Connection(auth_nsqd.tcp_address):
            pass
    with pytest.raises(trionsq.NSQError, match="E_UNAUTHORIZED AUTH no authorizations found"):
        async with trionsq.Connection(auth_nsqd.tcp_address, trionsq.Config(auth_secret="nothing")):
            pass
    async with trionsq.Connection(auth_nsqd.tcp_address, trionsq.Config(auth_secret="publish-orders")) as conn:
        await conn.publish("orders", b"allowed")
        with pytest.raises(trionsq.NSQError) as info:
            await conn.publish(topic, b"x")
        assert info.value.code == "E_UNAUTHORIZED"


async def test_tls_asked_of_an_nsqd_without_tls(module_nsqd, topic):
    # go-nsq would carry on in the clear; every trio entry point refuses instead
    config = trionsq.Config(tls_v1=True)
    with pytest.raises(trionsq.ConnectError, match="does not offer TLS"):
        async with trionsq.Connection(module_nsqd.tcp_address, config):
            pass
    async with trionsq.Producer([module_nsqd.tcp_address], config) as producer:
        with pytest.raises(trionsq.NoAvailableNsqd, match="does not offer TLS"):
            await producer.publish(topic, b"never in the clear")

    async def handler(message: trionsq.Message) -> None:
        raise AssertionError("no message can arrive")

    with pytest.raises(trionsq.ConnectError, match="does not offer TLS"):
        async with trionsq.Consumer(topic, "ch", handler, config, nsqd_tcp_addresses=[module_nsqd.tcp_address]):
            pass
    assert topic_message_count(module_nsqd, topic) == 0
