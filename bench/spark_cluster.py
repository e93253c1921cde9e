"""Spark source on a standalone cluster: the log path against the driver path, in one run, in a
warmed steady state, at two batch sizes.

A master and two 1-core workers (pyspark's ``spark-class`` on 127.0.0.1, executors in JVMs of
their own) and two nsqd. Per row: a fresh application (session, ``spark.driver.memory``
``--driver-memory`` on both paths); a warm-up query on a topic of its own
(``--warmup-messages`` in batches of ``--warmup-per-trigger``, not measured: about 60 micro-batches,
after which the JIT has compiled most of Spark's per-batch code; with 8 it still spent half the
driver's CPU); then the measured query on a new topic holding ``--messages`` bodies of
``--body-size`` bytes in all, split evenly between the row's nsqd, waiting before ``start()`` (the
log path's channel made a log first). The measured query takes at most ``--per-trigger`` messages
per micro-batch, the same value on both paths (``maxOffsetsPerTrigger`` on the log path;
``maxMessagesPerTrigger`` on the driver path, whose consumer may run at most two batches ahead of
Spark: ``maxBacklogMessages``; its batches are what the consumer logged meanwhile, often less than
the cap), ``minPartitions`` 2, into the sink of the row, with a checkpoint. One set of rows per
``--per-trigger`` value (default 200,000 and 1,000,000, with 2,000,000 and 6,000,000 messages).

Steady window: CPU of every process is read from /proc when a batch's commit file appears in the
checkpoint; the window runs from the commit of the ``--skip``-th batch with rows to the commit of
the ``--skip``-th from the end (``--skip`` 1 for a query of fewer than ``2 * skip + 4`` batches),
so start-up, the first batch and the tail (where the driver path's consumer has nothing left to
read) are outside it. Columns: messages per second in the window (``msg_s``), mean rows per batch
(``rows_batch``); CPU microseconds per message in it of the driver's JVM (``driver_jvm``), of its
Python source runner(s) (``driver_py``), their sum (``driver``), and per batch: ``driver_ms_batch``,
with two parts of the JVM's share, its JIT compiler threads (``driver_jit_ms_batch``) and the
processes it started and reaped (``driver_children_ms_batch``: Hadoop's local file system runs a
shell command at each rename of a checkpoint file); of the executors (their JVMs, ``exec_jvm``,
and Python workers, ``exec_py``; per batch ``exec_ms_batch``) and of nsqd. This process only
watches the checkpoint and the query's progress (``bench``). Start-up, per query: seconds from
``start()`` to the first commit and the driver's CPU seconds over it, less the steady cost of that
batch's messages (``startup_s``, ``startup_cpu_s``). ``load_1min``: the 1-minute load average
before and after the row.

Rows: the driver path (``readMode=driver``: the consumer and write-ahead log in the driver, the
messages inside the partitions) and the log path (executors read their offset ranges from nsqd),
two nsqd and two workers, with each sink of ``--sinks`` (``noop``: Spark's sink that drops the
rows, for the source's own throughput; ``parquet``: files, as a user's query would); and, at the
last ``--per-trigger`` value, the log path with one nsqd and one executor (``spark.cores.max`` 1),
for the shape of scaling. Goals, per sink and batch size: the log path's driver CPU per message at
most a tenth of the driver path's, and at least twice its rate.

    python -m bench.spark_cluster [--per-trigger 200000,1000000] [--messages 2000000,6000000] [--sinks noop,parquet]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Report, load_average_note, main, unique_topic

NAME = "spark_cluster"
TITLE = "nsqd -> Spark (standalone cluster, 2 workers, 2 nsqd) -> sink: log path vs driver path, steady state"

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_ROLES = ("driver_jvm", "driver_py", "executors_jvm", "executors_py", "nsqd", "bench", "driver_jit", "driver_children")


def add_arguments(parser) -> None:
    parser.add_argument(
        "--per-trigger",
        type=_counts,
        default=[200_000, 1_000_000],
        help="messages per micro-batch, the same on both paths; comma-separated, one set of rows each",
    )
    parser.add_argument(
        "--messages",
        type=_counts,
        default=[2_000_000, 6_000_000],
        help="messages waiting before the measured query, in all (split between the row's nsqd); "
        "comma-separated, one per --per-trigger value (the last one repeats)",
    )
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument(
        "--skip",
        type=int,
        default=2,
        help="batches with rows left out of the window at its start and at its end (1 for a query "
        "of fewer than 2 * skip + 4 batches)",
    )
    parser.add_argument("--sinks", default="noop,parquet", help="comma-separated: noop, parquet")
    parser.add_argument("--warmup-messages", type=int, default=1_200_000, help="in all, before each measured query")
    parser.add_argument(
        "--warmup-per-trigger",
        type=int,
        default=20_000,
        help="messages per micro-batch of the warm-up query: many batches, so that the JIT has "
        "compiled Spark's per-batch code before the measured query",
    )
    parser.add_argument(
        "--driver-memory",
        default="4g",
        help="spark.driver.memory of both paths (the driver path carries a batch's bodies)",
    )
    parser.add_argument("--query-timeout", type=float, default=300.0, help="give up on a query after this long")
    parser.add_argument(
        "--no-single",
        dest="single",
        action="store_false",
        help="skip the one nsqd, one worker rows (run with the last --per-trigger value)",
    )


def _counts(text: str) -> list[int]:
    return [int(part.replace("_", "")) for part in text.split(",") if part.strip()]


def _cpu_by_role(nsqd_pids: set[int]) -> dict[str, float]:
    """CPU seconds so far: ``executors_jvm`` and ``executors_py`` (an executor's JVM, and its
    descendants: the Python workers that run the source's reads), ``daemons`` (the
    master and workers), ``nsqd``, ``bench`` (this process), and this process's other
    descendants: ``driver_jvm`` (Spark's JVM) and ``driver_py`` (the Python source runners it
    starts). Processes that ended are counted in their reaped parent's children's time (a source
    runner's in the JVM's), so the roles stay whole. Two parts of ``driver_jvm`` are also given
    apart: ``driver_jit`` (its JIT compiler threads) and ``driver_children`` (processes it started
    and reaped: on a local checkpoint, Hadoop's file system runs a shell command to read a link at
    every rename of a checkpoint file)."""
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
                return "executors_jvm" if seen == pid else "executors_py"
            if b"deploy.master.Master" in line or b"deploy.worker.Worker" in line:
                return "daemons"
            if seen == os.getpid():
                if pid == seen:
                    return "bench"
                return "driver_jvm" if b"java" in cmd.get(pid, b"").split(b"\0", 1)[0] else "driver_py"
            seen = parent.get(seen, 1)
        return None

    totals: dict[str, float] = {}
    for pid, fields in stats.items():
        kind = role(pid)
        if kind is not None:
            totals[kind] = totals.get(kind, 0.0) + sum(int(x) for x in fields[11:15]) / _CLOCK_TICKS
        if kind == "driver_jvm":
            totals["driver_children"] = (
                totals.get("driver_children", 0.0) + (int(fields[13]) + int(fields[14])) / _CLOCK_TICKS
            )
            totals["driver_jit"] = totals.get("driver_jit", 0.0) + _jit_seconds(pid)
    return totals


def _jit_seconds(pid: int) -> float:
    """CPU seconds of a JVM's JIT compiler threads (HotSpot names them ``C1/C2 CompilerThread<n>``)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if "CompilerThre" not in f.read():
                    continue
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _CLOCK_TICKS


def _publish(nsqds, topic: str, count: int, body_size: int, log_channel: bool) -> None:
    """``count`` bodies split evenly between ``nsqds``."""
    from spark_connector.log_client import LogNode
    from spark_connector.options import SourceOptions
    from tests.integration.harness import RawClient

    body = b"b" * body_size
    each = count // len(nsqds)
    for nsqd in nsqds:
        if log_channel:  # the channel is a log before the messages come
            LogNode(
                nsqd.tcp_address,
                SourceOptions.parse({"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, "channel": "spark"}),
            ).offsets()
        else:
            _create_channel(nsqd, topic)
        with RawClient(nsqd.tcp) as client:
            for i in range(0, each, 1000):
                client.publish_many(topic, [body] * min(1000, each - i))


def _create_channel(nsqd, topic: str) -> None:
    import urllib.request

    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=spark"):
        urllib.request.urlopen(
            urllib.request.Request("http://{}:{}{}".format(*nsqd.http(), path), method="POST"), timeout=10
        ).read()


def _commits(checkpoint: Path) -> set[int]:
    try:
        return {int(name) for name in os.listdir(checkpoint / "commits") if name.isdigit()}
    except OSError:
        return set()


def _query(
    spark,
    nsqds,
    topic: str,
    work: Path,
    driver_path: bool,
    sink: str,
    per_trigger: int,
    total: int,
    timeout: float,
    nsqd_pids: set[int],
) -> dict:
    """Run one query until ``total`` rows are in; return its batches: id, rows, commit time and
    the CPU by role read at that commit."""
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd.tcp.addresses", ",".join(n.tcp_address for n in nsqds))
        .option("topic", topic)
        .option("channel", "spark")
        .option("minPartitions", "2")
    )
    if driver_path:
        reader = (
            reader.option("readMode", "driver")
            .option("walPath", str(work / "wal"))
            .option("maxMessagesPerTrigger", str(per_trigger))
            .option("maxBacklogMessages", str(2 * per_trigger))
        )
    else:
        reader = reader.option("maxOffsetsPerTrigger", str(per_trigger))
    writer = reader.load().writeStream.format(sink).option("checkpointLocation", str(work / "checkpoint"))
    if sink != "noop":
        writer = writer.option("path", str(work / "out"))
    before = _cpu_by_role(nsqd_pids)
    started = time.monotonic()
    query = writer.trigger(processingTime="0 seconds").start()
    committed: dict[int, tuple[float, dict]] = {}
    rows: dict[int, int] = {}
    polled = 0.0
    try:
        while sum(rows.values()) < total and time.monotonic() - started < timeout:
            for batch in sorted(_commits(work / "checkpoint") - committed.keys()):
                committed[batch] = (time.monotonic(), _cpu_by_role(nsqd_pids))
            if time.monotonic() - polled > 0.5:  # the rows of each batch, from Spark's progress
                polled = time.monotonic()
                if query.exception() is not None:
                    raise RuntimeError(f"query failed: {query.exception()}")
                for progress in query.recentProgress:
                    rows[progress["batchId"]] = progress["numInputRows"]
            time.sleep(0.005)
    finally:
        query.stop()
    return {
        "started": started,
        "before": before,
        "committed": committed,
        "rows": rows,
        "timed_out": sum(rows.values()) < total,
    }


def _figures(run: dict, skip: int) -> dict:
    """The steady window's rate and CPU per message; the start-up's seconds and CPU."""
    loaded = [b for b in sorted(run["rows"]) if run["rows"][b] and b in run["committed"]]
    if len(loaded) < 2 * skip + 4:
        skip = 1
    if len(loaded) < 2 * skip + 1:
        raise RuntimeError(f"only {len(loaded)} batches with rows: lower --per-trigger or --skip")
    first, last = loaded[skip - 1] if skip else None, loaded[-1 - skip]
    t0, cpu0 = run["committed"][first] if first is not None else (run["started"], run["before"])
    t1, cpu1 = run["committed"][last]
    window = [b for b in loaded if (first is None or b > first) and b <= last]
    messages = sum(run["rows"][b] for b in window)
    seconds = t1 - t0
    us = {role: (cpu1.get(role, 0.0) - cpu0.get(role, 0.0)) * 1e6 / messages for role in _ROLES}
    us["driver"] = us["driver_jvm"] + us["driver_py"]
    us["executors"] = us["executors_jvm"] + us["executors_py"]
    first_commit_t, first_cpu = run["committed"][loaded[0]]
    driver_cpu = lambda cpu: cpu.get("driver_jvm", 0.0) + cpu.get("driver_py", 0.0)  # noqa: E731
    startup_cpu = driver_cpu(first_cpu) - driver_cpu(run["before"]) - us["driver"] * run["rows"][loaded[0]] / 1e6
    per_batch = messages / len(window) / 1e3  # us per message -> ms per batch
    return {
        "window_msgs": messages,
        "batches": len(window),
        "rows_batch": messages / len(window),
        "msg_s": messages / seconds if seconds else 0.0,
        "driver_us_msg": us["driver"],
        "driver_jvm": us["driver_jvm"],
        "driver_py": us["driver_py"],
        "driver_ms_batch": us["driver"] * per_batch,
        "driver_jit_ms_batch": us["driver_jit"] * per_batch,
        "driver_children_ms_batch": us["driver_children"] * per_batch,
        "executors_us_msg": us["executors"],
        "exec_jvm": us["executors_jvm"],
        "exec_py": us["executors_py"],
        "exec_ms_batch": us["executors"] * per_batch,
        "nsqd_us_msg": us["nsqd"],
        "bench_us_msg": us["bench"],
        "startup_s": first_commit_t - run["started"],
        "startup_cpu_s": startup_cpu,
    }


def _measure(
    cluster,
    nsqds,
    args,
    work: Path,
    driver_path: bool,
    sink: str,
    cores: int,
    per_trigger: int,
    messages: int,
    nsqd_pids: set[int],
) -> dict:
    from bench.spark_throughput import build_session

    conf = {**cluster.session_conf(), "spark.cores.max": str(cores), "spark.driver.memory": args.driver_memory}
    spark = build_session(cluster.master_url, conf)
    try:
        import spark_connector

        spark_connector.register(spark)
        if args.warmup_messages:
            topic = unique_topic("spark_warm")
            _publish(nsqds, topic, args.warmup_messages, args.body_size, not driver_path)
            _query(
                spark,
                nsqds,
                topic,
                work / f"warm-{topic}",
                driver_path,
                sink,
                min(args.warmup_per_trigger, args.warmup_messages),
                args.warmup_messages,
                args.query_timeout,
                nsqd_pids,
            )
        topic = unique_topic("spark_run")
        _publish(nsqds, topic, messages, args.body_size, not driver_path)
        run = _query(
            spark,
            nsqds,
            topic,
            work / f"run-{topic}",
            driver_path,
            sink,
            per_trigger,
            messages // len(nsqds) * len(nsqds),
            args.query_timeout,
            nsqd_pids,
        )
        if run["timed_out"]:
            raise RuntimeError(f"the query timed out with {sum(run['rows'].values())} messages")
        return _figures(run, args.skip)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def run(args) -> Report:
    from tests.integration.harness import NsqdProcess
    from tests.spark.standalone import StandaloneCluster

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sinks = [s.strip() for s in args.sinks.split(",") if s.strip()]
    sizes = [(per, args.messages[min(i, len(args.messages) - 1)]) for i, per in enumerate(args.per_trigger)]
    report = Report(
        NAME,
        TITLE,
        params={
            "messages": args.messages,
            "body_size": args.body_size,
            "per_trigger": args.per_trigger,
            "skip": args.skip,
            "sinks": sinks,
            "warmup": f"{args.warmup_messages} in batches of {args.warmup_per_trigger}",
            "driver_memory": args.driver_memory,
        },
    )
    report.notes.append(load_average_note("start"))
    work = Path(tempfile.mkdtemp(prefix="trionsq-spark-cluster-"))
    nsqds = []
    cluster = None
    try:
        nsqds = [NsqdProcess(work / f"nsqd{i}").start() for i in range(2)]
        pids = {n.proc.pid for n in nsqds}
        cluster = StandaloneCluster(work / "standalone").start()
        for sink in sinks:
            for n, (per_trigger, messages) in enumerate(sizes):
                runs = [
                    ("driver path, 2 nsqd, 2 workers", True, nsqds, 2),
                    ("log path, 2 nsqd, 2 workers", False, nsqds, 2),
                ]
                if args.single and n == len(sizes) - 1:
                    runs.append(("log path, 1 nsqd, 1 worker", False, nsqds[:1], 1))
                results = {}
                for label, driver_path, targets, cores in runs:
                    name = f"{sink}-{per_trigger}-{label}".replace(" ", "_").replace(",", "")
                    load = f"{os.getloadavg()[0]:.1f}"
                    row = _measure(
                        cluster, targets, args, work / name, driver_path, sink, cores, per_trigger, messages, pids
                    )
                    results[label] = row
                    report.rows.append(
                        {
                            "sink": sink,
                            "per_trigger": per_trigger,
                            "query": label,
                            **row,
                            "load_1min": f"{load}-{os.getloadavg()[0]:.1f}",
                        }
                    )
                driver, logp = results[runs[0][0]], results[runs[1][0]]
                ratio_cpu = logp["driver_us_msg"] / driver["driver_us_msg"] if driver["driver_us_msg"] else 0.0
                ratio_rate = logp["msg_s"] / driver["msg_s"] if driver["msg_s"] else 0.0
                key = f"{sink}, {per_trigger:,} per trigger"
                report.targets[f"{key}: driver CPU per message, log path <= 1/10 of the driver path's"] = (
                    f"{'met' if ratio_cpu <= 0.1 else 'missed'} ({ratio_cpu:.3f})"
                )
                report.targets[f"{key}: end to end, log path >= 2x the driver path's"] = (
                    f"{'met' if ratio_rate >= 2 else 'missed'} ({ratio_rate:.2f}x)"
                )
                if len(runs) > 2:
                    one = results[runs[2][0]]
                    report.notes.append(
                        f"{key}: scaling, 2 nsqd + 2 workers / 1 nsqd + 1 worker = "
                        f"{logp['msg_s'] / one['msg_s']:.2f}x on {os.cpu_count()} cores"
                    )
    finally:
        if cluster is not None:
            cluster.stop()
        for nsqd in nsqds:
            if nsqd.is_running():
                nsqd.stop()
        shutil.rmtree(work, ignore_errors=True)
    report.notes.append(load_average_note("end"))
    return report


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__]))
