"""The Makefile's set-up: `make run` installs the daemons alone, `make test` everything the suite needs."""

import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dry_run(target: str, venv: Path) -> str:
    # -n prints the recipe without running it, -B as if nothing were installed yet.
    out = subprocess.run(
        ["make", "-n", "-B", f"VENV={venv}", target], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def pip_installs(recipe: str) -> list[str]:
    # What follows `pip install` on each line (the venv's path before it is the test's temporary directory).
    return [
        line.split("pip install", 1)[1]
        for line in recipe.splitlines()
        if "pip install" in line and "--upgrade pip" not in line
    ]


def test_run_installs_only_the_daemons(tmp_path):
    installs = pip_installs(dry_run("run", tmp_path / "venv"))
    assert installs, "make run must install the project"
    for line in installs:
        assert line.rstrip().endswith("-e ."), line
    assert not any(word in " ".join(installs) for word in ("test", "spark", "playwright"))


def test_test_installs_the_test_and_spark_extras(tmp_path):
    installs = pip_installs(dry_run("venv", tmp_path / "venv"))
    assert any("-e '.[test,spark]'" in line for line in installs), installs


def test_run_starts_the_three_daemons(tmp_path):
    recipe = dry_run("run", tmp_path / "venv")
    for daemon in ("nsqlookupd", "nsqadmin", "nsqd --data-path"):
        assert f"/bin/{daemon}" in recipe, daemon


def test_lint_installs_its_pinned_tools_and_runs_each_check(tmp_path):
    recipe = dry_run("lint", tmp_path / "venv")
    assert [line.strip() for line in pip_installs(recipe)] == ["--quiet -e '.[lint]'"]
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["lint"]
    assert sorted(requirement.split("==")[0] for requirement in lint) == ["mypy", "ruff"]
    assert all("==" in requirement for requirement in lint), "pinned: a fresh clone checks as CI does"
    # in this order; make stops at the first command that fails
    checks = [
        "-m ruff check .",
        "-m ruff format --check .",
        "-m mypy",
        "-Wall -Wextra -Werror",
        "nsqd/_speedups.c",
        "-m compileall",
    ]
    places = [recipe.find(check) for check in checks]
    assert -1 not in places and places == sorted(places), dict(zip(checks, places, strict=True))
