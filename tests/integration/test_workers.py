"""``--workers``: the number of processes serving one node. A bad value never starts a node."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .harness import REPO_ROOT, assert_refused_start

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_workers_below_one_is_fatal(tmp_path, value):
    assert_refused_start(
        "nsqd",
        [f"--workers={value}", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"],
        "--workers must be at least 1",
    )


def test_workers_not_a_number_in_the_config_file_is_fatal(tmp_path):
    config = tmp_path / "nsqd.toml"
    config.write_text('workers = "many"\n')
    assert_refused_start(
        "nsqd",
        [f"--config={config}", "--tcp-address=127.0.0.1:0", f"--data-path={tmp_path}"],
        "failed parsing workers 'many' in config file - expected an integer, got a string",
    )


def test_workers_not_a_number_on_the_command_line_is_a_usage_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "nsqd", "--workers=many", f"--data-path={tmp_path}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith('invalid value "many" for flag -workers: parse error\n'), done.stderr
    assert "Traceback" not in done.stderr


def test_workers_above_one_is_refused_until_carried(tmp_path):
    assert_refused_start(
        "nsqd",
        ["--workers=2", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"],
        "--workers above 1 is not available yet (bench/MULTICORE.md)",
    )
