"""Spark source on a standalone cluster: the log path against the driver path, in one run.

A master and two 1-core workers (pyspark's ``spark-class`` on 127.0.0.1, executors in JVMs of
their own) and two nsqd, each holding ``--messages`` bodies (600,000) of ``--body-size`` bytes in the
query's channel before it starts (a topic per query; the log path's channel made a log first).
Each query streams the channels into Parquet with a checkpoint and only the options a user needs
(``minPartitions`` 2, no limit per trigger) until every message is in; per query a fresh
application (session) and a short warm-up query on a topic of its own, not measured.

Rows:
- ``driver path, 2 nsqd, 2 workers``: ``readMode=driver`` (the consumer and write-ahead log in
  the driver, the messages inside the partitions);
- ``log path, 2 nsqd, 2 workers``: executors read their offset ranges from nsqd;
- ``log path, 1 nsqd, 1 worker``: the same query on one nsqd (``--messages`` on it) and one
  executor (``spark.cores.max`` 1), for the shape of scaling.

Columns: messages per second from ``start()`` to the last batch committed (``msg_s``, the query's
start included: the delay to the first batch is in the notes), and CPU microseconds per message
of the driver's processes (Spark's JVM and its Python source runner; this process, which only
polls the query's progress, is ``bench_us_msg``), of the executors (their JVMs and Python workers)
and of nsqd, read from /proc over the query. Goals: the log path's driver CPU per message at most
a tenth of the driver path's, and at least twice its rate.

    python -m bench.spark_cluster [--messages 300000] [--body-size 200]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Report, main, unique_topic

NAME = "spark_cluster"
TITLE = "nsqd -> Spark (standalone cluster, 2 workers, 2 nsqd) -> Parquet: log path vs driver path"

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def add_arguments(parser) -> None:
    parser.add_argument("--messages", type=int, default=600_000,
                        help="messages waiting on each nsqd (enough that the query's start, a few seconds, does "
                             "not decide the figures)")
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--warmup-messages", type=int, default=30_000, help="per nsqd, before each measured query")
    parser.add_argument("--query-timeout", type=float, default=300.0, help="give up on a query after this long")
    parser.add_argument("--no-single", dest="single", action="store_false",
                        help="skip the one nsqd, one worker row")


def _cpu_by_role(nsqd_pids: set[int]) -> dict[str, float]:
    """CPU seconds so far: ``executors`` (an executor JVM and its descendants), ``daemons`` (the
    master and workers), ``nsqd``, ``bench`` (this process: it polls the query's progress),
    ``driver`` (the rest of this process's tree: Spark's JVM, the source runner). Processes that
    ended are counted in their reaped parent's children's time, so the roles stay whole."""
    stats, parent, cmd = {}, {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd[pid] = f.read()
        except OSError:
            continue
        stats[pid], parent[pid] = fields, int(fields[1])

    def role(pid: int) -> str | None:
        seen = pid
        while seen > 1:
            if seen in nsqd_pids:
                return "nsqd"
            line = cmd.get(seen, b"")
            if b"CoarseGrainedExecutorBackend" in line:
                return "executors"
            if b"deploy.master.Master" in line or b"deploy.worker.Worker" in line:
                return "daemons"
            if seen == os.getpid():
                return "bench" if pid == seen else "driver"
            seen = parent.get(seen, 1)
        return None

    totals: dict[str, float] = {}
    for pid, fields in stats.items():
        kind = role(pid)
        if kind is not None:
            totals[kind] = totals.get(kind, 0.0) + sum(int(x) for x in fields[11:15]) / _CLOCK_TICKS
    return totals


def _publish(nsqds, topic: str, count: int, body_size: int, log_channel: bool, topts) -> None:
    from spark_connector.log_client import LogNode
    from tests.integration.harness import RawClient

    body = b"b" * body_size
    for nsqd in nsqds:
        if log_channel:
            LogNode(nsqd.tcp_address, topts).offsets()  # the channel is a log before the messages come
        with RawClient(nsqd.tcp) as client:
            for i in range(0, count, 1000):
                client.publish_many(topic, [body] * min(1000, count - i))


def _create_channel(nsqd, topic: str) -> None:
    import urllib.request

    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=spark"):
        urllib.request.urlopen(urllib.request.Request("http://%s:%d%s" % (*nsqd.http(), path), method="POST"),
                               timeout=10).read()


def _query(spark, nsqds, topic: str, work: Path, driver_path: bool, total: int, timeout: float,
           nsqd_pids: set[int]) -> dict:
    reader = (spark.readStream.format("nsq")
              .option("nsqd.tcp.addresses", ",".join(n.tcp_address for n in nsqds))
              .option("topic", topic).option("channel", "spark").option("minPartitions", "2"))
    if driver_path:
        reader = reader.option("readMode", "driver").option("walPath", str(work / "wal"))
    before = _cpu_by_role(nsqd_pids)
    started, started_at = time.monotonic(), time.time()
    query = (reader.load().writeStream.format("parquet").option("path", str(work / "out"))
             .option("checkpointLocation", str(work / "checkpoint")).trigger(processingTime="0 seconds").start())
    seen: dict[int, dict] = {}
    done = 0
    finished = started
    try:
        while done < total and time.monotonic() - started < timeout:
            if query.exception() is not None:
                raise RuntimeError(f"query failed: {query.exception()}")
            for progress in query.recentProgress:
                if progress["batchId"] not in seen:
                    seen[progress["batchId"]] = progress
                    done += progress["numInputRows"]
            finished = time.monotonic()
            time.sleep(0.05)
    finally:
        after = _cpu_by_role(nsqd_pids)
        query.stop()
    loaded = sorted((p for p in seen.values() if p["numInputRows"]), key=lambda p: p["batchId"])
    import datetime

    first = (datetime.datetime.fromisoformat(loaded[0]["timestamp"].replace("Z", "+00:00")).timestamp() - started_at
             if loaded else None)
    elapsed = finished - started
    cpu = {role: (after.get(role, 0.0) - before.get(role, 0.0)) * 1e6 / max(done, 1) for role in after}
    return {"messages": done, "seconds": elapsed, "msg_s": done / elapsed if elapsed else 0.0,
            "driver_us_msg": cpu.get("driver", 0.0), "executors_us_msg": cpu.get("executors", 0.0),
            "nsqd_us_msg": cpu.get("nsqd", 0.0), "bench_us_msg": cpu.get("bench", 0.0), "batches": len(loaded),
            "_first_batch_s": first, "_batch_ms": [p["durationMs"].get("triggerExecution") for p in loaded],
            "_timed_out": done < total}


def _measure(cluster, nsqds, args, work: Path, driver_path: bool, cores: int, nsqd_pids: set[int]) -> dict:
    from bench.spark_throughput import build_session
    from spark_connector.options import SourceOptions

    conf = {**cluster.session_conf(), "spark.cores.max": str(cores)}
    spark = build_session(cluster.master_url, conf)
    try:
        import spark_connector

        spark_connector.register(spark)
        for phase, count in (("warm", args.warmup_messages), ("run", args.messages)):
            if not count:
                continue
            topic = unique_topic(f"spark_{phase}")
            topts = SourceOptions.parse({"nsqd.tcp.addresses": nsqds[0].tcp_address, "topic": topic,
                                         "channel": "spark"})
            if driver_path:
                for nsqd in nsqds:
                    _create_channel(nsqd, topic)
            _publish(nsqds, topic, count, args.body_size, not driver_path, topts)
            row = _query(spark, nsqds, topic, work / f"{phase}-{topic}", driver_path, count * len(nsqds),
                         args.query_timeout, nsqd_pids)
        return row
    finally:
        spark.stop()


def run(args) -> Report:
    from tests.integration.harness import NsqdProcess
    from tests.spark.standalone import StandaloneCluster

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    report = Report(NAME, TITLE, params={"messages_per_nsqd": args.messages, "body_size": args.body_size})
    report.notes.append("load average at the start: %.2f %.2f %.2f" % os.getloadavg())
    work = Path(tempfile.mkdtemp(prefix="trionsq-spark-cluster-"))
    nsqds = []
    cluster = None
    try:
        nsqds = [NsqdProcess(work / f"nsqd{i}").start() for i in range(2)]
        pids = {n.proc.pid for n in nsqds}
        cluster = StandaloneCluster(work / "standalone").start()
        runs = [("driver path, 2 nsqd, 2 workers", True, nsqds, 2), ("log path, 2 nsqd, 2 workers", False, nsqds, 2)]
        if args.single:
            runs.append(("log path, 1 nsqd, 1 worker", False, nsqds[:1], 1))
        results = {}
        for label, driver_path, targets, cores in runs:
            row = _measure(cluster, targets, args, work / label.replace(" ", "_").replace(",", ""), driver_path,
                           cores, pids)
            report.notes.append(f"{label}: first batch {row.pop('_first_batch_s') or 0:.1f} s after start(); "
                                f"batch durations (ms) {row.pop('_batch_ms')}")
            if row.pop("_timed_out"):
                report.notes.append(f"{label}: timed out with {row['messages']} messages")
            results[label] = row
            report.rows.append({"query": label, **row})
        driver, logp = results["driver path, 2 nsqd, 2 workers"], results["log path, 2 nsqd, 2 workers"]
        ratio_cpu = logp["driver_us_msg"] / driver["driver_us_msg"] if driver["driver_us_msg"] else 0.0
        ratio_rate = logp["msg_s"] / driver["msg_s"] if driver["msg_s"] else 0.0
        report.targets["driver CPU per message, log path <= 1/10 of the driver path's"] = (
            f"{'met' if ratio_cpu <= 0.1 else 'missed'} ({ratio_cpu:.3f})")
        report.targets["end to end, log path >= 2x the driver path's"] = (
            f"{'met' if ratio_rate >= 2 else 'missed'} ({ratio_rate:.2f}x)")
        if args.single:
            one = results["log path, 1 nsqd, 1 worker"]
            report.notes.append(f"scaling: 2 nsqd + 2 workers / 1 nsqd + 1 worker = "
                                f"{logp['msg_s'] / one['msg_s']:.2f}x on {os.cpu_count()} cores")
    finally:
        if cluster is not None:
            cluster.stop()
        for nsqd in nsqds:
            if nsqd.is_running():
                nsqd.stop()
        shutil.rmtree(work, ignore_errors=True)
    report.notes.append("load average at the end: %.2f %.2f %.2f" % os.getloadavg())
    return report


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
