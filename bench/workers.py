"""Scenario: ``pub``, ``mpub``, ``consume``, ``pubsub``, many topics (``many_topics``: ``pub`` with one topic per
connection; ``many_mpub``: ``mpub`` with one topic per connection; ``many_consume``: 8 topics' backlogs drained, one
consumer each, the topics split evenly over the workers: nothing crosses) and the publish-to-delivery latency at
10k msg/s (``latency``) against nsqd ``--workers=1`` and ``--workers=2``, alternated in one run (round by round,
the two counts back to back for each scenario), so that the noise of a shared machine falls on both alike. Each
row is one scenario's run with its defaults; ``nsqd_us/msg`` is the CPU of every nsqd process (the parent and its
workers) per message, ``by worker us/msg`` each worker's part of it, and ``vs 1`` compares a row's throughput and
CPU per message with the ``--workers=1`` run just before it. Unpinned: pinning nsqd to one CPU would pin its
workers there too.

The load generator runs on the same machine, so a row's throughput is bounded by the machine before nsqd: with
``gen_us/msg`` the generator's CPU per message, no run can pass ``ceiling msg/s`` = cores / (nsqd_us/msg +
gen_us/msg), every core busy with nsqd or its load (``machine_ceiling``). ``of ceiling`` is the row's share of
it: near 1, the run was bound by the machine, and a second worker cannot raise the throughput, whatever it costs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pickle
import shutil
import socket
import struct
import time

from bench import latency
from bench.common import (
    _PINNING,
    Generators,
    Report,
    Target,
    WorkerWindow,
    add_common_arguments,
    main,
    unique_topic,
)
from bench.pub_against import codes_against
from nsqd.workers import owner_of
from protocol.commands import encode_mpub, encode_pub

NAME = "workers"
TITLE = "pub, mpub, consume, pubsub and many topics with --workers=1 and --workers=2, alternated"
PIN = False
SCENARIOS = ("pub", "mpub", "consume", "pubsub", "many_topics", "many_mpub", "many_consume", "latency")
#: each scenario's throughput column
RATE = {
    "pub": "msg/s",
    "mpub": "msg/s",
    "consume": "msg/s",
    "pubsub": "out msg/s",
    "many_topics": "msg/s",
    "many_mpub": "msg/s",
    "many_consume": "msg/s",
    "latency": "msg/s",
}
#: columns a scenario's rows carry besides the throughput and the CPU
EXTRA = ("p50 ms", "p99 ms", "split", "by worker us/msg", "others cores")


def machine_ceiling(nsqd_us: float, generator_us: float, cores: int) -> float:
    """The messages per second a machine of ``cores`` cores can carry when nsqd and the load generator share it
    and cost what they were measured to cost per message: every core busy with one or the other."""
    return cores * 1e6 / (nsqd_us + generator_us)


def _ceiling_columns(name: str, row: dict, cores: int) -> dict:
    """The generator's CPU per message, the machine's ceiling and the row's share of it (``machine_ceiling``);
    ``pubsub``'s per message in + out, as its ``nsqd_us/msg``."""
    rate = (row["in msg/s"] + row["out msg/s"]) / 2 if name == "pubsub" else row.get(RATE[name])
    nsqd_us, generator = row.get("nsqd_us/msg"), row.get("generator_cpu")
    if not rate or nsqd_us is None or generator is None:
        return {}
    generator_us = generator * 1e6 / rate
    ceiling = machine_ceiling(nsqd_us, generator_us, cores)
    return {"gen_us/msg": generator_us, "ceiling msg/s": ceiling, "of ceiling": rate / ceiling}


def add_arguments(parser) -> None:
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--counts", default="1,2", help="the --workers values, comma separated")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument(
        "--against",
        default="",
        help="a git revision to run too: each scenario and count with that code's nsqd, then this one's",
    )
    parser.add_argument(
        "--spread",
        default="",
        metavar="SHARE,SPARE",
        help="run this code a second time with TRIONSQ_SPREAD=SHARE,SPARE (a busy owner spreads its producers of "
        "big reads, nsqd/workers.py), after this code's run of each scenario and count (code `spread`)",
    )


def crossing_cost(
    per_batch: int, messages: int = 200_000, body_size: int = 200, *, per_record: int = 1, raw: bool = False
) -> dict:
    """What one message costs to cross between two workers as ``nsqd/workers.py``'s links carry it: records of
    ``per_record`` bodies (1: a PUB's; 200: an MPUB's) pickled ``per_batch`` to a batch, written to a unix
    socketpair, read and unpickled by a second process. With ``raw``, a record carries the MPUB's body as one
    bytes object (its count, then each size and body, as the frame has them), which the receiver cuts into
    bodies at fixed strides, as the parser cuts an MPUB of bodies of one size (``_split_mpub_body``), instead of
    pickling a list of bodies. CPU microseconds per message on each side (both processes busy, so the wall time is
    one side's)."""
    left, right = socket.socketpair()
    records = [[os.urandom(body_size) for _ in range(per_record)] for _ in range(per_batch)]
    # distinct objects, as a batch's are (no memo); raw: each record's bodies in one bytes object
    payloads = [_mpub_body(bodies) if raw else bodies for bodies in records]
    batches = messages // (per_batch * per_record)
    pid = os.fork()
    if pid == 0:  # the receiver
        left.close()
        started = time.process_time()
        buffer = bytearray()
        got = 0
        while got < batches:
            chunk = right.recv(1 << 18)
            if not chunk:
                break
            buffer += chunk
            while len(buffer) >= 4:
                (size,) = struct.unpack_from(">I", buffer)
                if len(buffer) < 4 + size:
                    break
                batch = pickle.loads(bytes(buffer[4 : 4 + size]))
                if raw:
                    for record in batch:
                        _split_mpub_body(record[3], body_size)
                del buffer[: 4 + size]
                got += 1
        right.sendall(struct.pack(">d", time.process_time() - started))
        os._exit(0)
    right.close()
    started = time.process_time()
    for number in range(batches):
        batch = [("pub", number * per_batch + index, "topic", payload, 0.0) for index, payload in enumerate(payloads)]
        data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        left.sendall(struct.pack(">I", len(data)) + data)
    sender = time.process_time() - started
    receiver = struct.unpack(">d", left.recv(8))[0]
    os.waitpid(pid, 0)
    left.close()
    sent = batches * per_batch * per_record
    shape = f"{per_batch} per batch" if per_record == 1 else f"{per_record} bodies per record{', raw' if raw else ''}"
    return {
        "scenario": f"crossing, {shape}",
        "sender_us/msg": sender * 1e6 / sent,
        "receiver_us/msg": receiver * 1e6 / sent,
    }


def _mpub_body(bodies: list[bytes]) -> bytes:
    """An MPUB's body: the count, then each body after its size."""
    return struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(body)) + body for body in bodies)


def _split_mpub_body(data: bytes, size: int) -> list[bytes]:
    """The bodies of ``_mpub_body``'s bytes, all of ``size`` bytes, with one ``Struct.unpack_from``."""
    count = struct.unpack_from(">i", data)[0]
    return list(struct.unpack_from(f"4x{size}s" * count, data, 4))


class _ManyTopics:
    """``pub`` with one topic per connection (16 connections, one PUB in flight each, 200-byte bodies): the topics
    spread over the workers, and a connection's topic is owned by the worker that accepted it 1 time in N."""

    NAME = "many_topics"
    TITLE = "PUB, one topic per connection"
    TOPICS = 16
    BODY_SIZE = 200
    #: bodies per frame: 1 is a PUB, more an MPUB
    BATCH = 1
    #: whether the topics' names are chosen so that they split evenly over the workers (``even_topics``)
    EVEN = False

    @staticmethod
    def add_arguments(parser) -> None:
        return None

    @classmethod
    def frame(cls, topic: str) -> bytes:
        return encode_pub(topic, b"t" * cls.BODY_SIZE)

    @classmethod
    def run(cls, args) -> Report:
        from bench.load import build_roles  # the generator side, as run_spread imports it
        from bench.pub import MEM_QUEUE_SIZE

        report = Report(cls.NAME, cls.TITLE)
        workers = _workers_of(args)
        prefix = unique_topic(cls.NAME)
        topics = even_topics(prefix, cls.TOPICS, workers) if cls.EVEN else [f"{prefix}_{i}" for i in range(cls.TOPICS)]
        with Target(args, [f"--mem-queue-size={MEM_QUEUE_SIZE}"]) as target:
            specs = [
                ("pub", 1, dict(address=target.tcp, frame=cls.frame(topic), messages_per_frame=cls.BATCH))
                for topic in topics
            ]
            generators = Generators(count_syscalls=False)
            generators.add(build_roles, specs=specs)
            by_worker = WorkerWindow(target.sampler())
            result = generators.run(
                warmup=args.warmup, duration=args.duration, sampler=target.sampler(), on_window=by_worker.mark
            )
            messages = sum(sum(worker["window_counts"]) for worker in result["workers"])
            window = result["window"]
            generator_cpu = sum(worker["cpu_seconds"] for worker in result["workers"])
            report.rows.append(
                {
                    "msg/s": messages / window,
                    "nsqd_cpu": result["nsqd_cpu_seconds"] / window,
                    "nsqd_us/msg": result["nsqd_cpu_seconds"] * 1e6 / messages if messages else None,
                    "generator_cpu": generator_cpu / window,
                    "split": split_of(topics, workers),
                    **by_worker.column(messages),
                    "others cores": by_worker.others_cores(result["nsqd_cpu_seconds"] + generator_cpu),
                }
            )
        return report


class _ManyMpub(_ManyTopics):
    """``mpub`` with one topic per connection (8 connections, one MPUB x200 of 200-byte bodies in flight each, no
    channel), the topics' names chosen to split evenly over the workers, as a user's many topics split about
    evenly by hash: nothing crosses once each connection is with its topic's owner."""

    NAME = "many_mpub"
    TITLE = "MPUB x200, one topic per connection, split evenly"
    TOPICS = 8
    BATCH = 200
    EVEN = True

    @classmethod
    def frame(cls, topic: str) -> bytes:
        return encode_mpub(topic, [b"t" * cls.BODY_SIZE] * cls.BATCH)


class _ManyConsume:
    """``consume`` over 8 topics: each gets a backlog of 100,000 messages of 200 bytes (published before the
    window into a channel that exists), then one consumer per topic's channel at RDY 200 drains it; the rate and
    CPU per message of the drain. The topics' names split evenly over the workers, as ``_ManyMpub``'s."""

    TOPICS = 8
    MESSAGES = 100_000
    RDY = 200
    BODY_SIZE = 200

    @staticmethod
    def add_arguments(parser) -> None:
        return None

    @classmethod
    def run(cls, args) -> Report:
        from bench import consume

        report = Report("many_consume", "drain 8 topics' backlogs, one consumer each at RDY 200")
        workers = _workers_of(args)
        topics = even_topics(unique_topic("many_consume"), cls.TOPICS, workers)
        with Target(args, [f"--mem-queue-size={cls.MESSAGES + 100_000}"]) as target:
            published = 0
            for topic in topics:
                consume.create_channel(target, topic, "bench")
                published += consume.prefill(target, topic, cls.MESSAGES, cls.BODY_SIZE)
            sampler = target.sampler()
            cpu_before = sampler.cpu_seconds()
            by_worker = WorkerWindow(sampler)
            by_worker.mark("start")
            result = consume.drain(target, topics, "bench", len(topics), cls.RDY, 1)
            by_worker.mark("end")
            nsqd_cpu = sampler.cpu_seconds() - cpu_before
            delivered, seconds = result["delivered"], result["seconds"]
            report.rows.append(
                {
                    "msg/s": result["msg/s"],
                    "nsqd_cpu": nsqd_cpu / seconds if seconds else None,
                    "nsqd_us/msg": nsqd_cpu * 1e6 / delivered if delivered else None,
                    "generator_cpu": result["generator_cpu_seconds"] / seconds if seconds else None,
                    "split": split_of(topics, workers),
                    **by_worker.column(delivered),
                    "others cores": by_worker.others_cores(nsqd_cpu + result["generator_cpu_seconds"]),
                }
            )
            if delivered < published:
                report.notes.append(f"only {delivered} of {published} messages were delivered")
        return report


def _workers_of(args) -> int:
    """The ``--workers`` count a scenario's nsqd runs with (the last ``--nsqd-arg=--workers=N``; 1 without)."""
    counts = [int(flag.split("=", 1)[1]) for flag in args.nsqd_arg if flag.startswith("--workers=")]
    return counts[-1] if counts else 1


def even_topics(prefix: str, total: int, count: int) -> list[str]:
    """``total`` topic names ``prefix_<n>`` that ``count`` workers own in equal shares (``owner_of``; ``total``
    a multiple of ``count``), as a user's many topics split about evenly by hash."""
    share = total // count
    chosen: dict[int, list[str]] = {owner: [] for owner in range(count)}
    index = 0
    while sum(len(names) for names in chosen.values()) < share * count:
        name = f"{prefix}_{index}"
        owned = chosen[owner_of(name, count)]
        if len(owned) < share:
            owned.append(name)
        index += 1
    return [name for owner in range(count) for name in chosen[owner]]


def split_of(topics: list[str], count: int) -> str:
    """How many of ``topics`` each of ``count`` workers owns, worker 0 first: ``4/4``."""
    return "/".join(str(sum(owner_of(name, count) == owner for name in topics)) for owner in range(count))


class _Latency:
    """``bench.latency`` at one rate, 10k msg/s (one paced publisher, 2 consumers at RDY 500 that FIN at once,
    200-byte bodies): p50 and p99 from publish to delivery, whose goal is to be no worse with N workers than with
    one. The topic's owner is the worker that accepted the publisher or a consumer, or not, as it falls."""

    RATE = 10_000.0

    @staticmethod
    def add_arguments(parser) -> None:
        latency.add_arguments(parser)

    @classmethod
    def run(cls, args) -> Report:
        report = Report("latency", "publish to delivery at 10k msg/s")
        with Target(args, [f"--mem-queue-size={latency.MEM_QUEUE_SIZE}"]) as target:
            row = latency.measure(args, target, cls.RATE)
            report.rows.append(
                {
                    "msg/s": row["delivered msg/s"],
                    "nsqd_cpu": row["nsqd_cpu"],
                    "nsqd_us/msg": row["nsqd_us/msg"],
                    "generator_cpu": row["generator_cpu"],
                    "p50 ms": row["p50 ms"],
                    "p99 ms": row["p99 ms"],
                }
            )
        return report


#: the scenarios defined here rather than in a module of their own
_HERE = {"many_topics": _ManyTopics, "many_mpub": _ManyMpub, "many_consume": _ManyConsume, "latency": _Latency}


def _scenario_module(name: str):
    return _HERE[name] if name in _HERE else importlib.import_module(f"bench.{name}")


def _scenario_args(args, module, workers: int, root) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    module.add_arguments(parser)
    argv = ["--no-pin", "--no-syscalls", f"--duration={args.duration}", f"--warmup={args.warmup}"]
    argv += [f"--nsqd-arg={flag}" for flag in [*args.nsqd_arg, f"--workers={workers}"]]
    namespace = parser.parse_args(argv)
    namespace.nsqd_root = root  # None: this tree
    return namespace


def run(args) -> Report:
    counts = [int(text) for text in args.counts.split(",")]
    names = [name for name in args.scenarios.split(",") if name]
    report = Report(NAME, TITLE, params={"rounds": args.rounds, "counts": counts, "duration_s": args.duration})
    _PINNING["on"] = False
    codes = codes_against(report, args.against)
    if args.spread:
        codes.append(("spread", None))
    try:
        for per_batch in (1, 16, 64):
            report.rows.append({"round": 0, **crossing_cost(per_batch)})
        for raw in (False, True):  # one MPUB x200 a batch, as a producer's step sends it
            report.rows.append({"round": 0, **crossing_cost(1, per_record=200, raw=raw)})
        for round_number in range(1, args.rounds + 1):
            for name in names:
                _run_scenario(args, report, round_number, name, counts, codes)
    finally:
        for _, tree in codes:
            if tree is not None:
                shutil.rmtree(tree, ignore_errors=True)
    report.notes.append("nsqd_cores: cores used by all nsqd processes together; load and nsqd share the machine")
    report.notes.append(
        "others cores (many_mpub, many_consume): the cores the machine kept busy over the window besides nsqd and "
        "the generator (/proc/stat), other processes' work the run competed with; split: the topics each worker "
        "owns, worker 0 first"
    )
    report.notes.append(
        f"ceiling msg/s: {len(os.sched_getaffinity(0))} cores / (nsqd_us/msg + gen_us/msg), the most this machine "
        "carries with nsqd and its load generator on it; of ceiling: the row's share of it (near 1: machine-bound)"
    )
    return report


@contextlib.contextmanager
def _environment(name: str, value: str | None):
    """``name`` set to ``value`` (None: unset) in this process's environment, which nsqd inherits, meanwhile."""
    before = os.environ.pop(name, None)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)
        if before is not None:
            os.environ[name] = before


def _run_scenario(args, report: Report, round_number: int, name: str, counts: list[int], codes: list) -> None:
    """One scenario with each ``--workers`` count, each code in turn for a count; ``vs 1`` against the same code's
    first count."""
    module = _scenario_module(name)
    cores = len(os.sched_getaffinity(0))
    base: dict[str, dict] = {}
    for workers in counts:
        for code, root in codes:
            with _environment("TRIONSQ_SPREAD", args.spread if code == "spread" else None):
                scenario = module.run(_scenario_args(args, module, workers, root))
            for row in scenario.rows:
                rate = row.get(RATE[name])
                cpu = row.get("nsqd_us/msg")
                entry = {
                    "round": round_number,
                    "scenario": name,
                    "code": code,
                    "workers": workers,
                    "msg/s": rate,
                    "nsqd_cores": row.get("nsqd_cpu"),
                    "nsqd_us/msg": cpu,
                    **_ceiling_columns(name, row, cores),
                    **{column: row[column] for column in EXTRA if column in row},
                }
                first = base.setdefault(code, entry)
                if first is not entry and first["msg/s"] and rate is not None and first["nsqd_us/msg"] and cpu:
                    entry["vs 1"] = f"{rate / first['msg/s']:.2f}x msg/s, {cpu / first['nsqd_us/msg']:.2f}x us/msg"
                report.rows.append(entry)
            for note in scenario.notes:
                if note not in report.notes and note.startswith("only "):
                    report.notes.append(f"{name}, --workers={workers}: {note}")


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
