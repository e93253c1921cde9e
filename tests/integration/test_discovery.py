"""Discovery across several nsqd: nsqd registering with several nsqlookupd, all as subprocesses.

Waits are bounded and poll lookupd's HTTP API for the awaited state; nothing waits for nsqd's 15 s PING:
a restarted lookupd is noticed through the closed connection.
"""

from __future__ import annotations

import json
import uuid

import pytest

from protocol.lookup_v1 import PING, encode_register
from tests.integration.harness import NsqdProcess, RawClient, consumer
from tests.integration.http_helpers import get, post, request, stats
from tests.integration.lookupd_harness import (
    Cluster,
    LookupdProcess,
    RawPeer,
    lookup_producers,
    wait_for,
    wait_for_producers,
)
from tests.integration.partition import Proxy

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def topic() -> str:
    return f"d_{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two nsqlookupd and two nsqd shared by the tests that leave the daemons running."""
    built = Cluster(tmp_path_factory.mktemp)
    yield built
    built.stop()


@pytest.fixture
def make_cluster(tmp_path_factory):
    built: list[Cluster] = []

    def make(**kwargs) -> Cluster:
        built.append(Cluster(tmp_path_factory.mktemp, **kwargs))
        return built[-1]

    yield make
    for item in built:
        item.stop()


def publish(nsqd, topic: str, body: bytes = b"x") -> None:
    with RawClient(nsqd.tcp) as client:
        client.publish(topic, body)


def tcp_ports(cluster: Cluster) -> set[int]:
    return {nsqd.tcp[1] for nsqd in cluster.nsqds}


def channel_producers(lookupd, topic: str, channel: str) -> set[int]:
    entries = get(lookupd.http_address, "/debug").json().get(f"channel:{topic}:{channel}", [])
    return {entry["tcp_port"] for entry in entries}


def test_every_nsqd_registers_with_every_lookupd(cluster, topic):
    for nsqd in cluster.nsqds:
        publish(nsqd, topic)
    for lookupd in cluster.lookupds:
        producers = wait_for_producers(lookupd, topic, tcp_ports(cluster))
        by_port = {p["tcp_port"]: p for p in producers}
        for nsqd in cluster.nsqds:
            peer = by_port[nsqd.tcp[1]]
            assert (peer["broadcast_address"], peer["http_port"], peer["version"]) == (
                "127.0.0.1",
                nsqd.http()[1],
                "1.3.0",
            )
        nodes = get(lookupd.http_address, "/nodes").json()["producers"]
        assert {n["tcp_port"] for n in nodes if topic in n["topics"]} == tcp_ports(cluster)
        for node in nodes:
            assert len(node["tombstones"]) == len(node["topics"])


def test_channels_and_deletions_follow_nsqd(cluster, topic):
    nsqd = cluster.nsqds[0]
    port = nsqd.tcp[1]
    sub = consumer(nsqd.tcp, topic, "workers")
    ephemeral = consumer(nsqd.tcp, topic, "tail#ephemeral")
    for lookupd in cluster.lookupds:
        wait_for(lambda ld=lookupd: channel_producers(ld, topic, "workers") == {port}, message="channel registered")
        wait_for(
            lambda ld=lookupd: channel_producers(ld, topic, "tail#ephemeral") == {port}, message="ephemeral channel"
        )
    # the last consumer of an ephemeral channel leaves: nsqd deletes it and lookupd forgets the key
    ephemeral.close()
    for lookupd in cluster.lookupds:
        wait_for(
            lambda ld=lookupd: (
                "tail#ephemeral" not in get(ld.http_address, f"/channels?topic={topic}").json()["channels"]
            ),
            message="ephemeral channel gone",
        )
    sub.close()
    # deleting the channel on nsqd unregisters it; the key itself stays in lookupd
    assert post(nsqd.http(), f"/channel/delete?topic={topic}&channel=workers").status == 200
    for lookupd in cluster.lookupds:
        wait_for(lambda ld=lookupd: channel_producers(ld, topic, "workers") == set(), message="channel unregistered")
        assert "workers" in get(lookupd.http_address, f"/channels?topic={topic}").json()["channels"]
        assert {p["tcp_port"] for p in lookup_producers(lookupd, topic)} == {port}
    # deleting the topic unregisters the producer
    assert post(nsqd.http(), f"/topic/delete?topic={topic}").status == 200
    for lookupd in cluster.lookupds:
        wait_for_producers(lookupd, topic, set())


def test_channels_are_pre_created_from_lookupd(cluster, topic):
    lookupd = cluster.lookupds[1]
    for channel in ("archive", "metrics", "live#ephemeral"):
        assert post(lookupd.http_address, f"/channel/create?topic={topic}&channel={channel}").status == 200
    nsqd = cluster.nsqds[0]
    publish(nsqd, topic, b"first message")

    # nsqd asked lookupd before its topic started: the first message is in both channels
    def channels():
        found = stats(nsqd.http(), f"topic={topic}")["topics"]
        return {c["channel_name"]: c["depth"] for c in found[0]["channels"]} if found else {}

    wait_for(lambda: channels() == {"archive": 1, "metrics": 1}, message="channels pre-created with the message")
    with consumer(nsqd.tcp, topic, "archive", ready=1) as client:
        assert client.read_message().body == b"first message"
    assert "CI: querying nsqlookupd http://127.0.0.1:" in nsqd.log_text()


def test_a_topic_made_before_lookupd_answered_waits_for_its_channels(cluster, topic, tmp_path):
    # a node that just started takes a publish before any lookupd identified itself: the topic waits for the first
    # one's answer (a moment) instead of going on without channels, which gave the message to the first channel a
    # consumer made and not to the others
    lookupd = cluster.lookupds[0]
    for channel in ("one", "two"):
        assert post(lookupd.http_address, f"/channel/create?topic={topic}&channel={channel}").status == 200
    proxy = Proxy(lookupd.tcp)
    proxy.set(outbound=True, inbound=True)  # refuses connections: the lookupd looks down
    nsqd = NsqdProcess(tmp_path, ["--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={proxy.address}"])
    nsqd.start()
    try:
        publish(nsqd, topic, b"early")
        assert proxy.connections == 0  # published before the lookupd could answer anything
        proxy.set(outbound=False, inbound=False)

        def channels():
            found = stats(nsqd.http(), f"topic={topic}")["topics"]
            return {c["channel_name"]: c["depth"] for c in found[0]["channels"]} if found else {}

        wait_for(lambda: channels() == {"one": 1, "two": 1}, message="the early message in both channels")
        assert "no available nsqlookupd" not in nsqd.log_text()
    finally:
        nsqd.stop()
        proxy.close()


def test_lookupd_addresses_change_at_run_time(cluster, topic):
    nsqd = cluster.nsqds[1]
    first, second = cluster.lookupds
    publish(nsqd, topic)
    for lookupd in cluster.lookupds:
        wait_for_producers(lookupd, topic, tcp_ports(cluster) & {nsqd.tcp[1]})
    reply = request(nsqd.http(), "PUT", "/config/nsqlookupd_tcp_addresses", json.dumps([second.tcp_address]))
    assert reply.status == 200, reply
    wait_for_producers(first, topic, set())  # the connection to the first lookupd is closed
    assert {p["tcp_port"] for p in lookup_producers(second, topic)} == {nsqd.tcp[1]}
    reply = request(
        nsqd.http(), "PUT", "/config/nsqlookupd_tcp_addresses", json.dumps([first.tcp_address, second.tcp_address])
    )
    assert reply.status == 200, reply
    wait_for_producers(first, topic, {nsqd.tcp[1]})  # a new peer announces everything
    assert json.loads(get(nsqd.http(), "/config/nsqlookupd_tcp_addresses").body) == [
        first.tcp_address,
        second.tcp_address,
    ]


def test_nsqd_reregisters_after_lookupd_restarts(make_cluster, topic):
    cluster = make_cluster(lookupds=1, nsqds=2)
    for nsqd in cluster.nsqds:
        publish(nsqd, topic)
    consumer(cluster.nsqds[0].tcp, topic, "ch").close()
    wait_for_producers(cluster.lookupds[0], topic, tcp_ports(cluster))
    lookupd = cluster.restart(cluster.lookupds[0])
    # a restarted lookupd starts empty (nsqd may already have registered again by now, so no 404 is asserted):
    # what it knows next comes from the nsqds' new registrations
    wait_for_producers(lookupd, topic, tcp_ports(cluster))

    # the second nsqd may hold "ch" too: its topic asks lookupd for channels to pre-create without blocking the
    # PUB, so that query can see the consumer's "ch" registered meanwhile; lookupd must list exactly the nsqds
    # that hold the channel, the consumer's among them
    def settled():
        holders = nsqds_with_channel(cluster, topic, "ch")
        return holders if channel_producers(lookupd, topic, "ch") == holders else None

    assert cluster.nsqds[0].tcp[1] in wait_for(settled, message="lookupd lists the nsqds holding ch")


def nsqds_with_channel(cluster: Cluster, topic: str, channel: str) -> set[int]:
    return {
        nsqd.tcp[1]
        for nsqd in cluster.nsqds
        for found in stats(nsqd.http(), f"topic={topic}")["topics"]
        if any(c["channel_name"] == channel for c in found["channels"])
    }


def test_lookupd_sees_nsqd_leave_and_come_back(make_cluster, topic):
    cluster = make_cluster(lookupds=2, nsqds=2)
    for nsqd in cluster.nsqds:
        publish(nsqd, topic)
    for lookupd in cluster.lookupds:
        wait_for_producers(lookupd, topic, tcp_ports(cluster))
    leaving = cluster.nsqds[0]
    assert leaving.stop() == 0
    for lookupd in cluster.lookupds:
        wait_for_producers(lookupd, topic, {cluster.nsqds[1].tcp[1]})
        assert leaving.tcp[1] not in {n["tcp_port"] for n in get(lookupd.http_address, "/nodes").json()["producers"]}
    cluster.daemons.remove(leaving)
    back = cluster.start_nsqd(leaving.data_path)  # the topic comes back from nsqd.dat and is announced
    cluster.nsqds[0] = back
    for lookupd in cluster.lookupds:
        wait_for_producers(lookupd, topic, tcp_ports(cluster))


def test_tombstone_hides_a_producer_for_its_lifetime(make_cluster, topic):
    cluster = make_cluster(lookupds=1, nsqds=2, lookupd_args=("--tombstone-lifetime=3s",))
    lookupd = cluster.lookupds[0]
    for nsqd in cluster.nsqds:
        publish(nsqd, topic)
    wait_for_producers(lookupd, topic, tcp_ports(cluster))
    hidden, kept = cluster.nsqds
    node = f"127.0.0.1:{hidden.http()[1]}"
    assert post(lookupd.http_address, f"/topic/tombstone?topic={topic}&node={node}").status == 200
    assert {p["tcp_port"] for p in lookup_producers(lookupd, topic)} == {kept.tcp[1]}
    node_entry = next(
        n for n in get(lookupd.http_address, "/nodes").json()["producers"] if n["tcp_port"] == hidden.tcp[1]
    )
    assert dict(zip(node_entry["topics"], node_entry["tombstones"], strict=True))[topic] is True
    # once the lifetime has passed the producer is listed again
    wait_for_producers(lookupd, topic, tcp_ports(cluster), timeout=30)


def test_inactive_producers_drop_out(make_cluster, topic):
    cluster = make_cluster(lookupds=1, nsqds=0, lookupd_args=("--inactive-producer-timeout=1s",))
    lookupd = cluster.lookupds[0]
    with RawPeer(lookupd.tcp) as peer:
        peer.identify(tcp_port=7150, http_port=7151)
        assert peer.command(encode_register(topic)) == b"OK"
        # no PING within the timeout: gone from /lookup and /nodes, though still connected and registered
        wait_for_producers(lookupd, topic, set())
        wait_for(lambda: get(lookupd.http_address, "/nodes").json() == {"producers": []}, message="node inactive")
        assert get(lookupd.http_address, "/debug").json()[f"topic:{topic}:"][0]["tcp_port"] == 7150
        assert peer.command(PING) == b"OK"
        assert [p["tcp_port"] for p in lookup_producers(lookupd, topic)] == [7150]


def test_nsqd_tolerates_a_missing_lookupd(make_cluster, topic, tmp_path):
    # nothing listens on the second address: nsqd keeps trying, serves, and registers with the first
    cluster = make_cluster(lookupds=1, nsqds=0)
    dead = LookupdProcess(tmp_path / "dead").start()
    dead_address = dead.tcp_address
    assert dead.stop() == 0
    cluster.lookupds.append(dead)  # only its address is used
    nsqd = cluster.start_nsqd()
    cluster.lookupds.pop()
    publish(nsqd, topic)
    wait_for_producers(cluster.lookupds[0], topic, {nsqd.tcp[1]})
    nsqd.wait_for_log(rf"LOOKUPD\({dead_address}\): ", 10)
    nsqd.assert_running()
