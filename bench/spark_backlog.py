"""Spark source with default options on a backlog: memory and steadiness on both paths.

A standalone cluster of two 1-core workers (pyspark's ``spark-class`` on 127.0.0.1, executors in
JVMs of their own with ``--executor-memory``, 768m), a driver of ``--driver-memory`` (1g) and two
nsqd. Per path a fresh application and a topic holding ``--messages`` bodies of ``--body-size``
bytes in all, split evenly between the nsqd, waiting before ``start()``: by default 20,000,000 for
the log path and 2,400,000 for the driver path (``readMode=driver``: nsqd 1.3.0 is what takes it
in the field; this project's nsqd serves it the same when the query asks for it). The query has
the source's default options (no ``maxOffsetsPerTrigger``: the driver path's default
``maxBytesPerTrigger`` bounds its batches) and Spark's ``noop`` sink, and runs until every message
is in. Each path runs in a process of its own, with a driver JVM of its own.

Figures per path: batches with rows, their rows (min, median, max), the rate over the whole query
and per batch (first, median, last batch's rows over its trigger's duration: steady when these are
alike), and memory: the peak heap used before a collection and the most left after one (the JVMs
log their collections, ``-Xlog:gc``), and the peak RSS (``VmHWM``) of the driver's JVM, of its
Python source runner, of the executors' JVMs and of their Python workers. ``oom``: an
``OutOfMemoryError`` in an executor's log or the query failed.

    python -m bench.spark_backlog [--paths log,driver] [--messages 20000000,2400000]
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Report, main, unique_topic

NAME = "spark_backlog"
TITLE = "nsqd -> Spark (standalone cluster, 2 workers, 2 nsqd), default options, a backlog read to the end: memory"

_GC_LINE = re.compile(r"(\d+)M->(\d+)M\((\d+)M\)")


def add_arguments(parser) -> None:
    parser.add_argument("--paths", default="log,driver", help="comma-separated: log, driver")
    parser.add_argument(
        "--messages",
        default="20000000,2400000",
        help="messages waiting, in all, one per path of --paths (the last one repeats)",
    )
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--executor-memory", default="768m")
    parser.add_argument("--query-timeout", type=float, default=1200.0, help="give up on a query after this long")


def _processes() -> dict[int, tuple[int, bytes]]:
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = (parent, f.read())
        except OSError:
            continue
    return found


def _peak_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _roles() -> dict[str, list[int]]:
    """Of this process's descendants: the driver's JVM (SparkSubmit) and its Python source runner,
    the executors' JVMs and their Python workers."""
    procs = _processes()

    def under(pid: int, ancestor) -> bool:
        while pid > 1 and pid in procs:
            if ancestor(pid):
                return True
            pid = procs[pid][0]
        return False

    me = os.getpid()
    executors = {
        p for p, (parent, cmd) in procs.items() if b"CoarseGrainedExecutorBackend" in cmd and under(parent, me.__eq__)
    }
    drivers = {p for p, (parent, cmd) in procs.items() if b"SparkSubmit" in cmd and under(parent, me.__eq__)}
    roles: dict[str, list[int]] = {"driver_jvm": sorted(drivers), "driver_py": [], "executors_jvm": sorted(executors)}
    roles["executors_py"] = []
    for pid, (parent, cmd) in procs.items():
        if b"python" not in cmd:
            continue
        if under(parent, executors.__contains__):
            roles["executors_py"].append(pid)
        elif under(parent, drivers.__contains__):
            roles["driver_py"].append(pid)
    return roles


def _gc_heap(paths: list[Path]) -> tuple[int, int]:
    """MiB: the most heap used before a collection, and the most left after one, over ``paths``."""
    before = after = 0
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for match in _GC_LINE.finditer(text):
            before = max(before, int(match.group(1)))
            after = max(after, int(match.group(2)))
    return before, after


def _run_path(cluster, nsqds, args, work: Path, driver_path: bool, messages: int) -> dict:
    from bench.spark_cluster import _publish
    from bench.spark_throughput import build_session

    topic = unique_topic("spark_backlog")
    published = time.monotonic()
    _publish(nsqds, topic, messages, args.body_size, not driver_path)
    published = time.monotonic() - published
    total = messages // len(nsqds) * len(nsqds)
    gc_dir = work / "gc"
    gc_dir.mkdir(parents=True)
    conf = {
        **cluster.session_conf(),
        "spark.driver.memory": args.driver_memory,
        "spark.executor.memory": args.executor_memory,
        "spark.driver.extraJavaOptions": f"-Xlog:gc:file={gc_dir}/driver.log",
        "spark.executor.extraJavaOptions": f"-Xlog:gc:file={gc_dir}/executor-%p.log",
    }
    spark = build_session(cluster.master_url, conf)
    import spark_connector

    spark_connector.register(spark)
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd.tcp.addresses", ",".join(n.tcp_address for n in nsqds))
        .option("topic", topic)
        .option("channel", "spark")
    )
    if driver_path:
        reader = reader.option("readMode", "driver").option("walPath", str(work / "wal"))
    query = reader.load().writeStream.format("noop").option("checkpointLocation", str(work / "checkpoint")).start()
    started = time.monotonic()
    batches: dict[int, tuple[int, int]] = {}  # batch id -> (rows, trigger ms)
    rss: dict[str, dict[int, int]] = {}
    failed = None
    try:
        while sum(rows for rows, _ in batches.values()) < total:
            if time.monotonic() - started > args.query_timeout:
                failed = f"timed out after {args.query_timeout:.0f} s"
                break
            if query.exception() is not None:
                failed = str(query.exception())[:200]
                break
            for progress in query.recentProgress:
                batches[progress["batchId"]] = (progress["numInputRows"], progress["durationMs"]["triggerExecution"])
            for role, pids in _roles().items():
                for pid in pids:
                    rss.setdefault(role, {})[pid] = max(rss.get(role, {}).get(pid, 0), _peak_rss(pid))
            time.sleep(0.5)
        elapsed = time.monotonic() - started
    finally:
        query.stop()
        spark.stop()
    loaded = [batches[b] for b in sorted(batches) if batches[b][0]]
    rows = [r for r, _ in loaded]
    rates = [r * 1000 / ms for r, ms in loaded if ms]
    driver_heap = _gc_heap([gc_dir / "driver.log"])
    executor_heap = _gc_heap(sorted(gc_dir.glob("executor-*.log")))
    logs = "".join(p.read_text(errors="replace") for p in cluster.base.rglob("stderr"))
    mib = 1 << 20
    return {
        "messages": sum(rows),
        "publish_s": published,
        "batches": len(loaded),
        "rows_min": min(rows, default=0),
        "rows_median": int(statistics.median(rows)) if rows else 0,
        "rows_max": max(rows, default=0),
        "msg_s": sum(rows) / elapsed if elapsed else 0.0,
        "batch_msg_s_first": rates[0] if rates else 0.0,
        "batch_msg_s_median": statistics.median(rates) if rates else 0.0,
        "batch_msg_s_last": rates[-1] if rates else 0.0,
        "driver_heap_peak_MB": driver_heap[0],
        "driver_heap_live_MB": driver_heap[1],
        "driver_jvm_rss_MB": max(rss.get("driver_jvm", {}).values(), default=0) // mib,
        "driver_py_rss_MB": max(rss.get("driver_py", {}).values(), default=0) // mib,
        "exec_heap_peak_MB": executor_heap[0],
        "exec_heap_live_MB": executor_heap[1],
        "exec_jvm_rss_MB": max(rss.get("executors_jvm", {}).values(), default=0) // mib,
        "exec_py_rss_MB": max(rss.get("executors_py", {}).values(), default=0) // mib,
        "oom": "yes" if failed or "OutOfMemoryError" in logs else "no",
        "failed": failed or "",
    }


def _run_child(args, path: str, messages: int) -> dict:
    """This scenario for one path in a process of its own; its JSON document."""
    import json
    import subprocess

    results = Path(tempfile.mkdtemp(prefix="trionsq-spark-backlog-results-"))
    try:
        argv = [sys.executable, "-m", f"bench.{NAME}", "--paths", path, "--messages", str(messages)]
        argv += ["--body-size", str(args.body_size), "--driver-memory", args.driver_memory]
        argv += ["--executor-memory", args.executor_memory, "--query-timeout", str(args.query_timeout)]
        subprocess.run([*argv, "--results-dir", str(results)], check=True)
        return json.loads((results / f"{NAME}.json").read_text())
    finally:
        shutil.rmtree(results, ignore_errors=True)


def run(args) -> Report:
    from tests.integration.harness import NsqdProcess
    from tests.spark.standalone import StandaloneCluster

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    counts = [int(c.replace("_", "")) for c in args.messages.split(",") if c.strip()]
    report = Report(
        NAME,
        TITLE,
        params={
            "paths": paths,
            "messages": counts,
            "body_size": args.body_size,
            "driver_memory": args.driver_memory,
            "executor_memory": args.executor_memory,
            "sink": "noop",
            "options": "defaults",
        },
    )
    report.notes.append("load average at the start: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    if len(paths) > 1:
        # one process per path: pyspark keeps the driver's JVM for the life of the process, so a second
        # application here would run in the first one's JVM, its heap and its collections
        for i, path in enumerate(paths):
            child = _run_child(args, path, counts[min(i, len(counts) - 1)])
            report.rows += child["results"]
            report.targets.update(child["targets"])
        report.notes.append("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
        return report
    work = Path(tempfile.mkdtemp(prefix="trionsq-spark-backlog-"))
    nsqds = []
    cluster = None
    try:
        nsqds = [NsqdProcess(work / f"nsqd{i}").start() for i in range(2)]
        cluster = StandaloneCluster(work / "standalone").start()
        for i, path in enumerate(paths):
            messages = counts[min(i, len(counts) - 1)]
            row = _run_path(cluster, nsqds, args, work / path, path == "driver", messages)
            report.rows.append({"path": path, **row})
            report.targets[f"{path} path, {messages:,} waiting: read to the end, no OutOfMemoryError"] = (
                "met" if row["oom"] == "no" and row["messages"] >= messages // 2 * 2 else "missed"
            )
    finally:
        if cluster is not None:
            cluster.stop()
        for nsqd in nsqds:
            if nsqd.is_running():
                nsqd.stop()
        shutil.rmtree(work, ignore_errors=True)
    report.notes.append("load average at the end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return report


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
