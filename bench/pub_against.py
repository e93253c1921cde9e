"""Scenario: ``pub`` against the code before the PUB round-trip work, the two alternated in one run.

bench/README.md states nsqd's CPU per PUB round trip against the code it started from (``BEFORE``: the commit
before bench/HISTORY.md's items 23-30). One ``pub`` run says little on a shared VM, where single runs of one
build spread by 10-20% and the host's speed drifts by as much within an hour; so this scenario makes
``--rounds`` pairs, the earlier code first in every other one, unpinned and then pinned, both under this tree's load
generator, and prints each build's median and the ratio of the medians, with each pair's ratio. nsqd's system
calls are not counted here (``--no-syscalls``): the counter costs both builds CPU on every call.

The earlier code is taken from git (``git archive``) into a temporary directory and started from there with
this venv's Python: ``python -m nsqd`` run in that directory imports its own packages first. It predates the
C accelerator, so nothing is built for it (a later revision given with ``--against`` gets its own built).
Without git, or without the commit (a source tarball, a shallow clone), the scenario says so and is skipped.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

from bench import common
from bench.common import REPO_ROOT, Report, Target, main, unique_topic
from bench.pub import MEM_QUEUE_SIZE, publish_rate
from protocol.commands import encode_pub

NAME = "pub_against"
TITLE = "TCP PUB round trip, this code against the code before the round-trip work, alternated"
#: the code before the PUB round-trip work (bench/HISTORY.md, items 23-30)
BEFORE = "1deece5"
PIN = False  # the unpinned half first, as users run nsqd; the pinned half follows in the same run


def add_arguments(parser) -> None:
    parser.add_argument("--against", default=BEFORE, help="the git revision to compare with")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="pairs of runs per pinning (single sets of 5 scatter by about 0.07 around the pooled ratio)",
    )
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--processes", type=int, default=1, help="generator processes (at most one per core)")


def resolve(revision: str | None) -> str:
    """The full commit name of ``revision``; None: the working tree's tracked files as they are, as a commit
    that ``git stash create`` makes without touching anything (HEAD when nothing is changed). Raises
    ``OSError``/``subprocess.SubprocessError`` when git cannot say."""

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", *argv], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()

    if revision is None:
        return git("stash", "create") or git("rev-parse", "--verify", "HEAD^{commit}")
    return git("rev-parse", "--verify", f"{revision}^{{commit}}")


def build_accelerator(source: Path) -> None:
    """Compile ``source`` (a tree's ``nsqd/_speedups.c``) beside it as ``pip install -e .`` does with this
    Python: its ``CFLAGS`` and ``CCSHARED``, then setup.py's ``-O2``. Called directly because a revision's
    packaging metadata may not suit this venv's setuptools; every tree a comparison runs is built by it, so
    no build differs from another in how it was compiled."""
    built = source.with_name("_speedups" + sysconfig.get_config_var("EXT_SUFFIX"))
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    flags = (sysconfig.get_config_var("CFLAGS") or "").split() + (sysconfig.get_config_var("CCSHARED") or "").split()
    paths = sysconfig.get_paths()
    includes = sorted({f"-I{paths['include']}", f"-I{paths['platinclude']}"})
    subprocess.run(
        [*compiler, *flags, "-O2", *includes, "-shared", str(source), "-o", str(built)],
        check=True,
        timeout=300,
        capture_output=True,
    )


def extract_both(report, against: str | None, now: str | None, trees: list[Path]) -> list[tuple[str, Path]] | None:
    """``extract`` of ``against`` and ``now``, labelled ``before (commit)`` and ``now (commit)``, their commits in
    ``report.params``; each tree made is appended to ``trees`` (the caller removes them). None, with
    ``report.skipped`` set, when git cannot give one."""
    for key, revision in (("against_commit", against), ("now_commit", now)):
        tree, commit = extract(revision)
        if tree is None:
            report.skipped = commit
            return None
        trees.append(tree)
        report.params[key] = commit
    return [
        (f"before ({report.params['against_commit'][:7]})", trees[-2]),
        (f"now ({report.params['now_commit'][:7]})", trees[-1]),
    ]


def codes_against(report: Report, against: str) -> list[tuple[str, Path | None]]:
    """The code of a scenario's ``--against`` comparison: ``("this", None)`` (this tree), after the tree of
    ``against`` labelled with its short commit when given and extracted (a note in ``report`` when git cannot).
    The caller removes the trees (``shutil.rmtree`` of each one not None)."""
    codes: list[tuple[str, Path | None]] = [("this", None)]
    if against:
        tree, commit = extract(against)
        if tree is None:
            report.notes.append(f"--against {against}: {commit}; this code only")
        else:
            codes.insert(0, (commit[:9], tree))
    return codes


def extract(revision: str | None) -> tuple[Path | None, str]:
    """The sources of ``revision`` (None: the working tree's tracked files, ``resolve``) in a new temporary
    directory, with its C accelerator built (``build_accelerator``) and its modules byte-compiled, and its full
    commit name; (None, why) when git cannot give them."""
    try:
        commit = resolve(revision)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"git has no commit {revision or 'of the working tree'!r} here ({exc.__class__.__name__})"
    tree = Path(tempfile.mkdtemp(prefix="trionsq-bench-tree-"))
    archive = tree / "sources.tar"
    try:
        subprocess.run(
            ["git", "archive", "--format=tar", "-o", str(archive), commit],
            cwd=REPO_ROOT,
            check=True,
            timeout=120,
            capture_output=True,
        )
        with tarfile.open(archive) as sources:
            sources.extractall(tree, filter="data")
    except (OSError, subprocess.SubprocessError, tarfile.TarError) as exc:
        shutil.rmtree(tree, ignore_errors=True)
        return None, f"git archive of {commit} failed ({exc.__class__.__name__})"
    archive.unlink()
    source = tree / "nsqd" / "_speedups.c"
    try:
        if source.exists():  # a revision with the C accelerator runs with it, as its install would build it
            build_accelerator(source)
        # the first start of each build would otherwise compile its modules, and only the first
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree)], check=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        shutil.rmtree(tree, ignore_errors=True)
        return None, f"building {commit} failed ({exc.__class__.__name__})"
    return tree, commit


def summary(label: str, pinned: bool, rows: list[dict], before: list[dict] | None = None) -> dict:
    """One build's medians over its runs; against ``before``'s, the ratio of the medians and of each pair."""

    def median(key: str) -> float | None:
        values = [row[key] for row in rows if row.get(key) is not None]
        return statistics.median(values) if values else None

    row = {
        "pinned": "yes" if pinned else "no",
        "code": label,
        "runs": len(rows),
        "msg/s": median("msg/s"),
        "nsqd_us/msg": median("nsqd_us/msg"),
        "user_us": median("user_us"),
        "sys_us": median("sys_us"),
        "gen_us": median("gen_us"),
        "each run us/msg": " ".join(f"{r['nsqd_us/msg']:.2f}" for r in rows),
    }
    if before is not None:
        base = statistics.median(r["nsqd_us/msg"] for r in before)
        row["vs before"] = row["nsqd_us/msg"] / base
        row["each pair"] = " ".join(
            f"{r['nsqd_us/msg'] / b['nsqd_us/msg']:.2f}" for r, b in zip(rows, before, strict=True)
        )
    return row


def run(args) -> Report:
    args.syscalls = False
    report = Report(
        NAME,
        TITLE,
        params={
            "against": args.against,
            "rounds": args.rounds,
            "connections": args.connections,
            "body_size": args.body_size,
            "processes": args.processes,
            "duration_s": args.duration,
        },
    )
    if args.nsqd_tcp_address:
        report.skipped = "starts both builds itself: not with --nsqd-tcp-address"
        return report
    tree, commit = extract(args.against)
    if tree is None:
        report.skipped = commit
        return report
    report.params["against_commit"] = commit
    frame = encode_pub(unique_topic(NAME), b"p" * args.body_size)
    try:
        for pinned in (False, True):
            args.pin = common._PINNING["on"] = pinned
            runs: dict[str, list[dict]] = {"before": [], "now": []}
            for number in range(args.rounds):
                builds = [("before", tree), ("now", REPO_ROOT)]
                # which build runs first alternates: the second of a pair tends to read a different CPU per message
                # on this shared machine, and the earlier code always first made the later look dearer
                for label, root in builds if number % 2 == 0 else builds[::-1]:
                    with Target(args, [f"--mem-queue-size={MEM_QUEUE_SIZE}"], root=root) as target:
                        runs[label].append(
                            publish_rate(args, target, frame, 1, args.connections, args.processes, breakdown=True)
                        )
            report.rows.append(summary(f"before ({commit[:7]})", pinned, runs["before"]))
            report.rows.append(summary("now", pinned, runs["now"], runs["before"]))
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    report.targets = {"vs before": "<= 0.5 (half of nsqd's CPU per PUB round trip)"}
    report.notes.append(
        "medians of the runs of each build; nsqd_us/msg: nsqd's CPU per PUB round trip "
        "(user_us and sys_us its user and kernel parts), gen_us the load generator's"
    )
    report.notes.append(
        "the generator and nsqd share the machine's cores; the earlier code runs first in even pairs, last in odd ones"
    )
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
