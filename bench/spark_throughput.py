"""Spark connector: messages per second from nsqd into a Parquet sink.

A backlog of ``--messages`` bodies is published first (nsqd keeps it in memory), then a streaming
query ``spark.readStream.format("nsq")`` -> ``writeStream.format("parquet")`` (local[2], one
checkpoint, the write-ahead log in a temporary directory) drains it. Figures, from the query's
own progress reports:

- ``msg_s`` of the Spark row: messages over the time from ``start()`` to the last batch
  committed (includes the query start; a first query on ``--warmup-messages`` has warmed the
  JVM and Spark's Python workers);
- ``batches_msg_s``: messages over the summed durations of the batches that carried data
  (what the pipeline sustains once running);
- ``msg_s`` of the consumer row: the same backlog (published to a second channel) drained by the
  connector's consumer alone, without Spark: nsqd -> fsynced log -> FIN. nsqd's own delivery rate
  (``python -m bench.consume``) bounds both.

    python -m bench.spark_throughput [--messages 500000] [--body-size 100] [--max-per-trigger 200000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Report, Target, main, unique_topic
from bench.consume import create_channel, prefill

NAME = "spark_throughput"
TITLE = "nsqd -> Spark Structured Streaming -> Parquet (local[2])"
TARGET_MSG_S = 100_000


def add_arguments(parser) -> None:
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--max-per-trigger", type=int, default=200_000, help="maxMessagesPerTrigger (0: no limit)")
    parser.add_argument("--ack-mode", choices=("durable", "commit"), default="durable")
    parser.add_argument("--warmup-messages", type=int, default=50_000, help="drained by a first, unmeasured query")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")


def build_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").appName("trionsq-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_query(spark, target: Target, topic: str, args, work: Path) -> dict:
    import spark_connector

    spark_connector.register(spark)
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd.tcp.addresses", "%s:%d" % target.tcp)
        .option("topic", topic)
        .option("channel", "spark")
        .option("walPath", str(work / "wal"))
        .option("ackMode", args.ack_mode)
    )
    if args.max_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", str(args.max_per_trigger))
    started = time.monotonic()
    query = (
        reader.load().writeStream.format("parquet")
        .option("path", str(work / "out"))
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
        query.stop()
    loaded = [p for p in seen.values() if p["numInputRows"] > 0]
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
    }


def run_intake(target: Target, topic: str, args, work: Path) -> dict:
    """The consumer alone (no Spark): nsqd -> fsynced write-ahead log -> FIN."""
    from spark_connector.consumer import ConsumerGroup
    from spark_connector.options import SourceOptions

    options = SourceOptions.parse({"nsqd.tcp.addresses": "%s:%d" % target.tcp, "topic": topic,
                                   "channel": "intake", "walPath": str(work / "intake-wal"),
                                   "ackMode": args.ack_mode, "maxBacklogMessages": str(args.messages + 1)})
    group = ConsumerGroup(options)
    started = time.monotonic()
    cpu = time.process_time()
    group.start()
    try:
        mlog = group.wal.logs["%s:%d" % target.tcp]
        while mlog.synced_end < args.messages and time.monotonic() - started < args.timeout:
            time.sleep(0.005)
        elapsed = time.monotonic() - started
        logged = mlog.synced_end
    finally:
        group.stop()
    return {"stage": "nsqd -> log (consumer only)", "ack_mode": args.ack_mode, "messages": logged,
            "body_bytes": args.body_size, "batches": None, "mean_batch": None, "seconds": elapsed,
            "msg_s": logged / elapsed, "batches_msg_s": None,
            "consumer_us_msg": (time.process_time() - cpu) * 1e6 / max(logged, 1)}


def run(args) -> Report:
    report = Report(NAME, TITLE, params={"messages": args.messages, "body_size": args.body_size,
                                         "max_per_trigger": args.max_per_trigger or None,
                                         "ack_mode": args.ack_mode})
    work = Path(tempfile.mkdtemp(prefix="trionsq-spark-bench-"))
    try:
        with Target(args, [f"--mem-queue-size={args.messages + 10_000}"]) as target:
            report.target = target.describe()
            topic = unique_topic("spark")
            spark = build_session()
            try:
                # Two channels: one drained by the consumer alone, one by the Spark query.
                create_channel(target, topic, "intake")
                create_channel(target, topic, "spark")
                published = prefill(target, topic, args.messages, args.body_size)
                if published < args.messages:
                    report.skipped = f"nsqd took only {published} of {args.messages} messages"
                    return report
                report.rows.append(run_intake(target, topic, args, work))
                if args.warmup_messages:
                    # A first query warms the JVM and Spark's Python workers; its figures are dropped.
                    warm = unique_topic("spark_warmup")
                    prefill(target, warm, args.warmup_messages, args.body_size)
                    run_query(spark, target, warm, argparse.Namespace(**{**vars(args), "messages": args.warmup_messages}),
                              work / "warmup")
                row = run_query(spark, target, topic, args, work)
            finally:
                spark.stop()
        report.notes.append(f"Spark batch durations (ms): {row.pop('batch_ms')}")
        report.rows.append(row)
        report.targets[f"{TARGET_MSG_S:,} msg/s end to end"] = (
            "met" if row["msg_s"] >= TARGET_MSG_S else f"missed ({row['msg_s']:,.0f})"
        )
        report.notes.append("load average at the end: %.2f %.2f %.2f" % os.getloadavg())
        if row["messages"] < args.messages:
            report.notes.append(f"timed out after {args.timeout}s with {row['messages']} messages")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
