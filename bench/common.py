"""What every scenario shares: the command line, the nsqd under test, generator processes, reports.

A scenario module (``bench/<name>.py``) has ``NAME``, ``TITLE``, ``add_arguments(parser)`` for its own
flags and ``run(args) -> Report``; ``main(module)`` here turns that into ``python -m bench.<name>``.

The nsqd under test (``Target``): by default a fresh ``python -m nsqd`` subprocess on 127.0.0.1 with
a temporary data directory (removed afterwards), plus the flags the scenario needs (a large
``--mem-queue-size`` for in-memory backlogs) and any ``--nsqd-arg``. With ``--nsqd-tcp-address``
(and ``--nsqd-http-address``) the scenario runs against a server that is already there, ours or
NSQ's; topic names are unique per run so earlier runs do not interfere, and ``--nsqd-pid`` lets
the scenarios that read the server's CPU time or memory do so.

Generator processes (``Generators``): each runs ``bench.load.run_roles`` over roles built in the
child (sockets never cross processes). They connect, report ready, then start together at one
``time.monotonic`` instant chosen by the parent; every process measures the same window.
Loops are bounded in time: each child has a hard deadline and the parent waits for it with a
timeout, then terminates what is left.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import multiprocessing.connection
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "BREAKDOWN_NOTE",
    "Generators",
    "ProcessSampler",
    "Report",
    "RESULTS_DIR",
    "SyscallCounter",
    "Target",
    "format_table",
    "jain_index",
    "machine_info",
    "main",
    "per_message_breakdown",
    "percentile",
    "unique_topic",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = Path(__file__).resolve().parent / "results"
_LISTENING = re.compile(r"(TCP|HTTP): listening on (\S+)")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


# -- small helpers ------------------------------------------------------------------------------


def unique_topic(prefix: str) -> str:
    return f"bench_{prefix}_{uuid.uuid4().hex[:8]}"


def percentile(sorted_values: list, fraction: float):
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, int(round(fraction * len(sorted_values) + 0.5)) - 1))
    return sorted_values[index]


def jain_index(values: list[float]) -> float:
    """Jain's fairness index: 1.0 when all values are equal, 1/n when one takes everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return (total * total) / (len(values) * squares) if squares else 0.0


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return host, int(port)


#: steal above this share of the CPU time during a scenario gets a note under its table
STEAL_NOTICE = 0.02


def machine_info() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import trio

        trio_version = trio.__version__
    except ImportError:  # pragma: no cover
        trio_version = None
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "trio": trio_version,
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "load_average": os.getloadavg(),
    }


def load_average_note(when: str) -> str:
    """The load average over 1, 5 and 15 minutes, for a report's notes ``when`` ("start", "end")."""
    one, five, fifteen = os.getloadavg()
    return f"load average at the {when}: {one:.2f} {five:.2f} {fifteen:.2f}"


def cpu_times() -> tuple[int, int] | None:
    """(steal, total) clock ticks of all CPUs so far, from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return ticks[7], sum(ticks)


def steal_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time the hypervisor gave to others between two ``cpu_times()``: on a
    shared virtual machine, a few percent or more makes every figure noisy (a vCPU is taken away mid-run)."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


def _process_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(child) for child in f.read().split()]
    except OSError:
        return []


class ProcessSampler:
    """CPU seconds and resident set of a process from /proc (Linux); zeros when unavailable."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid

    def cpu_seconds(self) -> float:
        """CPU seconds of the process and of its live children (nsqd's workers with ``--workers`` above 1)."""
        if self.pid is None:
            return 0.0
        return sum(_process_cpu(pid) for pid in (self.pid, *_children(self.pid)))

    def cpu_by_worker(self) -> list[float]:
        """CPU seconds of each live child (nsqd's workers with ``--workers`` above 1, in the order they were
        forked, which is their index); empty for a single process."""
        if self.pid is None:
            return []
        return [_process_cpu(pid) for pid in sorted(_children(self.pid))]

    def snapshot(self) -> dict:
        """The counters so far of the process and of its live children (nsqd's workers, as ``cpu_seconds``):
        ``user`` and ``system`` CPU seconds (``/proc/<pid>/stat``), and ``voluntary`` and ``involuntary`` context
        switches summed over their threads (``/proc/<pid>/task/*/status``: a process's own ``status`` counts only
        its main thread). Empty when unavailable."""
        if self.pid is None:
            return {}
        counts = {"user": 0.0, "system": 0.0, "voluntary": 0, "involuntary": 0}
        for index, pid in enumerate((self.pid, *_children(self.pid))):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                if index == 0:
                    return {}
                continue  # a worker that ended meanwhile
            counts["user"] += int(fields[11]) / _CLOCK_TICKS
            counts["system"] += int(fields[12]) / _CLOCK_TICKS
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                tasks = []
            for task in tasks:
                try:
                    with open(f"/proc/{pid}/task/{task}/status") as f:
                        for line in f:
                            if line.startswith("voluntary_ctxt_switches:"):
                                counts["voluntary"] += int(line.split()[1])
                            elif line.startswith("nonvoluntary_ctxt_switches:"):
                                counts["involuntary"] += int(line.split()[1])
                except OSError:  # a thread that ended meanwhile
                    pass
        return counts

    def rss_bytes(self) -> int:
        if self.pid is None:
            return 0
        try:
            with open(f"/proc/{self.pid}/statm") as f:
                return int(f.read().split()[1]) * _PAGE_SIZE
        except OSError:
            return 0


#: the system calls ``SyscallCounter`` counts, by the figure they go into (``epoll``: every wait, trio's and the
#: read poller's; ``recv`` and ``send``: every read and write of a socket, whichever call makes it)
SYSCALL_GROUPS = {
    "epoll": ("epoll_wait", "epoll_pwait", "epoll_pwait2"),
    "epoll_ctl": ("epoll_ctl",),
    "recv": ("read", "readv", "recvfrom", "recvmsg"),
    "send": ("write", "writev", "sendto", "sendmsg"),
    # nsqd's poller makes a step's reads and writes in one call through an io_uring (nsqd/_speedups.c)
    "io_uring": ("io_uring_enter",),
}


class WorkerWindow:
    """Each nsqd worker's CPU seconds over a window (``ProcessSampler.cpu_by_worker`` at ``mark("start")`` and
    ``mark("end")``, which ``Generators.run`` takes as ``on_window``): where the work ran with ``--workers`` above 1.
    """

    #: the note that explains ``column``'s figures
    NOTE = "by worker us/msg: nsqd's CPU per message of each worker, worker 0 first"

    def __init__(self, sampler: ProcessSampler) -> None:
        self.sampler = sampler
        self.marks: dict[str, list[float]] = {}
        self.machine: dict[str, tuple[float, float]] = {}

    def mark(self, moment: str) -> None:
        self.marks[moment] = self.sampler.cpu_by_worker()
        self.machine[moment] = (time.monotonic(), machine_busy_seconds())

    def others_cores(self, own_cpu_seconds: float) -> float | None:
        """The cores the machine kept busy over the window with work other than ``own_cpu_seconds`` (nsqd's and
        the load generator's CPU over the same window): other processes', which a shared machine's run competes
        with."""
        if "start" not in self.machine or "end" not in self.machine:
            return None
        (started, busy_start), (ended, busy_end) = self.machine["start"], self.machine["end"]
        return max(busy_end - busy_start - own_cpu_seconds, 0.0) / (ended - started) if ended > started else None

    def per_message(self, messages: int) -> list[float]:
        """Each worker's CPU microseconds per message over the window; empty for one process (or none counted)."""
        before, after = self.marks.get("start", []), self.marks.get("end", [])
        if not messages or not before or len(after) != len(before):
            return []
        return [(end - start) * 1e6 / messages for start, end in zip(before, after, strict=True)]

    def column(self, messages: int) -> dict:
        """``{"by worker us/msg": "1.20 / 1.31"}``, or nothing for one process."""
        values = self.per_message(messages)
        return {"by worker us/msg": " / ".join(f"{value:.2f}" for value in values)} if values else {}


def machine_busy_seconds() -> float:
    """CPU seconds the machine spent busy since boot, all cores (``/proc/stat``: user, nice, system, irq and
    softirq); 0.0 when unavailable."""
    try:
        with open("/proc/stat") as f:
            fields = [int(value) for value in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / _CLOCK_TICKS


class SyscallCounter:
    """How many system calls of each group (``SYSCALL_GROUPS``, plus ``all``) a process makes between ``start``
    and ``stop``: with ``perf stat`` on the kernel's syscall tracepoints, which counts in the kernel (a cost of
    well under a microsecond per call, measured below in bench/README.md), or, where perf cannot, with
    ``strace -c -f`` over the first ``strace_seconds`` of the window (ptrace stops the process at every call:
    its figures are counts per message, and the process runs several times slower meanwhile, which lets more
    connections be ready per wake-up, so they understate the waits). The process's live children are counted
    with it (nsqd's workers with ``--workers`` above 1: neither tool follows a child forked before it attached).
    ``counts()`` is None when neither works."""

    def __init__(self, pid: int | None, strace_seconds: float = 1.0) -> None:
        self.pid = pid
        self.strace_seconds = strace_seconds
        self.tool: str | None = None
        self._proc: subprocess.Popen | None = None
        self._output = ""

    def start(self) -> None:
        if self.pid is None:
            return
        pids = [self.pid, *_children(self.pid)]
        if shutil.which("perf"):
            events = ["raw_syscalls:sys_enter"] + [
                f"syscalls:sys_enter_{name}" for names in SYSCALL_GROUPS.values() for name in names
            ]
            argv = ["perf", "stat", "-x", ",", "--no-big-num", "-e", ",".join(events), "-p", ",".join(map(str, pids))]
            if self._launch(argv, "perf"):
                return
        if shutil.which("strace"):
            argv = ["timeout", "-s", "INT", str(self.strace_seconds), "strace", "-c", "-f", "-q"]
            self._launch([*argv, *(f"-p{pid}" for pid in pids)], "strace")

    def _launch(self, argv: list[str], tool: str) -> bool:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError:
            return False
        time.sleep(0.05)  # attached (or failed) before the window's traffic is counted
        if proc.poll() is not None and proc.returncode != 0 and tool == "perf":
            proc.communicate()
            return False
        self._proc = proc
        self.tool = tool
        return True

    def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            if self.tool == "perf":
                proc.send_signal(signal.SIGINT)
            else:  # strace ends by itself (``timeout``); it detaches on SIGINT
                try:
                    proc.wait(self.strace_seconds + 5)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        self._output = err.decode("utf-8", "replace")

    def counts(self) -> dict | None:
        """``{"all": n, "epoll": n, ...}`` over the counted span, or None; with strace, also ``seconds``: the
        span it counted (a part of the window)."""
        if self.tool is None or not self._output:
            return None
        by_name: dict[str, int] = {}
        total = 0
        if self.tool == "perf":
            for line in self._output.splitlines():
                fields = line.split(",")
                if len(fields) < 3 or not fields[0].strip().isdigit():
                    continue
                event = fields[2]
                if event == "raw_syscalls:sys_enter":
                    total = int(fields[0])
                elif event.startswith("syscalls:sys_enter_"):
                    by_name[event[len("syscalls:sys_enter_") :]] = int(fields[0])
        else:
            for line in self._output.splitlines():
                fields = line.split()
                # % time, seconds, usecs/call, calls, [errors,] syscall
                if len(fields) >= 5 and fields[3].isdigit():
                    name = fields[-1]
                    if name == "total":
                        total = int(fields[3])
                    else:
                        by_name[name] = int(fields[3])
        if not total and not by_name:
            return None
        result = {"all": total or sum(by_name.values())}
        for group, names in SYSCALL_GROUPS.items():
            result[group] = sum(by_name.get(name, 0) for name in names)
        if self.tool == "strace":
            result["seconds"] = self.strace_seconds
        return result


#: what the breakdown's columns are, printed under the tables that have them
BREAKDOWN_NOTE = (
    "per message: user_us/sys_us nsqd's CPU in user and kernel mode, vcsw/ivcsw its voluntary and "
    "involuntary context switches, epoll/recv/send/all its epoll waits, socket reads, socket writes "
    "and system calls (counted by syscall_tool), gen_us the generators' CPU"
)


def per_message_breakdown(result: dict, messages: int) -> dict:
    """The round trip part by part, per message, from ``Generators.run``'s result: nsqd's user and system CPU
    (us), its voluntary and involuntary context switches, its epoll waits, socket reads and writes, every
    system call it made, and the generators' CPU (us). A figure that was not measured is None."""
    nsqd = result.get("nsqd") or {}
    window = result["window"]
    if not messages:
        return {}
    generator = sum(worker["cpu_seconds"] for worker in result["workers"])
    row = {
        "user_us": nsqd["user"] * 1e6 / messages if "user" in nsqd else None,
        "sys_us": nsqd["system"] * 1e6 / messages if "system" in nsqd else None,
        "vcsw": nsqd["voluntary"] / messages if "voluntary" in nsqd else None,
        "ivcsw": nsqd["involuntary"] / messages if "involuntary" in nsqd else None,
    }
    calls = result.get("syscalls")
    if calls is not None:
        # strace counts only part of the window: scale the messages to that part
        share = messages * min(calls.get("seconds", window), window) / window
        for group in ("epoll", "recv", "send", "all"):
            row[f"{group}/msg"] = calls[group] / share if share else None
        row["syscall_tool"] = result.get("syscall_tool")
    row["gen_us"] = generator * 1e6 / messages
    return row


# -- the server under test ------------------------------------------------------------------------


class Target:
    """The nsqd a scenario talks to. Use as a context manager (see the module notes)."""

    def __init__(
        self,
        args,
        flags: list[str] | tuple[str, ...] = (),
        *,
        want_http: bool = False,
        root: Path = REPO_ROOT,
        log_path: Path | None = None,
        wrapper: list[str] | tuple[str, ...] = (),
        start_timeout: float = 30.0,
    ) -> None:
        self.args = args
        # the source tree whose nsqd is started (``pub_against`` starts an earlier one, ``workers --against`` too)
        self.root = getattr(args, "nsqd_root", None) or root
        self.flags = list(flags) + list(args.nsqd_arg or [])
        self.want_http = want_http
        self.own = not args.nsqd_tcp_address
        self.tcp: tuple[str, int] | None = None
        self.http: tuple[str, int] | None = None
        self.pid: int | None = None
        self.proc: subprocess.Popen | None = None
        self.data_path: str | None = None
        self.lines: list[str] = []  # the first 10,000 lines of its log
        #: every line of its log goes to this file too (``lines`` keeps only the first ones)
        self.log_path = log_path
        #: a command nsqd runs under (``valgrind --tool=callgrind``: ``bench.instructions``), and how long it may
        #: take to listen
        self.wrapper = list(wrapper)
        self.start_timeout = start_timeout
        self._cond = threading.Condition()
        self._closed = False

    def describe(self) -> dict:
        return {
            "own_nsqd": self.own,
            "tcp": "{}:{}".format(*self.tcp) if self.tcp else None,
            "http": "{}:{}".format(*self.http) if self.http else None,
            "nsqd_flags": self.flags if self.own else None,
        }

    def __enter__(self) -> Target:
        if not self.own:
            self.tcp = parse_address(self.args.nsqd_tcp_address)
            if self.args.nsqd_http_address:
                self.http = parse_address(self.args.nsqd_http_address)
            self.pid = self.args.nsqd_pid
            return self
        self.data_path = tempfile.mkdtemp(prefix="trionsq-bench-")
        argv = [
            *self.wrapper,
            sys.executable,
            "-m",
            "nsqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={self.data_path}",
            *self.flags,
        ]
        self.proc = subprocess.Popen(
            argv,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        self.pid = self.proc.pid
        if self.args.pin:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.pid, {server_cpu()})
        threading.Thread(target=self._drain_log, daemon=True).start()
        try:
            self.tcp = self._wait_for("TCP", self.start_timeout)
            if self.tcp is None:
                raise RuntimeError("nsqd did not start:\n" + "\n".join(self.lines[-30:]))
            self.http = self._wait_for("HTTP", 2.0 if self.want_http else 0.0)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _drain_log(self) -> None:
        with contextlib.ExitStack() as stack:
            saved = stack.enter_context(open(self.log_path, "a", encoding="utf-8")) if self.log_path else None
            for raw in self.proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if saved is not None:
                    saved.write(line + "\n")
                    saved.flush()
                with self._cond:
                    if len(self.lines) < 10000:
                        self.lines.append(line)
                    self._cond.notify_all()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _wait_for(self, kind: str, timeout: float) -> tuple[str, int] | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    match = _LISTENING.search(line)
                    if match and match.group(1) == kind:
                        return parse_address(match.group(2))
                remaining = deadline - time.monotonic()
                if self._closed or remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def __exit__(self, *exc) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if self.data_path is not None:
            shutil.rmtree(self.data_path, ignore_errors=True)

    def log_tail(self, count: int = 20) -> str:
        with self._cond:
            return "\n".join(self.lines[-count:])

    def sampler(self) -> ProcessSampler:
        return ProcessSampler(self.pid)


# -- generator processes ---------------------------------------------------------------------------


def _collect(roles) -> list[dict]:
    out = []
    for role in roles:
        info = {"kind": type(role).__name__, "counter": role.counter}
        for name in ("first_at", "last_at", "bytes", "acked", "sent"):
            if hasattr(role, name):
                info[name] = getattr(role, name)
        if getattr(role, "latency", False):
            info["latencies"] = role.latencies
        out.append(info)
    return out


#: whether scenarios pin (``--pin``/``--no-pin``, or the scenario's ``PIN`` default), set by ``main``
_PINNING = {"on": True}


def server_cpu() -> int:
    return sorted(os.sched_getaffinity(0))[0]


def generator_cpus() -> list[int]:
    """The CPUs generators are pinned to: all but the server's (all of them on one CPU)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[1:] or cpus


def _child(conn, build: Callable, kwargs: dict, cpu: int | None) -> None:
    """A generator process: build the roles, report ready, run the window, report counters."""
    from bench.load import close_all, run_roles

    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        roles = build(**kwargs)
        conn.send(("ready", len(roles)))
        message = conn.recv()
        if message[0] != "go":
            return
        _, start_at, warm_at, end_at, hard_end_at, until_done = message
        result = run_roles(
            roles, start_at=start_at, warm_at=warm_at, end_at=end_at, hard_end_at=hard_end_at, until_done=until_done
        )
        result["roles"] = _collect(roles)
        close_all(roles)
        conn.send(("result", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


@dataclass
class Generators:
    """A set of generator processes started together. ``add`` each, then ``run``."""

    specs: list[tuple[Callable, dict]] = field(default_factory=list)
    #: pin each process to one of the generators' CPUs; None: as the command line says (``--pin``/``--no-pin``)
    pin: bool | None = None
    #: count nsqd's system calls over the window (``SyscallCounter``; the scenarios that print the breakdown)
    count_syscalls: bool = False

    def add(self, build: Callable, **kwargs) -> None:
        self.specs.append((build, kwargs))

    def run(
        self,
        *,
        warmup: float,
        duration: float,
        until_done: bool = False,
        hard_limit: float | None = None,
        sampler: ProcessSampler | None = None,
        on_window: Callable[[str], None] | None = None,
    ) -> dict:
        """Start every process, wait for all to be ready, run the window, gather the results.

        Returns ``{"workers": [...], "nsqd_cpu_seconds": x, "window": duration}``; raises
        RuntimeError with the child's traceback if one failed.
        """
        context = multiprocessing.get_context("spawn")
        children = []
        try:
            cpus = generator_cpus()
            for index, (build, kwargs) in enumerate(self.specs):
                parent_end, child_end = context.Pipe()
                pin = _PINNING["on"] if self.pin is None else self.pin
                cpu = cpus[index % len(cpus)] if pin else None
                process = context.Process(target=_child, args=(child_end, build, kwargs, cpu), daemon=True)
                process.start()
                child_end.close()
                children.append((process, parent_end))
            for _, pipe in children:
                if not pipe.poll(60):
                    raise RuntimeError("a generator process did not get ready within 60 s")
                message = pipe.recv()
                if message[0] != "ready":
                    raise RuntimeError(f"generator failed during setup:\n{message[1]}")
            start_at = time.monotonic() + 0.2
            warm_at = start_at + warmup
            end_at = warm_at + duration
            hard_end_at = end_at + (hard_limit if hard_limit is not None else 1.0)
            for _, pipe in children:
                pipe.send(("go", start_at, warm_at, end_at, hard_end_at, until_done))
            cpu_start = cpu_end = 0.0
            counts_start: dict = {}
            counts_end: dict = {}
            syscalls = SyscallCounter(sampler.pid if sampler is not None and self.count_syscalls else None)
            if sampler is not None:
                time.sleep(max(warm_at - time.monotonic(), 0))
                syscalls.start()
                counts_start = sampler.snapshot()
                cpu_start = sampler.cpu_seconds()
                if on_window is not None:
                    on_window("start")
            # wait for the window's end, or for every process to finish early (a drained backlog)
            messages: dict[int, tuple] = {}
            while len(messages) < len(children):
                now = time.monotonic()
                limit = (end_at if sampler is not None and not cpu_end else hard_end_at + 30) - now
                ready = multiprocessing.connection.wait(
                    [pipe for index, (_, pipe) in enumerate(children) if index not in messages], max(limit, 0)
                )
                for pipe in ready:
                    index = next(i for i, (_, p) in enumerate(children) if p is pipe)
                    try:
                        messages[index] = pipe.recv()
                    except EOFError:
                        messages[index] = ("error", "the generator process died")
                now = time.monotonic()
                if sampler is not None and not cpu_end and (now >= end_at or len(messages) == len(children)):
                    cpu_end = sampler.cpu_seconds()
                    counts_end = sampler.snapshot()
                    syscalls.stop()
                    if on_window is not None:
                        on_window("end")
                elif not ready and now >= hard_end_at + 30:
                    raise RuntimeError("a generator process did not report in time")
            results = []
            for index in range(len(children)):
                message = messages[index]
                if message[0] != "result":
                    raise RuntimeError(f"generator failed:\n{message[1]}")
                results.append(message[1])
            nsqd = {key: counts_end[key] - counts_start[key] for key in counts_end if key in counts_start}
            return {
                "workers": results,
                "nsqd_cpu_seconds": cpu_end - cpu_start,
                "window": duration,
                "nsqd": nsqd,
                "syscalls": syscalls.counts(),
                "syscall_tool": syscalls.tool,
            }
        finally:
            for process, pipe in children:
                pipe.close()
                process.join(5)
                if process.is_alive():
                    process.terminate()
                    process.join(5)


# -- reports -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadRun:
    """What one window of spread-out load counted: messages, generator CPU seconds, the window, nsqd's CPU."""

    messages: int
    generator_cpu: float
    window: float
    nsqd_cpu: float
    #: the round trip part by part (``per_message_breakdown``), when asked for
    breakdown: dict = field(default_factory=dict)


def run_spread(
    args, target: Target, role: str, connections: int, processes: int, params: dict, *, breakdown: bool = False
) -> LoadRun:
    """Run ``connections`` of one load ``role`` spread evenly over up to ``processes`` generator processes
    (never more processes than connections) for the measured window, and total what the workers counted."""
    from bench.load import build_roles  # the generator side; imported here so load.py stays standalone

    generators = Generators(count_syscalls=breakdown and getattr(args, "syscalls", True))
    processes = max(1, min(processes, connections))
    for index in range(processes):
        count = connections // processes + (1 if index < connections % processes else 0)
        generators.add(build_roles, specs=[(role, count, params)])
    result = generators.run(warmup=args.warmup, duration=args.duration, sampler=target.sampler())
    workers = result["workers"]
    messages = sum(sum(worker["window_counts"]) for worker in workers)
    return LoadRun(
        messages=messages,
        generator_cpu=sum(worker["cpu_seconds"] for worker in workers),
        window=result["window"],
        nsqd_cpu=result["nsqd_cpu_seconds"],
        breakdown=per_message_breakdown(result, messages) if breakdown else {},
    )


@dataclass
class Report:
    """What a scenario found: table rows (dicts with the same keys), its parameters and notes."""

    name: str
    title: str
    rows: list[dict] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    targets: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None
    target: dict | None = None


def _fmt(value) -> str:
    if isinstance(value, float):
        if value >= 1000:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "" if value is None else str(value)


def format_table(rows: list[dict]) -> str:
    if not rows:
        return ""
    columns = list(rows[0])
    for row in rows[1:]:
        columns += [key for key in row if key not in columns]
    cells = [[_fmt(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]
    lines = [
        "  ".join(column.ljust(width) for column, width in zip(columns, widths, strict=True)),
        "  ".join("-" * width for width in widths),
    ]
    for line in cells:
        lines.append("  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)))
    return "\n".join(lines)


def write_report(report: Report, results_dir: Path) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{report.name}.json"
    document = {
        "scenario": report.name,
        "title": report.title,
        "machine": machine_info(),
        "target": report.target,
        "params": report.params,
        "results": report.rows,
        "targets": report.targets,
        "notes": report.notes,
        "skipped": report.skipped,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


def print_report(report: Report) -> None:
    print(f"\n== {report.name}: {report.title}")
    if report.skipped:
        print(f"skipped: {report.skipped}")
        return
    print(format_table(report.rows))
    for key, value in report.targets.items():
        print(f"target {key}: {value}")
    for note in report.notes:
        print(f"note: {note}")


# -- command line ------------------------------------------------------------------------------------


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server under test")
    group.add_argument("--nsqd-tcp-address", help="use this running server instead of starting nsqd")
    group.add_argument("--nsqd-http-address", help="its HTTP address (HTTP scenarios)")
    group.add_argument("--nsqd-pid", type=int, help="its process id, to read CPU time and memory")
    group.add_argument(
        "--nsqd-arg", action="append", default=[], help="extra flag for the nsqd started here (repeatable)"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where <scenario>.json goes")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per figure")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds run before measuring")
    parser.add_argument(
        "--no-syscalls",
        dest="syscalls",
        action="store_false",
        default=os.environ.get("BENCH_SYSCALLS", "1") != "0",
        help="do not count nsqd's system calls (BENCH_SYSCALLS=0): the CPU figures without the "
        "cost of perf's tracepoints on every call, which is about 1 us per PUB here",
    )
    pinning = parser.add_mutually_exclusive_group()
    pinning.add_argument(
        "--pin",
        dest="pin",
        action="store_true",
        default=None,
        help="pin nsqd to the first CPU and the generators to the others (the default of every "
        "scenario but pub, pubsub and latency, which run unpinned, as users run nsqd)",
    )
    pinning.add_argument("--no-pin", dest="pin", action="store_false", help="let every process move between CPUs")


def main(module, argv: list[str] | None = None) -> int:
    """``python -m bench.<name>``: parse flags, run the scenario, print its table, write its JSON."""
    parser = argparse.ArgumentParser(prog=f"python -m bench.{module.NAME}", description=module.TITLE)
    add_common_arguments(parser)
    if hasattr(module, "add_arguments"):
        module.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.pin is None:  # no flag: BENCH_PIN=1 or 0 for a whole ``make bench``, else the scenario's default
        env = os.environ.get("BENCH_PIN")
        args.pin = env == "1" if env in ("0", "1") else getattr(module, "PIN", True)
    _PINNING["on"] = args.pin
    before = cpu_times()
    report = module.run(args)
    report.params["pinned"] = args.pin
    steal = steal_share(before, cpu_times())
    if steal is not None:
        report.params["cpu_steal"] = round(steal, 4)
        if steal >= STEAL_NOTICE:
            report.notes.append(
                f"the hypervisor took {steal:.1%} of this machine's CPU time during the run "
                "(steal): the figures are noisy"
            )
    path = write_report(report, args.results_dir)
    print_report(report)
    print(f"wrote {path}")
    return 0
