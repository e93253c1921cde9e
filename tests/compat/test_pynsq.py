"""The real pynsq client (Writer and Reader on tornado) against nsqd, one scenario per subprocess."""

from __future__ import annotations

import pytest

from tests.compat.client_runs import python_client, run_client, unique_topic
from tests.integration.harness import REPO_ROOT

pytestmark = [pytest.mark.compat, pytest.mark.timeout(90)]


def run_scenario(nsqd, scenario: str) -> dict:
    result = run_client(
        python_client("pynsq_scenarios", scenario, nsqd.tcp_address, unique_topic("pynsq")),
        cwd=REPO_ROOT,
        what=f"pynsq scenario {scenario}",
        logs=nsqd.log_text,
        timeout=75,
    )
    server_errors = [w for w in result["warnings"] if "E_" in w]
    assert not server_errors, f"nsqd sent error frames to pynsq: {server_errors}"
    return result


def test_pynsq_imports_on_this_python():
    import nsq
    import tornado

    assert nsq.__version__ == "0.9.1"
    assert tornado.version_info[0] == 6


def test_publish_consume_finish(nsqd):
    result = run_scenario(nsqd, "publish_consume_finish")
    assert result["pub"] == "OK"
    assert result["first"]["body"] == "hello from pynsq"
    assert result["first"]["attempts"] == 1
    assert len(result["first"]["id"]) == 16
    assert result["redelivered"] == [], "a message pynsq finished was delivered again"


def test_requeue_with_delay_comes_back_with_attempts_two(nsqd):
    result = run_scenario(nsqd, "requeue_with_delay")
    first, second = result["first"], result["second"]
    assert (first["body"], first["attempts"]) == ("requeue me", 1)
    assert (second["id"], second["body"], second["attempts"]) == (first["id"], "requeue me", 2)
    assert second["timestamp"] == first["timestamp"]


def test_touch_keeps_the_message(nsqd):
    result = run_scenario(nsqd, "touch")
    assert result["first"]["body"] == "touch me"
    assert result["redelivered"] == [], "a touched message timed out"


def test_max_in_flight_above_one(nsqd):
    result = run_scenario(nsqd, "max_in_flight")
    assert result["pub"] == "OK"
    assert result["bodies"] == sorted(f"m{i:02d}" for i in range(50))
    assert result["peak_in_flight"] == 10


def test_mpub_and_dpub(nsqd):
    result = run_scenario(nsqd, "mpub_and_dpub")
    assert (result["dpub"], result["mpub"]) == ("OK", "OK")
    assert sorted(result["bodies"]) == sorted(["deferred"] + [f"batch-{i}" for i in range(100)])
    assert result["bodies"][-1] == "deferred", "the deferred message overtook immediate ones"
