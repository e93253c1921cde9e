"""The node page's replication data and its takeover action, against two real trionsq nodes (A keeps copies on
B) and a real nsqadmin in nsqd mode."""

from __future__ import annotations

import pytest

from tests.admin.cluster import Daemon, http, wait_until
from tests.integration.harness import RawClient, free_port

ADMIN = {"X-Forwarded-User": "alice"}


@pytest.fixture
def nodes(tmp_path):
    started = []

    def start(module: str, args: list[str]) -> Daemon:
        daemon = Daemon(module, args).start()
        started.append(daemon)
        return daemon

    replica_port, origin_port = free_port(), free_port()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    common = ["--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1"]
    replica = start("nsqd", [f"--tcp-address=127.0.0.1:{replica_port}", *common, f"--data-path={tmp_path / 'b'}"])
    origin = start(
        "nsqd",
        [
            f"--tcp-address=127.0.0.1:{origin_port}",
            *common,
            f"--data-path={tmp_path / 'a'}",
            f"--replicate-to=127.0.0.1:{replica_port}",
        ],
    )
    admin = start(
        "admin",
        [
            "--http-address=127.0.0.1:0",
            "--admin-user=alice",
            f"--nsqd-http-address={replica.http}",
            f"--nsqd-http-address={origin.http}",
        ],
    )
    yield origin, replica, admin, f"127.0.0.1:{origin_port}"
    for daemon in reversed(started):
        if daemon.is_running():
            daemon.kill()


def _node_name(daemon: Daemon) -> str:
    return "127.0.0.1:" + daemon.http.rpartition(":")[2]


def test_node_page_shows_replication_and_takes_over(nodes):
    origin, replica, admin, origin_node = nodes
    url = f"http://{admin.http}"
    wait_until(
        lambda: http("GET", f"{url}/api/nodes/{_node_name(origin)}").json()["replication"]["state"] == "replicating",
        message="replicating",
    )
    with RawClient(("127.0.0.1", int(origin_node.rpartition(":")[2]))) as producer:
        producer.publish_many("t", [b"a", b"b", b"c"])
    page = http("GET", f"{url}/api/nodes/{_node_name(replica)}").json()
    assert list(page) == ["node", "topics", "total_messages", "total_clients", "replication", "message"]
    held = {r["node"]: r for r in page["replication"]["replicas"]}
    assert held[origin_node]["held_messages"] == 3 and held[origin_node]["state"] == "connected"
    peers = http("GET", f"{url}/api/nodes/{_node_name(origin)}").json()["replication"]["peers"]
    assert [(p["state"], p["pending_messages"]) for p in peers] == [("connected", 0)]

    session = http("GET", f"{url}/api/session", headers=ADMIN).json()
    headers = {**ADMIN, "X-CSRF-Token": session["csrf_token"], "Content-Type": "application/json"}
    assert (
        http(
            "POST",
            f"{url}/api/nodes/{_node_name(replica)}",
            {"action": "takeover", "origin": origin_node},
            headers={"Content-Type": "application/json"},
        ).status
        == 403
    )  # not an admin
    assert (
        http(
            "POST", f"{url}/api/nodes/{_node_name(replica)}", {"action": "nap", "origin": origin_node}, headers=headers
        ).status
        == 400
    )
    origin.kill()
    reply = http(
        "POST", f"{url}/api/nodes/{_node_name(replica)}", {"action": "takeover", "origin": origin_node}, headers=headers
    )
    assert reply.status == 200  # its message warns of the dead origin, which the admin could not reach
    assert origin.http.rpartition(":")[2] in reply.json()["message"]
    stats = http("GET", f"http://{replica.http}/stats?format=json&topic=t").json()
    assert stats["topics"][0]["depth"] == 3
    assert stats["replication"]["takeovers"] == 1
