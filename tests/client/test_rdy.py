"""The consumer's RDY distribution and backoff (trionsq._rdy), driven with plain numbers for the clock."""

from __future__ import annotations

import random

import pytest

from trionsq._rdy import ReadyController


def controller(max_in_flight: int, **kwargs) -> ReadyController[str]:
    return ReadyController(max_in_flight=max_in_flight, rng=random.Random(7), **kwargs)


def rdys(ctl: ReadyController, keys) -> dict[str, int]:
    return {key: ctl.rdy(key) for key in keys}


def test_one_connection_gets_max_in_flight_capped_by_max_rdy():
    ctl = controller(200)
    assert ctl.add("a", 2500, 0) == [("a", 200)]
    ctl = controller(5000)
    assert ctl.add("a", 2500, 0) == [("a", 2500)]


def test_spread_evenly_lowering_the_others_before_the_newcomer():
    ctl = controller(10)
    assert ctl.add("a", 2500, 0) == [("a", 10)]
    assert ctl.add("b", 2500, 0) == [("a", 5), ("b", 5)]
    assert ctl.add("c", 2500, 0) == [("a", 3), ("b", 3), ("c", 3)]
    assert ctl.total_rdy == 9
    # one leaves: its share goes back to the rest at once
    assert ctl.remove("b", 1) == [("a", 5), ("c", 5)]
    assert ctl.total_rdy == 10


def test_sum_never_passes_max_in_flight_with_a_small_max_rdy():
    ctl = controller(10)
    ctl.add("a", 2, 0)
    ctl.add("b", 2500, 0)
    assert rdys(ctl, "ab") == {"a": 2, "b": 5}
    assert ctl.total_rdy <= 10


def test_more_connections_than_max_in_flight_rotate_rdy_1():
    ctl = controller(2, low_rdy_idle_timeout=10, low_rdy_timeout=30, redistribute_interval=5)
    for key in "abcd":
        ctl.add(key, 2500, 0)
    assert ctl.total_rdy == 2 and sorted(rdys(ctl, "abcd").values()) == [0, 0, 1, 1]
    holders = {key for key in "abcd" if ctl.rdy(key)}
    # holders that keep receiving keep their RDY until low_rdy_timeout
    for now in (4, 8, 12, 16, 20, 24, 28):
        for key in holders:
            ctl.message_received(key, now)
        ctl.tick(now + 1)
        assert {key for key in "abcd" if ctl.rdy(key)} == holders
    # past 30 s of holding it, RDY goes to the others
    ctl.tick(40)
    assert ctl.total_rdy == 2
    assert {key for key in "abcd" if ctl.rdy(key)} == set("abcd") - holders


def test_idle_connection_gives_up_rdy_to_another():
    ctl = controller(1, low_rdy_idle_timeout=10, redistribute_interval=5)
    ctl.add("a", 2500, 0)
    ctl.add("b", 2500, 0)
    holder = "a" if ctl.rdy("a") else "b"
    other = "b" if holder == "a" else "a"
    assert ctl.total_rdy == 1
    assert ctl.next_deadline() == 5
    assert ctl.tick(5) == []  # received nothing for 5 s: still within low_rdy_idle_timeout
    assert ctl.tick(15) == [(holder, 0), (other, 1)]


def test_a_closed_holder_hands_its_rdy_to_a_waiting_connection():
    ctl = controller(1)
    ctl.add("a", 2500, 0)
    ctl.add("b", 2500, 0)
    holder = "a" if ctl.rdy("a") else "b"
    other = "b" if holder == "a" else "a"
    assert ctl.remove(holder, 1) == []  # the next redistribution moves it
    assert ctl.tick(ctl.next_deadline()) == [(other, 1)]


def test_backoff_levels_durations_trial_and_recovery():
    ctl = controller(10, backoff_multiplier=1.0, max_backoff_duration=120)
    ctl.add("a", 2500, 0)
    ctl.add("b", 2500, 0)
    assert ctl.failed(0) == [("a", 0), ("b", 0)]
    assert (ctl.backoff_level, ctl.backing_off, ctl.backoff_until, ctl.next_deadline()) == (1, True, 2, 2)
    # failures of messages already in flight during the RDY-0 period are ignored
    assert ctl.failed(1) == [] and ctl.backoff_level == 1
    assert ctl.succeeded(1) == [] and ctl.backoff_level == 1
    (trial,) = ctl.tick(2)
    assert trial[1] == 1 and ctl.total_rdy == 1 and not ctl.backing_off
    # the trial fails: level 2, 4 s
    assert ctl.failed(3) == [(trial[0], 0)]
    assert (ctl.backoff_level, ctl.backoff_until) == (2, 7)
    (trial,) = ctl.tick(7)
    # a success lowers the level but stays in backoff: another RDY-0 period at level 1
    assert ctl.succeeded(8) == [(trial[0], 0)]
    assert (ctl.backoff_level, ctl.backoff_until) == (1, 10)
    (trial,) = ctl.tick(10)
    # the last success restores everyone's share
    assert sorted(ctl.succeeded(11)) == [("a", 5), ("b", 5)]
    assert rdys(ctl, "ab") == {"a": 5, "b": 5}
    assert (ctl.backoff_level, ctl.backing_off) == (0, False)


def test_backoff_level_stops_where_the_next_duration_passes_the_max():
    ctl = controller(1, backoff_multiplier=1.0, max_backoff_duration=10)
    ctl.add("a", 2500, 0)
    now = 0.0
    for expected_level in (1, 2, 3, 3, 3):  # 2, 4, 8 s; 16 s would pass 10 s
        ctl.failed(now)
        assert ctl.backoff_level == expected_level
        assert ctl.backoff_until == now + 2**expected_level
        now = ctl.backoff_until
        assert ctl.tick(now) == [("a", 1)]


def test_full_jitter_backoff_is_random_below_the_exponential_duration():
    ctl = controller(1, backoff_multiplier=1.0, max_backoff_duration=100, backoff_strategy="full_jitter")
    ctl.add("a", 2500, 0)
    now = 0.0
    periods = []
    for level in (1, 2, 3, 4):
        ctl.failed(now)
        assert ctl.backoff_level == level
        period = ctl.backoff_until - now
        assert 0 <= period < 2**level
        periods.append(period / 2**level)
        now = ctl.backoff_until
        assert ctl.tick(now) == [("a", 1)]
    assert len(set(periods)) == len(periods)  # drawn each time, not a fixed share of the exponential time
    # the level still stops where a drawn duration would pass the max (drawn below 2**level, so later here)
    ctl = controller(1, backoff_multiplier=1.0, max_backoff_duration=3, backoff_strategy="full_jitter")
    ctl.add("a", 2500, 0)
    now = 0.0
    for _ in range(30):
        ctl.failed(now)
        assert ctl.backoff_until - now <= 3 + 1e-9
        now = ctl.backoff_until
        ctl.tick(now)
    assert 2 <= ctl.backoff_level <= 10
    with pytest.raises(ValueError, match="backoff_strategy"):
        controller(1, backoff_strategy="linear")


def test_requeue_without_backoff_keeps_the_level():
    ctl = controller(4)
    ctl.add("a", 2500, 0)
    assert ctl.failed(0, backoff=False) == [] and ctl.backoff_level == 0
    ctl.failed(0)
    ctl.tick(2)
    # not a backoff signal, but the level stays and the RDY-0 period starts again
    assert ctl.failed(3, backoff=False) == [("a", 0)]
    assert (ctl.backoff_level, ctl.backoff_until) == (1, 5)


def test_zero_max_backoff_disables_backoff():
    ctl = controller(4, max_backoff_duration=0)
    ctl.add("a", 2500, 0)
    assert ctl.failed(0) == [] and ctl.backoff_level == 0 and ctl.rdy("a") == 4


def test_connections_joining_during_backoff_wait_and_trial_needs_a_connection():
    ctl = controller(4)
    ctl.add("a", 2500, 0)
    ctl.failed(0)
    assert ctl.add("b", 2500, 1) == []
    ctl.remove("a", 1)
    ctl.remove("b", 1)
    assert ctl.tick(2) == [] and ctl.backoff_until == 3  # nobody to try: again in a second
    ctl.add("c", 2500, 2.5)
    assert ctl.tick(3) == [("c", 1)]


def test_in_backoff_the_trial_rdy_moves_off_an_idle_connection():
    ctl = controller(4, low_rdy_idle_timeout=10, redistribute_interval=5)
    ctl.add("a", 2500, 0)
    ctl.add("b", 2500, 0)
    ctl.failed(0)
    (trial,) = ctl.tick(2)
    other = "b" if trial[0] == "a" else "a"
    assert ctl.tick(5) == []
    assert ctl.tick(20) == [(trial[0], 0), (other, 1)]
    assert ctl.total_rdy == 1


def test_set_max_in_flight_and_pause():
    ctl = controller(10)
    ctl.add("a", 2500, 0)
    ctl.add("b", 2500, 0)
    assert ctl.set_max_in_flight(0, 1) == [("a", 0), ("b", 0)]
    assert ctl.set_max_in_flight(4, 2) == [("a", 2), ("b", 2)]
    with pytest.raises(ValueError):
        ctl.set_max_in_flight(-1, 3)


def test_stop_zeroes_everything_and_ignores_what_follows():
    ctl = controller(10)
    ctl.add("a", 2500, 0)
    ctl.add("b", 2500, 0)
    assert ctl.stop(1) == [("a", 0), ("b", 0)]
    assert ctl.failed(2) == [] and ctl.tick(100) == [] and ctl.add("c", 2500, 3) == []
    stats = ctl.stats()
    assert (stats.connections, stats.total_rdy, stats.backoff_level) == (3, 0, 0)


def test_rotation_goes_round_every_connection():
    ctl = controller(1, low_rdy_idle_timeout=1, redistribute_interval=5)
    for key in "abc":
        ctl.add(key, 2500, 0)
    holders = [next(key for key in "abc" if ctl.rdy(key))]
    for now in (5, 10, 15):
        ctl.tick(now)
        holders.append(next(key for key in "abc" if ctl.rdy(key)))
    assert sorted(holders[:3]) == ["a", "b", "c"] and holders[3] == holders[0]
