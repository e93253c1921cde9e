"""Message IDs with ``--workers``: every worker stamps the node's ``--node-id``, each issuing its own share of
every tick's sequences (nsqd/guid.py), so a node's IDs are one process's. A worker that stamped ``--node-id`` plus
its number issued the IDs of the node whose ``--node-id`` is that: a replica adopting that node's messages then
held two messages with one ID in a channel, and a channel delivers one of two copies in flight."""

from __future__ import annotations

import threading

import pytest

from nsqd.guid import split_id
from nsqd.workers import owner_of

from .harness import NsqdProcess, RawClient, free_port
from .http_helpers import post, stats, wait_for
from .persistence_helpers import receive
from .test_workers_restart import spread_topics

pytestmark = pytest.mark.timeout(120)


def test_every_worker_stamps_the_nodes_id(tmp_path):
    topics = spread_topics("stamped", (3,))
    node = NsqdProcess(tmp_path / "data", ["--workers=3", "--node-id=77"]).start()
    try:
        ids = []
        with RawClient(node.tcp) as producer:
            for topic in topics:
                producer.publish_many(topic, [b"x"] * 300)
        for topic in topics:
            with RawClient(node.tcp) as consumer:
                consumer.subscribe(topic, "c", ready=300)
                ids += [message.id for message in receive(consumer, 300)]
        assert {split_id(i).node_id for i in ids} == {77}
        assert len(set(ids)) == len(ids)
    finally:
        assert node.stop() == 0


def test_a_replica_adopting_the_messages_of_the_node_next_to_its_id_delivers_every_one(tmp_path):
    """Replica B (two workers, ``--node-id=5``) and origin A (``--node-id=6``) publish to one topic, owned by B's
    worker 1, at the same time; A is killed and B adopts its messages. Every message of both is delivered at once
    (all in flight together), with an ID of its own."""
    port_a, port_b = free_port(), free_port()
    topic = next(f"shared{n}" for n in range(100) if owner_of(f"shared{n}", 2) == 1)
    b = NsqdProcess(
        tmp_path / "b",
        [
            "--workers=2",
            "--node-id=5",
            "--max-rdy-count=5000",
            "--broadcast-address=127.0.0.1",
            f"--tcp-address=127.0.0.1:{port_b}",
            "--replica-takeover-timeout=1s",
        ],
    ).start()
    a = NsqdProcess(
        tmp_path / "a",
        [
            "--workers=1",
            "--node-id=6",
            "--broadcast-address=127.0.0.1",
            f"--tcp-address=127.0.0.1:{port_a}",
            f"--replicate-to=127.0.0.1:{port_b}",
        ],
    ).start()
    try:
        wait_for(lambda: stats(a.http()).get("replication", {}).get("state") == "replicating", 30)
        for node in (a, b):
            assert post(node.http(), f"/topic/create?topic={topic}").status == 200
            assert post(node.http(), f"/channel/create?topic={topic}&channel=c").status == 200
        sent: dict[str, list[bytes]] = {"a": [], "b": []}

        def publish(node: NsqdProcess, name: str) -> None:
            with RawClient(node.tcp) as producer:
                for batch in range(40):
                    bodies = [f"{name}-{batch}-{n}".encode() for n in range(50)]
                    producer.publish_many(topic, bodies)
                    sent[name] += bodies

        threads = [threading.Thread(target=publish, args=(node, name)) for node, name in ((a, "a"), (b, "b"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        a.kill()
        origin = f"127.0.0.1:{port_a}"
        wait_for(
            lambda: any(
                r["node"] == origin and r["held_messages"] == 0
                for r in stats(b.http()).get("replication", {}).get("replicas", [])
            ),
            timeout=30,
            message="B took A over",
        )
        expected = sent["a"] + sent["b"]
        with RawClient(b.tcp) as consumer:
            consumer.subscribe(topic, "c", ready=len(expected))
            got = receive(consumer, len(expected), timeout=30, finish=False)  # all in flight at once
        assert sorted(m.body for m in got) == sorted(expected)
        assert len({m.id for m in got}) == len(got)
    finally:
        a.kill()
        b.kill()
