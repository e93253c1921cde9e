"""Scenario 5: end-to-end latency, publish to delivery, at fixed rates (1k, 10k, 50k messages/s).

One generator process publishes at a fixed rate (every millisecond, the messages due as one MPUB,
or a PUB when one is due) with ``time.monotonic_ns()`` written into the first 8 bytes of each
200-byte body just before the send, and consumes the channel with ``--consumers`` connections
that FIN at once. Latency = read time - stamp, per message, for the messages read in the window;
the clock is system-wide, so the figure is the same whichever process reads it. Figures: p50,
p99 and p99.9 in milliseconds, and the delivered rate (to check the rate was held). nsqd gets a
``--mem-queue-size`` of 1,000,000 so that a stall of the shared machine does not spill the channel to
its disk queue: this is the memory path's latency.
"""

from __future__ import annotations

from bench.common import (
    BREAKDOWN_NOTE,
    Generators,
    Report,
    Target,
    main,
    per_message_breakdown,
    percentile,
    unique_topic,
)
from bench.consume import create_channel
from bench.load import build_roles

NAME = "latency"
TITLE = "end-to-end latency at fixed publish rates"
PIN = False  # as users run nsqd; ``--pin`` for the pinned figures
#: a hiccup of the machine must not push the channel over to its disk queue: this measures the memory path
MEM_QUEUE_SIZE = 1_000_000


def add_arguments(parser) -> None:
    parser.add_argument("--rates", default="1000,10000,50000", help="comma-separated messages/s")
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--rdy", type=int, default=500)
    parser.add_argument("--body-size", type=int, default=200)


def measure(
    args, target: Target, rate: float, topic: str | None = None, extra_specs=None, breakdown: bool = False
) -> dict:
    """Latency percentiles of one fixed-rate run (used by the isolation scenario too); with ``breakdown``, nsqd's
    costs per delivered message (``common.per_message_breakdown``)."""
    topic = topic or unique_topic(NAME)
    create_channel(target, topic, "bench")
    generators = Generators(count_syscalls=breakdown and bool(target.pid))
    generators.add(
        build_roles,
        specs=[
            ("paced", 1, dict(address=target.tcp, topic=topic, rate=rate, body_size=args.body_size)),
            ("sub", args.consumers, dict(address=target.tcp, topic=topic, channel="bench", rdy=args.rdy, latency=True)),
        ],
    )
    for specs in extra_specs or ():
        generators.add(build_roles, specs=specs)
    result = generators.run(warmup=args.warmup, duration=args.duration, sampler=target.sampler())
    latency_worker = result["workers"][0]
    samples = sorted(v for role in latency_worker["roles"] for v in role.get("latencies", ()))
    delivered = sum(
        c
        for role, c in zip(latency_worker["roles"], latency_worker["window_counts"], strict=True)
        if role["kind"] == "Consumer"
    )

    def ms(fraction):
        value = percentile(samples, fraction)
        return None if value is None else value / 1e6

    return {
        "rate": rate,
        "delivered msg/s": delivered / result["window"],
        "p50 ms": ms(0.50),
        "p99 ms": ms(0.99),
        "p99.9 ms": ms(0.999),
        "max ms": samples[-1] / 1e6 if samples else None,
        "samples": len(samples),
        "nsqd_cpu": result["nsqd_cpu_seconds"] / result["window"] if target.pid else None,
        "nsqd_us/msg": result["nsqd_cpu_seconds"] * 1e6 / delivered if target.pid and delivered else None,
        **(per_message_breakdown(result, delivered) if breakdown and target.pid else {}),
        "generator_cpu": latency_worker["cpu_seconds"] / result["window"],
        "_result": result,
    }


def run(args) -> Report:
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    report = Report(
        NAME,
        TITLE,
        params={
            "rates": rates,
            "consumers": args.consumers,
            "rdy": args.rdy,
            "body_size": args.body_size,
            "duration_s": args.duration,
        },
    )
    with Target(args, [f"--mem-queue-size={MEM_QUEUE_SIZE}"]) as target:
        report.target = target.describe()
        for rate in rates:
            row = measure(args, target, rate, breakdown=True)
            row.pop("_result")
            report.rows.append(row)
    report.targets = {"p99 at 10k msg/s": "<= 5 ms"}
    report.notes.append("publishing is paced in 1 ms ticks: the messages of one tick leave as one MPUB")
    report.notes.append(BREAKDOWN_NOTE + "; per message delivered")
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
