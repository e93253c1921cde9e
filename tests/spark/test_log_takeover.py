"""The log path across a takeover (``spark_connector.log_source``, "After a takeover"), on the
standalone cluster the other tests share.

An origin nsqd (durable mode) replicates to a replica with a short ``--replica-takeover-timeout``;
a query on the log path reads both, with the default ``failOnDataLoss=true`` and ``readRetryMs``.
The origin dies with SIGKILL mid-stream: the replica takes it over and appends the origin's
uncommitted messages to its own log; the query carries on by itself (the ranges it had planned on
the origin are given up to the replica, which LOG names as their adopter). The origin comes back
on its data, having handed those offsets over: the query moves past them and reads what the origin
gets next. Every published message is in the output at least once; the duplicates (read from the
origin in a committed batch whose commit had not reached the replica) are at most the batches under
way at the kill. First, without Spark, the planner and a task's reader against the same daemons:
what they skip, move past and count (the query's planner logs in the driver's source runner, out
of a test's reach).
"""

from __future__ import annotations

from collections import Counter

import pytest

from spark_connector.log_source import LogPartition, LogPlanner, make_log_offset, probe, read_partition
from spark_connector.options import SourceOptions
from tests.integration.harness import RawClient, free_port
from tests.integration.http_helpers import stats
from tests.spark.conftest import bodies, publish, read_output, wait_until

pytestmark = pytest.mark.timeout(240)

DURABLE = ("--mem-queue-size=0", "--sync-every=1")
PER_TRIGGER = 100


def replicating(origin) -> bool:
    return stats(origin.http())["replication"]["state"] == "replicating"


def pair(nsqd_at, tmp_path_factory, topic):
    """An origin (durable mode) replicating to a replica with a 1 s takeover timeout, the channel
    ``spark`` a log on both; returns (origin, replica, start the origin again)."""
    po, pr = free_port(), free_port()
    do, dr = tmp_path_factory.mktemp("origin"), tmp_path_factory.mktemp("replica")
    origin_args = (*DURABLE, "--broadcast-address=127.0.0.1", f"--replicate-to=127.0.0.1:{pr}")
    replica = nsqd_at(pr, dr, "--broadcast-address=127.0.0.1", "--replica-takeover-timeout=1s")
    origin = nsqd_at(po, do, *origin_args)
    wait_until(lambda: replicating(origin), 20, "the origin replicating")
    for daemon in (origin, replica):  # the channel is a log before anything is published: replicas know it
        with RawClient(daemon.tcp) as client:
            client.send(b"LOG %s spark\n" % topic.encode())
            client.read_response()
    return origin, replica, lambda: nsqd_at(po, do, *origin_args)


def test_the_planner_and_a_task_skip_what_a_replica_adopted_and_count_it(nsqd_at, tmp_path_factory, topic):
    origin, replica, restart = pair(nsqd_at, tmp_path_factory, topic)
    publish(origin, topic, bodies("o", 0, 50))
    addresses = [origin.tcp_address, replica.tcp_address]
    options = SourceOptions.parse({"nsqd.tcp.addresses": ",".join(addresses), "topic": topic, "channel": "spark"})
    wait_until(lambda: probe(options, addresses)[0][origin.tcp_address]["end"] == 50, 10, "appended")
    planner = LogPlanner(options, probe(options, addresses)[0])
    try:
        start = planner.initial_offset()
        end = planner.latest_offset(start, None)
        planner.commit(planner.latest_offset(start, None) | {"nsqd": {origin.tcp_address: 20, replica.tcp_address: 0}})
        (part,) = [p for p in planner.partitions(start, end) if p.nsqd == origin.tcp_address]
        assert (part.lo, part.hi, part.others) == (0, 50, (replica.tcp_address,))
        origin.kill()
        replica.wait_for_log(r"REPLICATION: took over origin", timeout=30)
        # the task of a range planned on the origin gives it up to the replica (default failOnDataLoss)
        assert list(read_partition(options, LogPartition(origin.tcp_address, 20, 50, part.others))) == []
        # the planner plans nothing more there and counts what may come twice: planned, not acknowledged
        following = planner.latest_offset(end, None)
        assert planner.adopted == {origin.tcp_address: replica.tcp_address}
        assert planner.takeover_duplicates == 30
        assert {p.nsqd for p in planner.partitions(end, following)} == {replica.tcp_address}
        # without the note (another query's view: no replica among its nsqd) the range is not given up
        with pytest.raises(Exception, match="did not answer"):
            list(
                read_partition(
                    SourceOptions.parse(
                        {
                            "nsqd.tcp.addresses": origin.tcp_address,
                            "topic": topic,
                            "channel": "spark",
                            "readRetryMs": 500,
                        }
                    ),
                    LogPartition(origin.tcp_address, 20, 50),
                )
            )
        origin = restart()
        wait_until(lambda: replicating(origin), 40, "the origin back")
        # the returned origin handed [20, 50) over: the planner moves past it, counted, and fails on nothing
        back = planner.latest_offset(following, None)
        assert planner.adopted == {} and planner.takeover_skipped == 0
        assert parse(back)[origin.tcp_address] == 50 and planner.takeover_duplicates == 30
        behind = make_log_offset({origin.tcp_address: 20, replica.tcp_address: parse(back)[replica.tcp_address]})
        assert parse(planner.latest_offset(behind, None))[origin.tcp_address] == 50
        assert planner.takeover_skipped == 30
        assert [p for p in planner.partitions(behind, back) if p.nsqd == origin.tcp_address] == []
        # a task that had planned [20, 50) on it moves past the span too
        assert list(read_partition(options, LogPartition(origin.tcp_address, 20, 50))) == []
    finally:
        planner.stop()


def parse(offset: dict) -> dict:
    return offset["nsqd"]


def test_the_query_carries_on_across_a_takeover_and_the_origins_return(
    cluster_spark, nsqd_at, tmp_path, tmp_path_factory, topic
):
    origin, replica, restart = pair(nsqd_at, tmp_path_factory, topic)
    first = bodies("o", 0, 600)
    publish(origin, topic, first)
    publish(replica, topic, bodies("r", 0, 200))
    reader = cluster_spark.readStream.format("nsq")
    for key, value in {
        "nsqd.tcp.addresses": f"{origin.tcp_address},{replica.tcp_address}",
        "topic": topic,
        "channel": "spark",
        "maxOffsetsPerTrigger": PER_TRIGGER,
    }.items():
        reader = reader.option(key, str(value))
    out = tmp_path / "out"
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )

    def output(want: set[bytes]):
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        rows = read_output(None, out)
        return rows if want <= {bytes(r.body) for r in rows} else None

    try:
        wait_until(
            lambda: sum(r.nsqd == origin.tcp_address for r in read_output(None, out)) >= PER_TRIGGER // 2,
            120,
            "batches read from the origin",
            interval=0.05,
        )
        origin.kill()  # SIGKILL, mid-stream
        replica.wait_for_log(r"REPLICATION: took over origin", timeout=30)
        publish(replica, topic, bodies("r", 200, 300))
        wait_until(
            lambda: output(set(first) | set(bodies("r", 0, 300))),
            90,
            "the origin's messages from the replica",
            interval=0.5,
        )

        origin = restart()  # back on its data: it drops what the replica adopted
        wait_until(lambda: replicating(origin), 40, "the origin replicating again")
        late = bodies("o", 600, 700)
        publish(origin, topic, late)
        rows = wait_until(
            lambda: output(set(first) | set(bodies("r", 0, 300)) | set(late)),
            90,
            "the returned origin's new messages",
            interval=0.5,
        )
    finally:
        query.stop()
    by_id = Counter(r.id for r in rows)
    twice = {i: n for i, n in by_id.items() if n > 1}
    assert all(n == 2 for n in twice.values()), twice
    # a duplicate was read from the origin and again, adopted, from the replica; at most what the query had
    # planned on the origin and not yet committed there when it died
    assert {frozenset(r.nsqd for r in rows if r.id == i) for i in twice} <= {
        frozenset({origin.tcp_address, replica.tcp_address})
    }
    assert len(twice) <= 2 * PER_TRIGGER, len(twice)
    print(f"takeover: {len(rows)} rows, {len(by_id)} messages, {len(twice)} duplicates")
