"""Log channels against a real nsqd (nsqd/LOG-PROTOCOL.md): LOG, LSEEK, LREAD, LCOMMIT; every error code; a
channel with a backlog and a consumer made a log; SUB refused; offsets after SIGTERM and, in durable mode,
after kill -9; retention by bytes and by time with replay; a torn log file at start-up; /stats and /metrics;
AUTH (subscribe permission) and TLS as for SUB."""

from __future__ import annotations

import os
import re
import time
import uuid

import pytest

from protocol.log import (
    decode_offsets,
    decode_range,
    encode_lcommit,
    encode_log,
    encode_lread,
    encode_lseek,
)
from tests.integration.features import FeatureClient
from tests.integration.harness import REPO_ROOT, NsqdProcess, RawClient, command, identify, mpub, rdy, sub
from tests.integration.http_helpers import get, stats, wait_for
from tests.integration.persistence_helpers import http
from tests.integration.test_auth import AuthServer

pytestmark = pytest.mark.timeout(90)


def fresh() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def offsets(client, topic: str, channel: str = "c") -> dict:
    client.send(encode_log(topic, channel))
    return decode_offsets(client.read_response())


def read(client, topic: str, first: int, to: int, max_bytes: int = 0, channel: str = "c"):
    client.send(encode_lread(topic, channel, first, to, max_bytes))
    return decode_range(client.read_response())


def read_all(client, topic: str, first: int, to: int, channel: str = "c") -> list[bytes]:
    got = []
    while first < to:
        part = read(client, topic, first, to, 4096, channel)
        got += [m[4] for m in part.messages()]
        first = part.next
    return got


def publish_to_log(client, topic: str, *batches: list[bytes]) -> None:
    """Make ``topic``'s channel ``c`` a log, publish the batches and wait until the log holds them all."""
    end = offsets(client, topic)["end"] + sum(map(len, batches))
    for batch in batches:
        client.send(mpub(topic, batch))
        client.expect_ok()
    wait_for(lambda: offsets(client, topic)["end"] == end, message="all appended")


def commit(client, topic: str, offset: int, channel: str = "c") -> dict:
    client.send(encode_lcommit(topic, channel, offset))
    return decode_offsets(client.read_response())


def bodies(prefix: str, count: int, start: int = 0) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(start, start + count)]


def test_read_commit_and_the_byte_cap(module_nsqd):
    topic = fresh()
    with RawClient(module_nsqd.tcp) as client:
        assert offsets(client, topic) == {"start": 0, "committed": 0, "end": 0}
        client.send(mpub(topic, bodies("m", 300)))
        client.expect_ok()
        assert offsets(client, topic)["end"] == 300
        before = time.time_ns()
        whole = read(client, topic, 0, 300, 1 << 20)
        assert [m[4] for m in whole.messages()] == bodies("m", 300)
        assert (whole.first, whole.count, whole.end) == (0, 300, 300)
        message = next(whole.messages())
        assert len(message[1]) == 16 and message[3] == 0 and message[2] <= before
        capped = read(client, topic, 10, 300, 24 + 5 * 33)  # "m10".."m14": 30 + 3 bytes each
        assert (capped.first, capped.count) == (10, 5)
        assert read(client, topic, 299, 300, 1).count == 1  # one message even past the cap
        assert read(client, topic, 300, 300).count == 0
        assert commit(client, topic, 120) == {"start": 120, "committed": 120, "end": 300}
        assert commit(client, topic, 50) == {"start": 120, "committed": 120, "end": 300}  # idempotent
        assert read_all(client, topic, 120, 300) == bodies("m", 180, 120)
        client.send(encode_lseek(topic, "c", before))
        assert decode_offsets(client.read_response())["offset"] == 300  # all published before
        client.send(encode_lseek(topic, "c", 0))
        assert decode_offsets(client.read_response())["offset"] == 120  # never below start
        address = http(module_nsqd)
        channel = stats(address, f"topic={topic}")["topics"][0]["channels"][0]
        assert channel["log"] == {"start": 120, "committed": 120, "end": 300}
        assert channel["depth"] == 180
        text = get(address, "/stats").body.decode()
        assert "[log start: 120 committed: 120 end: 300]" in text
        metrics = get(address, "/metrics").body.decode()
        assert f'nsqd_channel_log_end_offset{{channel="c",topic="{topic}"}} 300.0' in metrics
        assert f'nsqd_channel_log_committed_offset{{channel="c",topic="{topic}"}} 120.0' in metrics


@pytest.mark.parametrize(
    "request_line,error",
    [
        (b"LREAD {t} c 5 4\n", b"E_LOG_BAD_RANGE LREAD from 5 > to 4"),
        (b"LREAD {t} c 0 11\n", b"E_LOG_PAST_END LREAD offset 11 past the end 10 of {t}:c"),
        (b"LCOMMIT {t} c 11\n", b"E_LOG_PAST_END LCOMMIT offset 11 past the end 10 of {t}:c"),
        (b"LREAD {t} c 2 5\n", b"E_LOG_BEFORE_START LREAD offset 2 before the oldest retained offset 3 of {t}:c"),
        (b"LREAD {t} nolog 0 0\n", b"E_LOG_UNKNOWN LREAD unknown topic or channel {t}:nolog"),
        (b"LSEEK nosuch_topic c 0\n", b"E_LOG_UNKNOWN LSEEK unknown topic or channel nosuch_topic:c"),
        (b"LCOMMIT {t} plain 0\n", b"E_LOG_NOT_LOG LCOMMIT channel {t}:plain is not a log (LOG makes it one)"),
        (b"LREAD {t} c 0\n", b"E_INVALID LREAD insufficient number of parameters"),
        (b"LREAD {t} c x 1\n", b"E_INVALID LREAD could not parse from x"),
        (b"LOG {t} c extra\n", b"E_INVALID LOG too many parameters"),
        (b"LOG bad/topic c\n", b'E_BAD_TOPIC LOG topic name "bad/topic" is not valid'),
        (b"LOG {t} bad/channel\n", b'E_BAD_CHANNEL LOG channel name "bad/channel" is not valid'),
        (b"LOG {t} c#ephemeral\n", b"E_INVALID LOG ephemeral topic or channel {t}:c#ephemeral cannot be a log"),
        (b"SUB {t} c\n", b"E_INVALID SUB channel {t}:c is a log, read it with LREAD"),
    ],
    ids=[
        "from>to",
        "past-end",
        "commit-past-end",
        "before-start",
        "unknown-channel",
        "unknown-topic",
        "not-a-log",
        "too-few",
        "not-a-number",
        "too-many",
        "bad-topic",
        "bad-channel",
        "ephemeral",
        "sub-refused",
    ],
)
def test_errors(module_nsqd, request_line, error):
    topic = fresh()
    with RawClient(module_nsqd.tcp) as setup:
        setup.send(mpub(topic, bodies("e", 10)))
        setup.expect_ok()
        assert offsets(setup, topic)["end"] == 10
        commit(setup, topic, 3)
        setup.send(identify({}))
        setup.read_response()
    with RawClient(module_nsqd.tcp) as plain:  # an ordinary channel beside the log
        plain.send(identify({}))
        plain.read_response()
        plain.send(sub(topic, "plain"))
        plain.expect_ok()
    with RawClient(module_nsqd.tcp) as client:
        if request_line.startswith(b"SUB"):
            client.send(identify({}))
            client.read_response()
        client.send(request_line.replace(b"{t}", topic.encode()))
        client.expect_error(error.replace(b"{t}", topic.encode()))
        client.assert_closed()


def test_log_commands_after_sub_are_refused(module_nsqd):
    topic = fresh()
    with RawClient(module_nsqd.tcp) as client:
        client.subscribe(topic, "plain")
        client.send(encode_log(topic, "c"))
        client.expect_error(b"E_INVALID cannot LOG in current state")


def test_a_channel_with_a_backlog_and_a_consumer_becomes_a_log(nsqd_factory):
    daemon = nsqd_factory("--mem-queue-size=5", "--msg-timeout=60s")
    topic = fresh()
    with RawClient(daemon.tcp) as producer, RawClient(daemon.tcp) as consumer:
        producer.send(mpub(topic, bodies("b", 40)))  # most go to the channel's disk queue
        producer.expect_ok()
        consumer.send(identify({}))
        consumer.read_response()
        consumer.send(sub(topic, "c"))
        consumer.expect_ok()
        consumer.send(rdy(2))
        held = [consumer.read_message(), consumer.read_message()]
        assert [m.body for m in held] == [b"b0", b"b1"]
        assert offsets(producer, topic) == {"start": 0, "committed": 0, "end": 38}
        assert read_all(producer, topic, 0, 38) == bodies("b", 38, 2)  # waiting ones first, in order
        producer.send(mpub(topic, [b"new"]))
        producer.expect_ok()
        consumer.send(b"FIN " + held[0].id + b"\n")  # finished: never in the log
        consumer.send(b"REQ " + held[1].id + b" 0\n")  # put back: appended, with its attempts
        wait_for(lambda: offsets(producer, topic)["end"] == 40, message="the requeued message appended")
        tail = list(read(producer, topic, 38, 40).messages())
        assert [(m[3], m[4]) for m in tail] == [(0, b"new"), (1, b"b1")]
        consumer.send(b"NOP\n")
        assert consumer.poll_frame(0.3) is None  # delivers nothing more
    with RawClient(daemon.tcp) as again:
        again.send(identify({}))
        again.read_response()
        again.send(sub(topic, "c"))
        again.expect_error(f"E_INVALID SUB channel {topic}:c is a log, read it with LREAD".encode())


def test_offsets_survive_sigterm_with_old_consumers_messages(data_dir):
    d = data_dir("--mem-queue-size=10")
    daemon = d.start()
    topic = fresh()
    with RawClient(daemon.tcp) as client, RawClient(daemon.tcp) as consumer:
        client.send(mpub(topic, bodies("s", 30)))
        client.expect_ok()
        consumer.subscribe(topic, "c", ready=1)
        held = consumer.read_message()
        assert offsets(client, topic)["end"] == 29
        client.send(mpub(topic, bodies("s", 5, 30)))
        client.expect_ok()
        commit(client, topic, 10)
    d.stop()  # the consumer's message in flight goes into the log
    daemon = d.start()
    with RawClient(daemon.tcp) as client:
        assert offsets(client, topic) == {"start": 10, "committed": 10, "end": 35}
        got = read_all(client, topic, 10, 35)
        assert got == bodies("s", 19, 11) + bodies("s", 5, 30) + [held.body]
        client.send(mpub(topic, [b"after"]))
        client.expect_ok()
        assert [m[4] for m in read(client, topic, 35, 36).messages()] == [b"after"]


def test_offsets_survive_kill_9_in_durable_mode(data_dir):
    d = data_dir("--mem-queue-size=0", "--sync-every=1")
    daemon = d.start()
    topic = fresh()
    with RawClient(daemon.tcp) as client:
        publish_to_log(client, topic, *(bodies("k", 20, 20 * k) for k in range(5)))
        commit(client, topic, 42)
    d.kill()
    daemon = d.start()
    with RawClient(daemon.tcp) as client:
        assert offsets(client, topic) == {"start": 42, "committed": 42, "end": 100}
        assert read_all(client, topic, 42, 100) == bodies("k", 58, 42)


def test_a_log_channel_missing_from_nsqd_dat_is_found_by_its_files(data_dir):
    # a kill right after LOG may come before the coalesced write of nsqd.dat: the log's files are enough
    d = data_dir()
    daemon = d.start()
    topic = fresh()
    with RawClient(daemon.tcp) as client:
        publish_to_log(client, topic, bodies("u", 8))
        commit(client, topic, 3)
    d.stop()
    listing = d.path / "nsqd.dat"
    listing.write_text(listing.read_text().replace(f'"name":"{topic}"', '"name":"other"'))
    daemon = d.start()
    channel = stats(http(daemon), f"topic={topic}")["topics"][0]["channels"][0]
    assert channel["channel_name"] == "c" and channel["log"] == {"start": 3, "committed": 3, "end": 8}
    assert re.search(rf"log channel {topic}:c is not in nsqd.dat, found by its files", daemon.log_text())


def _segments(path, topic: str) -> list[str]:
    return sorted(n for n in os.listdir(path) if n.startswith(f"{topic}:c.log.") and n.endswith(".dat"))


def test_retention_by_bytes_and_replay_from_the_oldest(data_dir):
    d = data_dir("--max-bytes-per-file=2000", "--log-retention-bytes=4000", "--mem-queue-size=0", "--sync-every=1")
    daemon = d.start()
    topic = fresh()
    with RawClient(daemon.tcp) as client:
        # one chunk of 20 x 70 bytes + 20 per publish (1,420): one segment each
        publish_to_log(client, topic, *([b"%-40d" % i for i in range(20 * k, 20 * k + 20)] for k in range(10)))
        # wholly committed: the 7 segments below 140; 4,000 bytes keep the 2 newest of them
        assert commit(client, topic, 150) == {"start": 100, "committed": 150, "end": 200}
        assert _segments(d.path, topic)[0] == f"{topic}:c.log.{100:020d}.dat"
        got = read_all(client, topic, 100, 200)
        assert got == [b"%-40d" % i for i in range(100, 200)]  # a new reader replays from the oldest kept
    d.stop()
    daemon = d.start()
    with RawClient(daemon.tcp) as client:
        assert offsets(client, topic) == {"start": 100, "committed": 150, "end": 200}


def test_retention_by_time(data_dir):
    d = data_dir("--max-bytes-per-file=500", "--log-retention-time=1s", "--sync-timeout=0.1s")
    daemon = d.start()
    topic = fresh()
    with RawClient(daemon.tcp) as client:
        publish_to_log(client, topic, bodies("r", 100))
        first = commit(client, topic, 100)
        assert first["start"] == 0  # kept for now: replayable
        assert read_all(client, topic, 0, 100) == bodies("r", 100)
        wait_for(lambda: offsets(client, topic)["start"] == 100, timeout=15, message="removed after 1 s")
        assert _segments(d.path, topic) == []


def test_a_torn_log_file_at_start_up(data_dir):
    d = data_dir("--mem-queue-size=0", "--sync-every=1")
    daemon = d.start()
    topic = fresh()
    with RawClient(daemon.tcp) as client:
        publish_to_log(client, topic, bodies("x", 10), bodies("x", 10, 10))
    d.stop()
    (segment,) = _segments(d.path, topic)
    path = d.path / segment
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size - 5)
    daemon = d.start()
    match = daemon.wait_for_log(r"LOG\(.*\): (\S+): bad chunk at byte (\d+) \((.*)\), the log ends at offset (\d+)", 10)
    assert match.group(1) == str(path) and match.group(4) == "10"
    assert 0 < int(match.group(2)) < size
    with RawClient(daemon.tcp) as client:
        assert offsets(client, topic)["end"] == 10
        assert read_all(client, topic, 0, 10) == bodies("x", 10)
        client.send(encode_lread(topic, "c", 0, 11))
        client.expect_error(f"E_LOG_PAST_END LREAD offset 11 past the end 10 of {topic}:c".encode())


@pytest.fixture(scope="module")
def auth_nsqd(tmp_path_factory):
    with AuthServer() as server:
        daemon = NsqdProcess(tmp_path_factory.mktemp("nsqd-log-auth"), [f"--auth-http-address={server.address}"])
        daemon.start()
        yield daemon
        daemon.stop()


def test_log_commands_need_subscribe_permission(auth_nsqd):
    with RawClient(auth_nsqd.tcp) as client:
        client.send(encode_log("orders", "billing"))
        client.expect_error(b"E_AUTH_FIRST AUTH required before LOG")
    with RawClient(auth_nsqd.tcp) as client:
        client.send(command("AUTH", body=b"publish-orders"))
        client.read_response()
        client.send(mpub("orders", [b"o1", b"o2"]))
        client.expect_ok()
        assert offsets(client, "orders", "billing")["end"] == 2
        assert [m[4] for m in read(client, "orders", 0, 2, channel="billing").messages()] == [b"o1", b"o2"]
        client.send(encode_lread("orders", "audit", 0, 0))
        client.expect_error(b'E_UNAUTHORIZED AUTH failed for LREAD on "orders" "audit"')


def test_log_over_tls_and_snappy(certs, nsqd_factory):
    daemon = nsqd_factory(*certs.daemon_args())
    topic = fresh()
    with FeatureClient(daemon.tcp) as client:
        response = client.identify({"feature_negotiation": True, "tls_v1": True, "snappy": True})
        assert response["tls_v1"] is True
        client.start_tls(certs.client_context())
        client.start_snappy()
        client.send(mpub(topic, [b"z" * 5000] * 50))
        client.expect_ok()
        assert offsets(client, topic)["end"] == 50
        assert read_all(client, topic, 0, 50) == [b"z" * 5000] * 50
    required = nsqd_factory(*certs.daemon_args("--tls-required=true"))
    with RawClient(required.tcp) as client:
        client.send(encode_log(topic, "c"))
        client.expect_error(b"E_INVALID cannot LOG in current state (TLS required)")


def test_channel_page_data_in_admin_form(module_nsqd):
    """nsqadmin's per-node channel objects carry the offsets (admin/stats.py)."""
    from admin.stats import node_topics

    topic = fresh()
    with RawClient(module_nsqd.tcp) as client:
        client.send(mpub(topic, [b"a", b"b"]))
        client.expect_ok()
        offsets(client, topic)
        commit(client, topic, 1)
    raw = stats(http(module_nsqd), f"topic={topic}")
    (entry,) = node_topics(raw, "n:1", "host", 0)
    (channel,) = entry["channels"]
    assert channel["log"] == {"start": 1, "committed": 1, "end": 2}
    assert channel["depth"] == 1
    assert re.search(r"Log offsets", (REPO_ROOT / "admin" / "static" / "pages.js").read_text())
