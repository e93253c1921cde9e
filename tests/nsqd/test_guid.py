"""Message IDs: nsqd's layout, uniqueness, monotonicity, and the batch lead rule."""

from __future__ import annotations

import random
import struct
from binascii import unhexlify
from itertools import pairwise

import pytest

from nsqd import guid as guid_module
from nsqd.guid import (
    MAX_LEAD_TICKS,
    NODE_ID_BITS,
    SEQUENCE_BITS,
    TWEPOCH,
    GUIDFactory,
    GUIDUnavailable,
    split_id,
)

NOW = 1_790_000_000_123_456_789  # a fixed wall-clock reading in nanoseconds
TICK_NS = 1 << 20


def expected_id(now_ns: int, node_id: int, sequence: int) -> bytes:
    """nsqd's formula, written out independently of the implementation."""
    value = (((now_ns >> 20) - 1288834974288) << 22) | (node_id << 12) | sequence
    return struct.pack(">Q", value).hex().encode()


def test_layout_matches_nsqd():
    factory = GUIDFactory(617)
    first = factory.next_id(NOW)
    assert first == expected_id(NOW, 617, 0)
    assert len(first) == 16 and first == first.lower() and bytes.fromhex(first.decode())
    assert factory.next_id(NOW + 1) == expected_id(NOW, 617, 1)  # same tick: next sequence
    assert factory.next_id(NOW + TICK_NS) == expected_id(NOW + TICK_NS, 617, 0)  # new tick: back to 0
    parts = split_id(first)
    assert (parts.tick, parts.node_id, parts.sequence) == (NOW >> 20, 617, 0)
    assert TWEPOCH == 1288834974288


def test_sample_id_from_a_real_nsqd_decodes():
    parts = split_id(b"18a398c44e669000")
    assert parts.sequence == 0
    assert 0 <= parts.node_id < 1024
    assert 1_600_000_000 < (parts.tick << 20) / 1e9 < 1_900_000_000  # a plausible Unix time


@pytest.mark.parametrize("node_id", [-1, 1024])
def test_node_id_range(node_id):
    with pytest.raises(ValueError):
        GUIDFactory(node_id)


def test_sequence_exhaustion_raises_and_recovers_on_next_tick():
    factory = GUIDFactory(3)
    ids = [factory.next_id(NOW) for _ in range(4096)]
    assert split_id(ids[-1]).sequence == 4095
    with pytest.raises(GUIDUnavailable):
        factory.next_id(NOW)
    with pytest.raises(GUIDUnavailable):  # still exhausted: nothing was consumed
        factory.next_id(NOW + 5)
    after = factory.next_id(NOW + TICK_NS)
    assert after == expected_id(NOW + TICK_NS, 3, 0)
    assert after > ids[-1]


def test_clock_moving_back_raises():
    factory = GUIDFactory(3)
    issued = factory.next_id(NOW)
    with pytest.raises(GUIDUnavailable):
        factory.next_id(NOW - TICK_NS)
    assert factory.next_id(NOW) > issued  # same tick again is fine


def test_100k_single_ids_unique_and_increasing():
    factory = GUIDFactory(1023)
    clock = NOW
    ids = []
    retries = 0
    while len(ids) < 100_000:
        try:
            ids.append(factory.next_id(clock))
        except GUIDUnavailable:
            retries += 1
            clock += 1_000_000  # the caller waits 1 ms and retries, as nsqd does
            continue
        clock += 50  # 20 ids per microsecond: far faster than a tick allows
    assert retries > 0
    assert len(set(ids)) == len(ids)
    assert all(a < b for a, b in pairwise(ids))
    for message_id in ids[::997]:
        parts = split_id(message_id)
        assert parts.node_id == 1023 and 0 <= parts.sequence < 4096


def test_100k_batch_borrows_ticks_and_stays_monotonic():
    factory = GUIDFactory(5)
    first = factory.next_id(NOW)
    batch = factory.next_ids(100_000, NOW)
    assert len(batch) == 100_000
    ids = [first] + batch
    assert len(set(ids)) == len(ids)
    assert all(a < b for a, b in pairwise(ids))
    # the batch fills the rest of the tick, then whole ticks ahead of the clock
    assert batch[0] == expected_id(NOW, 5, 1)
    assert batch[4094] == expected_id(NOW, 5, 4095)
    assert batch[4095] == expected_id(NOW + TICK_NS, 5, 0)
    last = split_id(batch[-1])
    assert last.tick == (NOW >> 20) + (100_000 + 1 - 1) // 4096
    assert last.sequence == (100_000) % 4096
    # while ahead, a clock reading behind the borrowed tick continues after it
    following = factory.next_id(NOW)
    assert following > batch[-1]
    assert split_id(following).tick == last.tick
    # once the clock passes the borrowed ticks, sequences restart at the clock's tick
    later = NOW + (last.tick - (NOW >> 20) + 1) * TICK_NS
    assert factory.next_id(later) == expected_id(later, 5, 0)
    with pytest.raises(GUIDUnavailable):  # and going back is an error again
        factory.next_id(NOW)


@pytest.mark.parametrize("node_id", [0, 1, 618, 1023])
def test_every_batch_id_matches_the_formula(node_id):
    """The batch path builds IDs from a per-tick prefix and precomputed suffixes: check each one."""
    factory = GUIDFactory(node_id)
    factory.next_ids(4000, NOW)  # start the next batch near the end of a tick
    batch = factory.next_ids(3 * 4096 + 7, NOW)
    start = 4000
    assert batch == [
        expected_id(NOW + ((start + i) >> 12) * TICK_NS, node_id, (start + i) & 4095) for i in range(len(batch))
    ]
    assert all(type(i) is bytes and len(i) == 16 for i in batch)


def test_batch_beyond_the_lead_is_refused_without_using_ids():
    factory = GUIDFactory(9)
    factory.next_id(NOW)
    too_many = (MAX_LEAD_TICKS + 1) * 4096
    with pytest.raises(GUIDUnavailable):
        factory.next_ids(too_many, NOW)
    assert factory.next_id(NOW) == expected_id(NOW, 9, 1)
    assert GUIDFactory.max_batch == MAX_LEAD_TICKS * 4096
    fresh = GUIDFactory(9)
    ids = fresh.next_ids(GUIDFactory.max_batch, NOW - (NOW % TICK_NS))
    assert split_id(ids[-1]).tick - (NOW >> 20) == MAX_LEAD_TICKS - 1


def test_batch_edge_sizes():
    factory = GUIDFactory(2)
    assert factory.next_ids(0, NOW) == []
    with pytest.raises(ValueError):
        factory.next_ids(-1, NOW)
    assert factory.next_ids(1, NOW) == [expected_id(NOW, 2, 0)]
    assert factory.next_ids(4095, NOW)[-1] == expected_id(NOW, 2, 4095)  # exactly fills the tick
    with pytest.raises(GUIDUnavailable):  # next_id itself never borrows
        factory.next_id(NOW)
    assert factory.next_ids(1, NOW) == [expected_id(NOW + TICK_NS, 2, 0)]  # next_ids borrows the next tick
    assert factory.next_id(NOW) == expected_id(NOW + TICK_NS, 2, 1)  # and next_id continues in it


def test_backwards_beyond_the_lead_raises():
    factory = GUIDFactory(4)
    last = factory.next_ids(3 * 4096 - 10, NOW)[-1]
    assert factory.next_id(NOW - 10 * TICK_NS) > last  # within the lead: continues after the batch
    with pytest.raises(GUIDUnavailable):
        factory.next_id(NOW - (MAX_LEAD_TICKS + 10) * TICK_NS)
    with pytest.raises(GUIDUnavailable):
        factory.next_ids(1, NOW - (MAX_LEAD_TICKS + 10) * TICK_NS)


def test_random_mix_never_repeats_or_goes_back():
    rng = random.Random(1234)
    factory = GUIDFactory(77)
    clock = NOW
    issued: list[bytes] = []
    while len(issued) < 100_000:
        clock += rng.choice([0, 0, 100, 10_000, TICK_NS, -TICK_NS, -3 * TICK_NS])
        try:
            if rng.random() < 0.3:
                issued += factory.next_ids(rng.randint(1, 9000), clock)
            else:
                issued.append(factory.next_id(clock))
        except GUIDUnavailable:
            clock += TICK_NS
    assert len(set(issued)) == len(issued)
    assert all(a < b for a, b in pairwise(issued))
    assert {split_id(i).node_id for i in issued[::101]} == {77}


def test_real_clock():
    factory = GUIDFactory(0)
    ids = factory.next_ids(10_000) + [factory.next_id()]
    assert all(a < b for a, b in pairwise(ids))


def test_single_ids_borrow_up_to_the_lead_like_batches():
    """``next_ids(1)`` (a PUB's path) borrows ticks ahead exactly as far as a batch may, and no further."""
    start = NOW - (NOW % TICK_NS)
    factory = GUIDFactory(6)
    factory.next_ids(GUIDFactory.max_batch, start)  # ticks start .. start + MAX_LEAD_TICKS - 1, all used
    factory.next_ids(4095, start)  # the tick MAX_LEAD_TICKS ahead, all but its last ID
    last_tick = start + MAX_LEAD_TICKS * TICK_NS
    assert factory.next_ids(1, start) == [expected_id(last_tick, 6, 4095)]
    with pytest.raises(GUIDUnavailable):  # one more would be MAX_LEAD_TICKS + 1 ticks ahead
        factory.next_ids(1, start)
    # nothing was used by the refusal: one tick later the next ID follows the last one
    assert factory.next_ids(1, start + TICK_NS) == [expected_id(last_tick + TICK_NS, 6, 0)]
    singles = GUIDFactory(6)
    assert [singles.next_ids(1, start)[0] for _ in range(4097)] == GUIDFactory(6).next_ids(4097, start)


@pytest.mark.parametrize("node_id", [0, 1, 17, 1023])
def test_packed_ids_are_the_ids_values_and_use_the_same_sequence(node_id):
    """``next_packed``: the 8-byte values ``next_ids`` would have written in hex, with the same bookkeeping (ticks
    borrowed ahead, a used-up tick, the lead refused without using an ID)."""
    hexed, packed = GUIDFactory(node_id), GUIDFactory(node_id)
    now = NOW
    rng = random.Random(node_id)
    for count in [1, 2, 200, 4095, 4096, 5000, 1, 3, 9000, 0] + [rng.randrange(1, 3000) for _ in range(30)]:
        ids = hexed.next_ids(count, now)
        assert packed.next_packed(count, now) == unhexlify(b"".join(ids))
        assert (hexed._last_tick, hexed._sequence) == (packed._last_tick, packed._sequence)
        now += rng.randrange(0, 3) << 20
    with pytest.raises(GUIDUnavailable):
        packed.next_packed((MAX_LEAD_TICKS + 2) << 12, now)
    assert packed.next_packed(1, now) == unhexlify(hexed.next_ids(1, now)[0])
    with pytest.raises(ValueError):
        packed.next_packed(-1, now)


def _one_twins() -> list:
    """``next_packed_one``'s Python twin, and its C twin when the accelerator is built (whatever
    TRIONSQ_NO_SPEEDUPS says)."""
    twins = [pytest.param(guid_module._next_packed_one, id="python")]
    try:
        import nsqd._speedups as speedups
    except ImportError:
        return twins
    speedups.guid_layout(GUIDFactory, TWEPOCH, guid_module.TICK_SHIFT, NODE_ID_BITS, SEQUENCE_BITS)
    return [*twins, pytest.param(speedups.next_packed_one, id="c")]


@pytest.mark.parametrize("one", _one_twins())
@pytest.mark.parametrize("parts", [1, 3])
def test_single_packed_ids_follow_next_ids_through_ticks_used_up_borrowed_and_refused(parts, one):
    """A PUB's one packed ID (``next_packed_one``, then ``next_packed(1)`` when it answers None): the same value
    and bookkeeping as ``next_ids(1)`` through a new tick, the same tick, a tick used up (the next borrowed ahead),
    the clock standing still while ticks are borrowed, the lead used up (refused, nothing used) and the clock
    going back."""
    hexed, packed = GUIDFactory(9, parts - 1, parts), GUIDFactory(9, parts - 1, parts)
    rng = random.Random(parts)
    now = NOW
    for _ in range(20000):
        step = rng.random()
        if step < 0.0002:
            now -= 1 << 20  # back one tick: refused unless within the ticks borrowed ahead
        elif step < 0.0005:
            now += rng.randrange(1, 4) << 20
        outcomes = []
        for factory, call in (
            (hexed, lambda f, at: unhexlify(f.next_ids(1, at)[0])),
            (packed, lambda f, at: one(f, at) or f.next_packed(1, at)),  # as a PUB's publish asks
        ):
            try:
                outcomes.append(call(factory, now))
            except GUIDUnavailable as exc:
                outcomes.append(str(exc))
            outcomes.append((factory._last_tick, factory._sequence, factory._ahead))
        assert outcomes[:2] == outcomes[2:]


@pytest.mark.parametrize("parts", [2, 3, 7])
def test_the_workers_of_a_node_share_each_tick_and_stamp_the_nodes_id(parts):
    """``--workers``: each worker's factory issues its share of every tick's sequences, with the node's id, so no
    two workers issue one ID and none issues another node's."""
    factories = [GUIDFactory(42, part, parts) for part in range(parts)]
    issued: list[bytes] = []
    for part, factory in enumerate(factories):
        first, end = part * 4096 // parts, (part + 1) * 4096 // parts
        assert factory.next_id(NOW) == expected_id(NOW, 42, first)
        assert factory.next_ids(end - first - 1, NOW)[-1] == expected_id(NOW, 42, end - 1)  # fills its share
        with pytest.raises(GUIDUnavailable):
            factory.next_id(NOW)
        batch = factory.next_ids(3 * (end - first) + 5, NOW)  # into the next ticks' shares
        assert batch[0] == expected_id(NOW + TICK_NS, 42, first)
        assert batch[-1] == expected_id(NOW + 4 * TICK_NS, 42, first + 4)
        assert [split_id(i).sequence for i in batch] == [first + n % (end - first) for n in range(len(batch))]
        packed = factory.next_packed(end - first + 2, NOW)
        assert [packed[n : n + 8].hex().encode() for n in range(0, len(packed), 8)] == [
            expected_id(NOW + (4 + (5 + n) // (end - first)) * TICK_NS, 42, first + (5 + n) % (end - first))
            for n in range(end - first + 2)
        ]
        issued += batch
    assert len(set(issued)) == len(issued)
    assert {split_id(i).node_id for i in issued} == {42}


def test_a_share_beyond_the_tick_is_refused():
    with pytest.raises(ValueError):
        GUIDFactory(1, 0, 4097)
    with pytest.raises(ValueError):
        GUIDFactory(1, 2, 2)
