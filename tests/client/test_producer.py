"""trionsq.Producer against real nsqd subprocesses: pipelining, fail-over, errors, upgrades."""

from __future__ import annotations

import pytest
import trio

import trionsq
from protocol.frames import OK_FRAME, encode_frame
from tests.integration.harness import NsqdProcess, free_port

from .conftest import producer_entries, topic_message_count

pytestmark = pytest.mark.timeout(60)


async def test_concurrent_publishes_are_pipelined(module_nsqd, topic):
    async with trionsq.Producer([module_nsqd.tcp_address]) as producer:
        async with trio.open_nursery() as nursery:
            for i in range(3000):
                nursery.start_soon(producer.publish, topic, b"p%d" % i)
            nursery.start_soon(producer.multi_publish, topic, [b"m1", b"m2", b"m3"])
            nursery.start_soon(producer.deferred_publish, topic, 0.01, b"d")
        stats = producer.stats()
        assert (stats.messages_published, stats.requests, stats.requests_failed) == (3004, 3002, 0)
        assert (stats.connections, stats.failovers) == (1, 0)  # one dial shared by all the callers
        assert len([e for e in producer_entries(module_nsqd) if e["remote_address"]]) >= 1
    assert topic_message_count(module_nsqd, topic) == 3004
    assert producer.stats().connections == 0
    with pytest.raises(RuntimeError, match="not open"):
        await producer.publish(topic, b"late")


async def test_first_address_dead(module_nsqd, topic):
    dead = f"127.0.0.1:{free_port()}"
    async with trionsq.Producer([dead, module_nsqd.tcp_address]) as producer:
        for i in range(10):
            await producer.publish(topic, b"%d" % i)
        stats = producer.stats()
        assert stats.current_address == module_nsqd.tcp_address
        assert stats.failovers == 1  # later requests go straight to the live address
    assert topic_message_count(module_nsqd, topic) == 10


@pytest.fixture
def doomed_nsqd(tmp_path):
    """An nsqd the test kills (nsqd_factory's teardown wants a clean exit)."""
    daemon = NsqdProcess(tmp_path / "doomed").start()
    yield daemon
    daemon.kill()


async def test_fail_over_when_nsqd_dies_mid_stream(doomed_nsqd, nsqd_factory, topic):
    first, second = doomed_nsqd, nsqd_factory()
    async with trionsq.Producer([first.tcp_address, second.tcp_address]) as producer:
        for i in range(50):
            await producer.publish(topic, b"before %d" % i)
        assert producer.stats().current_address == first.tcp_address
        first.kill()  # SIGKILL: no goodbye on the socket
        async with trio.open_nursery() as nursery:  # in flight while the connection breaks
            for i in range(50):
                nursery.start_soon(producer.publish, topic, b"after %d" % i)
        stats = producer.stats()
        assert stats.current_address == second.tcp_address
        assert stats.requests_failed == 0 and stats.messages_published == 100
    assert topic_message_count(second, topic) == 50


async def test_every_address_dead():
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    async with trionsq.Producer(dead, trionsq.Config(dial_timeout=0.5)) as producer:
        with pytest.raises(trionsq.NoAvailableNsqd) as info:
            await producer.publish("t", b"x")
        assert list(info.value.errors) == dead
        assert all(isinstance(e, trionsq.ConnectError) for e in info.value.errors.values())
        assert str(info.value).count("Connection refused") == 2, str(info.value)
        assert isinstance(info.value.__cause__, trionsq.ConnectError)
        assert producer.stats().requests_failed == 1


async def test_request_errors_are_raised_without_fail_over(nsqd_factory, topic):
    first, second = nsqd_factory(), nsqd_factory()
    async with trionsq.Producer([first.tcp_address, second.tcp_address]) as producer:
        with pytest.raises(trionsq.NSQError) as info:
            await producer.publish("no good", b"x")
        assert info.value.code == "E_BAD_TOPIC"
        with pytest.raises(trionsq.NSQError) as info:
            await producer.publish(topic, b"x" * (1024 * 1024 + 1))
        assert info.value.code == "E_BAD_MESSAGE"
        stats = producer.stats()
        assert (stats.failovers, stats.requests_failed, stats.current_address) == (0, 2, first.tcp_address)
        await producer.publish(topic, b"fine")  # the connection nsqd closed is replaced
    assert topic_message_count(first, topic) == 1
    assert topic_message_count(second, topic) == 0


async def test_server_failure_moves_to_the_next_address(fake_nsqd, module_nsqd, topic):
    # nsqd answers E_PUB_FAILED only while it exits; a scripted listener answers it on demand
    async def failing(stream, rest):
        await stream.send_all(OK_FRAME)
        if not rest:
            await stream.receive_some(65536)
        await stream.send_all(encode_frame(1, b"E_PUB_FAILED PUB failed exiting"))
        await trio.sleep_forever()

    failing_address = await fake_nsqd(failing)
    async with trionsq.Producer([failing_address, module_nsqd.tcp_address]) as producer:
        await producer.publish(topic, b"moved")
        stats = producer.stats()
        assert (stats.current_address, stats.failovers) == (module_nsqd.tcp_address, 1)
    assert topic_message_count(module_nsqd, topic) == 1


async def test_tls_and_snappy_through_the_producer(nsqd_factory, certs, topic):
    daemon = nsqd_factory(*certs.daemon_args())
    config = trionsq.Config(client_id="tls-producer")
    for option in ("tls_v1", "snappy"):
        config.set_option_text(option)
    config.set_option_text(f"tls_root_ca_file,{certs.ca_file}")
    async with trionsq.Producer(daemon.tcp_address, config) as producer:
        await producer.multi_publish(topic, [b"a", b"b"])
        [entry] = [e for e in producer_entries(daemon) if e["client_id"] == "tls-producer"]
        assert entry["tls"] is True and entry["snappy"] is True
    assert topic_message_count(daemon, topic) == 2


def test_bad_addresses_are_refused_at_once():
    with pytest.raises(ValueError, match="invalid nsqd address"):
        trionsq.Producer(["127.0.0.1:4150", "nohost"])
    with pytest.raises(ValueError, match="at least one"):
        trionsq.Producer([])
