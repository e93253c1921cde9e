"""Scenario 2: TCP ``MPUB``, 200 messages of 200 bytes per batch, 4 connections.

Each connection keeps one MPUB in flight (``--outstanding`` to pipeline more), as NSQ's
``bench_writer`` does. No channel: the publish path alone, with nothing written to disk.
Figures: acknowledged messages per second and payload MB/s.
"""

from __future__ import annotations

from bench.common import Report, Target, main, unique_topic
from bench.pub import MEM_QUEUE_SIZE, publish_rate
from protocol.commands import encode_mpub

NAME = "mpub"
TITLE = "TCP MPUB, 200 messages per batch"


def add_arguments(parser) -> None:
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--outstanding", type=int, default=1, help="MPUBs in flight per connection")
    parser.add_argument("--processes", type=int, default=1, help="generator processes (at most one per core)")


def run(args) -> Report:
    report = Report(
        NAME,
        TITLE,
        params={
            "connections": args.connections,
            "batch": args.batch,
            "body_size": args.body_size,
            "outstanding": args.outstanding,
            "processes": args.processes,
            "duration_s": args.duration,
        },
    )
    with Target(args, [f"--mem-queue-size={MEM_QUEUE_SIZE}"]) as target:
        report.target = target.describe()
        frame = encode_mpub(unique_topic(NAME), [b"m" * args.body_size] * args.batch)
        row = publish_rate(args, target, frame, args.batch, args.connections, args.processes, args.outstanding)
        row["MB/s"] = row["msg/s"] * args.body_size / 1e6
        report.rows.append({"connections": args.connections, "batch": args.batch, **row})
    report.targets = {"msg/s": ">= 300,000 (real nsqd 1.3.0: ~600,000)"}
    report.notes.append("MB/s counts message bodies only")
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
