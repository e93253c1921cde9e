"""Spark drivers as subprocesses, for the tests that kill a whole driver (its Python, its JVM, its
Python workers and source runner) with SIGKILL in the middle of a micro-batch and start again on
its checkpoint: ``driver_app`` (the driver path) and ``log_driver_app`` (the log path).

"In the middle of a batch" is read from the checkpoint, as Spark writes it: the batch's offsets
are logged (``offsets/N``) before it runs and its commit (``commits/N``) after its sink committed,
so a batch planned and not committed is one whose output may be partly written and must be
neither lost nor doubled by the restart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.integration.harness import REPO_ROOT
from tests.spark.conftest import spark_env, wait_until


def planned_not_committed(base: Path, at_least: int = 1) -> bool:
    """True while batch ``at_least`` or a later one is planned in BASE/checkpoint and not committed."""
    offsets = base / "checkpoint" / "offsets"
    if not offsets.exists():
        return False
    planned = max((int(p.name) for p in offsets.iterdir() if p.name.isdigit()), default=-1)
    return planned >= at_least and not (base / "checkpoint" / "commits" / str(planned)).exists()


def launch(module: str, args: list[str], log_path: Path) -> subprocess.Popen:
    """``python -m MODULE ARGS`` in a process group of its own (so that SIGKILL takes its JVM and
    Python workers along), its output appended to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=REPO_ROOT,
            env=dict(os.environ, **spark_env()),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_mid_batch(driver: subprocess.Popen, base: Path, log_path: Path, at_least: int, timeout: float) -> None:
    """Wait until batch ``at_least`` or a later one is under way, then SIGKILL the driver's group."""

    def under_way() -> bool:
        if driver.poll() is not None:
            raise AssertionError(f"the driver exited with {driver.returncode}: {log_path.read_text()[-3000:]}")
        return planned_not_committed(base, at_least)

    wait_until(under_way, timeout, f"the driver in the middle of batch {at_least} or later", interval=0.01)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait(30)


def stop(driver: subprocess.Popen, base: Path, log_path: Path, timeout: float = 60) -> None:
    """Ask the driver to stop (the file BASE/stop) and check that its query ran without failing."""
    (base / "stop").touch()
    assert driver.wait(timeout) == 0, log_path.read_text()[-3000:]


def reap(driver: subprocess.Popen) -> None:
    """Kill the driver's group if it is still running (a test that failed half-way)."""
    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
