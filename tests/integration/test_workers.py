"""``--workers``: the number of processes serving one node. A bad value never starts a node."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from nsqd.workers import owner_of

from .features import FeatureClient
from .harness import (
    FRAME_TYPE_MESSAGE,
    REPO_ROOT,
    ConnectionClosed,
    NsqdProcess,
    RawClient,
    assert_refused_start,
    consumer,
    decode_message,
    dpub,
    fin,
    identify,
    mpub,
    pub,
    rdy,
    req,
    stop_all,
    sub,
    touch,
)
from .http_helpers import get, post, stats, wait_for
from .lookupd_harness import LookupdProcess, wait_for_producers

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("value", "fatal"),
    [("0", "at least 1"), ("-1", "at least 1"), ("4097", "at most 4096")],
)
def test_workers_out_of_range_is_fatal(tmp_path, value, fatal):
    assert_refused_start(
        "nsqd",
        [f"--workers={value}", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"],
        f"--workers must be {fatal}",
    )


def test_workers_not_a_number_in_the_config_file_is_fatal(tmp_path):
    config = tmp_path / "nsqd.toml"
    config.write_text('workers = "many"\n')
    assert_refused_start(
        "nsqd",
        [f"--config={config}", "--tcp-address=127.0.0.1:0", f"--data-path={tmp_path}"],
        "failed parsing workers 'many' in config file - expected an integer, got a string",
    )


def test_workers_not_a_number_on_the_command_line_is_a_usage_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "nsqd", "--workers=many", f"--data-path={tmp_path}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith('invalid value "many" for flag -workers: parse error\n'), done.stderr
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------------------------------------------
# --workers=2: one node to its clients. Each test uses a topic owned by each worker, so whichever worker accepts
# a connection, one of its topics is served there and the other crosses to the other worker.


def owned_topics(prefix: str, count: int = 2) -> list[str]:
    """One topic name owned by each of ``count`` workers."""
    found: dict[int, str] = {}
    for number in itertools.count():
        name = f"{prefix}{number}"
        found.setdefault(owner_of(name, count), name)
        if len(found) == count:
            return [found[index] for index in range(count)]
    raise AssertionError("unreachable")


def start_node(data_path, *args: str, workers: int = 2) -> NsqdProcess:
    """nsqd with ``--workers``, once every worker listens (each logs its listeners)."""
    node = NsqdProcess(data_path, [f"--workers={workers}", *args]).start()
    for index in range(workers):
        node.wait_for_log(rf"NSQ: worker {index} of {workers}", 20)
    line = 0
    for _ in range(workers):
        line = node.lines.index(node.wait_for_log(r"HTTP: listening on ", 20, line).string, line) + 1
    return node


def worker_pids(node: NsqdProcess) -> list[int]:
    assert node.proc is not None
    with open(f"/proc/{node.proc.pid}/task/{node.proc.pid}/children") as handle:
        return [int(pid) for pid in handle.read().split()]


@pytest.fixture
def node(tmp_path):
    daemon = start_node(tmp_path / "data")
    yield daemon
    stop_all([daemon])


def receive_all(consumers: list[RawClient], expected: int, timeout: float = 20.0) -> list[list[bytes]]:
    """The bodies each consumer receives (FIN'd) until ``expected`` arrived in all, then a short quiet wait
    shows nothing more comes."""
    got: list[list[bytes]] = [[] for _ in consumers]
    deadline = time.monotonic() + timeout
    while sum(map(len, got)) < expected:
        assert time.monotonic() < deadline, f"received {sum(map(len, got))} of {expected}"
        for index, client in enumerate(consumers):
            frame = client.poll_frame(0.05)
            if frame is None:
                continue
            assert frame.frame_type == FRAME_TYPE_MESSAGE, frame
            message = decode_message(frame.data)
            got[index].append(message.body)
            client.send(fin(message.id))
    for client in consumers:
        assert client.poll_frame(0.2) is None
    return got


def test_each_message_reaches_one_consumer_of_each_channel(node):
    topics = owned_topics("spread")
    first = {name: [consumer(node.tcp, name, "first", ready=5) for _ in range(3)] for name in topics}
    second = {name: [consumer(node.tcp, name, "second", ready=50)] for name in topics}
    producers = [RawClient(node.tcp) for _ in range(4)]
    sent = {name: [] for name in topics}
    for number in range(40):
        for name in topics:
            body = f"{name}-{number}".encode()
            producers[number % len(producers)].publish(name, body)
            sent[name].append(body)
    producers[0].publish_many(topics[0], [b"batch-1", b"batch-2"])
    producers[1].send(dpub(topics[1], 10, b"deferred"))
    producers[1].expect_ok()
    sent[topics[0]] += [b"batch-1", b"batch-2"]
    sent[topics[1]].append(b"deferred")
    for name in topics:
        for group in (first[name], second[name]):
            got = receive_all(group, len(sent[name]))
            received = [body for bodies in got for body in bodies]
            assert sorted(received) == sorted(sent[name])  # each message once per channel
        assert sum(1 for bodies in receive_all(first[name], 0, 1) if bodies) == 0
    for client in producers + [c for group in (*first.values(), *second.values()) for c in group]:
        client.close()


def test_req_touch_fin_and_timeouts_on_either_worker(node):
    for name in owned_topics("redeliver"):
        client = RawClient(node.tcp)
        client.identify({"msg_timeout": 1000})
        client.subscribe(name, "c", 1)
        RawClient(node.tcp).publish(name, b"again")
        message = client.read_message()
        assert message.attempts == 1
        client.send(touch(message.id))
        client.send(req(message.id, 0))
        message = client.read_message()
        assert (message.body, message.attempts) == (b"again", 2)
        # not finished: back after its 1 s timeout, to the same connection (the only consumer)
        message = client.read_message(timeout=10)
        assert (message.body, message.attempts) == (b"again", 3)
        client.send(fin(message.id))
        client.send(fin(message.id))  # finished already: refused, the connection stays
        refusal = client.read_reply()
        assert refusal.data == b"E_FIN_FAILED FIN " + message.id + b" failed ID not in flight", refusal
        client.send(rdy(0))
        client.assert_open()
        client.close()


def voluntary_switches(pid: int) -> int:
    """The voluntary context switches of every thread of ``pid``: each one a sleep of the process that ended."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/status") as handle:
            total += sum(int(line.split()[1]) for line in handle if line.startswith("voluntary_ctxt_switches:"))
    return total


def wait_until_asleep(pids: list[int], quiet: float = 1.0, timeout: float = 20.0) -> None:
    """Until none of ``pids`` wakes up for ``quiet`` seconds (a timer every 100 ms never lets that happen)."""
    deadline = time.monotonic() + timeout
    counts = [voluntary_switches(pid) for pid in pids]
    since = time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, "a worker kept waking up"
        time.sleep(0.05)
        now = [voluntary_switches(pid) for pid in pids]
        if now != counts:
            counts, since = now, time.monotonic()


def test_deferred_and_timed_out_messages_come_due_on_a_worker_that_was_idle(node):
    """An idle worker runs no queue scan (nor its other timers): the first deferred or in-flight message must
    start it again, and each comes due."""
    consumers = {}
    for name in owned_topics("asleep"):
        client = consumers[name] = RawClient(node.tcp)
        client.identify({"msg_timeout": 1000})
        client.subscribe(name, "c", 2)
    wait_until_asleep(worker_pids(node))
    producer = RawClient(node.tcp)
    for name in consumers:
        producer.send(dpub(name, 500, b"deferred"))
        producer.expect_ok()
        producer.publish(name, b"timed out")
    for client in consumers.values():
        message = client.read_message(timeout=10)
        assert (message.body, message.attempts) == (b"timed out", 1)  # not finished: back after its timeout
        got = {(m.body, m.attempts): m for m in (client.read_message(timeout=10) for _ in range(2))}
        assert sorted(got) == [(b"deferred", 1), (b"timed out", 2)]
        for message in got.values():
            client.send(fin(message.id))
    # and again once the workers went back to sleep
    wait_until_asleep(worker_pids(node))
    for name in consumers:
        producer.send(dpub(name, 300, b"later"))
        producer.expect_ok()
    for client in consumers.values():
        message = client.read_message(timeout=10)
        assert (message.body, message.attempts) == (b"later", 1)
        client.send(fin(message.id))
        client.close()
    producer.close()


def test_a_hot_topic_and_many_topics(node):
    (hot,) = owned_topics("hot", 1)
    consumers = [consumer(node.tcp, hot, "c", ready=20) for _ in range(4)]
    producers = [RawClient(node.tcp) for _ in range(8)]
    for number in range(25):
        for index, producer in enumerate(producers):
            producer.send(pub(hot, f"{index}-{number}".encode()))
    for producer in producers:
        for _ in range(25):
            producer.expect_ok()
    got = receive_all(consumers, 200)
    assert sorted(body for bodies in got for body in bodies) == sorted(
        f"{index}-{number}".encode() for index in range(8) for number in range(25)
    )
    many = [f"many{number}" for number in range(20)]
    for name in many:
        producers[0].publish(name, name.encode())
    document = stats(node.listening["HTTP"])
    names = [entry["topic_name"] for entry in document["topics"]]
    assert names == sorted(names) and set(many) <= set(names)
    assert {entry["topic_name"]: entry["message_count"] for entry in document["topics"]}[hot] == 200
    for client in consumers + producers:
        client.close()


def test_stats_metrics_and_http_are_one_node(node):
    topics = owned_topics("http")
    address = node.listening["HTTP"]
    for name in topics:
        assert post(address, f"/pub?topic={name}", b"one").status == 200
        assert post(address, f"/mpub?topic={name}", b"two\nthree").status == 200
        assert post(address, f"/channel/create?topic={name}&channel=c").status == 200
        assert post(address, f"/channel/pause?topic={name}&channel=c").status == 200
    listener = consumer(node.tcp, topics[0], "c", ready=1)
    document = stats(address)
    assert list(document) == ["version", "health", "start_time", "topics", "memory", "producers"]
    by_name = {entry["topic_name"]: entry for entry in document["topics"]}
    for name in topics:
        entry = by_name[name]
        assert entry["message_count"] == 3
        assert [(c["channel_name"], c["paused"], c["depth"]) for c in entry["channels"]] == [("c", True, 3)]
    assert len(by_name[topics[0]]["channels"][0]["clients"]) == 1
    one = stats(address, f"topic={topics[1]}")
    assert [entry["topic_name"] for entry in one["topics"]] == [topics[1]]
    metrics = get(address, "/metrics").body.decode()
    for name in topics:
        assert f'nsqd_topic_messages_total{{topic="{name}"}} 3.0' in metrics
    for name in topics:
        assert post(address, f"/topic/delete?topic={name}").status == 200
    assert post(address, f"/topic/delete?topic={topics[1]}").status == 404
    assert not {entry["topic_name"] for entry in stats(address)["topics"]} & set(topics)
    listener.close()


def test_one_registration_in_lookupd(tmp_path):
    lookupd = LookupdProcess(tmp_path / "lookupd").start()
    node = start_node(
        tmp_path / "data", f"--lookupd-tcp-address={lookupd.tcp_address}", "--broadcast-address=127.0.0.1"
    )
    try:
        topics = owned_topics("registered")
        for name in topics:
            consumer(node.tcp, name, "c", ready=0).close()
        for name in topics:
            producers = wait_for_producers(lookupd, name, {node.tcp[1]})
            assert len(producers) == 1
        wait_for(
            lambda: sorted(get(lookupd.http_address, f"/channels?topic={topics[1]}").json()["channels"]) == ["c"],
            20,
        )
        nodes = get(lookupd.http_address, "/nodes").json()["producers"]
        assert len(nodes) == 1 and set(topics) <= set(nodes[0]["topics"])
        # a new topic's channels are pre-created from lookupd whichever worker owns it
        fresh = owned_topics("precreated")
        for name in fresh:
            assert post(lookupd.http_address, f"/channel/create?topic={name}&channel=archive").status == 200
        producer = RawClient(node.tcp)
        for name in fresh:
            producer.publish(name, b"first")
        producer.close()

        def depths():
            found = {entry["topic_name"]: entry for entry in stats(node.listening["HTTP"])["topics"]}
            return [
                [(c["channel_name"], c["depth"]) for c in found[name]["channels"]] for name in fresh if name in found
            ]

        wait_for(lambda: depths() == [[("archive", 1)]] * 2, 20, message="channels pre-created in both workers")
    finally:
        stop_all([node, lookupd])


def test_graceful_stop_keeps_everything_and_a_restart_resumes(tmp_path):
    data = tmp_path / "data"
    node = start_node(data)
    topics = owned_topics("kept")
    producer = RawClient(node.tcp)
    for name in topics:
        consumer(node.tcp, name, "c", ready=0).close()
        for number in range(10):
            producer.publish(name, f"{name}-{number}".encode())
    producer.close()
    assert node.stop() == 0
    listed = json.loads((data / "nsqd.dat").read_text())
    assert sorted(entry["name"] for entry in listed["topics"]) == sorted(topics)
    node = start_node(data)
    try:
        for name in topics:
            got = receive_all([consumer(node.tcp, name, "c", ready=20)], 10)
            assert sorted(got[0]) == sorted(f"{name}-{number}".encode() for number in range(10))
    finally:
        stop_all([node])


def test_publishes_acknowledged_by_the_accepting_worker_survive_a_stop_meanwhile(tmp_path):
    """A publish to a topic another worker owns is acknowledged before the owner has it (nsqd/workers.py,
    ``publish_acknowledged``): a SIGTERM while producers stream PUBs must leave every acknowledged message stored
    (the stop is two-phase: each worker hands over what it acknowledged before any stops its topics)."""
    data = tmp_path / "data"
    node = start_node(data)
    topics = owned_topics("handed")
    for name in topics:
        consumer(node.tcp, name, "c", ready=0).close()
    producers = [RawClient(node.tcp) for _ in range(6)]
    stream = b"".join(pub(topics[number % 2], b"m%d" % number) for number in range(20_000))

    def send(producer: RawClient) -> None:
        with contextlib.suppress(OSError):
            producer.send(stream)

    senders = [threading.Thread(target=send, args=(producer,), daemon=True) for producer in producers]
    for sender in senders:
        sender.start()
    assert producers[0].read_reply().data == b"OK"
    assert node.proc is not None
    node.proc.send_signal(signal.SIGTERM)
    acknowledged = dict.fromkeys(topics, 0)
    for producer in producers:
        count = 0
        with contextlib.suppress(ConnectionClosed, TimeoutError, OSError):
            while producer.read_reply(timeout=10).data == b"OK":
                count += 1
        acknowledged[topics[0]] += (count + 1) // 2  # answers come in order: commands alternate the topics
        acknowledged[topics[1]] += count // 2
        producer.close()
    assert node.proc.wait(30) == 0  # the one SIGTERM above: a second could meet the parent's interpreter exiting
    node.stop()
    for sender in senders:
        sender.join(10)
    node = start_node(data)
    try:
        depths = {
            entry["topic_name"]: entry["channels"][0]["depth"] for entry in stats(node.listening["HTTP"])["topics"]
        }
        for name in topics:
            assert acknowledged[name] <= depths[name] <= len(producers) * 10_000, (acknowledged, depths)
    finally:
        stop_all([node])


def stop_every_process(node: NsqdProcess, workers: list[int]) -> int:
    """SIGTERM to the parent and every worker at once, as ``pkill nsqd`` and systemd's stop send; the exit code."""
    assert node.proc is not None
    for pid in [node.proc.pid, *workers]:
        os.kill(pid, signal.SIGTERM)
    return node.proc.wait(30)


def assert_graceful(node: NsqdProcess, code: int) -> None:
    errors = [line for line in node.lines if " ERROR: " in line]
    assert (code, errors) == (0, []), node.log_text()


def test_a_stop_signal_while_the_workers_start_is_a_graceful_stop(tmp_path):
    """A worker is forked before it imports trio and nsqd: a SIGTERM then waits for its handler."""
    started = r"NSQ: started 2 workers \(pids (\d+) (\d+)\)"
    node = NsqdProcess(tmp_path / "data", ["--workers=2"]).start(started)
    try:
        code = stop_every_process(node, [int(pid) for pid in node.wait_for_log(started, 1).groups()])
    finally:
        node.kill()
    assert_graceful(node, code)


def test_a_stop_signal_to_every_process_at_once_is_a_graceful_stop(tmp_path):
    """``pkill nsqd`` or systemd's stop signals the parent and every worker at once, so each worker gets SIGTERM
    twice (its own, then the parent's): every round must still exit 0 with no ERROR line, and keep every message."""
    data = tmp_path / "data"
    topics = owned_topics("signalled")
    published = 0
    for _ in range(4):
        node = start_node(data)
        try:
            depths = {entry["topic_name"]: entry["depth"] for entry in stats(node.listening["HTTP"])["topics"]}
            assert [depths.get(name, 0) for name in topics] == [published] * 2, node.log_text()
            producer = RawClient(node.tcp)
            for name in topics:
                producer.publish_many(name, [b"%d" % number for number in range(published, published + 10)])
            producer.close()
            published += 10
            code = stop_every_process(node, worker_pids(node))
        finally:
            node.kill()
        assert_graceful(node, code)
    node = start_node(data)
    try:
        depths = {entry["topic_name"]: entry["depth"] for entry in stats(node.listening["HTTP"])["topics"]}
        assert [depths.get(name, 0) for name in topics] == [published] * 2
    finally:
        stop_all([node])


def test_a_killed_worker_stops_the_node_and_a_restart_serves_every_topic(tmp_path):
    data = tmp_path / "data"
    node = start_node(data)
    topics = owned_topics("crash")
    for name in topics:
        consumer(node.tcp, name, "c", ready=0).close()
    address = node.listening["HTTP"]
    wait_for(lambda: sorted(e["name"] for e in json.loads((data / "nsqd.dat").read_text())["topics"] or ()) == topics)
    victim = worker_pids(node)[1]
    os.kill(victim, signal.SIGKILL)
    assert node.proc is not None
    assert node.proc.wait(30) == 1
    node.wait_for_log(rf"worker \d \(pid {victim}\) was killed by signal 9: stopping the node", 5)
    assert address  # (the node is gone: a supervisor would restart it)
    node = start_node(data)
    try:
        document = stats(node.listening["HTTP"])
        assert sorted(entry["topic_name"] for entry in document["topics"]) == topics
    finally:
        stop_all([node])


def test_answers_keep_their_order_across_workers(node):
    topics = owned_topics("ordered")
    client = RawClient(node.tcp)
    commands = [pub(topics[number % 2], f"m{number}".encode()) for number in range(30)]
    commands.append(mpub(topics[1], [b"a", b"b"]))
    commands.append(identify({"feature_negotiation": True, "user_agent": "ordered"}))
    client.send(b"".join(commands))
    for _ in range(31):
        assert client.read_reply().data == b"OK"
    assert json.loads(client.read_reply().data)["max_rdy_count"] == 2500
    counts = {entry["topic_name"]: entry["message_count"] for entry in stats(node.listening["HTTP"])["topics"]}
    assert (counts[topics[0]], counts[topics[1]]) == (15, 17)
    client.close()


def test_a_producer_goes_to_its_topics_owner_and_stays_one_connection(node):
    """A producer whose topic the other worker owns is handed over to it after its first publish there: the client
    sees one connection (its answers in order, a command cut in two across the hand-over, its IDENTIFY and its
    counts in ``/stats``), and every message arrives once."""
    topics = owned_topics("handed")
    producers = [RawClient(node.tcp) for _ in range(12)]
    for index, producer in enumerate(producers):
        producer.identify({"user_agent": f"handed-{index}"})
    for index, producer in enumerate(producers):
        name = topics[index % 2]
        if index < 6:
            producer.publish(name, f"{index}-first".encode())
        # pipelined, and a PUB cut in its line or in its body (the others: read with the first publish that may
        # hand the connection over): whichever worker reads each part, it is whole
        tail = pub(name, f"{index}-split".encode())
        cut = 7 if index < 6 else len(tail) - 3
        producer.send(pub(name, f"{index}-a".encode()) + mpub(name, [f"{index}-b".encode(), b"c"]) + tail[:cut])
        time.sleep(0.01)
        producer.send(tail[cut:])
        for _ in range(3):
            producer.expect_ok()
        if index >= 6:
            producer.publish(name, f"{index}-first".encode())
    node.wait_for_log(r"taken over from another worker", 10)
    for index, producer in enumerate(producers):
        producer.publish(topics[index % 2], f"{index}-last".encode())
    document = stats(node.listening["HTTP"])
    counts = {entry["topic_name"]: entry["message_count"] for entry in document["topics"]}
    assert counts == {name: 6 * 6 for name in topics}
    seen = {entry["user_agent"]: entry["pub_counts"] for entry in document["producers"]}
    assert len(document["producers"]) == 12
    for index in range(12):
        assert seen[f"handed-{index}"] == [{"topic": topics[index % 2], "count": 6}]
    for first, name in enumerate(topics):
        listener = consumer(node.tcp, name, "c", ready=100)
        got = sorted(body for bodies in receive_all([listener], 36) for body in bodies)
        kinds = ("first", "a", "b", "split", "last")
        expected = [f"{index}-{kind}".encode() for index in range(first, 12, 2) for kind in kinds] + [b"c"] * 6
        assert got == sorted(expected)
        listener.close()
    for producer in producers:
        producer.close()


def test_one_unix_socket_for_every_worker(tmp_path):
    sock_dir = tempfile.mkdtemp(prefix="nsqw", dir="/tmp")  # short: a socket's path has at most 107 bytes
    path = os.path.join(sock_dir, "nsqd.sock")
    try:
        node = start_node(tmp_path / "data", f"--tcp-address={path}")
        try:
            assert node.tcp == path
            topics = owned_topics("unix")
            consumers = [consumer(path, name, "c", ready=5) for name in topics for _ in range(2)]
            producer = RawClient(path)
            for name in topics:
                producer.publish_many(name, [f"{name}-{number}".encode() for number in range(6)])
            for index, name in enumerate(topics):
                got = receive_all(consumers[2 * index : 2 * index + 2], 6)
                assert sorted(body for bodies in got for body in bodies) == sorted(
                    f"{name}-{number}".encode() for number in range(6)
                )
            for client in [producer, *consumers]:
                client.close()
        finally:
            stop_all([node])
        assert not os.path.exists(path)  # removed once, by the parent, when the node stopped
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_tls_and_compression_stay_in_the_accepting_worker(tmp_path, certs):
    node = start_node(tmp_path / "data", *certs.daemon_args())
    try:
        topics = owned_topics("layers")
        layered = []
        for index in range(2):
            client = FeatureClient(node.tcp)
            features = {"feature_negotiation": True, "tls_v1": True, "snappy": index == 0, "deflate": index == 1}
            client.identify(features)
            client.start_tls(certs.client_context())
            if index == 0:
                client.start_snappy()
            else:
                client.start_deflate(6)
            layered.append(client)
        producer, listener = layered
        listener.send(sub(topics[0], "c") + rdy(10))
        listener.expect_ok()
        for name in topics:
            producer.send(pub(name, f"over tls to {name}".encode()))
            producer.expect_ok()
        message = listener.read_message()
        assert message.body == f"over tls to {topics[0]}".encode()
        listener.send(fin(message.id))
        for client in layered:
            client.close()
    finally:
        stop_all([node])


def _served_apart(node: NsqdProcess, port: int, topic: str) -> bool:
    """Whether the consumer on local ``port`` is served by the worker that accepted it through a stand-in of the
    topic's owner (its SUB line names the owner), or by the owner itself (accepted there, or handed over to it)."""
    line = node.wait_for_log(rf"\[127\.0\.0\.1:{port}\] SUB {topic}:c( through worker \d+)?$", 10)
    return line.group(1) is not None


def _apart_consumer(node: NsqdProcess, topic: str) -> FeatureClient:
    """A snappy consumer of ``topic`` (channel ``c``, RDY 0, msg_timeout 1 s) that the worker not owning it
    accepted: a compressed connection is never handed over, so it stays there, served through a stand-in.
    Connections are opened until the kernel gives one to that worker; the others are closed."""
    for _ in range(40):
        client = FeatureClient(node.tcp)
        client.identify({"feature_negotiation": True, "snappy": True, "msg_timeout": 1000})
        client.start_snappy()
        client.send(sub(topic, "c"))
        client.expect_ok()
        if _served_apart(node, client.raw.getsockname()[1], topic):
            return client
        client.close()
    raise AssertionError(f"no connection of 40 was accepted by the worker that does not own {topic}")


def test_one_channels_consumers_on_both_workers(node):
    """A channel's consumers served by both workers: a plain one by the owner, a snappy one (never handed over)
    by the other worker through a stand-in. NSQ's rules hold across them: each message to one consumer, a FIN
    of another connection's message refused either way, a timeout's requeue, and a consumer that vanishes with
    messages in flight loses none of them."""
    for topic in owned_topics("both"):
        local = consumer(node.tcp, topic, "c", ready=0, identify_fields={"msg_timeout": 1000})
        assert not _served_apart(node, local.sock.getsockname()[1], topic)
        apart = _apart_consumer(node, topic)
        producer = RawClient(node.tcp)

        # one message to each, by credit; a FIN on the other connection is refused, and the connection stays
        apart.send(rdy(1))
        producer.publish(topic, b"to-apart")
        far = apart.read_message()
        local.send(rdy(1))
        producer.publish(topic, b"to-local")
        near = local.read_message()
        assert (far.body, near.body) == (b"to-apart", b"to-local")
        local.send(fin(far.id))
        assert local.read_reply().data == b"E_FIN_FAILED FIN " + far.id + b" failed client does not own message"
        apart.send(fin(near.id))
        refusal = apart.read_frame()
        assert refusal.data == b"E_FIN_FAILED FIN " + near.id + b" failed client does not own message"
        apart.send(fin(far.id))
        local.send(fin(near.id))

        # not finished in its 1 s: requeued, and delivered again to the only consumer with credit
        local.send(rdy(0))
        producer.publish(topic, b"timed-out")
        first = apart.read_message()
        again = apart.read_message(timeout=10)
        assert (first.body, first.attempts, again.body, again.attempts) == (b"timed-out", 1, b"timed-out", 2)
        apart.send(fin(again.id))

        # a consumer gone with messages in flight (some read, some on their way): each reaches the other consumer
        apart.send(rdy(10))
        bodies = [f"stream-{number}".encode() for number in range(10)]
        producer.publish_many(topic, bodies)
        got = [apart.read_message().body for _ in range(3)]
        assert set(got) <= set(bodies)
        apart.close()
        local.send(rdy(10))
        rest = []
        while len(rest) < len(bodies):
            message = local.read_message()
            rest.append(message.body)
            local.send(fin(message.id))
        assert sorted(rest) == sorted(bodies)
        assert local.poll_frame(0.3) is None

        (channel,) = next(t for t in stats(node.listening["HTTP"])["topics"] if t["topic_name"] == topic)["channels"]
        assert (channel["depth"], channel["in_flight_count"], len(channel["clients"])) == (0, 0, 1)
        assert channel["message_count"] == 13
        # the one left unfinished, then the ten in flight to the vanished consumer (back after their timeout,
        # as one nsqd brings them back)
        assert (channel["timeout_count"], channel["requeue_count"]) == (11, 0)
        local.close()
        producer.close()


def test_three_workers(tmp_path):
    node = start_node(tmp_path / "data", workers=3)
    try:
        topics = owned_topics("three", 3)
        consumers = [consumer(node.tcp, name, "c", ready=10) for name in topics]
        producers = [RawClient(node.tcp) for _ in range(3)]
        for number in range(9):
            producers[number % 3].publish(topics[number % 3], f"{number}".encode())
        for index, client in enumerate(consumers):
            (got,) = receive_all([client], 3)
            assert sorted(got) == [f"{number}".encode() for number in range(index, 9, 3)]
        document = stats(node.listening["HTTP"])
        assert [entry["topic_name"] for entry in document["topics"]] == sorted(topics)
        for client in consumers + producers:
            client.close()
    finally:
        stop_all([node])
