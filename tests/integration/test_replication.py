"""Replication between two nodes: A keeps copies on B. Real daemons as subprocesses, real sockets.

Every publish answered OK on A is held by B; FINs on A drop B's copies; B adopts A's unfinished messages by the
HTTP call and by the timeout, channels and paused state included; B's copies survive B's restart; degraded
``refuse`` and ``accept``; bad input on the replication magic closes only that connection."""

from __future__ import annotations

import json
import socket
import struct
import threading

import pytest

from protocol.commands import encode_mpub
from protocol.replication import (
    HEARTBEAT_FRAME,
    MAGIC_R1,
    Ack,
    Adopted,
    Confirm,
    Confirmed,
    Error,
    Heartbeat,
    Hello,
    Messages,
    ReplicatedMessage,
    ReplicationDecoder,
    Synced,
    Welcome,
    encode,
)
from tests.integration.harness import NsqdProcess, RawClient, command, consumer, free_port, mpub_body, stop_all
from tests.integration.http_helpers import get, post, stats, wait_for


def start(daemons, data_path, *args: str, port: int | None = None) -> NsqdProcess:
    port = port or free_port()
    daemon = NsqdProcess(data_path, ["--broadcast-address=127.0.0.1", f"--tcp-address=127.0.0.1:{port}", *args])
    daemons.append(daemon)
    return daemon.start()


def replica_of(daemon: NsqdProcess, node: str) -> dict:
    for entry in stats(daemon.http()).get("replication", {}).get("replicas", []):
        if entry["node"] == node:
            return entry
    return {}


def held(daemon: NsqdProcess, node: str) -> int:
    return replica_of(daemon, node).get("held_messages", 0)


def wait_state(origin: NsqdProcess, state: str, *, timeout: float = 10, message: str | None = None) -> None:
    """Until the origin's /stats says its replication is in ``state`` (replicating, degraded...)."""
    wait_for(lambda: stats(origin.http())["replication"]["state"] == state, timeout=timeout, message=message or state)


def pair(daemons, tmp_path, *origin_args: str, replica_args: tuple[str, ...] = ()):
    replica = start(daemons, tmp_path / "b", *replica_args)
    origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.tcp_address}", *origin_args)
    wait_state(origin, "replicating")
    return origin, replica


def fins_acked(origin: NsqdProcess, before: int) -> None:
    """Wait until the origin's peer acknowledged frames after ``before`` and nothing more is pending (the FINs)."""

    def done() -> bool:
        peer = stats(origin.http())["replication"]["peers"][0]
        return peer["acked"] > before and peer["pending_frames"] == 0

    wait_for(done, message="FINs acknowledged by the replica")


def create(origin: NsqdProcess, *channels: str) -> None:
    """Topic ``t`` and its ``channels`` on ``origin`` (over HTTP, as an operator would)."""
    post(origin.http(), "/topic/create?topic=t")
    for channel in channels:
        post(origin.http(), f"/channel/create?topic=t&channel={channel}")


def receive(client: RawClient, count: int, *, fin: bool = True) -> list[bytes]:
    bodies = []
    for _ in range(count):
        message = client.read_message(timeout=10)
        bodies.append(message.body)
        if fin:
            client.send(command("FIN", message.id))
    return bodies


def test_publishes_are_held_by_the_replica_and_released_by_fins(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish("t", b"one")
        producer.publish_many("t", [b"two", b"three"])
        producer.send(command("DPUB", "t", 60000, body=b"later"))
        producer.expect_ok()
    assert post(origin.http(), "/pub?topic=t", b"four").status == 200
    assert post(origin.http(), "/mpub?topic=t", b"five\nsix").status == 200
    # every OK came after the replica stored the message: no wait needed
    assert held(replica, node) == 7
    doc = stats(origin.http())["replication"]
    assert doc["peers"][0]["state"] == "connected" and doc["unreplicated_messages"] == 0
    with consumer(origin.tcp, "t", "c", ready=10) as client:
        assert sorted(receive(client, 6)) == sorted([b"one", b"two", b"three", b"four", b"five", b"six"])
        wait_for(lambda: held(replica, node) == 1, message="FINs reached the replica")  # the deferred one


def test_takeover_by_http_adopts_unfinished_messages_with_their_channels(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    create(origin, "done", "todo", "stopped")
    post(origin.http(), "/channel/pause?topic=t&channel=stopped")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(20)])
    before = stats(origin.http())["replication"]["peers"][0]["acked"]
    with consumer(origin.tcp, "t", "done", ready=20) as client:
        receive(client, 20)
        fins_acked(origin, before)
    assert held(replica, node) == 20
    origin.kill()
    reply = post(replica.http(), f"/replica/takeover?node={node}")
    assert reply.status == 200 and reply.json() == {"node": node, "messages": 20}
    topic = stats(replica.http(), "topic=t")["topics"][0]
    channels = {c["channel_name"]: c for c in topic["channels"]}
    assert channels["done"]["depth"] == 0
    assert channels["todo"]["depth"] == 20
    assert channels["stopped"]["depth"] == 20 and channels["stopped"]["paused"]
    with consumer(replica.tcp, "t", "todo", ready=20) as client:
        assert sorted(receive(client, 20)) == sorted(b"m%d" % i for i in range(20))
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 0
    assert post(replica.http(), "/replica/takeover?node=nobody:1").status == 404
    assert stats(replica.http())["replication"]["takeovers"] == 2


def test_publishes_to_many_topics_in_the_same_millisecond_are_each_held_and_adopted(daemons, tmp_path):
    # one ID names one message of a node whatever its topic: the replica's index and its takeover rely on it
    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    topics = [f"t{n}" for n in range(8)]
    with RawClient(origin.tcp) as producer:
        for _ in range(5):  # one write: the publishes of all topics are read and handled together
            producer.send(
                b"".join(encode_mpub(topic, [b"%s-%d" % (topic.encode(), i) for i in range(3)]) for topic in topics)
            )
            for _ in topics:
                producer.expect_ok()
    assert held(replica, node) == 5 * 3 * len(topics)
    origin.kill()
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 5 * 3 * len(topics)
    depths = {t["topic_name"]: t["depth"] for t in stats(replica.http())["topics"]}
    assert all(depths.get(topic) == 15 for topic in topics), depths


def test_takeover_by_timeout(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path, replica_args=("--replica-takeover-timeout=1s",))
    with RawClient(origin.tcp) as producer:
        producer.publish("t", b"survivor")
    origin.kill()
    replica.wait_for_log(r"REPLICATION: took over origin", timeout=20)
    with consumer(replica.tcp, "t", "c", ready=1) as client:
        assert receive(client, 1) == [b"survivor"]


@pytest.mark.parametrize("durable", [False, True], ids=["default", "durable"])
def test_replica_keeps_its_copies_across_its_restart(daemons, tmp_path, durable):
    args = ("--mem-queue-size=0", "--sync-every=1") if durable else ()
    replica = start(daemons, tmp_path / "b", *args)
    port = replica.tcp[1]
    origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.tcp_address}", *args)
    node = f"127.0.0.1:{origin.tcp[1]}"
    wait_state(origin, "replicating")
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(50)])
    with consumer(origin.tcp, "t", "c", ready=10) as client:
        receive(client, 10)
        wait_for(lambda: held(replica, node) == 40, message="FINs reached the replica")
    origin.kill()
    if durable:
        replica.kill()
    else:
        assert replica.stop() == 0
    replica = start(daemons, tmp_path / "b", *args, port=port)
    assert held(replica, node) == 40
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 40
    with consumer(replica.tcp, "t", "c", ready=40) as client:
        assert sorted(receive(client, 40)) == sorted(b"m%d" % i for i in range(10, 50))


def test_degraded_refuse_answers_publish_failed_and_ping_nok(daemons, tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    origin = start(daemons, tmp_path / "a", f"--replicate-to={dead}")
    with RawClient(origin.tcp) as producer:
        producer.send(command("PUB", "t", body=b"x"))
        producer.expect_error(b"E_PUB_FAILED PUB failed replication degraded")
    with RawClient(origin.tcp) as producer:
        producer.send(command("MPUB", "t", body=mpub_body([b"x"])))
        producer.expect_error(b"E_MPUB_FAILED MPUB failed replication degraded")
    reply = post(origin.http(), "/pub?topic=t", b"x")
    assert reply.status == 503 and reply.message == "REPLICATION_DEGRADED"
    ping = get(origin.http(), "/ping")
    assert ping.status == 500 and ping.body == b"NOK - replication degraded"
    assert stats(origin.http())["replication"]["state"] == "degraded"


def test_degraded_accept_takes_messages_and_sends_them_when_the_peer_comes(daemons, tmp_path):
    port = free_port()
    origin = start(daemons, tmp_path / "a", f"--replicate-to=127.0.0.1:{port}", "--replication-degraded=accept")
    node = f"127.0.0.1:{origin.tcp[1]}"
    with RawClient(origin.tcp) as producer:
        producer.publish("t", b"alone")
    doc = stats(origin.http())["replication"]
    assert doc["state"] == "degraded" and doc["accepted_unreplicated"] == 1 and doc["unreplicated_messages"] == 1
    assert get(origin.http(), "/ping").status == 200
    metrics = get(origin.http(), "/metrics").body.decode()
    assert "nsqd_replication_degraded 1.0" in metrics
    assert "nsqd_replication_accepted_unreplicated_total 1.0" in metrics
    assert "Replication: degraded" in get(origin.http(), "/stats").body.decode()
    replica = start(daemons, tmp_path / "b", port=port)
    wait_for(lambda: held(replica, node) == 1, timeout=20, message="sent when the peer came")
    wait_for(lambda: stats(origin.http())["replication"]["unreplicated_messages"] == 0, message="acknowledged")


class StandIn:
    """A listener that stands for an origin node at ``node`` (127.0.0.1, a free port): it confirms the HELLOs of
    the sessions in ``sessions`` (CONFIRM) as that node would, and refuses any other; ``asked`` lists what it was
    asked. For tests that speak for an origin themselves."""

    def __init__(self, *sessions: str) -> None:
        self.sessions = set(sessions)
        self.asked: list[Confirm] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.node = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> StandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                event = self._read_ask(conn)
                if event is None:
                    continue
                self.asked.append(event)
                confirmed = type(event) is Confirm and event.node == self.node and event.session in self.sessions
                conn.sendall(
                    encode(
                        Confirmed(event.node, event.session) if confirmed else Error("E_NODE_CONFLICT", "not this node")
                    )
                )

    @staticmethod
    def _read_ask(conn: socket.socket):
        """The first frame after the magic, or None when the connection ends first."""
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
            if len(data) > 4:
                if data[:4] != MAGIC_R1:
                    return None
                decoder = ReplicationDecoder()
                decoder.receive_data(data[4:])
                if (event := decoder.next_event()) is not None:
                    return event
        return None


def _exchange(address, data: bytes) -> list:
    """Send ``data`` on a replication connection and decode what comes back until the node closes it."""
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(MAGIC_R1 + data)
        decoder = ReplicationDecoder()
        events = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return events
            decoder.receive_data(chunk)
            while (event := decoder.next_event()) is not None:
                events.append(event)


def test_bad_input_on_the_replication_magic_closes_that_connection_only(daemons, tmp_path):
    replica = start(daemons, tmp_path / "b")
    with RawClient(replica.tcp) as bystander, StandIn("s") as origin:
        bystander.publish("t", b"before")
        assert _exchange(replica.tcp, b"GET / HTTP/1.1\r\n\r\n")[-1].code == "E_BAD_PROTOCOL"
        hello = encode(Hello(f"127.0.0.1:{replica.tcp[1]}", "s"))
        assert _exchange(replica.tcp, hello)[-1] == Error(
            "E_NODE_CONFLICT", f"node 127.0.0.1:{replica.tcp[1]} is this node"
        )
        # a node claiming another node's identity: the node at that address does not confirm the session
        events = _exchange(replica.tcp, encode(Hello(origin.node, "stolen", clean=True)) + encode(Synced(0)))
        assert events[-1] == Error(
            "E_NODE_CONFLICT", f"node {origin.node} did not confirm session stolen - E_NODE_CONFLICT not this node"
        )
        assert origin.asked == [Confirm(origin.node, "stolen")]
        gone = f"127.0.0.1:{free_port()}"  # nothing listens there: a dead node's name
        events = _exchange(replica.tcp, encode(Hello(gone, "s")))
        assert events[-1].code == "E_NODE_CONFLICT"
        assert events[-1].text.startswith(f"node {gone} did not confirm session s - ")
        bad_topic = struct.pack(">IB", 1 + 8 + 5 + 2 + 4, 0x07) + struct.pack(">Q", 1) + b"\x00\x03a/b" + b"\x00" * 6
        events = _exchange(replica.tcp, encode(Hello(origin.node, "s")) + bad_topic)
        assert events[-1] == Error("E_BAD_TOPIC", "replicated topic name 'a/b' is not valid")
        message = ReplicatedMessage(b"0" * 16, 1, 0, 0, b"x")
        events = _exchange(
            replica.tcp,
            encode(Hello(origin.node, "s"))
            + encode(Messages(1, "t", (message,)))
            + encode(Messages(5, "t", (message,))),
        )
        assert events[-1] == Error("E_BAD_SEQ", "frame seq 5 after 1")
        events = _exchange(replica.tcp, encode(Hello(origin.node, "s")) + encode(Messages(1, "t", (message,), "c")))
        assert events[-1] == Error("E_BAD_PROTOCOL", "MESSAGES frame of a channel outside a backfill")
        assert _exchange(replica.tcp, b"\x00\x00\x00\x02\x01{")[-1].code == "E_BAD_HELLO"
        # a CONFIRM asked of a node that replicates nothing
        assert _exchange(replica.tcp, encode(Confirm(f"127.0.0.1:{replica.tcp[1]}", "s")))[-1] == Error(
            "E_NODE_CONFLICT", f"node 127.0.0.1:{replica.tcp[1]} with session s is not this node"
        )
        bystander.publish("t", b"after")
    assert held(replica, gone) == 0 and not replica_of(replica, gone)
    assert replica.is_running()
    assert stop_all([replica]) is None


def test_replication_over_tls(daemons, tmp_path):
    from tests.integration.features import make_certificates

    certs = make_certificates(tmp_path / "certs")
    tls = certs.daemon_args(f"--tls-root-ca-file={certs.ca_file}")
    # the replica takes no stream in the clear: the copies below came over TLS, and so did its CONFIRM
    origin, replica = pair(daemons, tmp_path, *tls, replica_args=(*tls, "--tls-required=tcp-https"))
    node = f"127.0.0.1:{origin.tcp[1]}"
    origin.wait_for_log(r"REPLICATION: peer .* connected", timeout=10)
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"secret%d" % i for i in range(5)])
    assert held(replica, node) == 5
    replica.wait_for_log(r"origin .* connected", timeout=10)
    assert _exchange(replica.tcp, encode(Hello(node, "plain")))[-1] == Error(
        "E_BAD_PROTOCOL", "TLS is required on this node"
    )
    plain = start(daemons, tmp_path / "c")
    with socket.create_connection(plain.tcp, timeout=10) as sock:  # a node without a certificate refuses TLS
        sock.sendall(MAGIC_R1 + b"\x16\x03\x01\x00\x05hello")
        decoder = ReplicationDecoder()
        decoder.receive_data(sock.recv(65536))
        assert decoder.next_event() == Error("E_BAD_PROTOCOL", "TLS is not configured on this node")


def test_a_replica_that_comes_back_empty_is_backfilled_before_it_counts(daemons, tmp_path):
    import shutil

    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    port = replica.tcp[1]
    create(origin, "c", "d")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(30)])
    with consumer(origin.tcp, "t", "c", ready=10) as client:
        receive(client, 10)
        wait_for(lambda: held(replica, node) == 30, message="held")
    replica.kill()
    shutil.rmtree(tmp_path / "b")
    wait_state(origin, "degraded")
    replica = start(daemons, tmp_path / "b", port=port)
    wait_state(origin, "replicating", timeout=20, message="back")
    assert held(replica, node) == 30  # every message d has not finished, whatever c did
    with consumer(origin.tcp, "t", "d", ready=30) as client:
        receive(client, 30)
        wait_for(lambda: held(replica, node) == 20, message="released")  # c still holds 20


def test_an_origin_whose_messages_were_adopted_does_not_deliver_them_again(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    port = origin.tcp[1]
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(10)])
    assert origin.stop() == 0  # its messages stay in its data directory
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 10
    origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.tcp_address}", port=port)
    origin.wait_for_log(r"adopted this node's messages while it was away \(epoch 1\): dropped the 10", timeout=20)
    wait_state(origin, "replicating")
    channel = stats(origin.http(), "topic=t")["topics"][0]["channels"][0]
    assert channel["depth"] == 0 and channel["in_flight_count"] == 0
    with RawClient(origin.tcp) as producer:
        producer.publish("t", b"new")
    with consumer(origin.tcp, "t", "c", ready=10) as client:
        assert receive(client, 1) == [b"new"]
        assert client.poll_frame(0.5) is None
    # the epoch is kept for the next start
    assert json.loads((tmp_path / "a" / "replication.dat").read_text()) == {"epoch": 1, "running": True}


def test_duplicates_after_takeover_are_the_adopted_messages_the_origin_had_finished(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    origin_port, replica_port = origin.tcp[1], replica.tcp[1]
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(10)])
    assert held(replica, node) == 10
    assert replica.stop() == 0  # the FINs that follow never reach it
    with consumer(origin.tcp, "t", "c", ready=4) as client:
        messages = [client.read_message(timeout=10) for _ in range(4)]
        client.send(command("RDY", 0))  # no more in flight after these
        for message in messages:
            client.send(command("FIN", message.id))
        finished = [message.body for message in messages]

        def settled() -> bool:
            channel = stats(origin.http(), "topic=t")["topics"][0]["channels"][0]
            return channel["in_flight_count"] == 0 and channel["depth"] == 6

        wait_for(settled, message="FINs taken by the origin")
    assert origin.stop() == 0  # its data directory keeps the 6 it had not finished
    replica = start(daemons, tmp_path / "b", port=replica_port)
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 10
    adopted_file = tmp_path / "b" / f"replica.{node}.adopted"
    assert adopted_file.stat().st_size == 10 * 16
    origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.tcp_address}", port=origin_port)
    origin.wait_for_log(
        r"dropped the 6 message\(s\) it adopted that were held here, kept 0 other\(s\) of their "
        r"topics; 4 it adopted had been finished here \(delivered twice\)",
        timeout=20,
    )
    wait_state(origin, "replicating")
    doc = stats(origin.http())["replication"]
    assert doc["duplicates_after_takeover"] == 4
    assert "duplicates after takeover: 4" in get(origin.http(), "/stats").body.decode()
    assert "nsqd_replication_duplicates_after_takeover_total 4.0" in get(origin.http(), "/metrics").body.decode()
    assert stats(origin.http(), "topic=t")["topics"][0]["channels"][0]["depth"] == 0
    wait_for(lambda: not adopted_file.exists(), message="the list removed once the origin heard it")
    replica_doc = stats(replica.http())["replication"]
    assert replica_doc["takeovers"] == 1 and replica_doc["adopted_messages"] == 10
    with consumer(replica.tcp, "t", "c", ready=10) as client:
        again = receive(client, 10)
    assert set(finished) <= set(again)  # the 4 come twice


@pytest.mark.parametrize(
    "args", [(), ("--mem-queue-size=0",), ("--mem-queue-size=0", "--sync-every=1")], ids=["memory", "disk", "durable"]
)
def test_accept_mode_keeps_what_it_took_alone_when_its_other_messages_were_adopted(daemons, tmp_path, args):
    origin, replica = pair(daemons, tmp_path, "--replication-degraded=accept", *args)
    node = f"127.0.0.1:{origin.tcp[1]}"
    origin_port, replica_port = origin.tcp[1], replica.tcp[1]
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(5)])
    assert replica.stop() == 0
    wait_state(origin, "degraded")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"alone1", b"alone2"])  # held by the origin alone
    assert stats(origin.http())["replication"]["accepted_unreplicated"] == 2
    assert origin.stop() == 0
    replica = start(daemons, tmp_path / "b", port=replica_port)
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 5
    origin = start(
        daemons,
        tmp_path / "a",
        f"--replicate-to={replica.tcp_address}",
        "--replication-degraded=accept",
        *args,
        port=origin_port,
    )
    origin.wait_for_log(r"dropped the 5 message\(s\) it adopted that were held here, kept 2", timeout=20)
    wait_state(origin, "replicating")
    assert held(replica, node) == 2  # replicated now that the peer is back
    assert stats(origin.http())["replication"]["accepted_unreplicated"] == 0  # in this run
    with consumer(origin.tcp, "t", "c", ready=10) as client:
        assert sorted(receive(client, 2)) == [b"alone1", b"alone2"]
        assert client.poll_frame(0.5) is None
        wait_for(lambda: held(replica, node) == 0, message="released")
    with consumer(replica.tcp, "t", "c", ready=10) as client:
        assert sorted(receive(client, 5)) == sorted(b"m%d" % i for i in range(5))


def test_what_a_paused_topic_held_stays_in_the_topic_when_its_other_messages_were_adopted(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path, "--replication-degraded=accept")
    node = f"127.0.0.1:{origin.tcp[1]}"
    origin_port, replica_port = origin.tcp[1], replica.tcp[1]
    create(origin, "c")
    post(origin.http(), "/topic/pause?topic=t")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m0", b"m1"])
    assert replica.stop() == 0
    wait_state(origin, "degraded")
    with RawClient(origin.tcp) as producer:
        producer.publish("t", b"alone")
    assert origin.stop() == 0
    replica = start(daemons, tmp_path / "b", port=replica_port)
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 2
    origin = start(
        daemons,
        tmp_path / "a",
        f"--replicate-to={replica.tcp_address}",
        "--replication-degraded=accept",
        port=origin_port,
    )
    origin.wait_for_log(r"dropped the 2 message\(s\) it adopted that were held here, kept 1", timeout=20)
    topic = stats(origin.http(), "topic=t")["topics"][0]
    assert topic["paused"] and topic["depth"] == 1 and topic["channels"][0]["depth"] == 0
    post(origin.http(), "/topic/unpause?topic=t")
    with consumer(origin.tcp, "t", "c", ready=10) as client:
        assert receive(client, 1) == [b"alone"]


def test_a_takeover_while_the_origin_lives_leaves_each_message_one_owner(daemons, tmp_path):
    # what a partition longer than the takeover wait does: the origin learns of it when its stream comes back, and
    # drops what the replica adopted (the replica delivers it) instead of delivering it as well
    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(3)])
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 3
    origin.wait_for_log(
        r"peer .* adopted 3 message\(s\) of this node \(epoch 1\) while it was connected elsewhere "
        r".*: dropped the 3 held here",
        timeout=20,
    )
    assert stats(origin.http())["replication"]["duplicates_after_takeover"] == 0  # none had been finished here
    wait_state(origin, "replicating")
    assert stats(origin.http(), "topic=t")["topics"][0]["channels"][0]["depth"] == 0
    assert stats(replica.http(), "topic=t")["topics"][0]["channels"][0]["depth"] == 3
    assert held(replica, node) == 0  # the backfill after the return has nothing of them
    wait_for(lambda: not (tmp_path / "b" / f"replica.{node}.adopted").exists(), message="the list removed")


def test_an_origin_with_no_peer_at_start_up_says_so_and_delivers(daemons, tmp_path):
    origin = start(daemons, tmp_path / "a", f"--replicate-to=127.0.0.1:{free_port()}", "--replication-degraded=accept")
    origin.wait_for_log(r"no peer reachable at start-up: delivering the messages this node holds", timeout=20)
    with RawClient(origin.tcp) as producer:
        producer.publish("t", b"x")


def test_a_second_stream_for_a_connected_origin(daemons, tmp_path):
    replica = start(daemons, tmp_path / "b")
    with StandIn("first") as origin:
        hello = encode(Hello(origin.node, "first"))
        with socket.create_connection(replica.tcp, timeout=10) as first:
            first.sendall(MAGIC_R1 + hello)
            decoder = ReplicationDecoder()
            decoder.receive_data(first.recv(65536))
            assert type(decoder.next_event()).__name__ == "Welcome"
            # another session claiming the same node while the first is open, not confirmed by it: refused
            events = _exchange(replica.tcp, encode(Hello(origin.node, "other")))
            assert events[-1].code == "E_NODE_CONFLICT" and "did not confirm session other" in events[-1].text
            # the same session again (its old connection broke unnoticed): the new one replaces the old one
            with socket.create_connection(replica.tcp, timeout=10) as second:
                second.sendall(MAGIC_R1 + hello)
                decoder = ReplicationDecoder()
                decoder.receive_data(second.recv(65536))
                assert type(decoder.next_event()).__name__ == "Welcome"
                assert first.recv(65536) == b""  # closed by the replica
                replica.wait_for_log(rf"origin {origin.node} reconnected, closing its previous connection", timeout=5)
                # the node restarted (a new session, which it confirms) while its old stream looks open: replaced
                origin.sessions = {"restarted"}
                with socket.create_connection(replica.tcp, timeout=10) as third:
                    third.sendall(MAGIC_R1 + encode(Hello(origin.node, "restarted")))
                    decoder = ReplicationDecoder()
                    decoder.receive_data(third.recv(65536))
                    assert type(decoder.next_event()).__name__ == "Welcome"
                    assert second.recv(65536) == b""


def test_an_origin_killed_without_durable_mode_has_its_copies_adopted_when_it_returns(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    port = origin.tcp[1]
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(10)])  # in memory only: a kill loses them there
    origin.kill()
    origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.tcp_address}", port=port)
    replica.wait_for_log(r"origin 127.0.0.1:\d+ is back without all of its messages", timeout=20)
    origin.wait_for_log(r"the last run did not stop cleanly", timeout=5)
    wait_state(origin, "replicating")
    with consumer(replica.tcp, "t", "c", ready=10) as client:
        assert sorted(receive(client, 10)) == sorted(b"m%d" % i for i in range(10))
    assert held(replica, node) == 0


def test_an_origin_stopped_cleanly_keeps_its_messages_and_its_replica_its_copies(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    port = origin.tcp[1]
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(10)])
    assert origin.stop() == 0
    origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.tcp_address}", port=port)
    wait_state(origin, "replicating")
    assert held(replica, node) == 10  # the backfill had them all
    assert "taking over" not in replica.log_text()
    with consumer(origin.tcp, "t", "c", ready=10) as client:
        assert sorted(receive(client, 10)) == sorted(b"m%d" % i for i in range(10))
        wait_for(lambda: held(replica, node) == 0, message="released")


def test_a_backlog_spilled_to_disk_is_backfilled_whole_while_publishing_goes_on(daemons, tmp_path):
    import threading

    port = free_port()
    origin = start(
        daemons,
        tmp_path / "a",
        f"--replicate-to=127.0.0.1:{port}",
        "--replication-degraded=accept",
        "--mem-queue-size=100",
        "--max-bytes-per-file=262144",
    )
    node = f"127.0.0.1:{origin.tcp[1]}"
    create(origin, "c", "d")
    published = [b"old%06d." % i + b"x" * 200 for i in range(20000)]
    with RawClient(origin.tcp) as producer:  # no replica yet: taken unreplicated, mostly onto disk
        for first in range(0, len(published), 500):
            producer.publish_many("t", published[first : first + 500])
    channels = {c["channel_name"]: c for c in stats(origin.http(), "topic=t")["topics"][0]["channels"]}
    assert channels["c"]["backend_depth"] > 10000 and channels["d"]["backend_depth"] > 10000

    replicating = threading.Event()
    failures: list[BaseException] = []

    def produce() -> None:  # publishes before, during and after the backfill
        try:
            with RawClient(origin.tcp) as producer:
                for n in range(10000):
                    if replicating.is_set() and n >= 40:
                        return
                    batch = [b"new%06d" % (n * 50 + i) for i in range(50)]
                    producer.publish_many("t", batch)
                    published.extend(batch)
        except BaseException as exc:  # reported by the test
            failures.append(exc)

    producer_thread = threading.Thread(target=produce)
    producer_thread.start()
    replica = start(daemons, tmp_path / "b", port=port)
    with consumer(origin.tcp, "t", "c", ready=100) as client:  # c finishes some while the backfill reads its files
        finished_on_c = set(receive(client, 3000))

        def finished_by_c() -> int:
            channel = next(
                c for c in stats(origin.http(), "topic=t")["topics"][0]["channels"] if c["channel_name"] == "c"
            )
            return sum(client["finish_count"] for client in channel["clients"])

        wait_for(lambda: finished_by_c() == len(finished_on_c), message="c's FINs taken")
    wait_state(origin, "replicating", timeout=60, message="backfilled")
    # FINs go to the peer asynchronously: a channel op sends those gathered before it, and its ACK says they are held
    before = stats(origin.http())["replication"]["peers"][0]["acked"]
    assert post(origin.http(), "/channel/unpause?topic=t&channel=c").status == 200
    fins_acked(origin, before)
    replicating.set()
    producer_thread.join(timeout=60)
    assert not producer_thread.is_alive() and not failures
    origin.wait_for_log(r"REPLICATION: peer .* backfill sent: \d+ message\(s\)", timeout=10)
    wait_for(lambda: stats(origin.http())["replication"]["unreplicated_messages"] == 0, message="acknowledged")
    wait_for(lambda: held(replica, node) == len(published), timeout=30, message="every message held (d has all)")
    origin.kill()
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == len(published)
    expected = set(published)
    with consumer(replica.tcp, "t", "d", ready=1000) as client:
        assert set(receive(client, len(expected))) == expected
    with consumer(replica.tcp, "t", "c", ready=1000) as client:
        assert set(receive(client, len(expected - finished_on_c))) == expected - finished_on_c
        assert client.poll_frame(0.5) is None


def test_a_replica_restarted_on_its_data_waits_for_an_origin_that_lives(daemons, tmp_path):
    # the origin's reconnections back off up to 5 s while the replica is down: the restarted replica, whose
    # takeover timeout is shorter, must not take the living origin's messages for its own (both would deliver them)
    durable = ("--mem-queue-size=0", "--sync-every=1")  # the replica's copies survive its kill
    origin, replica = pair(daemons, tmp_path, *durable, replica_args=("--replica-takeover-timeout=1s", *durable))
    node = f"127.0.0.1:{origin.tcp[1]}"
    port = replica.tcp[1]
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(5)])
    replica.kill()
    # lost, then unreachable after 0.1, 0.2, 0.4, 0.8, 1.6 and 3.2 s: the next attempt is 5 s away
    wait_for(
        lambda: origin.log_text().count(f"peer {replica.tcp_address} unreachable") >= 6,
        timeout=30,
        message="the origin's reconnections backing off",
    )
    replica = start(daemons, tmp_path / "b", "--replica-takeover-timeout=1s", *durable, port=port)
    assert held(replica, node) == 5
    wait_for(lambda: replica_of(replica, node).get("state") == "connected", timeout=30, message="origin back")
    wait_state(origin, "replicating", timeout=20)
    assert stats(replica.http())["replication"]["takeovers"] == 0, replica.log_text()
    assert held(replica, node) == 5
    assert "adopted" not in origin.log_text()
    assert f"origin {node} silent for 1 s but accepting connections: waiting for its stream" in replica.log_text()
    with consumer(origin.tcp, "t", "c", ready=5) as client:
        assert sorted(receive(client, 5)) == [b"m%d" % i for i in range(5)]


def test_a_replica_takes_over_an_origin_whose_address_refuses_connections(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path, replica_args=("--replica-takeover-timeout=1s",))
    node = f"127.0.0.1:{origin.tcp[1]}"
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish("t", b"survivor")
    origin.kill()
    replica.wait_for_log(rf"REPLICATION: origin {node} silent for 1 s and unreachable \(.+\), taking over", timeout=20)
    with consumer(replica.tcp, "t", "c", ready=1) as client:
        assert receive(client, 1) == [b"survivor"]


def accept_origin(listener: socket.socket) -> tuple[socket.socket, ReplicationDecoder]:
    """For a replica played by a test: the next origin's connection, its magic and HELLO read."""
    connection, _ = listener.accept()
    connection.settimeout(60)
    decoder = ReplicationDecoder()
    data = b""
    while len(data) < 4:
        data += connection.recv(65536)
    decoder.receive_data(data[4:])
    assert type(next_event(connection, decoder)) is Hello
    return connection, decoder


def next_event(connection: socket.socket, decoder: ReplicationDecoder):
    """The next event of a replication stream read on a blocking socket; EOFError at its end."""
    while (event := decoder.next_event()) is None:
        data = connection.recv(65536)
        if not data:
            raise EOFError
        decoder.receive_data(data)
    return event


class SlowReplica:
    """A replica played by the test: it takes the first connection and never answers its HELLO; the next one gets
    WELCOME (epoch 1) with ``adopted`` in ADOPTED, then ACKs."""

    def __init__(self, adopted: tuple[bytes, ...]) -> None:
        self.adopted = adopted
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(60)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _accept(self) -> tuple[socket.socket, ReplicationDecoder]:
        connection, decoder = accept_origin(self.listener)
        self.connections.append(connection)
        return connection, decoder

    def _run(self) -> None:
        try:
            self._accept()  # silent: the origin's HELLO gets no answer
            connection, decoder = self._accept()
            connection.sendall(
                encode(Welcome("127.0.0.1:1", epoch=1, adopted=len(self.adopted))) + encode(Adopted(self.adopted))
            )
            while True:
                event = next_event(connection, decoder)
                if type(event) is Heartbeat:
                    connection.sendall(HEARTBEAT_FRAME)
                elif type(event) is Synced or getattr(event, "seq", 0) > 0:
                    connection.sendall(encode(Ack(event.seq)))
        except (OSError, EOFError):
            pass

    def close(self) -> None:
        self.listener.close()
        for connection in self.connections:
            connection.close()
        self.thread.join(10)


def test_an_origin_restarted_on_its_data_waits_for_a_peer_that_took_its_connection_but_is_slow(daemons, tmp_path):
    # a peer slower to answer than a connection attempt's timeout is tried again, not taken for unreachable: the
    # node delivers nothing before it heard which of its messages that peer adopted (else it delivers them twice)
    durable = ("--mem-queue-size=0", "--sync-every=1", "--replication-degraded=accept")
    origin = start(daemons, tmp_path / "a", f"--replicate-to=127.0.0.1:{free_port()}", *durable)
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(4)])
    with consumer(origin.tcp, "t", "c", ready=4) as client:  # their IDs; they go back to the channel unfinished
        ids = {message.body: message.id for message in (client.read_message(timeout=10) for _ in range(4))}
        client.send(command("RDY", 0))
        for message_id in ids.values():
            client.send(command("REQ", message_id, 0))
    wait_for(
        lambda: stats(origin.http(), "topic=t")["topics"][0]["channels"][0]["in_flight_count"] == 0, message="requeued"
    )
    origin.kill()
    replica = SlowReplica((ids[b"m0"], ids[b"m1"]))
    try:
        origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.address}", *durable)
        origin.wait_for_log(
            rf"peer {replica.address} adopted this node's messages while it was away \(epoch 1\): "
            r"dropped the 2 message\(s\) it adopted that were held here",
            timeout=40,
        )
        assert "delivering the messages this node holds" not in origin.log_text()
        with consumer(origin.tcp, "t", "c", ready=4) as client:
            assert sorted(receive(client, 2)) == [b"m2", b"m3"]
            wait_for(
                lambda: stats(origin.http(), "topic=t")["topics"][0]["channels"][0]["in_flight_count"] == 0,
                message="FINs",
            )
        channel = stats(origin.http(), "topic=t")["topics"][0]["channels"][0]
        assert channel["depth"] == 0 and channel["in_flight_count"] == 0
    finally:
        replica.close()


def test_a_replica_killed_after_its_origin_changed_session_knows_the_session_it_resumes(daemons, tmp_path):
    # the origin (without durable mode) was killed and came back with a new session while the replica held
    # nothing, then published to a topic the replica knew: the replica, killed in turn, must come back knowing that
    # session, or it takes the living origin's messages for those of an origin that lost them, and both deliver
    durable = ("--mem-queue-size=0", "--sync-every=1")  # the replica's copies survive its kill
    origin, replica = pair(daemons, tmp_path, replica_args=durable)
    node = f"127.0.0.1:{origin.tcp[1]}"
    origin_port, replica_port = origin.tcp[1], replica.tcp[1]
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.publish("t", b"first")
    with consumer(origin.tcp, "t", "c", ready=1) as client:
        assert receive(client, 1) == [b"first"]
    wait_for(lambda: held(replica, node) == 0, message="the first message released")
    origin.kill()
    origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.tcp_address}", port=origin_port)
    wait_state(origin, "replicating", timeout=20)
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"m%d" % i for i in range(5)])
    wait_for(lambda: held(replica, node) == 5, message="the new session's messages held")
    replica.kill()
    replica = start(daemons, tmp_path / "b", *durable, port=replica_port)
    wait_for(lambda: replica_of(replica, node).get("state") == "connected", timeout=30, message="origin back")
    wait_state(origin, "replicating", timeout=20)
    assert "is back without all of its messages" not in replica.log_text()
    assert stats(replica.http())["replication"]["takeovers"] == 0
    assert held(replica, node) == 5
    with consumer(origin.tcp, "t", "c", ready=5) as client:
        assert sorted(receive(client, 5)) == [b"m%d" % i for i in range(5)]


@pytest.mark.timeout(90)
def test_a_takeover_registers_the_adopted_topic_and_channel_with_lookupd(daemons, tmp_path):
    import uuid

    from tests.integration.lookupd_harness import LookupdProcess, lookup_producers, wait_for_producers

    lookupd = LookupdProcess(tmp_path / "lookupd")
    daemons.append(lookupd)
    lookupd.start()
    registered = f"--lookupd-tcp-address={lookupd.tcp_address}"
    origin, replica = pair(daemons, tmp_path, registered, replica_args=(registered,))
    node = f"127.0.0.1:{origin.tcp[1]}"
    topic = f"r_{uuid.uuid4().hex[:12]}"  # on the origin alone until the takeover
    post(origin.http(), f"/topic/create?topic={topic}")
    post(origin.http(), f"/channel/create?topic={topic}&channel=c")
    with RawClient(origin.tcp) as producer:
        producer.publish_many(topic, [b"m%d" % i for i in range(5)])
    wait_for_producers(lookupd, topic, {origin.tcp[1]})
    origin.kill()
    wait_for(lambda: not lookup_producers(lookupd, topic), message="the killed origin unregistered")
    assert post(replica.http(), f"/replica/takeover?node={node}").json() == {"node": node, "messages": 5}
    [producer] = wait_for_producers(lookupd, topic, {replica.tcp[1]})
    assert get(lookupd.http_address, f"/lookup?topic={topic}").json()["channels"] == ["c"]
    # a consumer finds the node as a lookupd client does
    with consumer((producer["broadcast_address"], producer["tcp_port"]), topic, "c", ready=5) as client:
        assert sorted(receive(client, 5)) == [b"m%d" % i for i in range(5)]


@pytest.mark.timeout(60)
def test_degraded_refuse_answers_dpub_and_http_mpub_and_stores_nothing(daemons, tmp_path):
    # the other publishes are in test_degraded_refuse_answers_publish_failed_and_ping_nok
    origin = start(daemons, tmp_path / "a", f"--replicate-to=127.0.0.1:{free_port()}")
    with RawClient(origin.tcp) as producer:
        producer.send(command("DPUB", "t", 60000, body=b"x"))
        producer.expect_error(b"E_DPUB_FAILED DPUB failed replication degraded")
    with consumer(origin.tcp, "t", "c", ready=0) as client:  # a connection that consumes puts its OK first
        client.send(command("DPUB", "t", 60000, body=b"x"))
        client.expect_error(b"E_DPUB_FAILED DPUB failed replication degraded")  # the OK taken back, not sent
        client.assert_closed()  # fatal, as in nsqd
    for path, body in (
        ("/mpub?topic=t", b"x\ny"),
        ("/mpub?topic=t&binary=true", mpub_body([b"x"])),
        ("/pub?topic=t&defer=60000", b"x"),
    ):
        reply = post(origin.http(), path, body)
        assert (reply.status, reply.message) == (503, "REPLICATION_DEGRADED"), (path, reply)
    topic = stats(origin.http(), "topic=t")["topics"][0]
    channel = topic["channels"][0]
    assert (topic["depth"], topic["message_count"]) == (0, 0)
    assert (channel["depth"], channel["deferred_count"]) == (0, 0)


@pytest.mark.timeout(60)
def test_a_deferred_message_stays_deferred_after_a_takeover(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    create(origin, "c")
    with RawClient(origin.tcp) as producer:
        producer.send(command("DPUB", "t", 60000, body=b"later"))
        producer.expect_ok()
        producer.publish("t", b"now")
    origin.kill()
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 2
    channel = stats(replica.http(), "topic=t")["topics"][0]["channels"][0]
    assert (channel["depth"], channel["deferred_count"]) == (1, 1)
    with consumer(replica.tcp, "t", "c", ready=10) as client:
        assert receive(client, 1) == [b"now"]
        assert client.poll_frame(0.5) is None  # "later" is due in a minute
    assert stats(replica.http(), "topic=t")["topics"][0]["channels"][0]["deferred_count"] == 1


def test_a_message_put_back_keeps_its_attempts_and_its_delay_through_a_takeover(daemons, tmp_path):
    origin, replica = pair(daemons, tmp_path)
    node = f"127.0.0.1:{origin.tcp[1]}"
    create(origin, "c", "d")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"again", b"later"])
    with consumer(origin.tcp, "t", "c", ready=2) as client:
        for _ in range(2):
            message = client.read_message(timeout=10)
            assert message.attempts == 1
            client.send(command("REQ", message.id, 0 if message.body == b"again" else 60000))
        again = client.read_message(timeout=10)  # delivered a second time, and put back once more
        assert (again.body, again.attempts) == (b"again", 2)
        client.send(command("RDY", 0))
        client.send(command("REQ", again.id, 0))
        # REQUEUED frames go like FINs; a channel op after them is acknowledged once they are held
        before = stats(origin.http())["replication"]["peers"][0]["acked"]
        assert post(origin.http(), "/channel/unpause?topic=t&channel=d").status == 200
        fins_acked(origin, before)
    origin.kill()
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 2
    channels = {c["channel_name"]: c for c in stats(replica.http(), "topic=t")["topics"][0]["channels"]}
    assert (channels["c"]["depth"], channels["c"]["deferred_count"]) == (1, 1)  # "later" waits for its minute
    assert (channels["d"]["depth"], channels["d"]["deferred_count"]) == (2, 0)
    with consumer(replica.tcp, "t", "c", ready=10) as client:
        message = client.read_message(timeout=10)
        assert (message.body, message.attempts) == (b"again", 3)  # two deliveries on the origin, then this one
        client.send(command("FIN", message.id))
        assert client.poll_frame(0.5) is None
    with consumer(replica.tcp, "t", "d", ready=10) as client:
        got = sorted((m.body, m.attempts) for m in (client.read_message(timeout=10) for _ in range(2)))
        assert got == [(b"again", 1), (b"later", 1)]  # d never had them


def put_back_on_c(origin: NsqdProcess) -> None:
    """On channel c: "again" delivered twice and put back each time, "later" put back for a minute."""
    with consumer(origin.tcp, "t", "c", ready=2) as client:
        for _ in range(2):
            message = client.read_message(timeout=10)
            client.send(command("REQ", message.id, 0 if message.body == b"again" else 60000))
        again = client.read_message(timeout=10)
        assert (again.body, again.attempts) == (b"again", 2)
        client.send(command("RDY", 0))
        client.send(command("REQ", again.id, 0))
        wait_for(
            lambda: stats(origin.http(), "topic=t")["topics"][0]["channels"][0]["in_flight_count"] == 0,
            message="put back",
        )


def test_a_backfill_carries_what_a_channel_put_back(daemons, tmp_path):
    port = free_port()
    origin = start(daemons, tmp_path / "a", f"--replicate-to=127.0.0.1:{port}", "--replication-degraded=accept")
    node = f"127.0.0.1:{origin.tcp[1]}"
    create(origin, "c", "d")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [b"again", b"later"])
    put_back_on_c(origin)
    replica = start(daemons, tmp_path / "b", port=port)  # it gets them in a backfill, as the channels hold them
    wait_state(origin, "replicating", timeout=20)
    origin.kill()
    assert post(replica.http(), f"/replica/takeover?node={node}").json()["messages"] == 2
    channels = {c["channel_name"]: c for c in stats(replica.http(), "topic=t")["topics"][0]["channels"]}
    assert (channels["c"]["depth"], channels["c"]["deferred_count"]) == (1, 1)
    assert (channels["d"]["depth"], channels["d"]["deferred_count"]) == (2, 0)  # what c did is c's alone
    with consumer(replica.tcp, "t", "c", ready=10) as client:
        message = client.read_message(timeout=10)
        assert (message.body, message.attempts) == (b"again", 3)
        client.send(command("FIN", message.id))
        assert client.poll_frame(0.5) is None
    with consumer(replica.tcp, "t", "d", ready=10) as client:
        got = sorted((m.body, m.attempts) for m in (client.read_message(timeout=10) for _ in range(2)))
        assert got == [(b"again", 1), (b"later", 1)]


class GatedReplica:
    """A replica played by the test: WELCOME, the (empty) backfill and topic changes acknowledged at once (the
    backfill once ``hold_synced`` is set, when given); then
    it holds back its ACK until ``gate`` MESSAGES frames came, and answers them all with one ACK. ``oks_before``
    is how many publishers had their OK when the gate opened (``published``: one event per publisher)."""

    def __init__(
        self, gate: int, published: list[threading.Event], *, hold_synced: threading.Event | None = None
    ) -> None:
        self.gate = gate
        self.hold_synced = hold_synced  # set: the end of the backfill (SYNCED) is acknowledged only once it is set
        self.published = published
        self.frames: list[Messages] = []
        self.acks_after_gate: list[int] = []
        self.oks_before: int | None = None
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(60)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.connection: socket.socket | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.connection, decoder = accept_origin(self.listener)
            self.connection.sendall(encode(Welcome("127.0.0.1:1")))
            while True:
                event = next_event(self.connection, decoder)
                if type(event) is Heartbeat:
                    self.connection.sendall(HEARTBEAT_FRAME)
                elif type(event) is Messages and event.seq > 0:
                    self.frames.append(event)
                    if len(self.frames) == self.gate:
                        self.oks_before = sum(done.is_set() for done in self.published)
                        self.acks_after_gate.append(event.seq)
                        self.connection.sendall(encode(Ack(event.seq)))
                    elif len(self.frames) > self.gate:
                        self.acks_after_gate.append(event.seq)
                        self.connection.sendall(encode(Ack(event.seq)))
                elif type(event) is Synced or getattr(event, "seq", 0) > 0:
                    if type(event) is Synced and self.hold_synced is not None:
                        self.hold_synced.wait(30)
                    self.connection.sendall(encode(Ack(event.seq)))
        except (OSError, EOFError):
            pass

    def close(self) -> None:
        if self.hold_synced is not None:
            self.hold_synced.set()
        self.listener.close()
        if self.connection is not None:
            self.connection.close()
        self.thread.join(10)


@pytest.mark.timeout(60)
def test_publishes_of_many_connections_share_one_replication_round_trip(daemons, tmp_path):
    # group commit: the frames of publishes made while an ACK is pending go to the peer without waiting for it, and
    # one ACK answers them all; no publisher has its OK before the ACK that covers its message
    publishers = 16
    published = [threading.Event() for _ in range(publishers)]
    replica = GatedReplica(publishers, published)
    try:
        origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.address}")
        wait_state(origin, "replicating")
        assert post(origin.http(), "/topic/create?topic=t").status == 200
        clients = [RawClient(origin.tcp) for _ in range(publishers)]
        failures: list[BaseException] = []

        def publish(n: int) -> None:
            try:
                clients[n].publish("t", b"m%d" % n)
                published[n].set()
            except BaseException as exc:  # reported by the test
                failures.append(exc)

        threads = [threading.Thread(target=publish, args=(n,)) for n in range(publishers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert not failures and all(done.is_set() for done in published)
        assert sorted(m.body for frame in replica.frames for m in frame.messages) == sorted(
            b"m%d" % n for n in range(publishers)
        )
        assert replica.oks_before == 0  # every frame reached the replica before any of them was acknowledged
        assert replica.acks_after_gate == [replica.frames[-1].seq]  # and one ACK released all 16 OKs
        for client in clients:
            client.close()
    finally:
        replica.close()


@pytest.mark.timeout(60)
def test_a_peer_counts_toward_acks_only_once_its_backfill_is_acknowledged(daemons, tmp_path):
    backfilled = threading.Event()
    replica = GatedReplica(1, [], hold_synced=backfilled)
    try:
        origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.address}")
        wait_for(
            lambda: stats(origin.http())["replication"]["peers"][0]["state"] == "backfilling", message="backfilling"
        )
        assert stats(origin.http())["replication"]["state"] == "degraded"  # connected, but not counted yet
        with RawClient(origin.tcp) as producer:
            producer.send(command("PUB", "t", body=b"early"))
            producer.expect_error(b"E_PUB_FAILED PUB failed replication degraded")
        assert get(origin.http(), "/ping").status == 500
        backfilled.set()
        wait_state(origin, "replicating")
        with RawClient(origin.tcp) as producer:
            producer.publish("t", b"counted")
        assert [m.body for frame in replica.frames for m in frame.messages] == [b"counted"]
    finally:
        replica.close()
