"""Scenario 1: TCP ``PUB``, one message per round trip per connection (16 connections, 200-byte bodies).

Each connection keeps exactly one PUB in flight and sends the next one when the OK arrives, like
NSQ's ``bench_writer`` with a batch size of 1. The topic has no channel, so what is measured is the
publish path alone; nsqd is started with a ``--mem-queue-size`` large enough that nothing is
written to disk during the run. Figure: acknowledged messages per second.
"""

from __future__ import annotations

from bench.common import BREAKDOWN_NOTE, Report, Target, main, run_spread, unique_topic
from protocol.commands import encode_pub

NAME = "pub"
TITLE = "TCP PUB, one message per round trip"
MEM_QUEUE_SIZE = 20_000_000
#: unpinned unless ``--pin`` (or BENCH_PIN=1): users do not pin nsqd, and one round trip at a time is where
#: pinning changes the most (see bench/README.md, "Pinning")
PIN = False


def add_arguments(parser) -> None:
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--processes", type=int, default=1, help="generator processes (at most one per core)")


def publish_rate(
    args,
    target: Target,
    frame: bytes,
    messages_per_frame: int,
    connections: int,
    processes: int,
    outstanding: int = 1,
    *,
    breakdown: bool = False,
) -> dict:
    """Run ``connections`` publishers of ``frame`` for the window; the measured figures as a row (with
    ``breakdown``, the round trip part by part: ``common.per_message_breakdown``)."""
    run = run_spread(
        args,
        target,
        "pub",
        connections,
        processes,
        dict(address=target.tcp, frame=frame, messages_per_frame=messages_per_frame, outstanding=outstanding),
        breakdown=breakdown and bool(target.pid),
    )
    return {
        "msg/s": run.messages / run.window,
        "nsqd_cpu": run.nsqd_cpu / run.window if target.pid else None,
        "nsqd_us/msg": run.nsqd_cpu * 1e6 / run.messages if target.pid and run.messages else None,
        **run.breakdown,
        "generator_cpu": run.generator_cpu / run.window,
    }


def run(args) -> Report:
    report = Report(
        NAME,
        TITLE,
        params={
            "connections": args.connections,
            "body_size": args.body_size,
            "processes": args.processes,
            "duration_s": args.duration,
        },
    )
    with Target(args, [f"--mem-queue-size={MEM_QUEUE_SIZE}"]) as target:
        report.target = target.describe()
        frame = encode_pub(unique_topic(NAME), b"p" * args.body_size)
        row = publish_rate(args, target, frame, 1, args.connections, args.processes, breakdown=True)
        report.rows.append({"connections": args.connections, **row})
    report.targets = {"msg/s": ">= 40,000 (real nsqd 1.3.0: ~86,000)"}
    report.notes.append("cpu columns are cores used (1.0 = one core busy); load and nsqd share 2 cores")
    report.notes.append(BREAKDOWN_NOTE)
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
