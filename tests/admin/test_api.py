"""nsqadmin's HTTP API against a live cluster (lookupd + two nsqd + admin as subprocesses): nsqadmin's JSON
shapes, the action guard (admin user, CSRF token, origin), notifications, /config and the graph history.
Every effect of an action is checked through nsqd's own HTTP API."""

from __future__ import annotations

import gzip
import json
import queue
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.admin.cluster import REPO_ROOT, Cluster, Daemon, http, wait_until
from tests.integration.harness import consumer

ADMIN = {"X-Forwarded-User": "alice"}


class NotificationSink:
    """A real HTTP endpoint on 127.0.0.1 that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.received: queue.Queue = queue.Queue()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                sink.received.put((self.headers.get("Content-Type"), json.loads(self.rfile.read(length))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/notify"

    def next(self, timeout: float = 10.0):
        return self.received.get(timeout=timeout)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def sink():
    sink = NotificationSink()
    yield sink
    sink.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, sink):
    cluster = Cluster(
        tmp_path_factory.mktemp("admin-api"), ["--admin-user=alice", f"--notification-http-endpoint={sink.url}"]
    ).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def topic() -> str:
    return f"api_{uuid.uuid4().hex[:10]}"


def api(cluster, method, path, body=None, headers=None):
    return http(method, cluster.url + path, body, headers)


def token(cluster) -> str:
    reply = api(cluster, "GET", "/api/session", headers=ADMIN)
    assert reply.status == 200, reply
    assert reply.json()["is_admin"] is True
    return reply.json()["csrf_token"]


def action_headers(cluster) -> dict:
    return {**ADMIN, "X-CSRF-Token": token(cluster), "Content-Type": "application/json"}


def spread_topic(cluster, topic: str, channel: str = "work") -> None:
    """``topic`` with ``channel`` on both nodes, one message published on each, visible to the admin."""
    for index in (0, 1):
        cluster.publish(index, topic)
        cluster.create_channel(index, topic, channel)
    wait_until(
        lambda: len(api(cluster, "GET", f"/api/topics/{topic}").json().get("nodes") or []) == 2,
        message=f"both nodes listed for {topic}",
    )


def test_ping_shell_and_static(cluster):
    assert api(cluster, "GET", "/ping").body == b"OK"
    page = api(cluster, "GET", "/topics/anything", headers={"Accept-Encoding": "gzip"})
    assert page.status == 200
    assert "script-src 'self'" in page.headers["content-security-policy"]
    html = gzip.decompress(page.body).decode() if page.headers.get("content-encoding") == "gzip" else page.body.decode()
    assert '<script id="nsqadmin-config" type="application/json">' in html
    config = json.loads(html.split('type="application/json">')[1].split("</script>")[0])
    assert config["IS_ADMIN"] is False and config["VERSION"] == "1.3.0" and config["CSRF_TOKEN"]
    script = api(cluster, "GET", "/static/app.js")
    assert script.status == 200 and script.headers["content-type"] == "text/javascript; charset=utf-8"
    assert api(cluster, "GET", "/static/nope.js").status == 404
    assert api(cluster, "GET", "/no/such/page").json() == {"message": "NOT_FOUND"}


def test_topic_and_channel_shapes(cluster, topic):
    spread_topic(cluster, topic)
    assert topic in api(cluster, "GET", "/api/topics").json()["topics"]
    body = api(cluster, "GET", f"/api/topics/{topic}").json()
    assert list(body) == [
        "node",
        "hostname",
        "topic_name",
        "depth",
        "memory_depth",
        "backend_depth",
        "message_count",
        "nodes",
        "channels",
        "paused",
        "e2e_processing_latency",
        "message",
    ]
    assert (body["node"], body["topic_name"], body["message_count"], body["message"]) == ("*", topic, 2, "")
    assert sorted(n["node"] for n in body["nodes"]) == sorted([cluster.node_name(0), cluster.node_name(1)])
    (channel,) = body["channels"]
    assert channel["channel_name"] == "work" and len(channel["nodes"]) == 2
    assert channel["depth"] == sum(n["depth"] for n in channel["nodes"])

    client = consumer(
        cluster.nsqds[0].tcp,
        topic,
        "work",
        ready=1,
        identify_fields={"client_id": "reader-1", "hostname": "reader.local", "user_agent": "api-test/1.0"},
    )
    try:
        found = wait_until(
            lambda: api(cluster, "GET", f"/api/topics/{topic}/work").json().get("clients"), message="client listed"
        )
        (row,) = found
        assert list(row)[:8] == [
            "node",
            "remote_address",
            "version",
            "client_id",
            "hostname",
            "user_agent",
            "connect_ts",
            "connected",
        ]
        assert (row["client_id"], row["hostname"], row["user_agent"], row["node"]) == (
            "reader-1",
            "reader.local",
            "api-test/1.0",
            cluster.node_name(0),
        )
        assert row["connected"] % 1_000_000_000 == 0
    finally:
        client.close()
    assert api(cluster, "GET", f"/api/topics/{topic}/nochannel").json() == {"message": ""}


def test_nodes_node_and_counter(cluster, topic):
    spread_topic(cluster, topic)
    nodes = api(cluster, "GET", "/api/nodes").json()
    assert nodes["message"] == ""
    by_name = {f"{n['broadcast_address']}:{n['http_port']}": n for n in nodes["nodes"]}
    assert set(by_name) == {cluster.node_name(0), cluster.node_name(1)}
    first = by_name[cluster.node_name(0)]
    assert list(first) == [
        "remote_addresses",
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "topics",
        "out_of_date",
    ]
    assert {"topic": topic, "tombstoned": False} in first["topics"]

    node = api(cluster, "GET", f"/api/nodes/{cluster.node_name(1)}").json()
    assert list(node) == ["node", "topics", "total_messages", "total_clients", "message"]
    assert topic in [t["topic_name"] for t in node["topics"]]
    assert node["total_messages"] >= 1
    missing = api(cluster, "GET", "/api/nodes/127.0.0.1:1")
    assert (missing.status, missing.json()) == (404, {"message": "NODE_NOT_FOUND"})

    stats = api(cluster, "GET", "/api/counter").json()["stats"]
    key = f"{topic}:work:{cluster.node_name(0)}"
    assert stats[key] == {"node": cluster.node_name(0), "topic_name": topic, "channel_name": "work", "message_count": 1}


def test_action_without_admin_header_is_refused(cluster, topic):
    spread_topic(cluster, topic)
    headers = {"X-CSRF-Token": token(cluster), "Content-Type": "application/json"}  # a valid token, no user
    for method, path, body in [
        ("POST", f"/api/topics/{topic}", {"action": "pause"}),
        ("DELETE", f"/api/topics/{topic}", None),
        ("POST", f"/api/topics/{topic}/work", {"action": "empty"}),
        ("POST", "/api/topics", {"topic": topic + "_new"}),
        ("DELETE", f"/api/nodes/{cluster.node_name(0)}", {"topic": topic}),
    ]:
        reply = api(cluster, method, path, body, headers)
        assert (reply.status, reply.json()) == (403, {"message": "FORBIDDEN"}), (method, path)
    for index in (0, 1):
        t = cluster.topic_stats(index, topic)
        assert t is not None and t["paused"] is False
        assert cluster.channel_stats(index, topic, "work")["depth"] == 1


def test_browser_action_without_csrf_token_is_refused(cluster, topic):
    """A request that carries what only a browser sends (Origin, Referer, a cookie, Sec-Fetch-*) needs the token
    and must come from the admin's own origin."""
    spread_topic(cluster, topic)
    good = token(cluster)
    own = {**ADMIN, "Origin": cluster.url}
    for headers, code in [
        (own, "INVALID_CSRF_TOKEN"),
        ({**ADMIN, "Cookie": "session=1"}, "INVALID_CSRF_TOKEN"),
        ({**ADMIN, "Referer": cluster.url + f"/topics/{topic}"}, "INVALID_CSRF_TOKEN"),
        ({**own, "X-CSRF-Token": "f" * 64}, "INVALID_CSRF_TOKEN"),
        ({"X-Forwarded-User": "bob", "X-CSRF-Token": good}, "FORBIDDEN"),
        ({**ADMIN, "X-CSRF-Token": good, "Origin": "http://attacker.example"}, "CROSS_ORIGIN_REQUEST"),
        ({**ADMIN, "Referer": "http://attacker.example/"}, "CROSS_ORIGIN_REQUEST"),
    ]:
        reply = api(cluster, "POST", f"/api/topics/{topic}", {"action": "pause"}, headers)
        assert (reply.status, reply.json()) == (403, {"message": code}), headers
        reply = api(cluster, "DELETE", f"/api/topics/{topic}/work", None, headers)
        assert reply.status == 403
    for index in (0, 1):
        assert cluster.topic_stats(index, topic)["paused"] is False
        assert cluster.channel_stats(index, topic, "work") is not None


def test_scripts_written_for_nsqadmin_work_unchanged(cluster, topic):
    """What a script sends to nsqadmin (curl -X POST -d '{"action":"pause"}', curl -X DELETE ...): no token, no
    JSON content type, only the user header its proxy needs."""
    spread_topic(cluster, topic, "work")
    spread_topic(cluster, topic, "gone")
    curl = {**ADMIN, "User-Agent": "curl/8.5.0", "Accept": "*/*", "Content-Type": "application/x-www-form-urlencoded"}
    steps = [
        ("POST", f"/api/topics/{topic}", {"action": "pause"}),
        ("POST", f"/api/topics/{topic}/work", {"action": "pause"}),
        ("POST", f"/api/topics/{topic}/work", {"action": "empty"}),
        ("DELETE", f"/api/topics/{topic}/gone", None),
        ("POST", "/api/topics", {"topic": topic, "channel": "made"}),
    ]
    for method, path, body in steps:
        reply = api(cluster, method, path, body, curl)
        assert (reply.status, reply.json()) == (200, {"message": ""}), (method, path, reply.body)
    for index in (0, 1):
        assert cluster.topic_stats(index, topic)["paused"] is True
        channel = cluster.channel_stats(index, topic, "work")
        assert channel["paused"] is True and channel["depth"] == 0
        assert cluster.channel_stats(index, topic, "gone") is None
    assert api(cluster, "POST", f"/api/topics/{topic}", {"action": "unpause"}, curl).status == 200
    reply = api(cluster, "DELETE", f"/api/topics/{topic}", None, curl)
    assert (reply.status, reply.json()) == (200, {"message": ""})
    wait_until(lambda: all(cluster.topic_stats(i, topic) is None for i in (0, 1)), message="topic deleted")


def test_pause_with_token_changes_nodes_and_notifies(cluster, sink, topic):
    spread_topic(cluster, topic)
    while not sink.received.empty():
        sink.received.get_nowait()
    reply = api(
        cluster,
        "POST",
        f"/api/topics/{topic}",
        {"action": "pause"},
        {**action_headers(cluster), "User-Agent": "pause-script/2"},
    )
    assert (reply.status, reply.json()) == (200, {"message": ""})
    assert all(cluster.topic_stats(i, topic)["paused"] for i in (0, 1))
    content_type, note = sink.next()
    assert content_type == "application/json"
    assert list(note) == ["action", "topic", "timestamp", "remote_ip", "user_agent", "url", "via"]
    assert (note["action"], note["topic"], note["user_agent"]) == ("pause_topic", topic, "pause-script/2")
    assert note["url"] == f"{cluster.url}/api/topics/{topic}"
    assert note["remote_ip"].startswith("127.0.0.1:")

    reply = api(cluster, "POST", f"/api/topics/{topic}/work", {"action": "empty"}, action_headers(cluster))
    assert reply.status == 200, reply
    assert all(cluster.channel_stats(i, topic, "work")["depth"] == 0 for i in (0, 1))
    note = sink.next()[1]
    assert (note["action"], note["topic"], note["channel"]) == ("empty_channel", topic, "work")


def test_delete_channel_topic_and_tombstone(cluster, topic):
    spread_topic(cluster, topic)
    headers = action_headers(cluster)
    assert api(cluster, "DELETE", f"/api/topics/{topic}/work", None, headers).status == 200
    assert all(cluster.channel_stats(i, topic, "work") is None for i in (0, 1))

    reply = api(cluster, "DELETE", f"/api/nodes/{cluster.node_name(1)}", {"topic": topic}, headers)
    assert (reply.status, reply.json()) == (200, {"message": ""})
    assert cluster.topic_stats(1, topic) is None
    assert cluster.topic_stats(0, topic) is not None

    assert api(cluster, "DELETE", f"/api/topics/{topic}", None, headers).status == 200
    assert cluster.topic_stats(0, topic) is None


def test_bad_requests(cluster, topic):
    headers = action_headers(cluster)
    spread_topic(cluster, topic)
    cases = [
        ("POST", f"/api/topics/{topic}", {"action": "explode"}, "INVALID_ACTION"),
        ("POST", f"/api/topics/{topic}", "xyz", "invalid character 'x' looking for beginning of value"),
        ("POST", f"/api/topics/{topic}", "", "EOF"),
        ("POST", "/api/topics/bad%20name", {"action": "pause"}, "INVALID_TOPIC"),
        ("POST", "/api/topics", {"topic": "a" * 65}, "INVALID_TOPIC"),
        ("POST", "/api/topics", {"topic": topic, "channel": "no good"}, "INVALID_CHANNEL"),
        ("DELETE", f"/api/nodes/{cluster.node_name(0)}", "{", "INVALID_BODY"),
    ]
    for method, path, body, message in cases:
        reply = api(cluster, method, path, body, headers)
        assert (reply.status, reply.json()) == (400, {"message": message}), (method, path, body)
    assert cluster.topic_stats(0, topic)["paused"] is False


def test_create_topic_and_channel(cluster, topic):
    reply = api(cluster, "POST", "/api/topics", {"topic": topic, "channel": "fresh"}, action_headers(cluster))
    assert (reply.status, reply.json()) == (200, {"message": ""})
    if cluster.mode == "lookupd":
        lookupd = f"http://{cluster.lookupd.http}"
        assert topic in http("GET", lookupd + "/topics").json()["topics"]
        assert http("GET", lookupd + f"/channels?topic={topic}").json()["channels"] == ["fresh"]
        inactive = api(cluster, "GET", "/api/topics?inactive=true").json()
        assert inactive["topics"][topic] == ["fresh"]
    else:
        assert all(cluster.channel_stats(i, topic, "fresh") is not None for i in (0, 1))
        assert api(cluster, "GET", "/api/topics?inactive=true").json() == {"topics": {}, "message": ""}


def test_config_endpoint(cluster):
    reply = api(cluster, "GET", "/config/acl_http_header")
    assert (reply.status, reply.json()) == (200, "X-Forwarded-User")
    assert api(cluster, "GET", "/config/admin_users").json() == ["alice"]
    assert api(cluster, "GET", "/config/nope").json() == {"message": "INVALID_OPTION"}
    assert api(cluster, "PUT", "/config/log_level", "debug").json() == 1
    assert api(cluster, "GET", "/config/log_level").json() == 1
    assert api(cluster, "PUT", "/config/log_level", "info").json() == 2
    assert api(cluster, "PUT", "/config/log_level", "loud").json() == {"message": "INVALID_VALUE"}


def test_history_samples_the_cluster(cluster, topic):
    spread_topic(cluster, topic)
    cluster.publish(0, topic)

    def sampled():
        body = api(cluster, "GET", f"/api/history/topics/{topic}").json()
        present = [v for v in body["rate"] if v is not None]
        return body if len(present) >= 2 else None

    body = wait_until(sampled, timeout=20, interval=0.5, message="two rates sampled")
    assert body["interval"] == 1
    assert len(body["timestamps"]) == len(body["depth"]) == len(body["rate"])
    assert set(body["node_rates"]) == {cluster.node_name(0), cluster.node_name(1)}
    overview = api(cluster, "GET", "/api/history").json()
    assert overview["topics"][topic]["message_count"] == 3


def test_base_path_mounts_everything(cluster):
    admin = Daemon(
        "admin", ["--http-address=127.0.0.1:0", "--base-path=nsq/", f"--nsqd-http-address={cluster.nsqds[0].http}"]
    ).start()
    try:
        base = f"http://{admin.http}"
        assert http("GET", base + "/nsq/ping").body == b"OK"
        page = http("GET", base + "/nsq/topics").body.decode()
        assert 'src="/nsq/static/app.js"' in page and '"BASE_PATH":"/nsq"' in page
        assert http("GET", base + "/nsq/static/pages.js").status == 200
        assert http("GET", base + "/nsq/api/nodes").json()["nodes"][0]["http_port"] == int(
            cluster.nsqds[0].http.rpartition(":")[2]
        )
        assert http("GET", base + "/ping").status == 404
        # without lookupd the topics are read from the nodes' /stats
        names = {t["topic_name"] for t in cluster.stats(0).get("topics") or ()}
        assert set(http("GET", base + "/nsq/api/topics").json()["topics"]) == names
    finally:
        admin.stop()


def test_version_and_startup_errors():
    version = subprocess.run(
        [sys.executable, "-m", "admin", "--version"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0 and version.stdout.startswith("nsqadmin v1.3.0 (built w/python")
    missing = subprocess.run([sys.executable, "-m", "admin"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert missing.returncode == 1
    assert (
        "FATAL: failed to instantiate nsqadmin - --nsqd-http-address or --lookupd-http-address required"
        in missing.stderr
    )
