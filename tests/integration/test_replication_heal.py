"""Damaged queue files heal from the replica: real daemons, real files damaged between a stop and a start.

An origin keeps copies on a replica (``--mem-queue-size=0``: everything on disk). 2,000 messages are published and
acknowledged (so on both nodes) to a topic with two channels; channel ``half`` finishes the first 1,000. The origin
stops (SIGTERM: a clean stop), one segment of each channel's queue is damaged (cut to 40%, a size field
overwritten, a body byte flipped, deleted, set aside as ``.bad``), and the origin starts again. Its backfill finds
the damage and names those queues in its SYNCED; the replica sends back the copies they lost (RESTORE) instead of
dropping them. Every one of the 2,000 is delivered on ``all``, and on ``half`` exactly the 1,000 it had not
finished: none it finished comes back, no damaged body is ever delivered. Duplicates are allowed, and counted.

A replica whose own store is found damaged when it starts asks its origin for a new backfill and does not count
toward ``--replication-acks`` until it acknowledged it; a takeover afterwards delivers every acknowledged message.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.integration.harness import FRAME_TYPE_MESSAGE, RawClient, fin, free_port, rdy, sub
from tests.integration.http_helpers import post, stats, wait_for
from tests.integration.persistence_helpers import channel_stats, decode
from tests.integration.test_replication import create, fins_acked, start, wait_state
from tests.integration.test_storage_faults import (
    SEGMENT,
    body,
    cut_to_40,
    damage_size_field,
    delete,
    flip_body_byte,
    intact,
    record_offsets,
)

COUNT = 2000
FINISHED = 1000  # channel ``half`` finishes the first ones before the stop
FLAGS = ("--mem-queue-size=0", f"--max-bytes-per-file={SEGMENT}")


def set_aside(path: Path) -> int:
    """The segment and its side file renamed ``.bad``, as a queue that gave up on the file leaves them."""
    lost = len(record_offsets(path))
    os.rename(path, f"{path}.bad")
    os.rename(f"{path}.crc", f"{path}.bad.crc")
    return lost


DAMAGE = {
    "cut to 40%": cut_to_40,
    "size field": damage_size_field,
    "body byte": flip_body_byte,
    "segment deleted": delete,
    ".bad file": set_aside,
}


def segment(data: Path, channel: str, num: int) -> Path:
    return data / f"t:{channel}.diskqueue.{num:06d}.dat"


def take(daemon, channel: str, want: set[int], *, timeout: float = 60) -> list[int]:
    """Consume ``channel`` (FIN each) until every number of ``want`` came and the channel is empty; returns every
    number delivered, duplicates included. A damaged body is never delivered."""
    got: list[int] = []
    with RawClient(daemon.tcp) as client:
        client.send(sub("t", channel))
        client.expect_ok()
        client.send(rdy(500))
        deadline = time.monotonic() + timeout
        while not want <= set(got):
            assert time.monotonic() < deadline, f"{len(want - set(got))} of {len(want)} never came on {channel}"
            frame = client.read_frame(deadline - time.monotonic())
            assert frame.frame_type == FRAME_TYPE_MESSAGE, frame
            message = decode(frame.data)
            assert intact(message.body), f"a damaged body was delivered: {message.body!r}"
            got.append(int(message.body[:6]))
            client.send(fin(message.id))
        wait_for(
            lambda: (lambda c: (c["depth"], c["in_flight_count"]) == (0, 0))(channel_stats(daemon, "t", channel)),
            message=f"{channel} drained",
        )
    return got


def finish_first(daemon, channel: str, count: int) -> list[int]:
    """FIN the first ``count`` messages of ``channel`` and no other: at most 100 in flight at a time, each round
    received with RDY 0 sent before the FINs (no message beyond ``count`` is ever delivered)."""
    done: list[int] = []
    with RawClient(daemon.tcp) as client:
        client.send(sub("t", channel))
        client.expect_ok()
        while len(done) < count:
            step = min(100, count - len(done))
            client.send(rdy(step))
            messages = [decode(client.read_frame(30).data) for _ in range(step)]
            client.send(rdy(0))
            for message in messages:
                client.send(fin(message.id))
            done.extend(int(m.body[:6]) for m in messages)
        wait_for(lambda: channel_stats(daemon, "t", channel)["in_flight_count"] == 0, message="FINs taken")
    return done


def fins_reached_the_replica(origin) -> None:
    """The FINs taken so far are held by the replica: a CHANNEL frame (a pause, undone) goes into the outbox after
    them (FINs waiting to be sent go first), and the replica acknowledges everything up to it."""
    before = stats(origin.http())["replication"]["peers"][0]["acked"]
    post(origin.http(), "/channel/pause?topic=t&channel=all")
    post(origin.http(), "/channel/unpause?topic=t&channel=all")
    fins_acked(origin, before)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_queue_files_heal_from_the_replica(daemons, tmp_path, damage):
    replica = start(daemons, tmp_path / "b")
    origin_args = (f"--replicate-to={replica.tcp_address}", *FLAGS)
    origin = start(daemons, tmp_path / "a", *origin_args)
    port = origin.tcp[1]
    wait_state(origin, "replicating")
    create(origin, "all", "half")
    with RawClient(origin.tcp) as producer:
        for first in range(0, COUNT, 500):
            producer.publish_many("t", [body(n) for n in range(first, first + 500)])
    finished = finish_first(origin, "half", FINISHED)
    assert sorted(finished) == list(range(FINISHED))
    fins_reached_the_replica(origin)
    assert origin.stop(timeout=30) == 0

    data = tmp_path / "a"
    # channel ``all`` still holds everything: its second segment; ``half`` read up to 1,000: its fourth one
    lost_all = DAMAGE[damage](segment(data, "all", 1))
    lost_half = DAMAGE[damage](segment(data, "half", 3))
    assert lost_all and lost_half

    origin = start(daemons, data, *origin_args, port=port)
    got_all = take(origin, "all", set(range(COUNT)))
    got_half = take(origin, "half", set(range(FINISHED, COUNT)))
    origin.wait_for_log("sent back everything it held of the damaged queues", timeout=10)
    assert not set(got_half) & set(range(FINISHED)), "a message the channel had finished came back"
    duplicates = len(got_all) - COUNT + len(got_half) - (COUNT - FINISHED)
    replication = stats(origin.http())["replication"]
    print(
        f"{damage}: lost {lost_all} + {lost_half} to damage, restored {replication['restored_messages']}, "
        f"{duplicates} duplicate(s)"
    )
    assert replication["restored_messages"] >= lost_all + lost_half
    assert channel_stats(origin, "t", "all")["damaged_count"] > 0


def test_a_replica_that_finds_its_store_damaged_gets_a_new_backfill(daemons, tmp_path):
    replica_port = free_port()
    replica = start(daemons, tmp_path / "b", port=replica_port)
    origin = start(daemons, tmp_path / "a", f"--replicate-to={replica.tcp_address}", "--replication-acks=1", *FLAGS)
    wait_state(origin, "replicating")
    node = f"127.0.0.1:{origin.tcp[1]}"
    create(origin, "all")
    with RawClient(origin.tcp) as producer:
        for first in range(0, 1000, 100):
            producer.publish_many("t", [body(n) for n in range(first, first + 100)])
    assert replica.stop(timeout=30) == 0

    # one body byte of the first stored MESSAGES frame: its 100 copies are lost to the replica
    store = tmp_path / "b" / f"replica.{node}.diskqueue.000000.dat"
    data = store.read_bytes()
    at = next(at for at in record_offsets(store) if data[at + 8] == 0x07)  # [length][frame size][type]...
    size = int.from_bytes(data[at : at + 4], "big")
    with open(store, "r+b") as f:
        f.seek(at + 4 + size - 10)
        byte = f.read(1)
        f.seek(at + 4 + size - 10)
        f.write(bytes([byte[0] ^ 0xFF]))
    mark = len(origin.log_text().splitlines())

    replica = start(daemons, tmp_path / "b", port=replica_port)
    replica.wait_for_log(r"REPLICA\(.*\): 1 record\(s\) of the store damaged", timeout=10)
    entry = wait_for(
        lambda: [r for r in stats(replica.http())["replication"]["replicas"] if r["node"] == node],
        message="the origin's store in /stats",
    )[0]
    assert entry["damaged_records"] == 1
    # the origin sends a new backfill, and counts the replica toward the acks once it acknowledged its end
    origin.wait_for_log("connected, backfill up to seq", timeout=20, start=mark)
    origin.wait_for_log("backfilled, counting toward acks", timeout=20, start=mark)
    wait_state(origin, "replicating")
    with RawClient(origin.tcp) as producer:
        producer.publish_many("t", [body(n) for n in range(1000, 1100)])

    origin.kill()
    post(replica.http(), f"/replica/takeover?node={node}")
    got = take(replica, "all", set(range(1100)))
    assert set(got) == set(range(1100)), "an acknowledged message was lost"


def test_a_replica_that_missed_the_fins_sends_back_only_what_was_lost(daemons, tmp_path):
    """The replica is away while channel ``all`` finishes 1,500 of 2,000 messages: it never hears those FINs. A body
    byte of one unread record is then flipped. The replica, asked for what the backfill left out of ``all``, sends
    back its copies of all 1,501 (it cannot tell finished from lost); the origin matches them against the side
    file entry of the record it lost and puts back that one alone: no finished message comes back."""
    replica_port = free_port()
    replica = start(daemons, tmp_path / "b", port=replica_port)
    origin_args = (f"--replicate-to={replica.tcp_address}", *FLAGS)
    origin = start(daemons, tmp_path / "a", *origin_args)
    port = origin.tcp[1]
    wait_state(origin, "replicating")
    create(origin, "all")
    with RawClient(origin.tcp) as producer:
        for first in range(0, COUNT, 500):
            producer.publish_many("t", [body(n) for n in range(first, first + 500)])
    assert replica.stop(timeout=30) == 0
    finished = 1500
    assert sorted(finish_first(origin, "all", finished)) == list(range(finished))
    assert origin.stop(timeout=30) == 0

    data = tmp_path / "a"
    last = max(int(p.name.split(".")[-2]) for p in data.glob("t:all.diskqueue.[0-9]*.dat"))
    assert DAMAGE["body byte"](segment(data, "all", last)) == 1

    origin = start(daemons, data, *origin_args, port=port)  # its replica is down: it goes on without it
    replica = start(daemons, tmp_path / "b", port=replica_port)
    origin.wait_for_log("sent back everything it held of the damaged queues", timeout=30)
    sent_back = replica.wait_for_log(r"found its files damaged: sent back (\d+) cop", timeout=10).group(1)
    got = take(origin, "all", set(range(finished, COUNT)))
    replication = stats(origin.http())["replication"]
    print(f"replica sent back {sent_back} cop(ies), {replication['restored_messages']} put back")
    assert not set(got) & set(range(finished)), "a message the channel had finished came back"
    assert replication["restored_messages"] == 1
    assert set(got) == set(range(finished, COUNT))
