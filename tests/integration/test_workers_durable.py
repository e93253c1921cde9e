"""Durable mode (``--mem-queue-size=0 --sync-every=1``) with ``--workers=2``: a publish to a topic another worker
owns is acknowledged once its owner synced it (and nsqd.dat names its topic), so a kill -9 of the node or of one
worker loses nothing acknowledged; a failed sync or a full disk refuses as one nsqd refuses. The durable tests
of one process run here too, against two workers (``data_dir`` and ``full_disk`` below), a kill being a kill -9
of every process of the node."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct

import pytest

from .harness import NsqdProcess, RawClient, mpub, pub
from .http_helpers import post, stats, wait_for
from .persistence_helpers import data_dirs, limited_process_class, receive
from .test_durable_full_disk import (
    DURABLE as FULL_DISK_FLAGS,
)
from .test_durable_full_disk import (  # noqa: F401 (collected here, against two workers)
    FullDiskSetup,
    test_a_kill_9_after_a_channel_could_not_store_its_copy_loses_no_acknowledged_message,
    test_copies_kept_in_memory_go_to_disk_once_it_has_room_even_with_no_consumer,
    test_copies_kept_in_memory_release_the_topic_file_once_consumed,
    tmpfs,
)
from .test_persistence import (  # noqa: F401
    test_a_created_topic_is_there_for_what_follows_its_answer_and_through_a_kill_9,
    test_durable_mode_loses_no_acknowledged_message_across_kill_9_loops,
    test_durable_mode_redelivers_in_flight_messages_after_kill_9,
)
from .test_workers import owned_topics, start_node
from .test_workers_node import worker_pids_in_order
from .workers_harness import DurableLoad, TwoWorkersDataDir, consume_all

DURABLE = ("--mem-queue-size=0", "--sync-every=1")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def data_dir(tmp_path):
    yield from data_dirs(tmp_path, TwoWorkersDataDir)


class TwoWorkersFullDisk(FullDiskSetup):
    def __init__(self, mount, args: tuple[str, ...]) -> None:
        super().__init__(mount, args)
        self.data = TwoWorkersDataDir(self.data.path, args)


@pytest.fixture
def full_disk(tmpfs):  # noqa: F811 (the fixture imported above)
    setups: list[FullDiskSetup] = []

    def make(args: tuple[str, ...] = FULL_DISK_FLAGS) -> FullDiskSetup:
        setups.append(TwoWorkersFullDisk(tmpfs, args))
        return setups[-1]

    yield make
    for setup in setups:
        setup.data.cleanup()


def kill_worker(node: NsqdProcess, index: int) -> None:
    """kill -9 of one worker: the parent stops the other gracefully and exits 1 (supervisor.py)."""
    victim = node.children()[index]
    os.kill(victim, signal.SIGKILL)
    assert node.proc is not None
    assert node.proc.wait(30) == 1
    node.stop()


def test_new_topics_published_across_workers_survive_a_kill_9_of_the_node(tmp_path):
    """Each publish creates its topic in its owner (a worker other than 0 creates half of them): acknowledged only
    once the message is synced and nsqd.dat, which worker 0 writes, names the topic."""
    data = tmp_path / "data"
    node = start_node(data, *DURABLE)
    topics = [name for index in range(8) for name in owned_topics(f"fresh{index}x")]
    producers = [RawClient(node.tcp) for _ in range(4)]  # accepted by either worker
    for number, topic in enumerate(topics):
        producer = producers[number % len(producers)]
        if number % 3 == 0:
            producer.publish_many(topic, [topic.encode(), b"second"])
        else:
            producer.publish(topic, topic.encode())
    http_topic = owned_topics("byhttp")[1]
    assert post(node.listening["HTTP"], f"/pub?topic={http_topic}", http_topic.encode()).status == 200
    node.kill()  # every process of the node at once
    listed = {entry["name"] for entry in json.loads((data / "nsqd.dat").read_text())["topics"]}
    assert set(topics) | {http_topic} <= listed
    node = start_node(data, *DURABLE)
    try:
        for number, topic in enumerate(topics + [http_topic]):
            expected = {topic.encode(), b"second"} if number % 3 == 0 and topic != http_topic else {topic.encode()}
            assert consume_all(node, topic, expected) == expected
    finally:
        node.stop()


def test_a_topic_sent_to_worker_0_but_not_yet_written_holds_back_the_publish_to_it(tmp_path):
    """A topic worker 1 owns, created by HTTP while worker 0 is stopped: worker 1 has sent its entry towards
    worker 0, which has not written nsqd.dat. A PUB to it must not be acknowledged before worker 0 has written
    the file: what an OK covers must outlive a kill -9 of every process, the topic listed in nsqd.dat included
    (what was sent to worker 0 is not yet written)."""
    data = tmp_path / "data"
    node = start_node(data, *DURABLE)
    worker0 = worker_pids_in_order(node)[0]
    topic = owned_topics("sentnotwritten")[1]
    os.kill(worker0, signal.SIGSTOP)  # from here only worker 1 accepts
    try:
        assert post(node.listening["HTTP"], f"/topic/create?topic={topic}").status == 200
        with socket.create_connection(node.tcp, timeout=10) as sock:
            body = topic.encode()
            sock.sendall(b"  V2" + f"PUB {topic}\n".encode() + struct.pack(">i", len(body)) + body)
            sock.settimeout(1.0)
            try:  # a bounded look for an OK given while worker 0 cannot have written the file
                early = sock.recv(64)
            except TimeoutError:
                early = b""
            if early:  # acknowledged: then it must outlive a kill -9 of every process now
                node.kill()
            else:
                os.kill(worker0, signal.SIGCONT)
                sock.settimeout(10.0)
                assert sock.recv(64) == struct.pack(">ii", 6, 0) + b"OK"
                node.kill()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker0, signal.SIGCONT)
    # named in nsqd.dat: a restart (or nsqd 1.3.0 on this directory) lists the topic before anyone asks for it
    assert topic in {entry["name"] for entry in json.loads((data / "nsqd.dat").read_text())["topics"] or []}
    node = start_node(data, *DURABLE)
    try:
        assert consume_all(node, topic, {topic.encode()}) == {topic.encode()}
    finally:
        node.stop()


def test_a_producer_goes_to_its_topics_owner_after_its_first_synced_publish(tmp_path):
    """In durable mode a publish that crosses waits for its owner's fsync; once answered, the producer goes to
    the owner (its next publishes cross nothing and share the owner's group commit). It stays one connection, in
    order, and every publish it got OK for outlives a kill -9 of the node."""
    data = tmp_path / "data"
    node = start_node(data, *DURABLE)
    topics = owned_topics("durablehand")
    producers = [RawClient(node.tcp) for _ in range(8)]  # accepted by either worker: some cross
    for index, producer in enumerate(producers):
        producer.publish(topics[index % 2], f"{index}-first".encode())
    node.wait_for_log(r"taken over from another worker", 10)
    for index, producer in enumerate(producers):
        topic = topics[index % 2]
        producer.send(pub(topic, f"{index}-a".encode()) + mpub(topic, [f"{index}-b".encode(), f"{index}-c".encode()]))
        producer.expect_ok()
        producer.expect_ok()
    node.kill()
    for producer in producers:
        producer.close()
    node = start_node(data, *DURABLE)
    try:
        for first, topic in enumerate(topics):
            expected = {f"{index}-{kind}".encode() for index in range(first, 8, 2) for kind in ("first", "a", "b", "c")}
            assert consume_all(node, topic, expected) == expected
    finally:
        node.stop()


@pytest.mark.timeout(240)
def test_nothing_acknowledged_is_lost_across_kill_9_of_the_node_or_of_one_worker(tmp_path, record_property):
    """Publish (PUB and MPUB, to a topic owned by each worker, on connections either worker accepted) and consume
    with messages in flight, kill -9 the node or one of its workers in the middle, restart, repeat; then drain.
    Every message that got OK comes out at least once (duplicates are allowed: at least once)."""
    data = tmp_path / "data"
    load = DurableLoad(owned_topics("loop"))
    crashes = [NsqdProcess.kill, lambda node: kill_worker(node, 0), lambda node: kill_worker(node, 1), NsqdProcess.kill]
    for crash in crashes:
        load.until_crash(start_node(data, *DURABLE), crash)
    node = start_node(data, *DURABLE)
    try:
        duplicates = load.drain(node)
    finally:
        node.stop()
    record_property("acknowledged", len(load.acked))
    print(
        f"durable kill -9 loop, 2 workers: {len(load.acked)} acknowledged, 0 missing, {duplicates} duplicate deliveries"
    )


def test_a_graceful_stop_writes_everything(tmp_path):
    data = tmp_path / "data"
    node = start_node(data, *DURABLE)
    topics = owned_topics("kept")
    producer = RawClient(node.tcp)
    with RawClient(node.tcp) as client:
        client.subscribe(topics[1], "c", ready=3)
        for topic in topics:
            for number in range(10):
                producer.publish(topic, f"{topic}-{number}".encode())
        held = receive(client, 3, finish=False)  # in flight at the stop: delivered again after it
        assert len(held) == 3
        assert node.stop() == 0
    producer.close()
    node = start_node(data, *DURABLE)
    try:
        for topic in topics:
            expected = {f"{topic}-{number}".encode() for number in range(10)}
            assert consume_all(node, topic, expected) == expected
    finally:
        node.stop()


def test_a_failed_sync_fails_the_publishes_it_covered_in_the_owner(tmp_path):
    """A publish that crossed to its owner is refused as one nsqd refuses it when the owner's fsync fails."""
    trigger = tmp_path / "fail-fsync"

    class Failing(NsqdProcess):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.env["NSQD_TEST_FAIL_FSYNC"] = str(trigger)

    data = tmp_path / "data"
    node = Failing(data, ["--workers=2", *DURABLE]).start()
    node.wait_for_log(r"NSQ: worker 1 of 2", 20)
    try:
        topics = owned_topics("faulty")
        with RawClient(node.tcp) as client:
            for topic in topics:
                client.publish(topic, b"before")
        trigger.touch()
        for topic in topics:  # whichever worker accepts the connection, one of the two crosses
            with RawClient(node.tcp) as client:
                client.send(b"PUB %s\n" % topic.encode() + struct.pack(">I", 6) + b"failed")
                frame = client.read_frame(10)
                assert frame.data == b"E_PUB_FAILED PUB failed sync", frame
                client.assert_closed()
            with RawClient(node.tcp) as client:
                client.send(mpub(topic, [b"failed"]))
                assert client.read_frame(10).data.startswith(b"E_MPUB_FAILED MPUB failed "), topic
            reply = post(node.listening["HTTP"], f"/pub?topic={topic}", b"failed")
            assert (reply.status, reply.json()) == (503, {"message": "EXITING"}), reply
        trigger.unlink()
        with RawClient(node.tcp) as client:
            for topic in topics:
                client.publish(topic, b"after")
        assert node.stop() == 0
    finally:
        node.kill()


def test_a_full_disk_refuses_publishes_with_nsqs_error(tmp_path):
    """RLIMIT_FSIZE (inherited by the workers) stands in for a full disk: a publish the owner cannot store is
    refused with E_PUB_FAILED whichever worker accepted it, and nothing refused comes back."""
    body = b"f" * 1000
    data = tmp_path / "data"
    node = limited_process_class(20 * 1024)(data, ["--workers=2", *DURABLE]).start()
    node.wait_for_log(r"NSQ: worker 1 of 2", 20)
    try:
        acked = dict.fromkeys(owned_topics("full"), 0)
        for topic in acked:
            while True:
                with RawClient(node.tcp) as client:
                    client.send(pub(topic, body))
                    frame = client.read_reply()
                    if frame.data == b"OK":
                        acked[topic] += 1
                        assert acked[topic] < 100, "the file size limit never bit"
                        continue
                    assert frame.data.startswith(b"E_PUB_FAILED PUB failed "), frame
                    client.assert_closed()
                    break
            assert acked[topic] == (20 * 1024) // (4 + 26 + len(body))
        assert stats(node.listening["HTTP"])["health"].startswith("NOK - ")
        assert node.stop() == 0
    finally:
        node.kill()
    node = start_node(data, *DURABLE)
    try:
        for topic, count in acked.items():
            with RawClient(node.tcp) as client:
                client.subscribe(topic, "c", ready=count + 5)
                assert [m.body for m in receive(client, count)] == [body] * count
                assert client.poll_frame(0.5) is None
        wait_for(lambda: stats(node.listening["HTTP"])["health"] == "OK", 10, message="healthy after restart")
    finally:
        node.stop()
