"""A restart with another ``--workers`` count. The data directory is the one a single process writes (one nsqd.dat,
each topic's queue files named by the topic alone), so a node stopped at N workers starts at any other N, each
topic opened by its new owner.

A node at N=2 is filled with every kind of state (topics owned by each worker at N=2 and at N=3, channels, paused
topics and channels, messages in memory and on disk, deferred by DPUB and by REQ, in flight, a log channel, an
ephemeral channel and topic) and stopped gracefully; it restarts at N=1, then 3, then 2, changing things at each
step. After each stop the files hold every message where NSQ puts it (the topic's queue while the topic is paused,
else each channel's, in-flight ones with their attempts), nsqd.dat lists what the model says; after each start
``/stats`` shows it back and the consumers get it. In durable mode a kill -9 between restarts at other N loses
nothing acknowledged. A replicating node (worker 0 owns every topic there) restarted at another N keeps its
replication state: its peer holds its copies as before, takes nothing over and sees no new origin."""

from __future__ import annotations

import collections
import itertools
import json
import time
from pathlib import Path

import pytest

from nsqd.workers import owner_of

from .harness import NsqdProcess, RawClient, dpub, fin, free_port, mpub, pub, rdy, req, stop_all
from .http_helpers import post, stats, wait_for
from .persistence_helpers import (
    metadata,
    parse_record,
    read_queue,
    receive,
)
from .test_log_channels import commit, offsets, publish_to_log, read_all
from .test_workers import start_node
from .test_workers_replication import kill_worker
from .workers_harness import DurableLoad

pytestmark = pytest.mark.timeout(120)

#: a small memory queue: part of each backlog is on disk, part in memory at the stop
FLAGS = ("--mem-queue-size=5",)
DURABLE = ("--mem-queue-size=0", "--sync-every=1")
#: a delay (ms) that outlasts the test: these messages stay deferred throughout
LONG = 3_600_000
CHANNELS = ("ready", "flight", "held")


def spread_topics(prefix: str, counts: tuple[int, ...] = (2, 3)) -> list[str]:
    """One topic for each combination of owners at the worker ``counts`` (six for 2 and 3): every worker of
    every N owns some, and each worker's topics go to different workers at the other N."""
    wanted = list(itertools.product(*(range(count) for count in counts)))
    found: dict[tuple[int, ...], str] = {}
    for number in itertools.count():
        name = f"{prefix}{number}"
        found.setdefault(tuple(owner_of(name, count) for count in counts), name)
        if len(found) == len(wanted):
            return [found[owners] for owners in wanted]
    raise AssertionError("unreachable")


def start(data: Path, workers: int, *flags: str) -> NsqdProcess:
    return (
        start_node(data, *flags, workers=workers) if workers > 1 else NsqdProcess(data, ["--workers=1", *flags]).start()
    )


def http(node: NsqdProcess) -> tuple[str, int]:
    address = node.http(10)
    assert address is not None, node.log_text()
    return address


class Model:
    """Where NSQ keeps each message of the node, as a graceful stop leaves it: per queue (a topic's, while the
    topic is paused or has no channel, or a channel's ``topic:channel``) its bodies with their attempts (in-flight
    messages stay in their channel's, counted as delivered), the bodies deferred past the test's end, and the
    paused flags that nsqd.dat keeps."""

    def __init__(self) -> None:
        self.topics: dict[str, dict] = {}  # name -> {"paused": bool, "channels": {name: paused}}
        self.queues: dict[str, dict[bytes, int]] = {}  # queue -> body -> attempts
        self.deferred: dict[str, set[bytes]] = collections.defaultdict(set)
        self.log_topic = ""
        self.log: list[bytes] = []  # the log channel's messages by offset
        self.committed = 0
        self.gone: set[str] = set()  # the queues of deleted channels: no file left

    def channels(self, topic: str) -> list[str]:
        return list(self.topics[topic]["channels"])

    def held_at_topic(self, topic: str) -> bool:
        return self.topics[topic]["paused"] or not self.topics[topic]["channels"]

    def published(self, topic: str, bodies: list[bytes], *, deferred: bool = False) -> None:
        if topic == self.log_topic:
            self.log += bodies
            return
        queues = [topic] if self.held_at_topic(topic) else [f"{topic}:{c}" for c in self.channels(topic)]
        for queue in queues:
            self.queues.setdefault(queue, {}).update(dict.fromkeys(bodies, 0))
            if deferred:
                self.deferred[queue].update(bodies)

    def topic_unpaused(self, topic: str) -> None:
        backlog = self.queues.pop(topic, {})
        deferred = self.deferred.pop(topic, set())
        for channel in self.channels(topic):
            self.queues.setdefault(f"{topic}:{channel}", {}).update(backlog)
            self.deferred[f"{topic}:{channel}"] |= deferred

    def emptied(self, queue: str) -> None:
        self.queues.pop(queue, None)
        self.deferred.pop(queue, None)

    def delivered(self, queue: str, message) -> None:
        """``message`` came to a consumer of ``queue``: it was there, with one attempt less."""
        attempts = self.queues.get(queue, {}).get(message.body)
        assert attempts is not None, f"{message.body!r} delivered on {queue}, where it is not"
        assert message.attempts == attempts + 1, (queue, message.body, message.attempts, attempts)
        assert message.body not in self.deferred[queue], f"{message.body!r} delivered before its delay on {queue}"
        self.queues[queue][message.body] = message.attempts

    def finished(self, queue: str, body: bytes) -> None:
        del self.queues[queue][body]

    def deferred_again(self, queue: str, body: bytes) -> None:
        self.deferred[queue].add(body)

    def deleted_channel(self, topic: str, channel: str) -> None:
        del self.topics[topic]["channels"][channel]
        self.queues.pop(f"{topic}:{channel}", None)
        self.deferred.pop(f"{topic}:{channel}", None)
        self.gone.add(f"{topic}:{channel}")

    def ready(self, queue: str) -> set[bytes]:
        return set(self.queues.get(queue, {})) - self.deferred[queue]

    # -- the checks -------------------------------------------------------------------------------------------
    def check_files(self, data: Path) -> None:
        """After a graceful stop: nsqd.dat lists the model's topics, channels and flags (no ephemeral one), and
        each queue's file holds exactly its messages with their attempts."""
        document = metadata(data)
        listed = {
            entry["name"]: {
                "paused": entry["paused"],
                "channels": {channel["name"]: channel["paused"] for channel in entry["channels"] or ()},
            }
            for entry in document["topics"] or ()
        }
        assert listed == self.topics, json.dumps(document)
        channels = {f"{t}:{c}" for t in self.topics if t != self.log_topic for c in self.channels(t)}
        for queue in sorted(set(self.queues) | set(self.topics) | channels):
            records = [parse_record(record) for record in read_queue(data, queue)]
            kept = collections.Counter((body, attempts) for _, attempts, _, body in records)
            expected = collections.Counter(self.queues.get(queue, {}).items())
            assert kept == expected, (queue, kept - expected, expected - kept)
            assert (data / f"{queue}.deferred.dat").exists() == bool(self.deferred[queue]), queue
        files = [path.name for path in data.iterdir()]
        assert not [name for name in files if "#ephemeral" in name], files
        assert not [name for name in files if name.startswith(tuple(f"{queue}." for queue in self.gone))], files

    def check_stats(self, node: NsqdProcess) -> None:
        """After a start: ``/stats`` shows the model's topics, channels, flags and depths (a message deferred in
        a channel's file counts in its depth until the channel reads it, as after nsqd 1.3.0's restart)."""
        document = stats(http(node))
        shown = {t["topic_name"]: t for t in document["topics"] if t["topic_name"] in self.topics}
        assert set(shown) == set(self.topics), sorted(t["topic_name"] for t in document["topics"])
        assert not [t["topic_name"] for t in document["topics"] if t["topic_name"] not in self.topics]
        for name, topic in shown.items():
            assert topic["paused"] == self.topics[name]["paused"], name
            assert topic["depth"] == len(self.queues.get(name, {})), (name, topic["depth"])
            channels = {c["channel_name"]: c for c in topic["channels"]}
            assert {c: ch["paused"] for c, ch in channels.items()} == self.topics[name]["channels"], name
            for channel_name, channel in channels.items():
                if name == self.log_topic:
                    continue
                queue = f"{name}:{channel_name}"
                held = (channel["depth"] + channel["deferred_count"], channel["in_flight_count"])
                assert held == (len(self.queues.get(queue, {})), 0), (queue, channel)

    def check_log(self, node: NsqdProcess) -> None:
        with RawClient(node.tcp) as client:
            assert offsets(client, self.log_topic) == {
                "start": self.committed,
                "committed": self.committed,
                "end": len(self.log),
            }
            assert read_all(client, self.log_topic, self.committed, len(self.log)) == self.log[self.committed :]


class Node:
    """One node's run between two restarts: the model's changes made through it, on connections that land on
    any of its workers."""

    def __init__(self, node: NsqdProcess, model: Model, step: str) -> None:
        self.node = node
        self.model = model
        self.step = step
        self.http = http(node)
        self.producers = [RawClient(node.tcp) for _ in range(4)]
        self.holding: list[RawClient] = []  # consumers with messages in flight, open until the stop
        self.count = itertools.count()

    def bodies(self, topic: str, count: int) -> list[bytes]:
        return [f"{self.step}-{topic}-{next(self.count)}".encode() for _ in range(count)]

    def create(self, topic: str, channels: tuple[str, ...] = CHANNELS) -> None:
        assert post(self.http, f"/topic/create?topic={topic}").status == 200
        self.model.topics.setdefault(topic, {"paused": False, "channels": {}})
        for channel in channels:
            assert post(self.http, f"/channel/create?topic={topic}&channel={channel}").status == 200
            self.model.topics[topic]["channels"].setdefault(channel, False)

    def pause_topic(self, topic: str, paused: bool) -> None:
        if self.model.topics[topic]["paused"] == paused:
            return
        if paused:  # nothing left at the topic that its channels would still get
            wait_for(lambda: self.topic_depth(topic) == 0, message=f"{topic} copied to its channels")
        verb = "pause" if paused else "unpause"
        assert post(self.http, f"/topic/{verb}?topic={topic}").status == 200
        self.model.topics[topic]["paused"] = paused
        if not paused:  # its backlog goes to its channels
            self.model.topic_unpaused(topic)
            wait_for(lambda: self.topic_depth(topic) == 0, message=f"{topic} copied to its channels")

    def pause_channel(self, topic: str, channel: str, paused: bool) -> None:
        verb = "pause" if paused else "unpause"
        assert post(self.http, f"/channel/{verb}?topic={topic}&channel={channel}").status == 200
        self.model.topics[topic]["channels"][channel] = paused

    def empty(self, topic: str, channel: str | None = None) -> None:
        """nsqadmin's empty: of a channel (its queue, in-flight and deferred messages), or of a topic's own queue."""
        if channel is None:
            assert post(self.http, f"/topic/empty?topic={topic}").status == 200
        else:
            assert post(self.http, f"/channel/empty?topic={topic}&channel={channel}").status == 200
        self.model.emptied(topic if channel is None else f"{topic}:{channel}")

    def delete_channel(self, topic: str, channel: str) -> None:
        assert post(self.http, f"/channel/delete?topic={topic}&channel={channel}").status == 200
        self.model.deleted_channel(topic, channel)

    def topic_depth(self, topic: str) -> int:
        return next(t["depth"] for t in stats(self.http, f"topic={topic}")["topics"] if t["topic_name"] == topic)

    def channel(self, topic: str, channel: str) -> dict:
        for t in stats(self.http, f"topic={topic}")["topics"]:
            for c in t["channels"]:
                if t["topic_name"] == topic and c["channel_name"] == channel:
                    return c
        raise AssertionError(f"no channel {topic}:{channel}")

    def publish(self, topics: list[str], count: int = 12) -> None:
        """PUBs and MPUBs on every producer (each accepted by some worker): past the memory queue's 5."""
        for number, topic in enumerate(topics):
            batch = self.bodies(topic, count)
            producer = self.producers[number % len(self.producers)]
            half = count // 2
            for body in batch[:half]:
                producer.send(pub(topic, body))
            producer.send(mpub(topic, batch[half:]))
            for _ in range(half + 1):
                producer.expect_ok()
            self.model.published(topic, batch)

    def defer(self, topic: str) -> None:
        (body,) = self.bodies(topic, 1)
        producer = self.producers[0]
        producer.send(dpub(topic, LONG, body))
        producer.expect_ok()
        self.model.published(topic, [body], deferred=True)

    def consume(self, topic: str, channel: str, count: int, *, exact: bool = False) -> None:
        """``count`` messages of the channel delivered, FIN'd; ``exact``: and nothing more comes (the deferred ones
        are read then)."""
        queue = f"{topic}:{channel}"
        with RawClient(self.node.tcp) as client:
            client.subscribe(topic, channel, ready=count + exact)
            got = receive(client, count, finish=False)
            if exact:
                assert client.poll_frame(0.3) is None, queue
            client.send(rdy(0))  # before the FINs, which would free credit for more
            for message in got:
                self.model.delivered(queue, message)
                client.send(fin(message.id))
                self.model.finished(queue, message.body)
            wait_for(lambda: self.channel(topic, channel)["in_flight_count"] == 0, message=f"{queue} finished")

    def hold_in_flight(self, topic: str, channel: str = "flight") -> None:
        """Three messages delivered: one finished, one put back deferred past the test's end, one left in flight
        (and so the consumer kept open) until the stop."""
        queue = f"{topic}:{channel}"
        client = RawClient(self.node.tcp)
        self.holding.append(client)
        client.subscribe(topic, channel, ready=3)
        got = receive(client, 3, finish=False)
        client.send(rdy(0))
        for message in got:
            self.model.delivered(queue, message)
        client.send(fin(got[0].id) + req(got[1].id, LONG))
        self.model.finished(queue, got[0].body)
        self.model.deferred_again(queue, got[1].body)
        deferred = len(self.model.deferred[queue])
        wait_for(
            lambda: (c := self.channel(topic, channel))["in_flight_count"] == 1 and c["deferred_count"] >= 1,
            message=f"{queue}: one in flight, {deferred} deferred",
        )

    def ephemeral(self, topics: list[str]) -> None:
        """Ephemeral channels with a consumer (RDY 0) until the stop, and an ephemeral topic: gone after it."""
        for topic in [*topics, "scratch#ephemeral"]:
            client = RawClient(self.node.tcp)
            self.holding.append(client)
            client.subscribe(topic, "tail#ephemeral", ready=0)
        self.producers[1].publish("scratch#ephemeral", b"gone")

    def log(self, count: int, commit_to: int) -> None:
        with RawClient(self.node.tcp) as client:
            batch = self.bodies(self.model.log_topic, count)
            publish_to_log(client, self.model.log_topic, batch)
            self.model.log += batch
            assert commit(client, self.model.log_topic, commit_to)["committed"] == commit_to
            self.model.committed = commit_to

    def stop(self, data: Path) -> None:
        assert self.node.stop(30) == 0, self.node.log_text()
        for client in self.producers + self.holding:
            client.close()
        self.model.check_files(data)


def test_a_node_restarted_at_1_3_and_2_workers_keeps_every_message_where_it_was(tmp_path):
    data = tmp_path / "data"
    topics = spread_topics("kept")
    (bare,) = spread_topics("bare", (1,))
    model = Model()
    model.log_topic = next(name for name in spread_topics("logged") if owner_of(name, 2) == 1)

    # N=2: everything at once
    run = Node(start(data, 2, *FLAGS), model, "n2")
    for topic in topics:
        run.create(topic)
    run.create(bare, ())
    run.create(model.log_topic, ("c",))
    run.log(20, 5)
    for index, topic in enumerate(topics):
        run.pause_topic(topic, index in (1, 4))
        run.pause_channel(topic, "held", index % 2 == 0)
    run.ephemeral(topics)
    run.publish([*topics, bare])
    for index, topic in enumerate(topics):
        run.defer(topic)  # a paused topic keeps it, with its delay, until its channels get it
        if index not in (1, 4):
            run.hold_in_flight(topic)
            run.consume(topic, "ready", 4)
    run.defer(bare)
    run.stop(data)

    # N=1, then 3, then 2: each finds it all, changes some, and stops
    for workers, paused_topics in ((1, (2, 5)), (3, (0,)), (2, ())):
        run = Node(start(data, workers, *FLAGS), model, f"n{workers}-{len(paused_topics)}")
        model.check_stats(run.node)
        model.check_log(run.node)
        for index, topic in enumerate(topics):
            run.pause_topic(topic, index in paused_topics)
            if "held" in model.channels(topic):
                run.pause_channel(topic, "held", (index + workers) % 2 == 0)
        live = [topic for topic in topics if not model.topics[topic]["paused"]]
        for topic in live:
            run.consume(topic, "ready", 3)
            run.consume(topic, "flight", 1)
        run.publish([*topics, bare], 8)
        for topic in [*topics, bare]:
            run.defer(topic)
        for topic in live:
            run.hold_in_flight(topic)
        run.log(7, model.committed + 6)
        if workers == 3:
            run.delete_channel(topics[3], "held")
            run.create(topics[3], ("late",))
            run.empty(live[-1], "flight")
            run.empty(bare)
            run.publish([live[-1], bare], 6)
        run.stop(data)

    # and at N=2 again: every message comes out where the model says, deferred ones stay
    run = Node(start(data, 2, *FLAGS), model, "last")
    model.check_stats(run.node)
    model.check_log(run.node)
    for topic in topics:
        run.pause_topic(topic, False)
        for channel in model.channels(topic):
            run.pause_channel(topic, channel, False)
            queue = f"{topic}:{channel}"
            run.consume(topic, channel, len(model.ready(queue)), exact=True)
            assert model.ready(queue) == set(), queue
            wait_for(
                lambda t=topic, c=channel, q=queue: run.channel(t, c)["deferred_count"] == len(model.deferred[q]),
                message=f"{queue}: its deferred messages read",
            )
    run.stop(data)


def test_deferred_messages_keep_their_due_time_when_the_count_changes(tmp_path):
    """DPUBs (at a channel, and at a topic without one) and a REQ with a delay at 2 workers, a graceful stop, a
    start at 3: each owner under 3 reads the delays its topics' files keep and delivers nothing before it is due."""
    delay = 3.0
    data = tmp_path / "data"
    topics = spread_topics("due")
    node = start(data, 2)
    due: dict[bytes, float] = {}
    holding = []
    with RawClient(node.tcp) as producer:
        for number, topic in enumerate(topics):
            if number % 2 == 0:  # a channel to defer at; the others' DPUBs wait at the topic
                client = RawClient(node.tcp)
                holding.append(client)
                client.subscribe(topic, "c", ready=1)
                producer.publish(topic, b"requeued-" + topic.encode())
                (message,) = receive(client, 1, finish=False)
                due[message.body] = time.time() + delay  # (before the node reads it: the earliest it can be due)
                client.send(req(message.id, int(delay * 1000)))
            body = b"dpub-" + topic.encode()
            due[body] = time.time() + delay
            producer.send(dpub(topic, int(delay * 1000), body))
            producer.expect_ok()
    for client in holding:  # each REQ handled: its channel shows the message deferred
        client.send(b"NOP\n")
        client.assert_open()
    assert node.stop(30) == 0
    for client in holding:
        client.close()
    node = start(data, 3)
    try:
        clients = []
        for topic in topics:
            client = RawClient(node.tcp)
            clients.append(client)
            client.subscribe(topic, "c", ready=5)
        got = []
        for client, topic in zip(clients, topics, strict=True):
            for message in receive(
                client, len([b for b in due if b.endswith(b"-" + topic.encode())]), timeout=delay + 20
            ):
                got.append((message.body, time.time()))
            client.close()
        assert sorted(body for body, _ in got) == sorted(due)
        for body, arrived in got:
            assert arrived >= due[body], (body, due[body] - arrived)  # never before its delay is over
    finally:
        assert node.stop() == 0


@pytest.mark.timeout(240)
def test_nothing_acknowledged_is_lost_across_kill_9_and_restarts_at_another_count(tmp_path):
    """Durable mode: PUB and MPUB to topics spread over the workers of each N, consumers holding some in flight;
    kill -9 in the middle (of every process, or of one worker, which stops the node), restart at the next N (2, 1,
    3, 2), repeat; then drain at N=1. Every message that got OK comes out at least once."""
    data = tmp_path / "data"
    load = DurableLoad(spread_topics("durable"))
    for workers, victim in ((2, None), (1, None), (3, 2), (2, 0)):
        crash = NsqdProcess.kill if victim is None else lambda node, victim=victim: kill_worker(node, victim)
        load.until_crash(start(data, workers, *DURABLE), crash)
    node = start(data, 1, *DURABLE)
    try:
        duplicates = load.drain(node)
    finally:
        assert node.stop() == 0
    print(f"durable kill -9 at workers 2, 1, 3, 2: {len(load.acked)} acknowledged, 0 missing, {duplicates} duplicates")


# -- replication ---------------------------------------------------------------------------------------------------
def start_replicating(data: Path, workers: int, port: int, peer: int) -> NsqdProcess:
    return start(
        data,
        workers,
        "--broadcast-address=127.0.0.1",
        f"--tcp-address=127.0.0.1:{port}",
        f"--replicate-to=127.0.0.1:{peer}",
        "--replica-takeover-timeout=1s",
    )


def replication(node: NsqdProcess) -> dict:
    return stats(http(node)).get("replication", {})


def replicating(node: NsqdProcess) -> bool:
    doc = replication(node)
    return doc.get("state") == "replicating" and not doc.get("unreplicated_messages")


def replicas(node: NsqdProcess) -> dict[str, int]:
    """Origin -> messages this node holds for it."""
    return {entry["node"]: entry["held_messages"] for entry in replication(node).get("replicas", [])}


def test_a_replicating_node_restarted_at_another_count_keeps_its_replication_state(tmp_path):
    """A and B keep copies on each other. A, stopped gracefully and restarted at 1, 3, then 2 workers, finds its
    replication.dat, the store of B's copies and its own messages; B keeps A's copies, takes nothing over, and
    holds copies of one origin, A, throughout. Then every message of each is delivered once, by its own node."""
    port_a, port_b = free_port(), free_port()
    origin_a, origin_b = f"127.0.0.1:{port_a}", f"127.0.0.1:{port_b}"
    nodes = [start_replicating(tmp_path / "b", 1, port_b, port_a)]
    try:
        nodes.append(start_replicating(tmp_path / "a", 2, port_a, port_b))
        a, b = nodes[1], nodes[0]
        wait_for(lambda: replicating(a) and replicating(b), timeout=30, message="both replicating")
        topics = spread_topics("replicated")
        sent: dict[str, dict[str, list[bytes]]] = {origin_a: {}, origin_b: {}}
        for node in (a, b):
            for topic in topics:
                assert post(http(node), f"/topic/create?topic={topic}").status == 200
                assert post(http(node), f"/channel/create?topic={topic}&channel=c").status == 200
        state = (tmp_path / "a" / "replication.dat").read_text()
        for step, workers in enumerate((1, 3, 2)):
            for origin, node in ((origin_a, a), (origin_b, b)):
                with RawClient(node.tcp) as producer:
                    for topic in topics:
                        batch = [f"{origin}-{step}-{topic}-{n}".encode() for n in range(5)]
                        producer.publish_many(topic, batch)
                        sent[origin].setdefault(topic, []).extend(batch)
            count = sum(map(len, sent[origin_a].values()))
            assert replicas(b) == {origin_a: count}
            assert replicas(a) == {origin_b: sum(map(len, sent[origin_b].values()))}
            assert a.stop(30) == 0
            assert json.loads((tmp_path / "a" / "replication.dat").read_text()) == {
                **json.loads(state),
                "running": False,
            }
            nodes[1] = a = start_replicating(tmp_path / "a", workers, port_a, port_b)
            wait_for(lambda a=a: replicating(a) and replicating(b), timeout=30, message=f"A back at {workers} workers")
            assert replicas(b) == {origin_a: count}, "B sees A as it was"
            assert replicas(a) == {origin_b: sum(map(len, sent[origin_b].values()))}, "A kept B's copies"
            for doc in (replication(a), replication(b)):
                assert (doc["takeovers"], doc["adopted_messages"]) == (0, 0), doc
            depths = {t["topic_name"]: t["channels"][0]["depth"] for t in stats(http(a))["topics"]}
            assert depths == {topic: len(sent[origin_a][topic]) for topic in topics}
        for origin, node in ((origin_a, a), (origin_b, b)):
            for topic in topics:
                with RawClient(node.tcp) as client:
                    client.subscribe(topic, "c", ready=100)
                    got = [m.body for m in receive(client, len(sent[origin][topic]))]
                    assert sorted(got) == sorted(sent[origin][topic])
                    assert client.poll_frame(0.2) is None
        wait_for(lambda: not any(replicas(a).values()) and not any(replicas(b).values()), message="copies released")
    finally:
        stop_all(nodes)


def test_a_replica_node_restarted_at_another_count_keeps_its_copies_and_takes_over_at_the_last(tmp_path):
    """B keeps copies for A and replicates nothing itself (its topics spread over its workers; worker 0 keeps the
    stores). Restarted gracefully at 2, then 1, then 3 workers, it holds every copy of A's unfinished messages,
    A goes on replicating to it and it takes nothing over; A killed at the end, B (three workers) adopts them into
    the topics of their owners and delivers each acknowledged message."""
    port_a, port_b = free_port(), free_port()
    origin_a = f"127.0.0.1:{port_a}"
    flags = ("--broadcast-address=127.0.0.1", f"--tcp-address=127.0.0.1:{port_b}", "--replica-takeover-timeout=1s")
    nodes = [start(tmp_path / "b", 2, *flags)]
    try:
        nodes.append(
            start(
                tmp_path / "a",
                1,
                "--broadcast-address=127.0.0.1",
                f"--tcp-address=127.0.0.1:{port_a}",
                f"--replicate-to=127.0.0.1:{port_b}",
            )
        )
        b, a = nodes
        wait_for(lambda: replicating(a), timeout=30, message="A replicating")
        topics = spread_topics("adopted")
        for topic in topics:
            assert post(http(a), f"/topic/create?topic={topic}").status == 200
            assert post(http(a), f"/channel/create?topic={topic}&channel=c").status == 200
        sent: dict[str, list[bytes]] = {topic: [] for topic in topics}
        for step, workers in enumerate((1, 3)):
            with RawClient(a.tcp) as producer:
                for topic in topics:
                    batch = [f"{step}-{topic}-{n}".encode() for n in range(5)]
                    producer.publish_many(topic, batch)
                    sent[topic].extend(batch)
            count = sum(map(len, sent.values()))
            assert replicas(b) == {origin_a: count}
            assert b.stop(30) == 0
            nodes[0] = b = start(tmp_path / "b", workers, *flags)
            wait_for(lambda: replicating(a), timeout=30, message=f"A replicating to B at {workers} workers")
            assert replicas(b) == {origin_a: count}, f"B at {workers} workers holds A's copies"
            assert (replication(b)["takeovers"], replication(b)["adopted_messages"]) == (0, 0)
        a.kill()
        wait_for(lambda: replicas(b).get(origin_a) == 0, timeout=30, message="B took A over")
        for topic in topics:
            with RawClient(b.tcp) as client:
                client.subscribe(topic, "c", ready=100)
                got = [m.body for m in receive(client, len(sent[topic]))]
                assert sorted(got) == sorted(sent[topic])
                assert client.poll_frame(0.2) is None
    finally:
        stop_all([node for node in nodes if node.is_running()])
