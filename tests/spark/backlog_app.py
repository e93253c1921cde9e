"""A Spark driver with a heap of its own size, run as a subprocess by test_memory.py: it reads a
topic's backlog to the end, one query per path, and exits.

    python -m tests.spark.backlog_app CONFIG_JSON

CONFIG_JSON: ``{"master": ..., "conf": {...}, "base": DIR, "queries": {NAME: {options}}}``.
Each query streams into DIR/NAME/out (Parquet) with its checkpoint in DIR/NAME/checkpoint, with
default options but for the ones given and Trigger.AvailableNow; they run side by side, each
until it ends by itself. Prints each micro-batch's input rows as ``BATCH <name> <rows>``; exits 0
once every query has ended, 1 when one failed.
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
            .trigger(availableNow=True)
            .start()
        )
    print("QUERIES STARTED", flush=True)
    seen: set[tuple[str, int]] = set()
    while queries:
        for name, query in list(queries.items()):
            active = query.isActive  # before its last progress is read
            if query.exception() is not None:
                print(f"QUERY {name} FAILED {query.exception()}", flush=True)
                spark.stop()
                return 1
            for progress in query.recentProgress:
                if (name, progress["batchId"]) not in seen:
                    seen.add((name, progress["batchId"]))
                    print(f"BATCH {name} {progress['numInputRows']}", flush=True)
            if not active:
                del queries[name]
        time.sleep(0.2)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
