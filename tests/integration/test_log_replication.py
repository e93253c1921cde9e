"""Log channels replicated (nsqd/LOG-PROTOCOL.md "Replication"): real daemons, SIGKILL.

One origin A replicating to one replica B. A log channel that existed before B connected (it comes with the
backfill), one made a log after the stream started, one converted from an ordinary channel with a backlog; a
reader commits part of each. A is killed with SIGKILL; B takes it over by its timeout and serves, on each channel
as a log channel of its own, exactly what A had not committed (the commits were streamed: nothing committed is
adopted), after the messages B's own log of that channel already held. A, back on its data, drops from its logs
what B adopted. LOG answers where the messages went: B's log notes the offsets at which it appended A's
(``adopted``, settled once A is back), A's the span it handed over (``handed_over``), both across restarts."""

from __future__ import annotations

import pytest

from tests.integration.harness import RawClient, free_port, mpub
from tests.integration.http_helpers import post, stats, wait_for
from tests.integration.test_log_channels import bodies, commit, offsets, read_all
from tests.integration.test_replication import held, start, wait_state

pytestmark = pytest.mark.timeout(90)


def publish(client: RawClient, topic: str, batch: list[bytes]) -> None:
    client.send(mpub(topic, batch))
    client.expect_ok()


def log_of(daemon, topic: str, channel: str) -> dict | None:
    """The channel's ``log`` offsets in /stats (None: not a log channel, or no such channel)."""
    for entry in stats(daemon.http(), f"topic={topic}").get("topics", []):
        for found in entry["channels"]:
            if found["channel_name"] == channel:
                return found.get("log")
    return None


def test_a_replica_serves_the_uncommitted_messages_of_log_channels_after_the_origin_is_killed(daemons, tmp_path):
    replica_port = free_port()
    replica_address = f"127.0.0.1:{replica_port}"
    # A starts alone (its peer refuses the connection: it delivers and, in accept mode, takes publishes)
    origin = start(daemons, tmp_path / "a", f"--replicate-to={replica_address}", "--replication-degraded=accept")
    node = f"127.0.0.1:{origin.tcp[1]}"
    with RawClient(origin.tcp) as client:
        # "early": a log channel before B is there: B learns of it from the backfill
        assert offsets(client, "early", "spark")["end"] == 0
        publish(client, "early", bodies("e", 10))
        wait_for(lambda: offsets(client, "early", "spark")["end"] == 10, message="appended")
        commit(client, "early", 4, "spark")

    replica = start(daemons, tmp_path / "b", "--replica-takeover-timeout=1s", port=replica_port)
    wait_state(origin, "replicating")
    with RawClient(replica.tcp) as client:  # B's own log of "late"/"spark", with messages of its own
        offsets(client, "late", "spark")
        publish(client, "late", bodies("own", 3))
        wait_for(lambda: offsets(client, "late", "spark")["end"] == 3, message="own messages appended")
    assert held(replica, node) == 6  # the backfill sent the 6 uncommitted messages of "early", not the 4 committed

    with RawClient(origin.tcp) as client:
        # "late": made a log after the stream started
        offsets(client, "late", "spark")
        publish(client, "late", bodies("l", 20))
        # "conv": an ordinary channel with a backlog, converted
        post(origin.http(), "/topic/create?topic=conv")
        post(origin.http(), "/channel/create?topic=conv&channel=spark")
        publish(client, "conv", bodies("c", 12))
        wait_for(
            lambda: stats(origin.http(), "topic=conv")["topics"][0]["channels"][0]["depth"] == 12,
            message="the backlog reached the channel",
        )
        assert offsets(client, "conv", "spark") == {"start": 0, "committed": 0, "end": 12}
        wait_for(lambda: offsets(client, "late", "spark")["end"] == 20, message="appended")
        assert read_all(client, "late", 0, 20, "spark") == bodies("l", 20)
        commit(client, "late", 10, "spark")
        commit(client, "conv", 4, "spark")
        publish(client, "early", bodies("e", 2, 10))
        wait_for(lambda: offsets(client, "early", "spark")["end"] == 12, message="appended")
        commit(client, "early", 6, "spark")
    # the commits reach B as FINs, asynchronously: what B holds goes down to what A has not committed
    uncommitted = (12 - 6) + (20 - 10) + (12 - 4)
    wait_for(lambda: held(replica, node) == uncommitted, message="commits streamed to the replica")

    origin.kill()  # SIGKILL
    replica.wait_for_log(r"REPLICATION: took over origin", timeout=30)
    doc = stats(replica.http())["replication"]
    assert doc["takeovers"] == 1 and doc["adopted_messages"] == uncommitted
    with RawClient(replica.tcp) as client:
        # each channel is a log on B without any LOG: A's uncommitted messages at B's next offsets
        assert log_of(replica, "early", "spark") == {"start": 0, "committed": 0, "end": 6}
        assert sorted(read_all(client, "early", 0, 6, "spark")) == sorted(bodies("e", 6, 6))
        assert log_of(replica, "late", "spark") == {"start": 0, "committed": 0, "end": 13}
        late = read_all(client, "late", 0, 13, "spark")
        assert late[:3] == bodies("own", 3) and sorted(late[3:]) == sorted(bodies("l", 10, 10))
        assert log_of(replica, "conv", "spark") == {"start": 0, "committed": 0, "end": 8}
        assert sorted(read_all(client, "conv", 0, 8, "spark")) == sorted(bodies("c", 8, 4))
        assert commit(client, "conv", 8, "spark")["committed"] == 8  # and B's reader goes on from there
        # LOG tells a reader where A's messages went: B's offsets [from, to) of each channel, not yet settled
        early = offsets(client, "early", "spark")["adopted"]
        assert [(e["node"], e["from"], e["to"], e["settled"]) for e in early] == [(node, 0, 6, False)]
        assert early[0]["epoch"] == 1
        assert [(e["from"], e["to"]) for e in offsets(client, "late", "spark")["adopted"]] == [(3, 13)]
    # the notes are in the log's meta file: a restart of B keeps them
    replica.stop()
    replica = start(daemons, tmp_path / "b", "--replica-takeover-timeout=1s", port=replica_port)
    with RawClient(replica.tcp) as client:
        assert [(e["node"], e["from"], e["to"], e["settled"]) for e in offsets(client, "conv", "spark")["adopted"]] == [
            (node, 0, 8, False)
        ]

    # A comes back on its data: B's WELCOME lists what it adopted, and A drops those from its logs (committed up
    # to their end), so that no reader gets them from both nodes
    origin = start(
        daemons,
        tmp_path / "a",
        f"--replicate-to={replica_address}",
        "--replication-degraded=accept",
        port=int(node.rpartition(":")[2]),
    )
    origin.wait_for_log(r"peer .+ adopted this node's messages while it was away", timeout=40)
    wait_state(origin, "replicating")
    with RawClient(origin.tcp) as client:  # (without durable mode the kill may have taken the last appends)
        for topic, committed in (("early", 6), ("late", 10), ("conv", 4)):
            left = offsets(client, topic, "spark")
            assert left["committed"] == left["end"] > 0, (topic, left)
            # and LOG says that the span [committed then, end then) went to B: a reader there goes on at its end
            assert [(e["by"], e["epoch"], e["from"], e["through"]) for e in left["handed_over"]] == [
                (replica_address, 1, committed, left["end"])
            ], (topic, left)
    with RawClient(replica.tcp) as client:  # B's notes: A is back and heard of it
        assert [e["settled"] for e in offsets(client, "early", "spark")["adopted"]] == [True]
    replica.stop()
    replica = start(daemons, tmp_path / "b", port=replica_port)
    with RawClient(replica.tcp) as client:
        assert [e["settled"] for e in offsets(client, "late", "spark")["adopted"]] == [True]
