"""``python -m bench [SCENARIO ...]`` (``make bench``): run the scenarios, print each table, write the JSON.

Scenarios are the modules of this package that define ``NAME`` and ``run`` (see ``common.py``); the
known ones run in the order below, any other one found afterwards. Each runs in its own process
(``python -m bench.<name>``) so that one failure, or one scenario's memory, never affects the next.
The flags that choose the server under test, the window and the results directory are passed on, and so
are any other flags when scenarios are named (``python -m bench memory --against 73b8c37 --rounds 4``): each
named scenario gets them (``python -m bench.<name> --help`` lists a scenario's own).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pkgutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS_DIR, format_table

ORDER = [
    "pub",
    "pub_against",
    "mpub",
    "consume",
    "pubsub",
    "workers",
    "idle",
    "client",
    "latency",
    "http",
    "memory",
    "instructions",
    "fairness",
    "isolation",
    "persistence",
    "replication",
    "many",
    "many_lookupd",
    "spark_throughput",
    "spark_sink",
    "spark_cluster",
    "spark_backlog",
]
#: modules of this package that are not scenarios
HELPERS = {"common", "load", "__main__"}

#: the figure of each scenario shown in the closing summary: (column, how to pick the row)
HEADLINES = {
    "pub": ["msg/s"],
    "pub_against": ["pinned", "code", "nsqd_us/msg", "vs before"],
    "mpub": ["msg/s", "MB/s"],
    "consume": ["msg/s"],
    "pubsub": ["in msg/s", "out msg/s"],
    "workers": ["scenario", "code", "workers", "msg/s", "nsqd_us/msg"],
    "idle": ["code", "workers", "process", "cpu ms/s", "wake-ups/s"],
    "client": ["client", "workload", "msg/s", "client us/msg"],
    "latency": ["rate", "p50 ms", "p99 ms", "p99.9 ms"],
    "http": ["endpoint", "requests/s", "msg/s"],
    "memory": ["code", "channels", "state", "overhead/msg", "scenario", "nsqd_us/msg", "vs before"],
    "instructions": ["code", "workload", "net Ir/msg", "all/msg"],
    "fairness": ["few/many", "jain"],
    "isolation": ["live channel", "p99 ms", "drain msg/s"],
    "many_lookupd": ["nsqd", "reg/s", "lookup p99 ms", "after p99 ms"],
    "replication": ["mode", "workload", "pub msg/s", "vs off", "ok p99 ms", "p99 added ms"],
    "many": ["step", "ms", "p99 ms", "cpu ms", "cpu share", "topic KB", "channel KB", "connection KB"],
    "spark_cluster": ["sink", "per_trigger", "query", "msg_s", "driver_us_msg", "executors_us_msg"],
    "spark_backlog": ["path", "messages", "msg_s", "driver_heap_peak_MB", "exec_heap_peak_MB", "oom"],
}


def discover() -> list[str]:
    here = Path(__file__).resolve().parent
    found = [info.name for info in pkgutil.iter_modules([str(here)]) if info.name not in HELPERS]
    scenarios = [name for name in ORDER if name in found]
    for name in sorted(found):
        if name in scenarios:
            continue
        spec = importlib.util.find_spec(f"bench.{name}")
        source = Path(spec.origin).read_text() if spec and spec.origin else ""
        if "\nNAME = " in source and "\ndef run(" in source:
            scenarios.append(name)
    return scenarios


def summary(names: list[str], results_dir: Path, failed: list[str] = ()) -> str:
    rows = []
    for name in names:
        if name in failed:
            rows.append({"scenario": name, "figures": "FAILED (see its output above)"})
            continue
        path = results_dir / f"{name}.json"
        if not path.exists():
            continue
        document = json.loads(path.read_text())
        if document.get("skipped"):
            rows.append({"scenario": name, "figures": f"skipped: {document['skipped']}"})
            continue
        columns = HEADLINES.get(name)
        for row in document.get("results", []):
            keys = columns or list(row)[:4]
            text = ", ".join(f"{key}={_short(row.get(key))}" for key in keys if key in row)
            rows.append({"scenario": name, "figures": text})
    return format_table(rows)


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return str(value)


def _run_scenario(name: str, forwarded: list[str], timeout: float):
    """One scenario in its own process group; past ``timeout`` the group (the scenario, its nsqd and
    its generators) gets SIGTERM, then SIGKILL."""
    process = subprocess.Popen([sys.executable, "-m", f"bench.{name}", *forwarded], start_new_session=True)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        return "timeout"
    except KeyboardInterrupt:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)
        raise


def main(argv: list[str] | None = None) -> int:
    available = discover()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument(
        "scenarios", nargs="*", metavar="SCENARIO", help=f"scenarios to run (default: all): {', '.join(available)}"
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--nsqd-tcp-address")
    parser.add_argument("--nsqd-http-address")
    parser.add_argument("--nsqd-pid")
    parser.add_argument("--nsqd-arg", action="append", default=[])
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--duration", help="seconds measured per figure (each scenario's default otherwise)")
    parser.add_argument("--warmup")
    pinning = parser.add_mutually_exclusive_group()
    pinning.add_argument(
        "--pin",
        dest="pin",
        action="store_true",
        default=None,
        help="pin in every scenario (pub, pubsub and latency run unpinned by default)",
    )
    pinning.add_argument("--no-pin", dest="pin", action="store_false", help="pin in no scenario")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per scenario")
    args, scenario_flags = parser.parse_known_args(argv)
    if args.list:
        print("\n".join(available))
        return 0
    unknown = [name for name in args.scenarios if name not in available]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; available: {', '.join(available)}")
    if scenario_flags and not args.scenarios:
        parser.error(f"{' '.join(scenario_flags)}: a scenario's own flags need the scenario named")
    names = args.scenarios or available
    forwarded: list[str] = []
    for flag in ("nsqd_tcp_address", "nsqd_http_address", "nsqd_pid", "duration", "warmup"):
        value = getattr(args, flag)
        if value is not None:
            forwarded.append(f"--{flag.replace('_', '-')}={value}")
    forwarded += [f"--nsqd-arg={value}" for value in args.nsqd_arg]
    forwarded.append(f"--results-dir={args.results_dir}")
    if args.pin is not None:
        forwarded.append("--pin" if args.pin else "--no-pin")
    forwarded += scenario_flags
    failed = []
    for name in names:
        started = time.monotonic()
        print(f"\n### {name}", flush=True)
        code = _run_scenario(name, forwarded, args.timeout)
        print(
            f"### {name}: {'ok' if code == 0 else f'FAILED ({code})'} in {time.monotonic() - started:.0f} s", flush=True
        )
        if code != 0:
            failed.append(name)
    print("\n== summary")
    print(summary(names, args.results_dir, failed))
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
