"""The real nsqjs client (Node.js) against nsqd: each scenario is a `node scenarios.js` process printing JSON."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.compat, pytest.mark.timeout(90)]

NODE_DIR = Path(__file__).resolve().parent / "node"
NODE = shutil.which("node")


@pytest.fixture(autouse=True)
def require_nsqjs():
    if NODE is None:
        pytest.skip("node is not installed: install Node.js to run the nsqjs compatibility tests")
    if not (NODE_DIR / "node_modules" / "nsqjs").is_dir():
        pytest.skip("nsqjs is not installed: run `make node` (make test does it) to install tests/compat/node")


def run_scenario(nsqd, scenario: str) -> dict:
    topic = f"nsqjs_{uuid.uuid4().hex[:10]}"
    try:
        done = subprocess.run(
            [NODE, "scenarios.js", scenario, nsqd.tcp_address, topic],
            cwd=NODE_DIR, capture_output=True, timeout=75, text=True,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"nsqjs scenario {scenario} hung; stderr:\n{exc.stderr}\nnsqd log:\n{nsqd.log_text()}")
    assert done.returncode == 0, f"nsqjs scenario {scenario} failed:\n{done.stderr}\nnsqd log:\n{nsqd.log_text()}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
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
