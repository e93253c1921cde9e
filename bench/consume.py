"""Scenario 3: consume a backlog of 1,000,000 messages with 4 consumers at RDY 200.

The backlog is published first (MPUB, before any consumer connects) into a channel that already
exists, then 4 consumers subscribe and FIN everything; each read's messages are answered with one
write. Figure: messages delivered per second between the first and the last delivery.
By default nsqd keeps the whole backlog in memory (``--mem-queue-size`` above the backlog);
``--on-disk`` runs it with nsqd's default memory queue (10,000) so nearly all of it is read back
from the channel's disk queue.
"""

from __future__ import annotations

from collections import Counter

from bench.common import Generators, Report, Target, WorkerWindow, main, unique_topic
from bench.load import Consumer, build_roles
from protocol.commands import encode_mpub

NAME = "consume"
TITLE = "consume a 1,000,000-message backlog, 4 consumers at RDY 200"


def add_arguments(parser) -> None:
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--rdy", type=int, default=200)
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--on-disk", action="store_true", help="let the backlog spill to disk")
    parser.add_argument("--processes", type=int, default=1, help="consumer processes (at most one per core)")


def create_channel(target: Target, topic: str, channel: str) -> None:
    """SUB once and leave: the (non-ephemeral) channel stays, so a later backlog is copied to it."""
    Consumer(target.tcp, topic, channel, 0).sock.close()


def prefill(
    target: Target,
    topic: str,
    messages: int,
    body_size: int,
    batch: int = 200,
    connections: int = 2,
    limit: float = 300.0,
) -> int:
    """Publish ``messages`` bodies with pipelined MPUBs as fast as nsqd takes them; returns how many."""
    frame = encode_mpub(topic, [b"c" * body_size] * batch)
    frames = -(-messages // batch)
    generators = Generators()
    per = -(-frames // connections)
    specs = []
    for index in range(connections):
        count = min(per, frames - index * per)
        if count > 0:
            specs.append(
                ("pub", 1, dict(address=target.tcp, frame=frame, messages_per_frame=batch, outstanding=4, frames=count))
            )
    generators.add(build_roles, specs=specs)
    result = generators.run(warmup=0.0, duration=limit)
    return sum(role["counter"] for worker in result["workers"] for role in worker["roles"])


def drain(
    target: Target,
    topic: str | list[str],
    channel: str,
    consumers: int,
    rdy: int,
    processes: int,
    limit: float = 300.0,
) -> dict:
    """Consume until nothing arrives for a second; the delivery rate over the whole drain. With a list of topics,
    consumer ``n`` reads ``topics[n % len(topics)]``."""
    topics = [topic] if isinstance(topic, str) else topic
    generators = Generators()
    processes = max(1, min(processes, consumers))
    for index in range(processes):
        mine = Counter(topics[n % len(topics)] for n in range(index, consumers, processes))
        params = dict(address=target.tcp, channel=channel, rdy=rdy, idle_stop=1.0)
        generators.add(build_roles, specs=[("sub", count, dict(params, topic=name)) for name, count in mine.items()])
    result = generators.run(warmup=0.0, duration=limit, sampler=target.sampler())
    roles = [role for worker in result["workers"] for role in worker["roles"]]
    delivered = sum(role["counter"] for role in roles)
    active = [role for role in roles if role["counter"]]
    span = max(r["last_at"] for r in active) - min(r["first_at"] for r in active) if active else 0.0
    cpu = sum(worker["cpu_seconds"] for worker in result["workers"])
    return {
        "delivered": delivered,
        "seconds": span,
        "msg/s": delivered / span if span else 0.0,
        "per_consumer": [role["counter"] for role in roles],
        "generator_cpu_seconds": cpu,
    }


def run(args) -> Report:
    report = Report(
        NAME,
        TITLE,
        params={
            "messages": args.messages,
            "consumers": args.consumers,
            "rdy": args.rdy,
            "body_size": args.body_size,
            "on_disk": args.on_disk,
        },
    )
    flags = [] if args.on_disk else [f"--mem-queue-size={args.messages + 100_000}"]
    with Target(args, flags) as target:
        report.target = target.describe()
        topic = unique_topic(NAME)
        create_channel(target, topic, "bench")
        published = prefill(target, topic, args.messages, args.body_size)
        sampler = target.sampler()
        cpu_before = sampler.cpu_seconds()
        by_worker = WorkerWindow(sampler)
        by_worker.mark("start")
        result = drain(target, topic, "bench", args.consumers, args.rdy, args.processes)
        by_worker.mark("end")
        nsqd_cpu = sampler.cpu_seconds() - cpu_before
        seconds = result["seconds"]
        if by_worker.per_message(result["delivered"]):
            # where the drain ran, with --workers above 1: the topic's owner and the others
            report.notes.append(WorkerWindow.NOTE)
        report.rows.append(
            {
                "backlog": published,
                "where": "disk" if args.on_disk else "memory",
                "consumers": args.consumers,
                "rdy": args.rdy,
                "delivered": result["delivered"],
                "seconds": seconds,
                "msg/s": result["msg/s"],
                "nsqd_cpu": nsqd_cpu / seconds if seconds and target.pid else None,
                "nsqd_us/msg": nsqd_cpu * 1e6 / result["delivered"] if target.pid and result["delivered"] else None,
                "generator_cpu": result["generator_cpu_seconds"] / seconds if seconds else None,
                **by_worker.column(result["delivered"]),
            }
        )
        if result["delivered"] < published:
            report.notes.append(f"only {result['delivered']} of {published} messages were delivered")
    report.targets = {"msg/s": ">= 200,000 (real nsqd 1.3.0: ~350,000)"}
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
