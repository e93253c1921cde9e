"""The origin's side of a heal (``nsqd/replication/restore.py``): which copies sent back by replicas go in again."""

from __future__ import annotations

import struct

from nsqd.queues.checksums import LostRecords, crc_of
from nsqd.replication.restore import LostCopies
from protocol.replication import ReplicatedMessage


def copy(n: int, attempts: int = 0) -> ReplicatedMessage:
    return ReplicatedMessage(b"%016x" % n, 1_700_000_000_000_000_000 + n, attempts, 0, b"body %06d" % n)


def entry(m: ReplicatedMessage, attempts: int) -> tuple[int, int]:
    """The side file entry of ``m`` as a queue wrote it, with ``attempts``."""
    record = struct.pack(">qH", m.timestamp, attempts) + m.id + m.body
    return len(record), crc_of(struct.pack(">i", len(record)) + record)


def lost(*entries: tuple[int, int] | None) -> LostRecords:
    records = LostRecords()
    for e in entries:
        records.add(None if e is None else [e])
    return records


def nothing() -> set[bytes]:
    return set()


def test_only_the_copies_of_lost_records_go_back():
    copies = LostCopies()
    sent = [copy(n) for n in range(100)]
    copies.note("t", "c", lost(entry(sent[40], 2)))  # written after two deliveries; the copy knows none
    assert copies.sort("b", "t", "c", sent, nothing) == [sent[40]]
    assert copies.settle("b", lambda t, c: set()) == [], "the others matched no record lost: they stay out"
    # the other replica sends the same: nothing more goes back
    assert copies.sort("c", "t", "c", sent, nothing) == []
    assert copies.settle("c", lambda t, c: set()) == []


def test_a_lost_record_of_the_topic_goes_back_to_every_channel():
    copies = LostCopies()
    sent = [copy(n) for n in range(10)]
    copies.note("t", "", lost(entry(sent[3], 0)))
    assert copies.sort("b", "t", "one", sent, nothing) == [sent[3]]
    assert copies.sort("b", "t", "two", sent, nothing) == [sent[3]]
    assert copies.settle("b", lambda t, c: set()) == []


def test_every_copy_goes_back_when_the_loss_is_not_fully_known():
    copies = LostCopies()
    sent = [copy(n) for n in range(10)]
    copies.note_queue("t:c", lost(entry(sent[2], 0), None))  # one record lost without an entry
    assert copies.sort("b", "t", "c", sent, nothing) == [sent[2]]
    held = {sent[5].id}  # in flight there now
    assert copies.settle("b", lambda t, c: held) == [("t", "c", [m for m in sent if m.id not in {sent[2].id} | held])]


def test_an_entry_no_copy_matched_lets_every_copy_back():
    copies = LostCopies()
    sent = [copy(n) for n in range(10)]
    copies.note("t", "c", lost(entry(copy(99), 0)))  # the replica has no copy of it
    assert copies.sort("b", "t", "c", sent, nothing) == []
    assert copies.settle("b", lambda t, c: set()) == [("t", "c", sent)]


def test_nothing_noted_takes_every_copy_not_held():
    copies = LostCopies()
    sent = [copy(n) for n in range(4)]
    assert copies.sort("b", "t", "c", sent, lambda: {sent[0].id}) == sent[1:]
