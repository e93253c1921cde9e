"""A Spark driver on the log path, run as a subprocess by test_log_path.py so that a test can kill
it with SIGKILL and start it again on the same checkpoint.

    python -m tests.spark.log_driver_app CONFIG_JSON

CONFIG_JSON: ``{"master": ..., "conf": {...}, "options": {...}, "base": DIR, "trigger": ...}``. Streams
into DIR/out (Parquet) with its checkpoint in DIR/checkpoint, a micro-batch every ``trigger``
(default 200 milliseconds), until DIR/stop appears.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.spark.conftest import build_session
from tests.spark.driver_app import run_until_stopped


def main() -> int:
    config = json.loads(sys.argv[1])
    base = Path(config["base"])
    spark = build_session(config["master"], config["conf"])
    import spark_connector

    spark_connector.register(spark)
    reader = spark.readStream.format("nsq")
    for key, value in config["options"].items():
        reader = reader.option(key, str(value))
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(base / "out"))
        .option("checkpointLocation", str(base / "checkpoint"))
        .trigger(processingTime=config.get("trigger", "200 milliseconds"))
        .start()
    )
    return run_until_stopped(spark, query, base)


if __name__ == "__main__":
    sys.exit(main())
