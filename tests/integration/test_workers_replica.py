"""A replica node with ``--workers=2`` and no ``--replicate-to``: its topics are spread over its workers, worker 0
keeps the stores of its origins, and a takeover adopts into the topics of both workers (each batch crosses to its
topic's owner and the store goes only once every owner answered). A one-worker origin is killed -9 and taken over:
every message it acknowledged is delivered by the replica node, to each channel, whichever worker owns its topic;
a kill -9 of either worker of the replica node during the adoption stops the node, and the node restarted on its
data adopts again what it kept (a message may come twice, never not at all). A takeover whose messages either
worker's disk refuses (an fsync failure) keeps the store and is done once the disk takes them."""

from __future__ import annotations

import os
import signal
import zlib

import pytest

from .harness import NsqdProcess, RawClient, free_port
from .http_helpers import post, stats, wait_for
from .persistence_helpers import receive
from .test_workers_node import worker_pids_in_order
from .test_workers_replication import DURABLE, held

pytestmark = pytest.mark.timeout(240)

CHANNELS = ("c1", "c2")


def topic_owned_by(worker: int) -> str:
    """A topic name that worker ``worker`` of two owns (``nsqd.workers.owner_of``)."""
    for number in range(100):
        name = f"adopted{number}"
        if zlib.crc32(name.encode()) % 2 == worker:
            return name
    raise AssertionError("no such name")


TOPICS = (topic_owned_by(0), topic_owned_by(1))


def start_replica(data_path, port: int, *args: str, process: type[NsqdProcess] = NsqdProcess) -> NsqdProcess:
    argv = ["--workers=2", "--broadcast-address=127.0.0.1", f"--tcp-address=127.0.0.1:{port}"]
    return process(data_path, [*argv, "--replica-takeover-timeout=1s", *args]).start()


def start_origin(data_path, port: int, replica_port: int, *args: str) -> NsqdProcess:
    argv = ["--workers=1", "--broadcast-address=127.0.0.1", f"--tcp-address=127.0.0.1:{port}"]
    return NsqdProcess(data_path, [*argv, f"--replicate-to=127.0.0.1:{replica_port}", *args]).start()


def publish_to_both_workers_topics(
    origin: NsqdProcess, batches: int, topics: tuple[str, ...] = TOPICS
) -> dict[str, list[bytes]]:
    """MPUBs of 5 to each topic, each acknowledged (so held by the replica); returns the bodies per topic."""
    acknowledged: dict[str, list[bytes]] = {topic: [] for topic in topics}
    for topic in topics:
        assert post(origin.http(), f"/topic/create?topic={topic}").status == 200
        for channel in CHANNELS:
            assert post(origin.http(), f"/channel/create?topic={topic}&channel={channel}").status == 200
    with RawClient(origin.tcp) as producer:
        for number in range(batches):
            for topic in topics:
                bodies = [f"{topic}-{number}-{n}".encode() for n in range(5)]
                producer.publish_many(topic, bodies)
                acknowledged[topic].extend(bodies)
    return acknowledged


def assert_every_message_delivered(node: NsqdProcess, acknowledged: dict[str, list[bytes]]) -> None:
    for topic, bodies in acknowledged.items():
        for channel in CHANNELS:
            got: set[bytes] = set()
            with RawClient(node.tcp) as consumer:
                consumer.subscribe(topic, channel, ready=200)
                while not set(bodies) <= got:
                    got.update(m.body for m in receive(consumer, 1, timeout=15))


@pytest.mark.parametrize(
    ("victim", "args"),
    [(None, ()), (None, DURABLE), (1, DURABLE), (0, DURABLE)],
    ids=["no kill", "durable", "worker 1 killed while adopting, durable", "worker 0 killed while adopting, durable"],
)
def test_a_two_worker_replica_node_takes_over_a_one_worker_origin_into_both_workers_topics(
    tmp_path, daemons, victim, args
):
    replica_port, origin_port = free_port(), free_port()
    daemons.append(start_replica(tmp_path / "b", replica_port, *args))
    b = daemons[-1]
    daemons.append(start_origin(tmp_path / "a", origin_port, replica_port, *args))
    a = daemons[-1]
    origin = f"127.0.0.1:{origin_port}"
    # the origin's stream reached the replica whichever worker accepted it: worker 0 keeps the store
    wait_for(lambda: stats(a.http()).get("replication", {}).get("state") == "replicating", timeout=30)
    acknowledged = publish_to_both_workers_topics(a, 40 if victim is None else 150)
    assert held(b, origin) == sum(map(len, acknowledged.values()))
    a.kill()
    if victim is not None:
        # worker 1 makes its topics once worker 0 took over: from then on, the messages cross to it
        b.wait_for_log(r"REPLICATION: worker 1 makes 1 topic\(s\) of a takeover", 30)
        os.kill(worker_pids_in_order(b)[victim], signal.SIGKILL)
        assert b.proc is not None
        assert b.proc.wait(30) == 1  # the other worker stopped with it (supervisor.py)
        b.stop()
        # back on its data, the node adopts again whatever its store kept (the origin is still gone)
        daemons.append(start_replica(tmp_path / "b", replica_port, *args))
        b = daemons[-1]
    wait_for(lambda: held(b, origin) == 0, timeout=30, message="the replica node took the origin over")
    b.wait_for_log(r"REPLICATION: took over origin 127\.0\.0\.1:\d+", 5)
    assert_every_message_delivered(b, acknowledged)
    topics = {topic["topic_name"]: topic for topic in stats(b.http())["topics"]}
    for topic in TOPICS:
        channels = topics[topic]["channels"]
        assert sorted(channel["channel_name"] for channel in channels) == list(CHANNELS)
        if victim is None:  # one takeover: each message adopted once into each channel
            assert [channel["message_count"] for channel in channels] == [len(acknowledged[topic])] * len(CHANNELS)


@pytest.mark.parametrize("topics", [TOPICS, TOPICS[1:]], ids=["both workers' topics", "worker 1's topic"])
def test_a_takeover_whose_messages_a_worker_cannot_sync_keeps_the_copies_and_is_done_once_it_can(
    tmp_path, daemons, topics
):
    """Durable mode: while fsync fails (injected in both workers), the takeover fails and keeps its store, whether
    worker 0 (its own topic's messages come first) or worker 1 (it answers the refusal) refused; once fsync works
    again, a later attempt adopts every message (some twice, none lost)."""
    trigger = tmp_path / "fail-fsync"

    class Failing(NsqdProcess):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.env["NSQD_TEST_FAIL_FSYNC"] = str(trigger)

    replica_port, origin_port = free_port(), free_port()
    daemons.append(start_replica(tmp_path / "b", replica_port, *DURABLE, process=Failing))
    b = daemons[-1]
    daemons.append(start_origin(tmp_path / "a", origin_port, replica_port, *DURABLE))
    a = daemons[-1]
    wait_for(lambda: stats(a.http()).get("replication", {}).get("state") == "replicating", timeout=30)
    acknowledged = publish_to_both_workers_topics(a, 20, topics)
    trigger.touch()
    a.kill()
    # worker 0 refuses its own topic's messages first; worker 1 answers that it refused
    why = "topic [a-z0-9]+ did not take" if TOPICS[0] in topics else "a worker did not take"
    b.wait_for_log(rf"REPLICATION: takeover of origin 127\.0\.0\.1:\d+ stopped, its copies kept .* - {why}", 30)
    trigger.unlink()
    origin = f"127.0.0.1:{origin_port}"
    wait_for(lambda: held(b, origin) == 0, timeout=30, message="the replica node took the origin over")
    b.wait_for_log(r"REPLICATION: took over origin 127\.0\.0\.1:\d+", 5)
    assert_every_message_delivered(b, acknowledged)
