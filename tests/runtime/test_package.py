"""The split between ``protocol`` (pure wire formats) and ``runtime`` (the daemons' drivers) holds."""

import os
import subprocess
import sys
from pathlib import Path

import runtime

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL_MODULES = sorted(p.stem for p in (ROOT / "protocol").glob("*.py") if p.stem != "__init__")


def test_runtime_imported_from_this_checkout():
    assert Path(runtime.__file__).resolve().parent == ROOT / "runtime"


def test_no_protocol_module_imports_io_or_an_event_loop():
    # Every module, not only the package's re-exports: one that pulled in trio or socket belongs in runtime/.
    code = (
        "import importlib, sys\n"
        f"for name in {PROTOCOL_MODULES!r}:\n"
        "    importlib.import_module('protocol.' + name)\n"
        "print(sorted(m for m in ('trio', 'socket', 'asyncio', 'ssl', 'selectors', 'runtime') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert len(PROTOCOL_MODULES) >= 10
    assert out.stdout.strip() == "[]"
