"""The real nsqjs client (Node.js) against nsqd: each scenario is a `node scenarios.js` process printing JSON."""

from __future__ import annotations

import pytest

from tests.compat.client_runs import NODE, NODE_DIR, run_client, unique_topic

pytestmark = [pytest.mark.compat, pytest.mark.timeout(90), pytest.mark.usefixtures("require_nsqjs")]


def run_scenario(nsqd, scenario: str) -> dict:
    result = run_client(
        [NODE, "scenarios.js", scenario, nsqd.tcp_address, unique_topic("nsqjs")],
        cwd=NODE_DIR,
        what=f"nsqjs scenario {scenario}",
        logs=nsqd.log_text,
        timeout=75,
    )
    assert result["errors"] == [], f"nsqjs reported errors: {result['errors']}"
    return result


def test_publish_consume_finish(nsqd):
    result = run_scenario(nsqd, "publish_consume_finish")
    assert result["pub"] == "OK"
    first = result["first"]
    assert (first["body"], first["attempts"]) == ("hello from nsqjs", 1)
    assert len(first["id"]) == 16
    assert result["redelivered"] == [], "a message nsqjs finished was delivered again"


def test_requeue_comes_back_with_attempts_two(nsqd):
    result = run_scenario(nsqd, "requeue")
    first, second = result["first"], result["second"]
    assert (first["body"], first["attempts"]) == ("requeue me", 1)
    assert (second["id"], second["body"], second["attempts"]) == (first["id"], "requeue me", 2)
    assert second["timestamp"] == first["timestamp"]


def test_mpub_and_deferred_publish(nsqd):
    result = run_scenario(nsqd, "mpub_and_defer")
    assert (result["deferred"], result["mpub"]) == ("OK", "OK")
    assert sorted(result["bodies"]) == sorted(["deferred"] + [f"batch-{i}" for i in range(100)])
    assert result["bodies"][-1] == "deferred", "the deferred message overtook immediate ones"


def test_touch_keeps_the_message(nsqd):
    result = run_scenario(nsqd, "touch")
    assert result["first"]["body"] == "touch me"
    assert result["redelivered"] == [], "a touched message timed out"
