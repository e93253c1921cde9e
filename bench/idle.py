"""Scenario: what an idle nsqd costs, with ``--workers=1`` and ``--workers=2`` alternated (``--against``: another
revision's nsqd too, before this one's for each count).

Each run starts nsqd, creates a few topics with a channel each (so that every worker owns some), publishes one
message to each and consumes it (so that every loop has run once), closes every connection, waits ``--settle``
seconds, then reads each nsqd process's CPU time and context switches over ``--seconds`` (``_sample``): CPU
milliseconds a second, and the event loop's voluntary context switches a second (each a sleep that ended: a
wake-up of the process). With more than one worker, the parent (which waits for its workers) and each worker
get a row too. An idle node's CPU is what every worker of a busy node that owns no busy topic spends meanwhile,
on a core its busy peers or their clients may want.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time

from bench.common import Report, Target, _children, main, unique_topic
from bench.load import Consumer, connect
from bench.pub_against import codes_against
from protocol.commands import MAGIC_V2, encode_pub

NAME = "idle"
TITLE = "an idle nsqd's CPU and wake-ups a second, --workers=1 and --workers=2 alternated"
PIN = False
TOPICS = 8


def add_arguments(parser) -> None:
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--counts", default="1,2", help="the --workers values, comma separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="the idle window measured")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds idle before the window")
    parser.add_argument("--against", default="", help="a git revision to run too, before this code for each count")


def _sample(pid: int) -> tuple[dict[str, int], int]:
    """The CPU nanoseconds of each thread of ``pid`` (the scheduler's, ``/proc/<pid>/task/*/schedstat``: the clock
    ticks of ``/proc/<pid>/stat`` are 10 ms, as much as an idle node now spends in seconds), and the voluntary
    context switches of its main thread, the one that runs the event loop."""
    threads: dict[str, int] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return threads, 0
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                threads[task] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            pass
    switches = 0
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                switches = int(line.split()[1])
    return threads, switches


def _cpu_between(before: dict[str, int], after: dict[str, int]) -> float:
    """CPU seconds of the threads between two samples: a thread that ended meanwhile (trio's cache lets an idle
    thread go after 10 s) takes its time with it, so only the threads alive at the end count, each from its
    first sample (or from its start)."""
    return sum(ns - before.get(task, 0) for task, ns in after.items()) / 1e9


def _touch(target: Target) -> None:
    """A topic and channel per slot, one message through each (published, delivered, finished), every connection
    closed."""
    for n in range(TOPICS):
        topic = unique_topic(f"idle{n}")
        consumer = Consumer(target.tcp, topic, "c", 0)
        with connect(target.tcp) as producer:
            producer.sendall(MAGIC_V2 + encode_pub(topic, b"x"))
            producer.recv(64)
        consumer.set_ready(1)
        deadline = time.monotonic() + 10
        while not consumer.counter and time.monotonic() < deadline:
            consumer.on_readable()
        consumer.sock.close()


def measure(args, target: Target) -> list[dict]:
    """Rows of one idle window: the node, then (with workers) the parent and each worker."""
    _touch(target)
    time.sleep(args.settle)
    pids = [target.pid, *_children(target.pid)]
    before = [_sample(pid) for pid in pids]
    start = time.monotonic()
    time.sleep(args.seconds)
    window = time.monotonic() - start
    after = [_sample(pid) for pid in pids]
    parts = [
        {"cpu ms/s": _cpu_between(b[0], a[0]) * 1000 / window, "wake-ups/s": (a[1] - b[1]) / window}
        for b, a in zip(before, after, strict=True)
    ]
    node = {key: sum(part[key] for part in parts) for key in ("cpu ms/s", "wake-ups/s")}
    rows = [{"process": "node", **node}]
    if len(parts) > 1:
        rows.append({"process": "parent", **parts[0]})
        rows += [{"process": f"worker {n}", **part} for n, part in enumerate(parts[1:])]
    return rows


def run(args) -> Report:
    counts = [int(text) for text in args.counts.split(",")]
    report = Report(NAME, TITLE, params={"rounds": args.rounds, "seconds": args.seconds, "topics": TOPICS})
    codes = codes_against(report, args.against)
    try:
        for round_number in range(1, args.rounds + 1):
            for workers in counts:
                for code, root in codes:
                    args.nsqd_root = root
                    with Target(args, [f"--workers={workers}"]) as target:
                        for row in measure(args, target):
                            report.rows.append({"round": round_number, "code": code, "workers": workers, **row})
    finally:
        for _, tree in codes:
            if tree is not None:
                shutil.rmtree(tree, ignore_errors=True)
    report.notes.append(
        "cpu ms/s: every thread's time on a CPU (schedstat); wake-ups/s: the main thread's voluntary "
        "context switches a second"
    )
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
