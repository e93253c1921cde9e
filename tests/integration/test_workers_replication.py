"""Replication with ``--workers=2``: worker 0 owns every topic and runs the node's replication; the other worker's
publishes cross to it and are acknowledged once the peers hold them. Two nodes keep copies on each other (each
with two workers); publishes come on connections each worker accepted; a kill -9 of the node, or of one of its
workers, stops the node, and its peer takes it over and delivers every acknowledged message. A replication stream
accepted by worker 1 is served by worker 0."""

from __future__ import annotations

import os
import signal

import pytest

from .harness import NsqdProcess, RawClient, command, free_port
from .http_helpers import post, stats, wait_for
from .persistence_helpers import receive
from .test_workers_node import accepting_worker, call, connections_to_each_worker, worker_pids_in_order

pytestmark = pytest.mark.timeout(180)

TOPIC = "t"
DURABLE = ("--mem-queue-size=0", "--sync-every=1")


def start(data_path, port: int, peer_port: int, *args: str) -> NsqdProcess:
    return NsqdProcess(
        data_path,
        [
            "--workers=2",
            "--broadcast-address=127.0.0.1",
            f"--tcp-address=127.0.0.1:{port}",
            f"--replicate-to=127.0.0.1:{peer_port}",
            "--replica-takeover-timeout=1s",
            *args,
        ],
    ).start()


def producers_on_each_worker(node: NsqdProcess, per_worker: int = 2) -> list[tuple[int, RawClient]]:
    """``per_worker`` producer connections accepted by each worker (new connections until each has them)."""
    found: dict[int, list[RawClient]] = {0: [], 1: []}
    for _ in range(100):
        client = RawClient(node.tcp)
        client.identify({"client_id": "p"})  # answered: accepted, and not handed over before a publish
        index = accepting_worker(node, client.sock)
        if len(found[index]) < per_worker:
            found[index].append(client)
        else:
            client.close()
        if all(len(clients) == per_worker for clients in found.values()):
            return [(index, client) for index, clients in found.items() for client in clients]
    raise AssertionError(f"100 connections reached the workers {[len(c) for c in found.values()]} times")


def replicating(node: NsqdProcess) -> bool:
    doc = stats(node.http()).get("replication", {})
    return doc.get("state") == "replicating" and not doc.get("unreplicated_messages")


def held(node: NsqdProcess, origin: str) -> int:
    for entry in stats(node.http()).get("replication", {}).get("replicas", []):
        if entry["node"] == origin:
            return entry["held_messages"]
    return 0


def kill_worker(node: NsqdProcess, index: int) -> None:
    os.kill(worker_pids_in_order(node)[index], signal.SIGKILL)
    assert node.proc is not None
    assert node.proc.wait(30) == 1  # the other worker stopped with it (supervisor.py)
    node.stop()


@pytest.fixture
def nodes():
    started: list[NsqdProcess] = []
    yield started
    for node in started:
        node.kill()


def pair(tmp_path, nodes: list[NsqdProcess], *args: str, handed: bool = False) -> tuple[NsqdProcess, NsqdProcess, int]:
    """A and B, each with two workers, keeping copies on each other (``args`` for both); ``handed``: B's worker 0
    is stopped while A starts, so that B's worker 1 accepts A's replication stream and hands it to worker 0.
    Returns A's port too."""
    port_a, port_b = free_port(), free_port()
    nodes.append(start(tmp_path / "b", port_b, port_a, *args))
    b = nodes[-1]
    worker0 = worker_pids_in_order(b)[0]
    if handed:
        os.kill(worker0, signal.SIGSTOP)
    try:
        nodes.append(start(tmp_path / "a", port_a, port_b, *args))
        if handed:  # (worker 0 cannot log meanwhile)
            b.wait_for_log(r"replication stream: handed to worker 0", 20)
    finally:
        if handed:
            os.kill(worker0, signal.SIGCONT)
    a = nodes[-1]
    wait_for(lambda: replicating(a) and replicating(b), timeout=30, message="both nodes replicating")
    return a, b, port_a


@pytest.mark.parametrize(
    ("victim", "args"), [("node", ()), ("worker 0", ()), ("worker 1", ()), ("worker 0", DURABLE)], ids=str
)
def test_a_peer_takes_over_a_two_worker_node_and_delivers_every_acknowledged_message(tmp_path, nodes, victim, args):
    a, b, port_a = pair(tmp_path, nodes, *args, handed=True)
    b.wait_for_log(r"replication stream\(127\.0\.0\.1:\d+\) taken over from another worker", 5)
    assert post(a.http(), f"/topic/create?topic={TOPIC}").status == 200
    assert post(a.http(), f"/channel/create?topic={TOPIC}&channel=c").status == 200
    producers = producers_on_each_worker(a)
    acknowledged: list[bytes] = []
    for number in range(50):
        for index, client in producers:
            body = f"{number}-{index}-{id(client)}".encode()
            if number % 2:
                client.publish(TOPIC, body)
                acknowledged.append(body)
            else:
                bodies = [body + b"-" + str(n).encode() for n in range(5)]
                client.publish_many(TOPIC, bodies)
                acknowledged.extend(bodies)
    origin = f"127.0.0.1:{port_a}"
    assert held(b, origin) == len(acknowledged)  # every OK came once B held the message: nothing to wait for
    for _, client in producers:
        client.close()
    if victim == "node":
        a.kill()
    else:
        kill_worker(a, int(victim[-1]))
    wait_for(lambda: held(b, origin) == 0, timeout=30, message="B took A over")
    got: set[bytes] = set()
    with RawClient(b.tcp) as consumer:
        consumer.subscribe(TOPIC, "c", ready=200)
        while not set(acknowledged) <= got:
            got.update(m.body for m in receive(consumer, 1, timeout=10))
    # back on its data, A learns that B adopted its messages and drops what it still held of them
    nodes.append(start(tmp_path / "a", port_a, b.tcp[1], *args))
    a = nodes[-1]
    wait_for(lambda: replicating(a), timeout=30, message="A back and replicating")
    channels = [ch for topic in stats(a.http())["topics"] if topic["topic_name"] == TOPIC for ch in topic["channels"]]
    assert sum(channel["depth"] + channel["deferred_count"] for channel in channels) == 0, channels


def test_a_crossing_publish_fails_while_degraded_in_refuse_mode_and_every_worker_says_so(tmp_path, nodes):
    a, b, _ = pair(tmp_path, nodes)
    http = connections_to_each_worker(a)
    b.kill()
    wait_for(lambda: stats(a.http())["replication"]["state"] == "degraded", timeout=10, message="degraded")
    for _index, client in producers_on_each_worker(a, 1):
        client.send(command("PUB", TOPIC, body=b"x"))
        client.expect_error(b"E_PUB_FAILED PUB failed replication degraded")
        client.close()
    for connection in http:
        assert call(connection, "GET", "/ping") == (500, b"NOK - replication degraded")
        status, body = call(connection, "POST", f"/pub?topic={TOPIC}", b"x")
        assert status == 503 and b"REPLICATION_DEGRADED" in body
        assert call(connection, "GET", "/stats?format=json")[1].count(b'"state":"degraded"') == 1
        connection.close()


def test_no_worker_answers_a_publish_before_the_peer_holds_it(tmp_path, nodes):
    a, b, _ = pair(tmp_path, nodes)
    producers = producers_on_each_worker(a, 1)
    frozen = [b.proc.pid, *b.children()]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        for _index, client in producers:
            client.send(command("PUB", TOPIC, body=b"x"))
        for index, client in producers:  # a bounded look for an OK given while B cannot have stored the message
            assert client.poll_frame(1.0) is None, f"worker {index} answered before the peer held the message"
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    for _index, client in producers:
        client.expect_ok()
        client.close()
