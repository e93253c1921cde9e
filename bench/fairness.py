"""Scenario 8: fairness between two channels of one backlogged topic, 100 consumers against 2.

Both channels exist before the backlog is published, so each holds a full copy. Channel ``many``
gets ``--many`` consumers at RDY ``--many-rdy``, channel ``few`` gets ``--few`` consumers at RDY
``--few-rdy``; by default both channels have the same in-flight window (100 x 50 = 2 x 2500), so
the consumers are never what limits a channel and the figure shows nsqd's share-out. Every
consumer FINs at once. Figures over the window: each channel's delivered rate, their ratio, and
Jain's fairness index (1.0 = equal shares, 0.5 = one channel gets everything).
"""

from __future__ import annotations

from bench.common import Generators, Report, Target, jain_index, main, unique_topic
from bench.consume import create_channel, prefill
from bench.load import build_roles

NAME = "fairness"
TITLE = "two backlogged channels, 100 consumers against 2"


def add_arguments(parser) -> None:
    parser.add_argument("--backlog", type=int, default=4_000_000)
    parser.add_argument("--many", type=int, default=100)
    parser.add_argument("--many-rdy", type=int, default=50)
    parser.add_argument("--few", type=int, default=2)
    parser.add_argument("--few-rdy", type=int, default=2500)
    parser.add_argument("--body-size", type=int, default=200)


def run(args) -> Report:
    report = Report(
        NAME,
        TITLE,
        params={
            k: getattr(args, k) for k in ("backlog", "many", "many_rdy", "few", "few_rdy", "body_size", "duration")
        },
    )
    with Target(args, [f"--mem-queue-size={args.backlog + 100_000}"]) as target:
        report.target = target.describe()
        topic = unique_topic(NAME)
        create_channel(target, topic, "many")
        create_channel(target, topic, "few")
        published = prefill(target, topic, args.backlog, args.body_size)
        generators = Generators()
        generators.add(
            build_roles,
            specs=[
                ("sub", args.few, dict(address=target.tcp, topic=topic, channel="few", rdy=args.few_rdy)),
                ("sub", args.many, dict(address=target.tcp, topic=topic, channel="many", rdy=args.many_rdy)),
            ],
        )
        result = generators.run(warmup=args.warmup, duration=args.duration, sampler=target.sampler())
        window = result["window"]
        worker = result["workers"][0]
        few = sum(worker["window_counts"][: args.few]) / window
        many = sum(worker["window_counts"][args.few :]) / window
        finals = worker["final_counts"]
        exhausted = sum(finals[: args.few]) >= published or sum(finals[args.few :]) >= published
        report.rows.append(
            {
                "backlog": published,
                f"many ({args.many} consumers) msg/s": many,
                f"few ({args.few} consumers) msg/s": few,
                "few/many": few / many if many else None,
                "jain": jain_index([many, few]),
                "nsqd_cpu": result["nsqd_cpu_seconds"] / window if target.pid else None,
            }
        )
        if exhausted:
            report.notes.append("a channel ran out of backlog before the window ended: raise --backlog")
    report.targets = {"jain": ">= 0.95"}
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
