"""Scenario 7: memory, resident set per million 200-byte messages queued in memory, and after they drain.

nsqd is started with ``--mem-queue-size`` above the message count, so every message stays in
memory. The topic has one channel (the usual shape: the topic hands its messages to the channel,
which holds them). Figures: the resident set (VmRSS from /proc) before publishing, with the
messages queued, and after a consumer has drained them; ``bytes/msg`` is the growth per queued
message and ``overhead/msg`` that minus the body. Needs the server's pid (own nsqd, or
``--nsqd-pid``).
"""

from __future__ import annotations

import time

from bench.common import Report, Target, main, unique_topic
from bench.consume import create_channel, drain, prefill

NAME = "memory"
TITLE = "resident memory per million queued 200-byte messages"


def add_arguments(parser) -> None:
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait before each reading")


def run(args) -> Report:
    report = Report(NAME, TITLE, params={"messages": args.messages, "body_size": args.body_size})
    with Target(args, [f"--mem-queue-size={args.messages + 100_000}"]) as target:
        report.target = target.describe()
        sampler = target.sampler()
        if not sampler.rss_bytes():
            report.skipped = "the server's resident set cannot be read (give --nsqd-pid for a server started elsewhere)"
            return report
        topic = unique_topic(NAME)
        create_channel(target, topic, "bench")
        time.sleep(args.settle)
        before = sampler.rss_bytes()
        published = prefill(target, topic, args.messages, args.body_size)
        time.sleep(args.settle)
        queued = sampler.rss_bytes()
        result = drain(target, topic, "bench", 4, 200, 1)
        time.sleep(args.settle)
        after = sampler.rss_bytes()
        per_message = (queued - before) / published if published else 0.0
        report.rows.append(
            {
                "messages": published,
                "rss_before_MB": before / 1e6,
                "rss_queued_MB": queued / 1e6,
                "rss_drained_MB": after / 1e6,
                "bytes/msg": per_message,
                "overhead/msg": per_message - args.body_size,
                "MB per million": per_message,
            }
        )
        if result["delivered"] < published:
            report.notes.append(f"only {result['delivered']} of {published} messages drained")
    report.targets = {"overhead/msg": "<= 600 bytes"}
    report.notes.append("'MB per million' = bytes/msg: the resident growth for 1,000,000 queued messages, in MB")
    report.notes.append(
        "after the drain, CPython keeps freed memory in its allocator's arenas unless whole "
        "arenas empty, so the drained figure shows what the process holds, not what it uses"
    )
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
