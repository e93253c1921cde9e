"""Shared pieces for the utilities' end-to-end tests (tests/tools/test_<tool>.py).

The tools run as real subprocesses (``python -m nsq_tools.<tool>``, the same ``main`` as the console script)
against real nsqd and nsqlookupd subprocesses, so a test checks what a user would see: exit codes, stdout,
stderr. Fixtures (on top of tests/conftest.py's ``nsqd``, ``nsqd_factory``, ``topic``):

- ``lookupd``: one nsqlookupd for the test.
- ``lookupd_nsqd``: an nsqd registered with that lookupd (``--broadcast-address=127.0.0.1``).

Helpers (import them: ``from tests.tools.conftest import run_tool, ToolProcess, usage_flags``):

- ``run_tool(tool, *args, input=b"", timeout=30)``: run to the end, a ``CompletedProcess`` with bytes.
- ``ToolProcess(tool, *args)``: a running tool whose stdout and stderr are drained by threads (it can never
  block on a full pipe); ``wait_for_stdout``/``wait_for_stderr`` wait (bounded) for a pattern, ``stop`` sends a
  signal and returns the exit code.
- ``usage_flags(text)``: Go's ``-h`` text parsed into ``{name: (kind, default)}``, to compare with the table of
  NSQ-TOOLS-FACTS (kind is Go's placeholder: ``string``, ``int``, ``duration``, ``value``..., ``bool`` for a
  flag without one; default is the text of ``(default ...)`` or None).
- ``assert_usage(tool, expected)``: ``-h`` exits 0 and lists exactly ``expected`` (``usage_flags``' form).
- ``assert_fatal(result, text)``: the tool ended as Go's ``log.Fatal`` ends it (exit 1, last stderr line
  ``YYYY/MM/DD HH:MM:SS <text>``, no traceback); ``assert_unknown_flag(tool)``: exit 2 and Go's message.
- ``topic_depth(nsqd, topic)``, ``channel_depth(nsqd, topic, channel)``: from nsqd's ``/stats``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.harness import REPO_ROOT, NsqdProcess, stop_all
from tests.integration.http_helpers import stats, wait_for
from tests.integration.lookupd_harness import LookupdProcess

__all__ = [
    "ToolProcess",
    "assert_fatal",
    "assert_unknown_flag",
    "assert_usage",
    "channel_depth",
    "run_tool",
    "tool_argv",
    "topic_depth",
    "usage_flags",
    "wait_for",
]


def tool_argv(tool: str, *args: str) -> list[str]:
    return [sys.executable, "-m", f"nsq_tools.{tool}", *args]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1")


def run_tool(tool: str, *args: str, input: bytes = b"", timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run the tool to its end (bounded by ``timeout``); stdout and stderr as bytes."""
    return subprocess.run(
        tool_argv(tool, *args), cwd=REPO_ROOT, env=_env(), input=input, capture_output=True, timeout=timeout
    )


class ToolProcess:
    """A tool running in the background; its output collected by two threads."""

    def __init__(self, tool: str, *args: str, stdin: int | None = subprocess.DEVNULL) -> None:
        self.proc = subprocess.Popen(
            tool_argv(tool, *args),
            cwd=REPO_ROOT,
            env=_env(),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._cond = threading.Condition()
        self._out = {"stdout": bytearray(), "stderr": bytearray()}
        self._open = 2
        self._threads = [
            threading.Thread(target=self._drain, args=(name, stream), daemon=True)
            for name, stream in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr))
        ]
        for thread in self._threads:
            thread.start()

    def _drain(self, name: str, stream) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self._cond:
                self._out[name] += chunk
                self._cond.notify_all()
        with self._cond:
            self._open -= 1
            self._cond.notify_all()

    @property
    def stdout(self) -> bytes:
        with self._cond:
            return bytes(self._out["stdout"])

    @property
    def stderr(self) -> bytes:
        with self._cond:
            return bytes(self._out["stderr"])

    def _wait(self, name: str, pattern: bytes, timeout: float) -> re.Match:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                match = regex.search(self._out[name])
                if match:
                    return match
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self._open == 0 and self.proc.poll() is not None):
                    raise AssertionError(
                        f"{name} of the tool did not match {pattern!r} within {timeout}s "
                        f"(exit code {self.proc.poll()});\nstdout: {bytes(self._out['stdout'])!r}"
                        f"\nstderr: {bytes(self._out['stderr']).decode(errors='replace')}"
                    )
                self._cond.wait(min(remaining, 0.5))

    def wait_for_stdout(self, pattern: bytes, timeout: float = 20.0) -> re.Match:
        return self._wait("stdout", pattern, timeout)

    def wait_for_stderr(self, pattern: bytes, timeout: float = 20.0) -> re.Match:
        return self._wait("stderr", pattern, timeout)

    def wait(self, timeout: float = 20.0) -> int:
        """The exit code once the tool ends by itself (killed and failed if it does not within ``timeout``)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"the tool did not exit within {timeout}s; stderr:\n{self.stderr.decode(errors='replace')}"
            ) from None
        for thread in self._threads:
            thread.join(5)
        return code

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> ToolProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


_USAGE_FLAG = re.compile(r"^  -(\S+)(?: (\S+))?$")
_DEFAULT = re.compile(r"\(default (.*)\)$")


def usage_flags(text: str) -> dict[str, tuple[str, str | None]]:
    """``{name: (kind, default)}`` from Go's usage text (``Usage of x:`` then two lines per flag)."""
    flags: dict[str, tuple[str, str | None]] = {}
    lines = text.splitlines()
    for index, line in enumerate(lines):
        head, _, inline_help = line.partition("\t")
        match = _USAGE_FLAG.match(head.rstrip())
        if not match:
            continue
        help_lines = [inline_help] if inline_help else []
        for follow in lines[index + 1 :]:
            if not follow.startswith("    \t"):
                break
            help_lines.append(follow[5:])
        default = _DEFAULT.search(help_lines[-1]) if help_lines else None
        flags[match.group(1)] = (match.group(2) or "bool", default.group(1) if default else None)
    return flags


def assert_fatal(result: subprocess.CompletedProcess, text: str) -> None:
    """Exit code 1 and, as the last stderr line, Go's log line with ``text``; never a traceback."""
    stderr = result.stderr.decode(errors="replace") if isinstance(result.stderr, bytes) else result.stderr
    assert result.returncode == 1, f"exit code {result.returncode}; stderr:\n{stderr}"
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert lines and re.fullmatch(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d " + re.escape(text), lines[-1]), stderr


def assert_usage(tool: str, expected: dict[str, tuple[str, str | None]]) -> None:
    """``-h``: Go's usage text on stderr, exit code 0, exactly the flags (kinds and defaults) expected."""
    result = run_tool(tool, "-h")
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert stderr.startswith(f"Usage of {tool}:\n"), stderr
    assert usage_flags(stderr) == expected


def assert_unknown_flag(tool: str) -> None:
    """An undefined flag: Go's message, then the usage, exit code 2."""
    result = run_tool(tool, "-no-such-flag=1")
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert stderr.startswith("flag provided but not defined: -no-such-flag\n"), stderr
    assert f"Usage of {tool}:" in stderr and "Traceback" not in stderr, stderr


def assert_bad_option(tool: str, *args: str, flag: str, value: str, reason: str) -> None:
    """A refused ``-consumer-opt``/``-producer-opt`` value is a flag error, as go-nsq's ConfigFlag makes it in NSQ's
    tools: ``invalid value "<value>" for flag -<flag>: <reason>``, the usage, exit code 2."""
    result = run_tool(tool, *args, f"--{flag}={value}")
    stderr = result.stderr.decode()
    assert result.returncode == 2, stderr
    assert stderr.startswith(f'invalid value "{value}" for flag -{flag}: {reason}\n'), stderr
    assert f"Usage of {tool}:" in stderr and "Traceback" not in stderr, stderr


def topic_depth(nsqd: NsqdProcess, topic: str) -> int | None:
    """The topic's depth (None while nsqd does not have it)."""
    for entry in stats(nsqd.http(), f"topic={topic}")["topics"] or []:
        if entry["topic_name"] == topic:
            return entry["depth"]
    return None


def channel_depth(nsqd: NsqdProcess, topic: str, channel: str) -> int | None:
    for entry in stats(nsqd.http(), f"topic={topic}")["topics"] or []:
        if entry["topic_name"] == topic:
            for chan in entry["channels"]:
                if chan["channel_name"] == channel:
                    return chan["depth"]
    return None


@pytest.fixture
def lookupd(tmp_path_factory) -> LookupdProcess:
    daemon = LookupdProcess(tmp_path_factory.mktemp("lookupd"))
    daemon.start()
    yield daemon
    stop_all([daemon])


@pytest.fixture
def lookupd_nsqd(lookupd, nsqd_factory) -> NsqdProcess:
    """An nsqd that registers its topics with ``lookupd``."""
    return nsqd_factory("--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={lookupd.tcp_address}")
