"""Scenario 4: publish and consume at the same time, in and out messages per second.

Publishers send MPUB batches (200 x 200 bytes, ``--publishers`` connections, one batch in flight
each) into a topic whose channel is consumed by ``--consumers`` connections at RDY 200 that FIN
every message (one write per read). Both sides are measured over the same window; a steady state
has ``out`` close to ``in``. By default one generator process drives both sides (the machine has
two cores: one for nsqd, one for the load).
"""

from __future__ import annotations

from bench.common import BREAKDOWN_NOTE, Generators, Report, Target, main, per_message_breakdown, unique_topic
from bench.consume import create_channel
from bench.load import build_roles
from bench.pub import MEM_QUEUE_SIZE
from protocol.commands import encode_mpub

NAME = "pubsub"
TITLE = "publish and consume at the same time"
PIN = False  # as users run nsqd; ``--pin`` for the pinned figures


def add_arguments(parser) -> None:
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--outstanding", type=int, default=1, help="MPUBs in flight per publisher")
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--rdy", type=int, default=200)
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        choices=(1, 2),
        help="1: one process for both sides; 2: publishers and consumers apart",
    )


def run(args) -> Report:
    report = Report(
        NAME,
        TITLE,
        params={
            k: getattr(args, k)
            for k in ("publishers", "batch", "outstanding", "consumers", "rdy", "body_size", "processes", "duration")
        },
    )
    with Target(args, [f"--mem-queue-size={MEM_QUEUE_SIZE}"]) as target:
        report.target = target.describe()
        topic = unique_topic(NAME)
        create_channel(target, topic, "bench")
        frame = encode_mpub(topic, [b"s" * args.body_size] * args.batch)
        pubs = (
            "pub",
            args.publishers,
            dict(address=target.tcp, frame=frame, messages_per_frame=args.batch, outstanding=args.outstanding),
        )
        subs = ("sub", args.consumers, dict(address=target.tcp, topic=topic, channel="bench", rdy=args.rdy))
        generators = Generators(count_syscalls=bool(target.pid))
        if args.processes == 1:
            generators.add(build_roles, specs=[pubs, subs])
        else:
            generators.add(build_roles, specs=[pubs])
            generators.add(build_roles, specs=[subs])
        result = generators.run(warmup=args.warmup, duration=args.duration, sampler=target.sampler())
        window = result["window"]
        published = delivered = 0
        for worker in result["workers"]:
            for role, count in zip(worker["roles"], worker["window_counts"], strict=True):
                if role["kind"] == "Publisher":
                    published += count
                else:
                    delivered += count
        report.rows.append(
            {
                "publishers": args.publishers,
                "consumers": args.consumers,
                "in msg/s": published / window,
                "out msg/s": delivered / window,
                "nsqd_cpu": result["nsqd_cpu_seconds"] / window if target.pid else None,
                "nsqd_us/msg": (
                    result["nsqd_cpu_seconds"] * 1e6 / (published + delivered) * 2
                    if target.pid and published + delivered
                    else None
                ),
                # per message in + out, as nsqd_us/msg
                **(per_message_breakdown(result, (published + delivered) / 2) if target.pid else {}),
                "generator_cpu": sum(w["cpu_seconds"] for w in result["workers"]) / window,
            }
        )
    report.targets = {"in and out msg/s": ">= 150,000 each"}
    report.notes.append("nsqd_us/msg: nsqd CPU per message published and delivered (one in + one out)")
    report.notes.append(BREAKDOWN_NOTE + "; per message in + out")
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
