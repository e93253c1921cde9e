"""Scenario 7: memory, resident bytes per message over its body with 0, 1 and 4 channels, queued, in flight
and deferred; with the CPU figures of pub, mpub and consume beside them, and optionally the code before.

Each row starts its own nsqd (``--mem-queue-size`` above the message count, so everything stays in memory),
makes the topic's channels (a consumer subscribes once and leaves), reads the resident set (VmRSS), then:

- ``queued``: publishes ``--messages`` bodies of ``--body-size`` bytes with pipelined MPUBs (the channels keep
  them, or the topic when it has none);
- ``in flight``: the same, then one consumer per channel takes all of them at RDY = ``--messages`` and never
  answers (``--msg-timeout`` long enough that none comes back during the reading); the consumers leave before
  the reading, their messages stay in flight as nsqd keeps them;
- ``deferred``: publishes them with pipelined ``DPUB``\\ s due in 50 minutes (the channels' deferred heaps, or the
  topic's queue).

and reads the resident set again after ``--settle`` seconds. ``overhead/msg`` is the growth per message minus the
body: what a message costs besides its bytes, the figure issue 41 is about (nsqd 1.3.0: about 141 with no
channel). ``python -m bench.memory_parts`` says where those bytes go, part by part.

Beside them, unless ``--no-cpu``: nsqd's CPU per message of ``pub`` (16 connections, one PUB in flight each),
``mpub`` (200 per batch, 4 connections) and ``consume`` (a ``--cpu-backlog`` of messages in memory, 4 consumers
at RDY 200), over ``--duration`` seconds each, ``--rounds`` times (medians). Needs the server's pid (own nsqd).

With ``--against REV`` every row is made for that revision too, and the two builds are made alike: each is taken
from git (``git archive``; the later one is the working tree's tracked files as they are, or ``--now REV``) into
a directory of its own, its C accelerator compiled there with the same flags and its modules byte-compiled
(``bench.pub_against.extract``), and both run with this venv's Python and this tree's load generator. Each
scenario's two runs of a round come back to back, and which goes first alternates, ABBA: in round 1 the earlier
build runs ``pub`` first, the later build ``mpub`` first, and so on, the other way round in round 2 (so run an
even number of ``--rounds``); the memory rows alternate the same way from row to row. Each CPU figure is the
median over the rounds, and ``vs before`` the median of the rounds' ratios (later / earlier, each from the two
runs of one round, next to each other in time). ``--against HEAD`` with a clean tree compares the same code with
itself: its ratios, near 1.00, are what the harness and the machine's noise give.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

from bench.common import REPO_ROOT, Generators, Report, Target, main, unique_topic
from bench.consume import create_channel, drain, prefill
from bench.load import build_roles
from bench.pub import publish_rate
from bench.pub_against import extract_both
from protocol.commands import encode_dpub, encode_mpub, encode_pub

NAME = "memory"
TITLE = "resident bytes per message over its body: 0, 1 and 4 channels; queued, in flight, deferred"
STATES = ("queued", "in flight", "deferred")
#: the delay of the deferred rows: far beyond the measurement, within nsqd's default --max-req-timeout (1h)
DEFER_MS = 3_000_000


def add_arguments(parser) -> None:
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait before each reading")
    parser.add_argument("--channels", type=int, nargs="+", default=[0, 1, 4])
    parser.add_argument("--states", nargs="+", choices=STATES, default=list(STATES))
    parser.add_argument("--no-cpu", dest="cpu", action="store_false", help="leave out pub, mpub and consume")
    parser.add_argument("--cpu-backlog", type=int, default=300_000, help="the consume row's backlog")
    parser.add_argument("--against", help="a git revision to measure too, alternated (e.g. the code before)")
    parser.add_argument(
        "--now", help="with --against: the later git revision (default: the working tree's tracked files)"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs of each CPU row per build (medians; ABBA order with --against)"
    )


def _flags(args) -> list[str]:
    return [
        f"--mem-queue-size={args.messages + 100_000}",
        f"--max-rdy-count={max(args.messages, 2500)}",
        "--msg-timeout=14m",
    ]


def prefill_deferred(target: Target, topic: str, messages: int, body_size: int, limit: float = 300.0) -> int:
    """Publish ``messages`` DPUBs, 64 in flight on each of two connections; returns how many were acknowledged."""
    frame = encode_dpub(topic, DEFER_MS, b"d" * body_size)
    generators = Generators()
    per = -(-messages // 2)
    specs = [
        ("pub", 1, dict(address=target.tcp, frame=frame, messages_per_frame=1, outstanding=64, frames=count))
        for count in (per, messages - per)
        if count > 0
    ]
    generators.add(build_roles, specs=specs)
    result = generators.run(warmup=0.0, duration=limit)
    return sum(role["counter"] for worker in result["workers"] for role in worker["roles"])


def hold_in_flight(target: Target, topic: str, channels: list[str], rdy: int, limit: float = 300.0) -> int:
    """One consumer per channel takes everything (RDY ``rdy``) and answers nothing; returns how many arrived."""
    generators = Generators()
    specs = [
        ("sub", 1, dict(address=target.tcp, topic=topic, channel=name, rdy=rdy, idle_stop=1.0, fin=False))
        for name in channels
    ]
    generators.add(build_roles, specs=specs)
    result = generators.run(warmup=0.0, duration=limit)
    return sum(role["counter"] for worker in result["workers"] for role in worker["roles"])


def measure(args, root: Path, code: str, channels: int, state: str) -> dict:
    """One row: a fresh nsqd of the tree ``root``, its resident growth per message in ``state``."""
    with Target(args, _flags(args), root=root) as target:
        sampler = target.sampler()
        topic = unique_topic(NAME)
        names = [f"c{index}" for index in range(channels)]
        for name in names:
            create_channel(target, topic, name)
        time.sleep(args.settle)
        before = sampler.rss_bytes()
        if state == "deferred":
            published = prefill_deferred(target, topic, args.messages, args.body_size)
        else:
            published = prefill(target, topic, args.messages, args.body_size)
        delivered = None
        if state == "in flight":
            delivered = hold_in_flight(target, topic, names, args.messages)
        time.sleep(args.settle)
        after = sampler.rss_bytes()
    per_message = (after - before) / published if published else 0.0
    row = {
        "code": code,
        "channels": channels,
        "state": state,
        "messages": published,
        "rss_before_MB": before / 1e6,
        "rss_after_MB": after / 1e6,
        "bytes/msg": per_message,
        "overhead/msg": per_message - args.body_size,
    }
    if delivered is not None and delivered < published * channels:
        row["note"] = f"only {delivered} of {published * channels} deliveries"
    return row


#: the CPU rows, each a fresh nsqd
CPU_SCENARIOS = ("pub", "mpub", "consume")


def cpu_row(args, root: Path, code: str, scenario: str) -> dict:
    """nsqd's CPU per message of ``scenario`` (one of ``CPU_SCENARIOS``) on the tree ``root``."""
    body = b"p" * args.body_size
    if scenario != "consume":
        flags = [f"--mem-queue-size={max(args.cpu_backlog, 1_000_000) * 20}"]
        with Target(args, flags, root=root) as target:
            if scenario == "pub":
                row = publish_rate(args, target, encode_pub(unique_topic("pub"), body), 1, 16, 1)
            else:
                row = publish_rate(args, target, encode_mpub(unique_topic("mpub"), [body] * 200), 200, 4, 1)
        return {"code": code, "scenario": scenario, **_cpu_figures(row)}
    with Target(args, [f"--mem-queue-size={args.cpu_backlog + 100_000}"], root=root) as target:
        topic = unique_topic("consume")
        create_channel(target, topic, "bench")
        published = prefill(target, topic, args.cpu_backlog, args.body_size)
        sampler = target.sampler()
        cpu_before = sampler.cpu_seconds()
        result = drain(target, topic, "bench", 4, 200, 1)
        used = sampler.cpu_seconds() - cpu_before
    return {
        "code": code,
        "scenario": "consume",
        "msg/s": result["msg/s"],
        "nsqd_us/msg": used * 1e6 / result["delivered"] if result["delivered"] else None,
        "messages": published,
    }


def _cpu_figures(row: dict) -> dict:
    return {"msg/s": row["msg/s"], "nsqd_us/msg": row["nsqd_us/msg"]}


def _medians(runs: list[list[dict]]) -> list[dict]:
    """Per scenario, the median of each figure over the runs (the first run's other keys)."""
    merged = []
    for index, first in enumerate(runs[0]):
        row = dict(first)
        for key in ("msg/s", "nsqd_us/msg"):
            values = [run[index][key] for run in runs if run[index].get(key) is not None]
            row[key] = statistics.median(values) if values else None
        row["runs"] = len(runs)
        row["each run us/msg"] = " ".join(_figure(run[index].get("nsqd_us/msg")) for run in runs)
        merged.append(row)
    return merged


def _ratios(later: list[list[dict]], earlier: list[list[dict]]) -> list[dict]:
    """Per scenario, the later build's CPU per message over the earlier's in each round, and their median."""
    rows = []
    for index, first in enumerate(later[0]):
        ratios = []
        for now, before in zip(later, earlier, strict=True):
            a, b = now[index].get("nsqd_us/msg"), before[index].get("nsqd_us/msg")
            if a is not None and b:
                ratios.append(a / b)
        rows.append(
            {
                "code": "later / earlier",
                "scenario": first["scenario"],
                "vs before": statistics.median(ratios) if ratios else None,
                "each round": " ".join(f"{ratio:.2f}" for ratio in ratios),
            }
        )
    return rows


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _ordered(builds: list[tuple[str, Path]], turn: int) -> list[tuple[str, Path]]:
    """ABBA: the builds in their order on even turns, reversed on odd ones."""
    return builds if turn % 2 == 0 else builds[::-1]


def run(args) -> Report:
    args.syscalls = False
    report = Report(
        NAME,
        TITLE,
        params={
            "messages": args.messages,
            "body_size": args.body_size,
            "channels": args.channels,
            "states": args.states,
            "cpu": args.cpu,
            "cpu_backlog": args.cpu_backlog,
            "duration_s": args.duration,
            "against": args.against,
            "rounds": args.rounds,
            "now": args.now,
        },
    )
    if args.nsqd_tcp_address:
        report.skipped = "starts its own nsqd for each row: not with --nsqd-tcp-address"
        return report
    builds = [("now", REPO_ROOT)]
    trees: list[Path] = []
    try:
        if args.against:
            both = extract_both(report, args.against, args.now, trees)
            if both is None:
                return report
            builds = both
        turn = 0
        for channels in args.channels:
            for state in args.states:
                if state == "in flight" and not channels:
                    continue
                for code, root in _ordered(builds, turn):
                    report.rows.append(measure(args, root, code, channels, state))
                turn += 1
        if args.cpu:
            # each scenario's two runs of a round back to back, so that the pair meets the same load of the
            # machine; which build goes first alternates from scenario to scenario and from round to round
            runs: dict[str, list[list[dict]]] = {code: [] for code, _ in builds}
            for turn in range(args.rounds):
                for code, _ in builds:
                    runs[code].append([])
                for index, scenario in enumerate(CPU_SCENARIOS):
                    for code, root in _ordered(builds, turn + index):
                        runs[code][-1].append(cpu_row(args, root, code, scenario))
            for code, _ in builds:
                report.rows.extend(_medians(runs[code]))
            if len(builds) == 2:
                report.rows.extend(_ratios(runs[builds[1][0]], runs[builds[0][0]]))
    finally:
        for tree in trees:
            shutil.rmtree(tree, ignore_errors=True)
    report.targets = {"overhead/msg": "<= 70 bytes queued at 0 and 4 channels (half of nsqd 1.3.0's ~141)"}
    report.notes.append(
        "overhead/msg: the resident growth per message minus its body; in flight and deferred rows include "
        "the message itself (queued, then delivered or due later)"
    )
    report.notes.append("nsqd_us/msg: nsqd's CPU time per message (user + system) over the run")
    report.notes.append(
        "CPython keeps freed memory in its allocator's arenas: each row has its own nsqd, so none reuses another's"
    )
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
