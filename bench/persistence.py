"""Persistence: what durable mode costs. Publish throughput per persistence mode, with a consumer.

Three nsqd configurations, each a fresh nsqd with its own data directory:

- ``default``: nsqd's defaults (``--mem-queue-size=10000``, ``--sync-every=2500``): messages stay in memory while
  the consumer keeps up; a crash loses what memory held.
- ``mem0``: ``--mem-queue-size=0``: every message goes through the topic's and the channel's disk queues, synced
  every 2500 operations or 2 s, as in nsqd.
- ``durable``: ``--mem-queue-size=0 --sync-every=1``: every publish is fsynced before its ``OK``, each copy to the
  channel is fsynced, and in-flight messages survive ``kill -9`` (DESIGN.md "Persistence").

Two workloads each: ``PUB`` (16 connections, one message per round trip) and ``MPUB`` (4 connections, batches of
100), 200-byte bodies, into a topic whose one channel is drained by one consumer at RDY 200 (FIN for every message,
one write per read). Figures: acknowledged publishes per second, deliveries per second over the same window, and
nsqd's CPU use. Run it as ``python -m bench.persistence``; it prints a table and writes
``bench/results/persistence.json``. The fsync cost depends on the disk under ``--data-path`` (a temporary directory
by default; ``TMPDIR`` moves it).
"""

from __future__ import annotations

from bench.common import Generators, Report, Target, main, unique_topic
from bench.load import Consumer, build_roles
from protocol.commands import encode_mpub, encode_pub

NAME = "persistence"
TITLE = "publish throughput per persistence mode (default, mem-queue-size=0, durable)"

MODES = {
    "default": [],
    "mem0": ["--mem-queue-size=0"],
    "durable": ["--mem-queue-size=0", "--sync-every=1"],
}


def add_arguments(parser) -> None:
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--pub-connections", type=int, default=16)
    parser.add_argument("--mpub-connections", type=int, default=4)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="measure each figure this many times and report the run with the median rate",
    )


def measure(args, target: Target, frame: bytes, per_frame: int, connections: int, sampler=None) -> dict:
    topic = unique_topic(NAME)
    frame = frame.replace(b"TOPIC", topic.encode(), 1)
    Consumer(target.tcp, topic, "bench", 0).sock.close()  # the channel exists before the first publish
    generators = Generators()
    generators.add(
        build_roles,
        specs=[
            ("pub", connections, dict(address=target.tcp, frame=frame, messages_per_frame=per_frame, outstanding=1))
        ],
    )
    generators.add(build_roles, specs=[("sub", 1, dict(address=target.tcp, topic=topic, channel="bench", rdy=200))])
    result = generators.run(warmup=args.warmup, duration=args.duration, sampler=sampler or target.sampler())
    window = result["window"]
    published, delivered = (sum(worker["window_counts"]) for worker in result["workers"])
    return {
        "pub msg/s": published / window,
        "delivered msg/s": delivered / window,
        "nsqd_cpu": result["nsqd_cpu_seconds"] / window if target.pid else None,
    }


def publish_workloads(args) -> list[tuple[str, bytes, int, int]]:
    """``(name, frame, messages per frame, connections)`` of the PUB and MPUB workloads (``TOPIC`` in the frame
    is replaced per run), from ``--body-size``, ``--batch``, ``--pub-connections`` and ``--mpub-connections``."""
    body = b"d" * args.body_size
    return [
        ("PUB", encode_pub("TOPIC", body), 1, args.pub_connections),
        (f"MPUB x{args.batch}", encode_mpub("TOPIC", [body] * args.batch), args.batch, args.mpub_connections),
    ]


def run(args) -> Report:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown mode(s): {', '.join(unknown)}")
    workloads = publish_workloads(args)
    report = Report(
        NAME,
        TITLE,
        params={
            "body_size": args.body_size,
            "pub_connections": args.pub_connections,
            "mpub_connections": args.mpub_connections,
            "batch": args.batch,
            "duration_s": args.duration,
            "repeat": args.repeat,
            "modes": {m: MODES[m] for m in modes},
        },
    )
    baseline: dict[str, float] = {}
    for mode in modes:
        with Target(args, MODES[mode]) as target:
            report.target = target.describe()
            for workload, frame, per_frame, connections in workloads:
                runs = sorted(
                    (measure(args, target, frame, per_frame, connections) for _ in range(max(args.repeat, 1))),
                    key=lambda r: r["pub msg/s"],
                )
                row = runs[len(runs) // 2]
                if mode == "default":
                    baseline[workload] = row["pub msg/s"]
                ratio = row["pub msg/s"] / baseline[workload] if baseline.get(workload) else None
                report.rows.append(
                    {"mode": mode, "workload": workload, "connections": connections, **row, "vs default": ratio}
                )
    report.notes.append(
        "durable = --mem-queue-size=0 --sync-every=1: an OK means the message is fsynced, and "
        "messages in flight at a crash are delivered again"
    )
    report.notes.append("cpu column: cores used by nsqd (1.0 = one core); load and nsqd share the machine")
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
