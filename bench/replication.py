"""Replication: what a copy on a peer costs, and the second peer of three copies. Publish throughput and publish-to-OK
latency, with and without it.

Three nsqd on this machine: two peers (plain nodes; every node can hold copies) and the node under test, started
without replication (``off``), with one peer (``1 peer``: two copies), and with both peers (``2 peers``: three
copies, the default ``--replication-min-insync=2``, so the faster peer's ACK answers; ``2 peers, min 3``: both must
hold it), each with a fresh data directory; the peers adopt no backlog a stopped node left them
(``--replica-takeover-timeout=0``). Workloads, into a topic whose one channel is drained by one consumer
(FIN for every message): ``PUB`` (16 connections, one message per round trip) and ``MPUB x200`` (4 connections),
200-byte bodies; then publish-to-OK latency at a fixed rate (10,000 msg/s by default: one MPUB per millisecond of
the messages due, each frame timed from its send to its OK). Goals: MPUB x200 with replication at least half the
rate without it; p99 publish-to-OK added below 2 ms. Run it as ``python -m bench.replication``; it prints a table
and writes ``bench/results/replication.json``. ``--modes`` runs some of the four (``off,1,2,3``: the peers, with
min-insync 3 for ``3``). Each node's whole log is kept in ``--log-dir`` (a new directory under /tmp by default:
``peer.log``, ``second.log`` and ``node-<mode>.log``), named in the report: a peer lost under load is explained
from both sides' logs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

from bench.common import Generators, ProcessSampler, Report, Target, main, percentile, unique_topic
from bench.consume import create_channel
from bench.load import build_roles
from bench.persistence import measure, publish_workloads

NAME = "replication"
TITLE = "replication to one and two peers on the same machine against none"


def add_arguments(parser) -> None:
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--pub-connections", type=int, default=16)
    parser.add_argument("--mpub-connections", type=int, default=4)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--latency-rate", type=float, default=10000.0)
    parser.add_argument("--modes", default="off,1,2,3", help="off, 1 (one peer), 2 (two), 3 (two, min-insync 3)")
    parser.add_argument("--log-dir", type=Path, help="where each node's log goes (a new directory under /tmp)")


#: ``--modes`` names: the mode's label in the table, and how many peers it streams to
MODES = {"off": ("off", 0), "1": ("1 peer", 1), "2": ("2 peers", 2), "3": ("2 peers, min 3", 2)}


class _WithPeer(ProcessSampler):
    """The node's CPU, as the generators sample it; its peers' together at the same moments, in
    ``peer_readings``."""

    def __init__(self, pid: int | None, peer_pids: list[int]) -> None:
        super().__init__(pid)
        self.peers = [ProcessSampler(peer_pid) for peer_pid in peer_pids]
        self.peer_readings: list[float] = []

    def cpu_seconds(self) -> float:
        self.peer_readings.append(sum(peer.cpu_seconds() for peer in self.peers))
        return super().cpu_seconds()


def throughput(args, target: Target, peers: list[Target], frame: bytes, per_frame: int, connections: int) -> dict:
    """The persistence scenario's measure (publishers and one consumer), with the CPU per message of nsqd and of
    nsqd and its peers together (the peers' work for the copies competes for the same two cores)."""
    pids = [peer.pid for peer in peers if peer.pid]
    sampler = _WithPeer(target.pid, pids)
    row = measure(args, target, frame, per_frame, connections, sampler)
    cpu, rate = row["nsqd_cpu"], row["pub msg/s"]
    readings = sampler.peer_readings
    peer_cpu = (readings[-1] - readings[0]) / (args.duration or 1) if len(readings) >= 2 and pids else None
    both = cpu + peer_cpu if cpu is not None and peer_cpu is not None else None
    return {
        **row,
        "cpu us/msg": cpu / rate * 1e6 if cpu and rate else None,
        "peer_cpu": peer_cpu,
        "both us/msg": both / rate * 1e6 if both and rate else None,
    }


def ok_latency(args, target: Target) -> dict:
    topic = unique_topic(NAME)
    create_channel(target, topic, "bench")
    generators = Generators()
    generators.add(
        build_roles,
        specs=[
            (
                "paced",
                1,
                dict(
                    address=target.tcp, topic=topic, rate=args.latency_rate, body_size=args.body_size, ok_latency=True
                ),
            ),
            ("sub", 1, dict(address=target.tcp, topic=topic, channel="bench", rdy=500)),
        ],
    )
    result = generators.run(warmup=args.warmup, duration=args.duration, sampler=target.sampler())
    samples = sorted(v for role in result["workers"][0]["roles"] for v in role.get("latencies", ()))
    return {
        "pub msg/s": sum(result["workers"][0]["window_counts"]) / result["window"],
        "ok p50 ms": percentile(samples, 0.50) / 1e6 if samples else None,
        "ok p99 ms": percentile(samples, 0.99) / 1e6 if samples else None,
    }


def run(args) -> Report:
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown mode(s): {', '.join(unknown)}")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="trionsq-bench-replication-", dir="/tmp"))
    log_dir.mkdir(parents=True, exist_ok=True)
    workloads = publish_workloads(args)
    report = Report(
        NAME,
        TITLE,
        params={
            "body_size": args.body_size,
            "pub_connections": args.pub_connections,
            "mpub_connections": args.mpub_connections,
            "batch": args.batch,
            "latency_rate": args.latency_rate,
            "duration_s": args.duration,
        },
    )
    baseline: dict[str, float] = {}
    report.notes.append(f"each node's whole log: {log_dir}")
    # each mode's node leaves the backlog its consumer did not drain on the peers when it stops: they keep it rather
    # than adopt it 30 s later, in the middle of a later mode, whose figures would then carry that takeover's work
    keep = ["--replica-takeover-timeout=0"]
    with (
        Target(args, keep, log_path=log_dir / "peer.log") as peer,
        Target(args, keep, log_path=log_dir / "second.log") as second,
    ):
        for node in (peer, second):
            if node.proc is not None:
                with contextlib.suppress(OSError):  # a peer is not the node under test: it may run on any CPU
                    os.sched_setaffinity(node.pid, os.sched_getaffinity(0))
        one = "--replicate-to={}:{}".format(*peer.tcp)
        two = "--replicate-to={}:{}".format(*second.tcp)
        for key in chosen:
            mode, count = MODES[key]
            peers = [peer, second][:count]
            flags = [one, two][:count] + (["--replication-min-insync=3"] if key == "3" else [])
            node_log = log_dir / f"node-{key}.log"
            with Target(args, ["--broadcast-address=127.0.0.1", *flags], log_path=node_log) as target:
                report.target = target.describe()
                for workload, frame, per_frame, connections in workloads:
                    try:
                        row = throughput(args, target, peers, frame, per_frame, connections)
                    except RuntimeError as exc:  # refused (a peer fell silent: degraded), or a lost connection
                        said = [line for line in target.lines if "REPLICATION" in line][-3:]
                        report.rows.append(
                            {
                                "mode": mode,
                                "workload": workload,
                                "error": str(exc)[-200:],
                                "log": said,
                                "logs": str(log_dir),
                            }
                        )
                        print(
                            f"replication: {mode} {workload} failed - {str(exc)[-200:]} {said} (logs: {log_dir})",
                            file=sys.stderr,
                        )
                        continue
                    if mode == "off":
                        baseline[workload] = row["pub msg/s"]
                    ratio = row["pub msg/s"] / baseline[workload] if baseline.get(workload) else None
                    report.rows.append({"mode": mode, "workload": workload, **row, "vs off": ratio})
                try:
                    row = ok_latency(args, target)
                except RuntimeError as exc:  # a generator lost its connection: said in the table, not a crash
                    report.rows.append(
                        {"mode": mode, "workload": f"paced {args.latency_rate:g}/s", "error": str(exc)[-200:]}
                    )
                    print(f"replication: {mode} paced failed - {str(exc)[-200:]}", file=sys.stderr)
                    continue
                if mode == "off":
                    baseline["latency"] = row["ok p99 ms"] or 0.0
                base = baseline.get("latency")
                added = row["ok p99 ms"] - base if row["ok p99 ms"] is not None and base is not None else None
                report.rows.append(
                    {"mode": mode, "workload": f"paced {args.latency_rate:g}/s", **row, "p99 added ms": added}
                )
    report.notes.append("the peers run on the same machine: the figures include their CPU competing with nsqd's")
    report.notes.append(
        "nsqd_cpu / peer_cpu: cores used by the node under test / its peers together (1.0 = one core); "
        "both us/msg: their CPU together per message published"
    )
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
