"""Spark connector, sink: messages per second from a DataFrame into nsqd (``df.write.format("nsq")``).

``--messages`` rows of ``--body-size``-byte bodies, made by Spark (``spark.range`` and string
functions) in ``--partitions`` partitions, are cached and counted first, so that the measured write
reads them from Spark's memory; then ``df.write.format("nsq")`` publishes them to one nsqd
(local[2]: two tasks at a time, each with its own connection and up to ``maxInFlight`` MPUB of
``batchMessages`` in flight). A first, unmeasured write of ``--warmup-messages`` warms the JVM and
the Python workers. Figures: messages over the write's wall time (``msg_s``; the job's start and
commit included), nsqd's own count of the topic's messages afterwards (must equal the rows), and
the CPU time per message of each process during the write (nsqd, the JVM, the Python workers that
run the tasks' publishers, this driver). A second row writes the same rows without caching them
first (Spark computes them in the job): what a pipeline that makes its rows pays.

    python -m bench.spark_sink [--messages 2000000] [--body-size 200] [--batch-messages 500]
"""

from __future__ import annotations

import json
import sys
import time

from bench.common import Report, Target, load_average_note, main, unique_topic
from bench.spark_throughput import _process_cpu, build_session

NAME = "spark_sink"
TITLE = "DataFrame -> nsq sink -> nsqd (local[2], one nsqd)"
TARGET_MSG_S = 300_000


def add_arguments(parser) -> None:
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-messages", type=int, default=500, help="the sink's batchMessages")
    parser.add_argument("--max-in-flight", type=int, default=8, help="the sink's maxInFlight")
    parser.add_argument("--warmup-messages", type=int, default=400_000)


def _topic_count(target: Target, topic: str) -> int | None:
    if target.http is None:
        return None
    import urllib.request

    url = "http://{}:{}/stats?format=json&topic={}".format(*target.http, topic)
    with urllib.request.urlopen(url, timeout=30) as response:
        stats = json.loads(response.read())
    return sum(t["message_count"] for t in stats.get("topics") or [] if t["topic_name"] == topic)


def rows(spark, count: int, body_size: int, partitions: int):
    from pyspark.sql import functions as F

    prefix = F.format_string("%010d-", "id")
    pad = F.repeat(F.lit("x"), body_size - 11)
    return spark.range(0, count, numPartitions=partitions).select(F.concat(prefix, pad).alias("body"))


def write(frame, target: Target, topic: str, args) -> None:
    (
        frame.write.format("nsq")
        .mode("append")
        .option("nsqd.tcp.addresses", "{}:{}".format(*target.tcp))
        .option("topic", topic)
        .option("batchMessages", str(args.batch_messages))
        .option("maxInFlight", str(args.max_in_flight))
        .save()
    )


def measure(spark, frame, target: Target, args, stage: str) -> dict:
    topic = unique_topic("sink")
    cpu_before = _process_cpu(target.pid)
    started = time.monotonic()
    write(frame, target, topic, args)
    elapsed = time.monotonic() - started
    cpu_after = _process_cpu(target.pid)
    landed = _topic_count(target, topic)
    n = args.messages
    return {
        "stage": stage,
        "messages": n,
        "body_bytes": args.body_size,
        "seconds": elapsed,
        "msg_s": n / elapsed,
        "MB_s": n * args.body_size / elapsed / 1e6,
        "nsqd_count": landed,
        "cpu_us_msg": {
            role: round((cpu_after.get(role, 0.0) - cpu_before.get(role, 0.0)) * 1e6 / n, 2)
            for role in sorted(set(cpu_after) | set(cpu_before))
        },
    }


def run(args) -> Report:
    report = Report(
        NAME,
        TITLE,
        params={
            "messages": args.messages,
            "body_size": args.body_size,
            "partitions": args.partitions,
            "batch_messages": args.batch_messages,
            "max_in_flight": args.max_in_flight,
        },
    )
    report.notes.append(load_average_note("start"))
    # nsqd keeps what it is given in memory (no channel: the topic only counts the messages)
    with Target(
        args, [f"--mem-queue-size={2 * args.messages + args.warmup_messages + 10_000}"], want_http=True
    ) as target:
        report.target = target.describe()
        spark = build_session()
        try:
            import spark_connector

            spark_connector.register(spark)
            if args.warmup_messages:
                write(
                    rows(spark, args.warmup_messages, args.body_size, args.partitions),
                    target,
                    unique_topic("sink_warmup"),
                    args,
                )
            cached = rows(spark, args.messages, args.body_size, args.partitions).cache()
            cached.count()
            measured = [measure(spark, cached, target, args, "cached rows -> nsqd")]
            cached.unpersist()
            measured.append(
                measure(
                    spark,
                    rows(spark, args.messages, args.body_size, args.partitions),
                    target,
                    args,
                    "rows made in the job -> nsqd",
                )
            )
        finally:
            spark.stop()
    for row in measured:
        report.notes.append(f"{row['stage']}: CPU us per message by process: {row.pop('cpu_us_msg')}")
        if row["nsqd_count"] is not None and row["nsqd_count"] != args.messages:
            report.notes.append(f"{row['stage']}: nsqd counted {row['nsqd_count']} messages, not {args.messages}")
        report.rows.append(row)
    best = measured[0]["msg_s"]
    report.targets[f"{TARGET_MSG_S:,} msg/s into nsqd"] = "met" if best >= TARGET_MSG_S else f"missed ({best:,.0f})"
    report.notes.append(load_average_note("end"))
    return report


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
