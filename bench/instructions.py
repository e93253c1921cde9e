"""Scenario: nsqd's instructions and system calls per message of pub, mpub and consume, this code against another
revision: counts that do not move with the machine's load.

``bench.memory``'s CPU rows read nsqd's CPU time, which the other work of a shared machine moves by more than the
differences between two revisions (the same code against itself: 0.55 to 2.0 per round). This scenario counts
instead:

- **instructions** (``Ir``): nsqd runs under ``valgrind --tool=callgrind``, which counts every instruction it
  executes in user space (the interpreter, the C accelerator, the C library; not the kernel's). The counters are
  zeroed just before a window of work and dumped just after it (``callgrind_control``), so start-up and shutdown
  are left out, and the figure per message is the difference between a window of ``--ir-messages`` ``N2``
  messages and one of ``N1``, over ``N2 - N1``: what a window costs whatever its size (the connections' set-up,
  the last replies) cancels out. Each run's first window of each workload is a warm-up and is not counted.
- **system calls**: the same windows at full speed, with no valgrind, counted by ``perf stat`` on the kernel's
  syscall tracepoints (or ``strace -c -f``: ``SyscallCounter`` in ``common.py``), the figure per message again
  the difference of two windows (``--syscall-messages``) over the difference of their sizes.

The workloads have the shapes of ``bench.memory``'s CPU rows: ``pub``, 16 connections each with one PUB of a
``--body-size`` body in flight, into a topic with no channel; ``mpub``, 4 connections each with one MPUB of 200
in flight; ``consume``, a backlog (published first, outside the window) drained by 4 consumers at RDY 200 that
FIN each read's messages with one write (the window ends once nsqd holds none in flight: ``/stats``).

Under callgrind nsqd runs about 50 times slower while its clients do not, so each step of its loop finds more
ready work than at full speed (every connection has its next PUB waiting): the instructions per message are
those of full batches, the same for both revisions because the shape of the load is. Work done on a clock (the
periodic loops: the queue scan every 100 ms, the sync loop with its ``malloc_trim`` once a second) costs 50 times
more per message there too: an idle window of ``--idle`` seconds measures it (``idle Ir/s``), and ``net Ir/msg``
takes it out (the idle rate times each window's length). The system calls are counted at full speed, where the
batches are the machine's: their figures move a little from run to run (medians over ``--rounds``).

Both revisions are built alike (``bench.pub_against.extract``, as ``bench.memory --against``): ``git archive``,
the accelerator compiled with the same flags, the modules byte-compiled, run with this venv's Python. Their runs
alternate, ABBA. Each build runs ``--rounds`` times under callgrind (the counts should agree within a fraction of
a percent) and ``--rounds`` times at full speed. ``--keep-profiles DIR`` keeps callgrind's dumps, one per window
(``callgrind_annotate --inclusive=yes FILE``: where the instructions go, function by function).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from bench.common import Generators, Report, SyscallCounter, Target, main, unique_topic
from bench.consume import create_channel, prefill
from bench.load import OK_FRAME, Consumer, build_roles
from bench.pub_against import extract_both
from protocol.commands import MAGIC_V2, encode_mpub, encode_pub

NAME = "instructions"
TITLE = "instructions and system calls per message of pub, mpub and consume: counts, not times"
PIN = False  # nsqd under valgrind takes a core; the clients take what is left
WORKLOADS = ("pub", "pub1", "mpub", "consume")
#: the window sizes under callgrind (N1, N2) and at full speed, by workload
IR_MESSAGES = {
    "pub": (4_000, 12_000),
    "pub1": (2_000, 6_000),
    "mpub": (40_000, 120_000),
    "consume": (20_000, 60_000),
}
SYSCALL_MESSAGES = {
    "pub": (16_000, 48_000),
    "pub1": (4_000, 12_000),
    "mpub": (200_000, 600_000),
    "consume": (50_000, 150_000),
}
SYSCALL_FIGURES = ("all", "epoll", "io_uring", "recv", "send")
#: the PUB connections
PUB_CONNECTIONS = 16
HEARTBEAT_FRAME = b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
MPUB_BATCH = 200
#: every message of every window stays in memory, as in the bench's CPU rows (no disk queue, no checksums)
FLAGS = ["--mem-queue-size=10000000"]


def add_arguments(parser) -> None:
    parser.add_argument("--against", default="73b8c37", help="the git revision to compare with")
    parser.add_argument("--now", help="the later git revision (default: the working tree's tracked files)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=2, help="runs of each build under callgrind and at full speed")
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of the idle window under callgrind")
    parser.add_argument("--no-instructions", dest="instructions", action="store_false", help="no callgrind runs")
    parser.add_argument("--no-syscall-counts", dest="syscall_counts", action="store_false", help="no syscall runs")
    parser.add_argument("--keep-profiles", type=Path, help="keep callgrind's dump of every window in this directory")
    parser.add_argument("--start-timeout", type=float, default=240.0, help="seconds nsqd may take to start")


# -- the workloads: one window each, of a given number of messages --------------------------------------


class _Drainer(Consumer):
    """A consumer of a group that ends, all of it, once the group received ``total`` messages and it has written
    its FINs."""

    def __init__(self, group: list[_Drainer], total: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.group = group
        self.total = total
        self.finished = False
        group.append(self)

    @property  # type: ignore[override]
    def done(self) -> bool:
        return self.finished and not self._pending

    @done.setter
    def done(self, value: bool) -> None:
        self.finished = value

    def on_readable(self) -> None:
        super().on_readable()
        if sum(member.counter for member in self.group) >= self.total:
            for member in self.group:
                member.finished = True


def build_drainers(address, topic: str, channel: str, consumers: int, rdy: int, total: int) -> list[_Drainer]:
    """``consumers`` consumers that FIN what they get and stop together after ``total`` messages (for
    ``Generators``: made in the generator process)."""
    group: list[_Drainer] = []
    for _ in range(consumers):
        _Drainer(group, total, address=address, topic=topic, channel=channel, rdy=rdy)
    return group


def _publish(target: Target, frame: bytes, per_frame: int, connections: int, messages: int) -> int:
    frames = messages // per_frame
    generators = Generators()
    specs = []
    for index in range(connections):
        count = frames // connections + (1 if index < frames % connections else 0)
        if count:
            specs.append(("pub", 1, dict(address=target.tcp, frame=frame, messages_per_frame=per_frame, frames=count)))
    generators.add(build_roles, specs=specs)
    result = generators.run(warmup=0.0, duration=600.0)
    return sum(role["counter"] for worker in result["workers"] for role in worker["roles"])


def _state(pid: int) -> tuple[str, str]:
    """The process's state letter (``/proc/PID/stat``) and where it sleeps in the kernel (``wchan``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/wchan") as f:
            return state, f.read()
    except OSError:
        return "X", ""  # gone: the reads below fail


def _wait_until(pid: int, condition: Callable[[str, str], bool], limit: float = 120.0) -> None:
    """Until ``condition(state, wchan)`` holds on two reads in a row."""
    deadline = time.monotonic() + limit
    seen = 0
    while seen < 2:
        seen = seen + 1 if condition(*_state(pid)) else 0
        if time.monotonic() > deadline:
            raise RuntimeError("nsqd did not come to the expected state")
        time.sleep(0.0001)


def _asleep(state: str, wchan: str) -> bool:
    """Waiting in its event loop's ``epoll_wait`` (trio's: the poller's own polls never wait)."""
    return state in ("S", "X") and "epoll" in wchan


def _stopped(state: str, wchan: str) -> bool:
    return state in ("T", "t", "X")


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            raise RuntimeError("nsqd closed a connection")
        data += more
    return data


def _await_ok(sock: socket.socket) -> None:
    """Read frames until an OK; a heartbeat (nsqd sends one every 30 s, and a window under callgrind lasts
    minutes) is passed over: the PUBs keep the connection alive."""
    while True:
        frame = _read_exactly(sock, 4)
        frame += _read_exactly(sock, int.from_bytes(frame, "big"))
        if frame == OK_FRAME:
            return
        if frame != HEARTBEAT_FRAME:
            raise RuntimeError(f"PUB answered {frame!r}")


def lockstep_publish(target: Target, frame: bytes, connections: int, together: bool, messages: int) -> int:
    """PUBs on ``connections`` connections, in rounds, each round's OKs awaited before the next one starts, and
    each round sent while nsqd waits in its event loop's ``epoll_wait`` (so that it is not mid-step, nor polling
    again on its own: nsqd/poller.py's "several steps per wake-up" goes on while new PUBs arrive in time, which
    is a matter of timing). ``together``: one PUB on every connection per round, written while nsqd is stopped
    (SIGSTOP) and let go at once (SIGCONT), so that one step finds them all ready, every time; else one PUB per
    round, the connections in turn, each a wake-up of its own. Either way every window sees the same steps, and
    the counts do not depend on how the timing of the two processes falls."""
    socks = []
    pid = target.pid
    assert pid is not None
    try:
        for _ in range(connections):
            sock = socket.create_connection(target.tcp, timeout=600)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(MAGIC_V2)
            socks.append(sock)
        answered = 0
        turn = 0
        while answered < messages:
            _wait_until(pid, _asleep)
            if together:
                batch = socks[: messages - answered]
                os.kill(pid, signal.SIGSTOP)
                _wait_until(pid, _stopped)
                for sock in batch:
                    sock.sendall(frame)
                os.kill(pid, signal.SIGCONT)
            else:
                batch = [socks[turn % connections]]
                turn += 1
                batch[0].sendall(frame)
            for sock in batch:
                _await_ok(sock)
            answered += len(batch)
        return answered
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)
        for sock in socks:
            sock.close()


def _channel_stats(target: Target, topic: str, channel: str) -> dict:
    url = "http://{}:{}/stats?format=json&topic={}&channel={}".format(*target.http, topic, channel)
    with urllib.request.urlopen(url, timeout=60) as response:
        document = json.loads(response.read())
    document = document.get("data", document)  # the envelope of NSQ before 1.0
    for entry in document.get("topics") or []:
        if entry.get("topic_name") == topic:
            for found in entry.get("channels") or []:
                if found.get("channel_name") == channel:
                    return found
    return {}


class Workload:
    """One of ``WORKLOADS`` on one nsqd: ``prepare(n)`` outside the window, ``window(n)`` the counted work (n
    messages); returns the messages it saw through."""

    def __init__(self, name: str, target: Target, body_size: int) -> None:
        self.name = name
        self.target = target
        self.body = b"p" * body_size
        self.topic = unique_topic(f"instr_{name}")
        self.channel = "bench"
        if name == "consume":
            create_channel(target, self.topic, self.channel)

    def prepare(self, messages: int) -> None:
        if self.name == "consume":
            published = prefill(self.target, self.topic, messages, len(self.body), batch=MPUB_BATCH)
            if published != messages:
                raise RuntimeError(f"backlog of {published} messages, not {messages}")

    def window(self, messages: int) -> int:
        target = self.target
        if self.name in ("pub", "pub1"):
            frame = encode_pub(self.topic, self.body)
            return lockstep_publish(target, frame, PUB_CONNECTIONS, self.name == "pub", messages)
        if self.name == "mpub":
            return _publish(target, encode_mpub(self.topic, [self.body] * MPUB_BATCH), MPUB_BATCH, 4, messages)
        generators = Generators()
        generators.add(
            build_drainers,
            address=target.tcp,
            topic=self.topic,
            channel=self.channel,
            consumers=4,
            rdy=200,
            total=messages,
        )
        result = generators.run(warmup=0.0, duration=600.0)
        delivered = sum(role["counter"] for worker in result["workers"] for role in worker["roles"])
        # the last reads' FINs: the window ends when nsqd has taken them all
        deadline = time.monotonic() + 300
        while True:
            stats = _channel_stats(target, self.topic, self.channel)
            if not stats.get("in_flight_count") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if stats.get("in_flight_count") or stats.get("depth"):
            raise RuntimeError(f"the drain left messages behind: {stats}")
        return delivered


def _sizes(table: dict[str, tuple[int, int]], name: str) -> tuple[int, int]:
    small, large = table[name]
    step = MPUB_BATCH * 4 if name == "mpub" else PUB_CONNECTIONS
    return small // step * step, large // step * step


# -- callgrind --------------------------------------------------------------------------------------------


class Callgrind:
    """nsqd under ``valgrind --tool=callgrind``: its counters zeroed and dumped around each window."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pid: int | None = None

    def wrapper(self) -> list[str]:
        return ["valgrind", "--tool=callgrind", "-q", f"--callgrind-out-file={self.directory}/callgrind.out.%p"]

    def _control(self, option: str) -> None:
        subprocess.run(["callgrind_control", option, str(self.pid)], check=True, capture_output=True, timeout=120)

    def measure(self, work: Callable[[], int]) -> tuple[int, int, float, Path]:
        """(instructions, messages, seconds, dump) of ``work()``."""
        before = set(self.directory.glob(f"callgrind.out.{self.pid}.*"))
        self._control("-z")
        started = time.monotonic()
        messages = work()
        seconds = time.monotonic() - started
        self._control("-d")
        deadline = time.monotonic() + 120
        while True:
            new = set(self.directory.glob(f"callgrind.out.{self.pid}.*")) - before
            if new:
                dump = new.pop()
                instructions = _summary(dump)
                if instructions is not None:
                    return instructions, messages, seconds, dump
            if time.monotonic() > deadline:
                raise RuntimeError("callgrind wrote no dump")
            time.sleep(0.1)


def _summary(path: Path) -> int | None:
    """The instructions a callgrind dump counted (its ``summary:`` line); None while it is being written."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    return None


def _idle(seconds: float) -> int:
    time.sleep(seconds)
    return 0


def instruction_run(args, root: Path, code: str, workdir: Path) -> list[dict]:
    """One nsqd of the tree ``root`` under callgrind: the idle window, then each workload's warm-up, N1 and N2
    windows. Rows per workload with Ir/msg (raw and net of the idle rate)."""
    callgrind = Callgrind(workdir)
    rows = []
    with Target(
        args, FLAGS, root=root, want_http=True, wrapper=callgrind.wrapper(), start_timeout=args.start_timeout
    ) as target:
        callgrind.pid = target.pid
        time.sleep(1.0)
        idle_ir, _, idle_seconds, _ = callgrind.measure(functools.partial(_idle, args.idle))
        idle_rate = idle_ir / idle_seconds
        for name in args.workloads:
            workload = Workload(name, target, args.body_size)
            small, large = _sizes(IR_MESSAGES, name)
            windows = []
            for size in (small, small, large):
                workload.prepare(size)
                windows.append(callgrind.measure(functools.partial(workload.window, size)))
            (ir1, n1, t1, dump1), (ir2, n2, t2, dump2) = windows[1], windows[2]
            if args.keep_profiles:
                args.keep_profiles.mkdir(parents=True, exist_ok=True)
                for label, dump in (("small", dump1), ("large", dump2)):
                    shutil.copy(dump, args.keep_profiles / f"callgrind.{name}.{code.split()[0]}.{label}.{target.pid}")
            rows.append(
                {
                    "code": code,
                    "workload": name,
                    "messages": f"{n1}/{n2}",
                    "Ir/msg": (ir2 - ir1) / (n2 - n1),
                    "net Ir/msg": ((ir2 - idle_rate * t2) - (ir1 - idle_rate * t1)) / (n2 - n1),
                    "idle Ir/s": idle_rate,
                    "window s": f"{t1:.1f}/{t2:.1f}",
                }
            )
    return rows


# -- system calls at full speed ---------------------------------------------------------------------------


def syscall_run(args, root: Path, code: str) -> list[dict]:
    """One nsqd of the tree ``root`` at full speed: per workload, a warm-up window, then N1 and N2 windows with
    nsqd's system calls counted; rows with each group's calls per message."""
    rows = []
    with Target(args, FLAGS, root=root, want_http=True) as target:
        for name in args.workloads:
            workload = Workload(name, target, args.body_size)
            small, large = _sizes(SYSCALL_MESSAGES, name)
            counted = []
            for index, size in enumerate((small, small, large)):
                workload.prepare(size)
                counter = SyscallCounter(target.pid if index else None)
                counter.start()
                messages = workload.window(size)
                counter.stop()
                counted.append((counter.counts(), messages, counter.tool))
            (calls1, n1, tool), (calls2, n2, _) = counted[1], counted[2]
            row = {"code": code, "workload": name, "messages": f"{n1}/{n2}"}
            for group in SYSCALL_FIGURES:
                row[f"{group}/msg"] = (calls2[group] - calls1[group]) / (n2 - n1) if calls1 and calls2 else None
            row["syscall_tool"] = tool
            rows.append(row)
    return rows


# -- the report ----------------------------------------------------------------------------------------------


def _ordered(builds: list, turn: int) -> list:
    """ABBA: the builds in their order on even turns, reversed on odd ones."""
    return builds if turn % 2 == 0 else builds[::-1]


def combine(runs: dict[str, list[list[dict]]], figures: tuple[str, ...], builds: list[str]) -> list[dict]:
    """Per build and workload, the median of each figure over the runs and each run's value; then the later
    build's median over the earlier's."""
    rows = []
    medians: dict[tuple[str, str], dict] = {}
    for code in builds:
        for index, first in enumerate(runs[code][0]):
            row = {"code": code, "workload": first["workload"], "messages": first["messages"]}
            for key in figures:
                values = [run[index][key] for run in runs[code] if run[index].get(key) is not None]
                row[key] = statistics.median(values) if values else None
            lead = figures[0]
            row["each run"] = " ".join(
                f"{run[index][lead]:.4g}" for run in runs[code] if run[index].get(lead) is not None
            )
            for key in ("idle Ir/s", "syscall_tool"):
                if key in first:
                    row[key] = first[key]
            medians[(code, first["workload"])] = row
            rows.append(row)
    if len(builds) == 2:
        earlier, later = builds
        for (code, workload), row in list(medians.items()):
            if code != later:
                continue
            before = medians.get((earlier, workload))
            ratio = {"code": "later / earlier", "workload": workload}
            for key in figures:
                a, b = row.get(key), before.get(key) if before else None
                # a figure near nothing (a group of calls the workload does not make) gives no ratio
                ratio[key] = a / b if a is not None and b and abs(b) > 1e-3 else None
            rows.append(ratio)
    return rows


def run(args) -> Report:
    args.syscalls = False
    report = Report(
        NAME,
        TITLE,
        params={
            "against": args.against,
            "now": args.now,
            "workloads": args.workloads,
            "rounds": args.rounds,
            "body_size": args.body_size,
            "idle_s": args.idle,
            "ir_messages": {name: _sizes(IR_MESSAGES, name) for name in args.workloads},
            "syscall_messages": {name: _sizes(SYSCALL_MESSAGES, name) for name in args.workloads},
        },
    )
    if args.nsqd_tcp_address:
        report.skipped = "starts both builds itself: not with --nsqd-tcp-address"
        return report
    if args.instructions and not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        report.skipped = "valgrind (callgrind) is not installed"
        return report
    trees: list[Path] = []
    workdir = Path(tempfile.mkdtemp(prefix="trionsq-bench-callgrind-"))
    try:
        builds = extract_both(report, args.against, args.now, trees)
        if builds is None:
            return report
        codes = [code for code, _ in builds]
        if args.syscall_counts:
            calls: dict[str, list[list[dict]]] = {code: [] for code in codes}
            for turn in range(args.rounds):
                for code, root in _ordered(builds, turn):
                    calls[code].append(syscall_run(args, root, code))
            report.rows.extend(combine(calls, tuple(f"{group}/msg" for group in SYSCALL_FIGURES), codes))
        if args.instructions:
            runs: dict[str, list[list[dict]]] = {code: [] for code in codes}
            for turn in range(args.rounds):
                for code, root in _ordered(builds, turn):
                    runs[code].append(instruction_run(args, root, code, workdir))
            report.rows.extend(combine(runs, ("Ir/msg", "net Ir/msg"), codes))
    finally:
        for tree in trees:
            shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    report.notes.append(
        "Ir/msg: instructions nsqd executed in user space per message under callgrind (the difference of two "
        "windows over the difference of their sizes); net Ir/msg: less the idle rate times each window's length "
        "(the periodic loops, 50x dearer per message under callgrind than at full speed)"
    )
    report.notes.append(
        "under callgrind nsqd is ~50x slower than its clients: every step of its loop finds full batches"
    )
    report.notes.append("all/epoll/recv/send per msg: nsqd's system calls at full speed (syscall_tool), two windows")
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
