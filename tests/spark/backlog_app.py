"""A Spark driver with a heap of its own size, run as a subprocess by test_memory.py: it reads a
topic's backlog to the end, one query per path, and exits.

    python -m tests.spark.backlog_app CONFIG_JSON

CONFIG_JSON: ``{"master": ..., "conf": {...}, "base": DIR, "expected": N, "queries": {NAME: {options}}}``.
Each query streams into DIR/NAME/out (Parquet) with its checkpoint in DIR/NAME/checkpoint, with
default options but for the ones given; they run side by side, each until its batches have read
``expected`` rows or more (Trigger.AvailableNow would end the driver path's query at what its
consumer had logged when nsqd paused for a second). Prints each micro-batch's input rows as
``BATCH <name> <rows>``; exits 0 once every query has read its backlog, 1 when one failed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.spark.conftest import build_session


def main() -> int:
    config = json.loads(sys.argv[1])
    base = Path(config["base"])
    spark = build_session(config["master"], config["conf"])
    import spark_connector

    spark_connector.register(spark)
    queries = {}
    for name, options in config["queries"].items():
        reader = spark.readStream.format("nsq")
        for key, value in options.items():
            reader = reader.option(key, str(value))
        queries[name] = (
            reader.load()
            .writeStream.format("parquet")
            .option("path", str(base / name / "out"))
            .option("checkpointLocation", str(base / name / "checkpoint"))
            .start()
        )
    print("QUERIES STARTED", flush=True)
    rows = dict.fromkeys(queries, 0)
    seen: set[tuple[str, int]] = set()
    while queries:
        for name, query in list(queries.items()):
            if query.exception() is not None:
                print(f"QUERY {name} FAILED {query.exception()}", flush=True)
                spark.stop()
                return 1
            for progress in query.recentProgress:
                if (name, progress["batchId"]) not in seen:
                    seen.add((name, progress["batchId"]))
                    rows[name] += progress["numInputRows"]
                    print(f"BATCH {name} {progress['numInputRows']}", flush=True)
            if rows[name] >= config["expected"]:
                query.stop()
                del queries[name]
        time.sleep(0.2)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
