"""Spark connector: messages per second from nsqd into a Parquet sink.

A backlog of ``--messages`` bodies is published first (nsqd keeps it in memory), then a streaming
query ``spark.readStream.format("nsq")`` -> ``writeStream.format("parquet")`` (local[2], one
checkpoint, the write-ahead log in a temporary directory) drains it, then the same query on a
Spark standalone cluster (a master and two 1-core workers started on 127.0.0.1 with pyspark's
``spark-class``: executors in JVMs of their own, the consumer in the driver's source runner) drains
the same backlog from a channel of its own (``--no-cluster`` skips it), with no limit on a
micro-batch's size (``--max-per-trigger 0``: each batch takes what the log holds, so batches grow
with the backlog) and ``minPartitions=2`` (two tasks share each batch's Parquet writing). Figures,
from the query's own progress reports:

- ``msg_s`` of the Spark row: messages over the time from ``start()`` to the last batch
  committed (includes the query start, noted as the delay to the first batch; a first query on
  ``--warmup-messages`` in batches of ``--warmup-per-trigger`` has warmed the JVM and Spark's
  Python workers: the JIT compiles per-batch code paths only after many batches);
- ``batches_msg_s``: messages over the summed durations of the batches that carried data
  (what the pipeline sustains once running);
- ``msg_s`` of the consumer row: the same backlog (published to a second channel) drained by the
  connector's consumer alone, without Spark: nsqd -> fsynced log -> FIN, with the consumer's
  (this process's) and nsqd's CPU time per message. nsqd's own delivery rate
  (``python -m bench.consume``) bounds both.

Notes add each batch's duration, the mean of each phase of Spark's ``durationMs`` (addBatch is
the Parquet job; walCommit and commitOffsets the checkpoint writes), and the CPU time per message
of every process during the query (nsqd, the JVM, Spark's Python source runner that hosts the
consumer and reads the log for ``partitions``, the Python workers that build Arrow batches). On
the 2-core machine the JVM is the largest share: its JIT compiler still runs during the measured
query (several seconds of CPU), then writing Parquet costs it about 4 us per row; the source
runner's start imports pyspark from Spark's pyspark.zip, compiled from source, about 1.5 s of
CPU before the first batch.

    python -m bench.spark_throughput [--messages 2000000] [--body-size 100] [--max-per-trigger 0]
    python -m bench.spark_throughput --consumer-only      # the consumer row alone, no Spark
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Report, Target, load_average_note, main, unique_topic
from bench.consume import create_channel, prefill

NAME = "spark_throughput"
TITLE = "nsqd -> Spark Structured Streaming -> Parquet (local[2])"
TARGET_MSG_S = 100_000


def add_arguments(parser) -> None:
    parser.add_argument(
        "--messages",
        type=int,
        default=2_000_000,
        help="backlog drained by the measured query (long enough that its start-up, a few "
        "seconds, does not decide the figure)",
    )
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--max-per-trigger", type=int, default=0, help="maxMessagesPerTrigger (0: no limit)")
    parser.add_argument("--ack-mode", choices=("durable", "commit"), default="durable")
    parser.add_argument(
        "--read-mode",
        choices=("driver", "log", "auto"),
        default="driver",
        help="the source's readMode: this scenario measures the driver path (its consumer and "
        "write-ahead log) by default; bench.spark_cluster compares it with the log path",
    )
    parser.add_argument(
        "--min-partitions",
        type=int,
        default=2,
        help="minPartitions: Spark tasks per micro-batch (local[2] has two cores)",
    )
    parser.add_argument("--warmup-messages", type=int, default=200_000, help="drained by a first, unmeasured query")
    parser.add_argument(
        "--warmup-per-trigger",
        type=int,
        default=10_000,
        help="maxMessagesPerTrigger of the first query: many small batches warm the JVM's "
        "per-batch code paths (the JIT compiles them after enough batches)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    parser.add_argument(
        "--sink-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the Parquet sink (repeatable), e.g. parquet.enable.dictionary=false",
    )
    parser.add_argument("--consumer-only", action="store_true", help="measure the consumer alone, without Spark")
    parser.add_argument(
        "--no-cluster",
        dest="cluster",
        action="store_false",
        help="skip the run on a standalone cluster (a master and two 1-core workers on 127.0.0.1)",
    )


def build_session(master: str = "local[2]", conf: dict[str, str] | None = None):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": "2g",
        **(conf or {}),
    }  # the caller's settings win
    builder = SparkSession.builder.master(master).appName("trionsq-spark-bench")
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


_ROLES = (
    ("source runner", "python_streaming_source_runner"),
    ("python workers", "pyspark.daemon"),
    ("jvm", "java"),
)


def _process_cpu(nsqd_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of nsqd and of this process's descendants, by role (the JVM, Spark's
    Python source runner where the consumer runs, its Python workers, this driver). A child that
    ended and was reaped is counted in its parent's cumulated children's time."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(name)] = fields
        children.setdefault(int(fields[1]), []).append(int(name))
    tree = [os.getpid()]
    for pid in tree:
        tree.extend(children.get(pid, []))
    totals: dict[str, float] = {}
    for pid in tree + ([nsqd_pid] if nsqd_pid else []):
        fields = stats.get(pid)
        if fields is None:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if pid == nsqd_pid:
            role = "nsqd"
        elif pid == os.getpid():
            role = "driver"
        else:
            role = next((r for r, needle in _ROLES if needle in cmdline), "other")
        seconds = sum(int(x) for x in fields[11:15]) / _CLOCK_TICKS
        totals[role] = totals.get(role, 0.0) + seconds
    return totals


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _progress_time(progress: dict) -> float:
    """The wall-clock start of a batch, from its progress report (ISO 8601, UTC)."""
    import datetime

    stamp = progress["timestamp"].replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def run_query(spark, target: Target, topic: str, args, work: Path, channel: str = "spark") -> dict:
    import spark_connector

    spark_connector.register(spark)
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd.tcp.addresses", "{}:{}".format(*target.tcp))
        .option("topic", topic)
        .option("channel", channel)
        .option("walPath", str(work / "wal"))
        .option("ackMode", args.ack_mode)
        .option("readMode", getattr(args, "read_mode", "driver"))
    )
    if args.min_partitions:
        reader = reader.option("minPartitions", str(args.min_partitions))
    if args.max_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", str(args.max_per_trigger))
    cpu_before = _process_cpu(target.pid)
    started = time.monotonic()
    started_at = time.time()
    writer = reader.load().writeStream.format("parquet")
    for option in args.sink_option:
        key, _, value = option.partition("=")
        writer = writer.option(key, value)
    query = (
        writer.option("path", str(work / "out"))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    seen: dict[int, dict] = {}
    total = 0
    finished = None
    try:
        while total < args.messages:
            if time.monotonic() - started > args.timeout:
                break
            if query.exception() is not None:
                raise RuntimeError(f"query failed: {query.exception()}")
            for progress in query.recentProgress:
                if progress["batchId"] not in seen:
                    seen[progress["batchId"]] = progress
                    total += progress["numInputRows"]
            finished = time.monotonic()
            time.sleep(0.05)
    finally:
        cpu_after = _process_cpu(target.pid)
        query.stop()
    loaded = [p for p in seen.values() if p["numInputRows"] > 0]
    phases: dict[str, float] = {}
    for p in loaded:
        for phase, ms in p["durationMs"].items():
            phases[phase] = phases.get(phase, 0) + ms
    cpu_us = {
        role: (cpu_after.get(role, 0.0) - cpu_before.get(role, 0.0)) * 1e6 / max(total, 1)
        for role in sorted(set(cpu_after) | set(cpu_before))
    }
    busy_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in loaded)
    elapsed = (finished or time.monotonic()) - started
    return {
        "stage": "nsqd -> log -> Spark -> Parquet",
        "ack_mode": args.ack_mode,
        "messages": total,
        "body_bytes": args.body_size,
        "batches": len(loaded),
        "mean_batch": total / len(loaded) if loaded else 0.0,
        "seconds": elapsed,
        "msg_s": total / elapsed if elapsed else 0.0,
        "batches_msg_s": total * 1000 / busy_ms if busy_ms else 0.0,
        "consumer_us_msg": None,
        "batch_ms": [p["durationMs"].get("triggerExecution") for p in sorted(loaded, key=lambda p: p["batchId"])],
        "start_s": (_progress_time(min(loaded, key=lambda p: p["batchId"])) - started_at) if loaded else None,
        "phase_ms": {phase: round(ms / len(loaded)) for phase, ms in sorted(phases.items())} if loaded else {},
        "cpu_us_msg": {role: round(us, 2) for role, us in cpu_us.items()},
    }


def run_intake(target: Target, topic: str, args, work: Path) -> dict:
    """The consumer alone (no Spark): nsqd -> fsynced write-ahead log -> FIN."""
    from spark_connector.consumer import ConsumerGroup
    from spark_connector.options import SourceOptions

    options = SourceOptions.parse(
        {
            "nsqd.tcp.addresses": "{}:{}".format(*target.tcp),
            "topic": topic,
            "channel": "intake",
            "walPath": str(work / "intake-wal"),
            "ackMode": args.ack_mode,
            "maxBacklogMessages": str(args.messages + 1),
        }
    )
    group = ConsumerGroup(options)
    nsqd = target.sampler()
    nsqd_cpu = nsqd.cpu_seconds()
    started = time.monotonic()
    cpu = time.process_time()
    group.start()
    try:
        mlog = group.wal.logs["{}:{}".format(*target.tcp)]
        while mlog.synced_end < args.messages and time.monotonic() - started < args.timeout:
            time.sleep(0.005)
        elapsed = time.monotonic() - started
        logged = mlog.synced_end
    finally:
        group.stop()
    return {
        "stage": "nsqd -> log (consumer only)",
        "ack_mode": args.ack_mode,
        "messages": logged,
        "body_bytes": args.body_size,
        "batches": None,
        "mean_batch": None,
        "seconds": elapsed,
        "msg_s": logged / elapsed,
        "batches_msg_s": None,
        "consumer_us_msg": (time.process_time() - cpu) * 1e6 / max(logged, 1),
        "nsqd_us/msg": (nsqd.cpu_seconds() - nsqd_cpu) * 1e6 / max(logged, 1),
    }


def measure_spark(spark, target: Target, topic: str, args, work: Path, channel: str) -> dict:
    """The measured query on ``spark`` (after a warm-up query on a topic of its own); stops the
    session."""
    try:
        if args.warmup_messages:
            # A first query warms the JVM and Spark's Python workers; its figures are dropped.
            warm = unique_topic("spark_warmup")
            prefill(target, warm, args.warmup_messages, args.body_size)
            run_query(
                spark,
                target,
                warm,
                argparse.Namespace(
                    **{**vars(args), "messages": args.warmup_messages, "max_per_trigger": args.warmup_per_trigger}
                ),
                work / "warmup",
            )
        return run_query(spark, target, topic, args, work, channel)
    finally:
        spark.stop()


def run(args) -> Report:
    report = Report(
        NAME,
        TITLE,
        params={
            "messages": args.messages,
            "body_size": args.body_size,
            "max_per_trigger": args.max_per_trigger or None,
            "ack_mode": args.ack_mode,
        },
    )
    work = Path(tempfile.mkdtemp(prefix="trionsq-spark-bench-"))
    report.notes.append(load_average_note("start"))
    try:
        with Target(args, [f"--mem-queue-size={args.messages + 10_000}"]) as target:
            report.target = target.describe()
            topic = unique_topic("spark")
            # Two channels: one drained by the consumer alone, one by the Spark query.
            create_channel(target, topic, "intake")
            if not args.consumer_only:
                create_channel(target, topic, "spark")
            if args.cluster and not args.consumer_only:
                create_channel(target, topic, "spark_cluster")
            published = prefill(target, topic, args.messages, args.body_size)
            if published < args.messages:
                report.skipped = f"nsqd took only {published} of {args.messages} messages"
                return report
            report.rows.append(run_intake(target, topic, args, work))
            if args.consumer_only:
                report.notes.append(load_average_note("end"))
                return report
            row = measure_spark(build_session(), target, topic, args, work / "local", "spark")
            rows = [("local[2]", row)]
            if args.cluster:
                from tests.spark.standalone import StandaloneCluster

                cluster = StandaloneCluster(work / "standalone").start()
                try:
                    session = build_session(cluster.master_url, cluster.session_conf())
                    rows.append(
                        ("standalone", measure_spark(session, target, topic, args, work / "cluster", "spark_cluster"))
                    )
                finally:
                    cluster.stop()
        for mode, row in rows:
            report.notes.append(
                f"{mode}: Spark batch durations (ms): {row.pop('batch_ms')}; the first batch "
                f"started {row.pop('start_s') or 0:.1f} s after start()"
            )
            report.notes.append(
                f"{mode}: mean ms per batch by phase (query progress durationMs): {row.pop('phase_ms')}"
            )
            report.notes.append(f"{mode}: CPU us per message by process during the query: {row.pop('cpu_us_msg')}")
            row["stage"] = f"{row['stage']} ({mode})"
            report.rows.append(row)
        row = rows[0][1]
        report.targets[f"{TARGET_MSG_S:,} msg/s end to end (local[2])"] = (
            "met" if row["msg_s"] >= TARGET_MSG_S else f"missed ({row['msg_s']:,.0f})"
        )
        report.notes.append(load_average_note("end"))
        for mode, row in rows:
            if row["messages"] < args.messages:
                report.notes.append(f"{mode}: timed out after {args.timeout}s with {row['messages']} messages")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
