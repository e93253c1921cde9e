"""The pieces nsq_to_http and nsq_to_nsq share, without processes: the ``--mode`` destination pools with a clock
the test moves, the ``--status-every`` lines, nsq_to_nsq's JSON rules and Go-compatible JSON."""

from __future__ import annotations

import logging
import random

import pytest

from nsq_tools._gojson import decode_object, encode, int_if_whole
from nsq_tools._relay import Destinations, TimerMetrics, check_mode, destination_metrics
from nsq_tools.nsq_to_nsq import JsonRules, Skip


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_round_robin_starts_at_the_second_address_and_ignores_failures():
    pool = Destinations(["a", "b", "c"], "round-robin")
    picks = []
    for _ in range(6):
        address = pool.pick()
        pool.mark(address, False)
        picks.append(address)
    assert picks == ["b", "c", "a", "b", "c", "a"]


def test_hostpool_skips_a_failed_host_until_its_retry_time():
    clock = Clock()
    pool = Destinations(["a", "b", "c"], "hostpool", clock=clock)
    assert [pool.pick() for _ in range(3)] == ["a", "b", "c"]
    pool.mark("b", False)
    assert [pool.pick() for _ in range(4)] == ["a", "c", "a", "c"]
    clock.now += 30.5  # the first retry delay is 30s
    assert [pool.pick() for _ in range(3)] == ["a", "b", "c"]  # b tried again...
    pool.mark("b", False)  # ...fails again (still dead: its delay doubled to 60s at the retry)
    assert [pool.pick() for _ in range(2)] == ["a", "c"]
    clock.now += 59
    assert [pool.pick() for _ in range(2)] == ["a", "c"]
    clock.now += 2
    assert pool.pick() == "a" and pool.pick() == "b"
    pool.mark("b", True)  # alive again
    assert [pool.pick() for _ in range(3)] == ["c", "a", "b"]


def test_hostpool_revives_every_host_when_all_failed():
    pool = Destinations(["a", "b"], "hostpool", clock=Clock())
    for address in ("a", "b"):
        pool.mark(address, False)
    # go-hostpool revives them all, answers the first and restarts its walk at the first, which it gives again
    assert [pool.pick() for _ in range(4)] == ["a", "a", "b", "a"]


def test_epsilon_greedy_prefers_the_faster_host():
    clock = Clock()
    pool = Destinations(["slow", "fast"], "epsilon-greedy", clock=clock, rng=random.Random(7))
    for _ in range(20):
        pool.mark("slow", True, 0.100)
        pool.mark("fast", True, 0.010)
    picks = [pool.pick() for _ in range(2000)]
    fast = picks.count("fast")
    # weights 1/100 and 1/10: about 91% fast when exploiting, round-robin while exploring
    assert 1600 < fast < 1950
    assert picks.count("slow") > 50  # still explored


def test_epsilon_greedy_without_timings_walks_round_robin():
    pool = Destinations(["a", "b"], "epsilon-greedy", clock=Clock(), rng=random.Random(1))
    assert sorted(pool.pick() for _ in range(10)) == ["a"] * 5 + ["b"] * 5


def test_epsilon_greedy_old_timings_fade():
    clock = Clock()
    pool = Destinations(["a", "b"], "epsilon-greedy", clock=clock, rng=random.Random(3))
    pool.mark("a", True, 0.010)
    pool.mark("b", True, 0.500)
    clock.now += 301  # past the 5 minute window: every bucket was reset
    pool.mark("b", True, 0.010)
    assert pool._weighted_mean_ms(pool._hosts["a"]) == 0
    assert pool._weighted_mean_ms(pool._hosts["b"]) == pytest.approx(10.0)


def test_check_mode():
    assert check_mode("hostpool") is None and check_mode("round-robin") is None
    assert check_mode("epsilon-greedy") is None
    assert check_mode("multicast") == '--mode must be one of round-robin, hostpool, epsilon-greedy (got "multicast")'


def test_timer_metrics_logs_percentiles_every_n(caplog):
    metrics = TimerMetrics(4, "[aggregate]:")
    with caplog.at_level(logging.INFO, logger="nsq_tools"):
        for ms in (1, 2, 3):
            metrics.record(ms / 1000)
        assert not caplog.records
        metrics.record(0.010)
        for ms in (1, 1, 1):
            metrics.record(ms / 1000)
    # sorted [1, 2, 3, 10] ms: index ceil(0.99*4+0.5)=5 and ceil(0.95*4+0.5)=5, capped at 3 -> 10ms; mean 4ms
    assert [r.getMessage() for r in caplog.records] == [
        "[aggregate]: finished 4 - 99th: 10.00ms - 95th: 10.00ms - avg: 4.00ms"
    ]


def test_timer_metrics_disabled_and_per_destination():
    aggregate, per = destination_metrics(["only"], 250)
    assert aggregate.status_every == 250 and per["only"].status_every == 0
    aggregate, per = destination_metrics(["a", "b"], 5)
    assert per["a"].prefix == "[a]:" and per["b"].status_every == 5


# --- nsq_to_nsq's JSON rules -----------------------------------------------------------------------------------------


def test_go_json_encoding():
    value = decode_object(
        b'{"b": [1, 2.5, 1e-7, 1e21, 1e20, 0.1], "a": "<&>\\u2028 \xc3\xa9", "c": null, '
        b'"d": true, "e": {"z": 1.0}, "f": "\\n\\u0001"}'
    )
    assert encode(value) == (
        b'{"a":"\\u003c\\u0026\\u003e\\u2028 \xc3\xa9","b":[1,2.5,1e-7,1e+21,'
        b'100000000000000000000,0.1],"c":null,"d":true,"e":{"z":1},"f":"\\n\\u0001"}'
    )


@pytest.mark.parametrize("body", [b"[1]", b"1", b'"x"', b'{"a": NaN}', b'{"a": 1e400}', b"{", b""])
def test_go_json_rejects_non_objects(body):
    with pytest.raises(ValueError):
        decode_object(body)


def test_go_json_null_is_an_empty_object_and_numbers_are_floats():
    assert decode_object(b"null") == {}
    assert decode_object(b'{"n": 12}') == {"n": 12.0}
    assert [int_if_whole(v) for v in (12.0, 2.5, 1e19, -3.0)] == [12, 2.5, 1e19, -3]


def test_whitelist_keeps_listed_top_level_fields():
    rules = JsonRules("", "", ["id", "user.name", "missing", "n"])
    out = rules.apply(b'{"id": 7, "user": {"name": "x"}, "user.name": "dotted", "n": 1.5, "drop": 1}')
    assert out == b'{"id":7,"n":1.5,"user.name":"dotted"}'
    assert rules.apply(b'{"other": 1}') == b"{}"


def test_require_field_and_value():
    field_only = JsonRules("kind", "", [])
    body = b'{"kind": "a", "x": 1.0}'
    assert field_only.apply(body) == body  # passed through untouched without a whitelist
    with pytest.raises(Skip) as skip:
        field_only.apply(b'{"x": 1}')
    assert not skip.value.requeue  # missing field, no value asked: FIN'd

    by_value = JsonRules("kind", "a", [])
    assert by_value.apply(body) == body
    with pytest.raises(Skip) as skip:
        by_value.apply(b'{"kind": "b"}')
    assert not skip.value.requeue
    with pytest.raises(Skip) as skip:
        by_value.apply(b'{"other": "a"}')
    assert skip.value.requeue  # NSQ requeues (with backoff) a message missing the field it must compare

    numeric = JsonRules("n", "1", [])
    for body in (b'{"n": 1}', b'{"n": 1.0}', b'{"n": 1e0}', b'{"n": "1"}'):
        assert numeric.apply(body) == body
    for body in (b'{"n": 2}', b'{"n": "1.0"}', b'{"n": true}', b'{"n": [1]}'):
        with pytest.raises(Skip):
            numeric.apply(body)
    not_numeric = JsonRules("n", "true", [])
    with pytest.raises(Skip):
        not_numeric.apply(b'{"n": true}')  # neither a string nor a number: never equal


def test_json_rules_drop_bodies_that_are_not_objects(caplog):
    rules = JsonRules("", "", ["a"])
    with caplog.at_level(logging.ERROR, logger="nsq_tools"), pytest.raises(Skip) as skip:
        rules.apply(b"not json")
    assert not skip.value.requeue
    assert caplog.records[0].getMessage() == "ERROR: Unable to decode json: not json"
    assert JsonRules("", "", []).apply(b"not json") == b"not json"  # no JSON option: copied as is
