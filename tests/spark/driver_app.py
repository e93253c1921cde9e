"""A Spark driver run as a subprocess by test_streaming.py, so that a test can kill it with -9.

    python -m tests.spark.driver_app NSQD_ADDRESS TOPIC BASE_DIR [WAL_NAME [ACK_MODE]]

Streams the topic into BASE_DIR/out (Parquet) with its checkpoint in BASE_DIR/checkpoint and its
write-ahead log in BASE_DIR/WAL_NAME (default ``wal``; ackMode default ``durable``), small batches so that a batch is
always in progress, until the file BASE_DIR/stop appears (then it stops the query and exits 0).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.spark.conftest import build_session


def main() -> int:
    address, topic, base = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    wal_name, ack_mode = (sys.argv[4:] + ["wal", "durable"][len(sys.argv[4:]) :])[:2]
    spark = build_session()
    import spark_connector

    spark_connector.register(spark)
    frame = (
        spark.readStream.format("nsq")
        .option("nsqd.tcp.addresses", address)
        .option("topic", topic)
        .option("channel", "spark")
        .option("readMode", "driver")
        .option("walPath", str(base / wal_name))
        .option("ackMode", ack_mode)
        .option("maxMessagesPerTrigger", "200")
        .option("msgTimeoutMs", "3000")
        .load()
    )
    query = (
        frame.writeStream.format("parquet")
        .option("path", str(base / "out"))
        .option("checkpointLocation", str(base / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    return run_until_stopped(spark, query, base)


def run_until_stopped(spark, query, base: Path) -> int:
    """Run ``query`` until the file BASE/stop appears (0) or the query fails (1)."""
    print("QUERY STARTED", flush=True)
    while not (base / "stop").exists():
        if query.exception() is not None:
            print(f"QUERY FAILED {query.exception()}", flush=True)
            return 1
        time.sleep(0.2)
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
