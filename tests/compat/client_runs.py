"""Running a real client (pynsq, gnsq, nsqjs) in its own process for the compatibility tests.

Each client script prints one JSON object as its last line of stdout; ``run_client`` returns it, and fails the
test with the client's stderr and the daemons' logs when the script hangs or exits non-zero. The feature tests
(TLS, snappy, deflate, AUTH) also share an nsqd with a throw-away certificate and a scripted auth server.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.features import ScriptedAuthServer, grant
from tests.integration.harness import NsqdProcess, stop_all

__all__ = [
    "NODE",
    "NODE_DIR",
    "nsqjs_missing",
    "python_client",
    "run_client",
    "running_nsqd",
    "scripted_auth",
    "unique_topic",
]

NODE_DIR = Path(__file__).resolve().parent / "node"
NODE = shutil.which("node")


def nsqjs_missing() -> str | None:
    """Why the nsqjs tests cannot run here, or None when node and nsqjs are installed."""
    if NODE is None:
        return "node is not installed: install Node.js to run the nsqjs compatibility tests"
    if not (NODE_DIR / "node_modules" / "nsqjs").is_dir():
        return "nsqjs is not installed: run `make node` (make test does it) to install tests/compat/node"
    return None


def unique_topic(client: str) -> str:
    """A topic no other run uses, named after the client."""
    return f"{client}_{uuid.uuid4().hex[:10]}"


def python_client(module: str, *args: str) -> list[str]:
    """The command line of the client script ``tests.compat.<module>``."""
    return [sys.executable, "-m", f"tests.compat.{module}", *args]


def run_client(
    argv: list[str], *, cwd: Path, what: str, logs: Callable[[], str], logs_name: str = "nsqd log", timeout: float = 90
) -> dict:
    """Run a client script and return the JSON object it printed last. ``what`` names the run in a failure,
    which also shows ``logs()`` (the daemons' logs) under ``logs_name``."""
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, timeout=timeout, text=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{what} hung; stderr:\n{exc.stderr}\n{logs_name}:\n{logs()}")
    assert done.returncode == 0, f"{what} failed:\n{done.stderr}\n{logs_name}:\n{logs()}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@contextmanager
def scripted_auth(secret: str, identity: str) -> Iterator[ScriptedAuthServer]:
    """An auth server that grants everything to ``secret``, as ``identity``."""
    server = ScriptedAuthServer()
    server.answers[secret] = (200, grant(identity=identity))
    try:
        yield server
    finally:
        server.close()


@contextmanager
def running_nsqd(data_path: Path, args: list[str]) -> Iterator[NsqdProcess]:
    """An nsqd with ``args``, stopped (exit code 0 required) at the end."""
    daemon = NsqdProcess(data_path, args)
    daemon.start()
    try:
        yield daemon
    finally:
        stop_all([daemon])
