"""The package as a user gets it: ``python -m build`` makes an sdist and a wheel, and both install and run outside
the checkout.

Built once per module in a temporary directory (``python -m build``: the sdist first, then the wheel from the
unpacked sdist, so the sdist is shown to hold what a build needs). Each install goes into an empty venv (made
``--without-pip``, filled by this venv's pip with ``--python``; pip's cache serves the dependencies), and
everything installed runs with its working directory outside the checkout and no ``PYTHONPATH``, so nothing can be
imported from here:

- the wheel: the console scripts with ``--version`` where NSQ 1.3.0's programs have it, ``import trionsq``, the C
  accelerator in use, nsqadmin's pages, and one message published and read through the installed nsqlookupd,
  nsqd, ``to_nsq`` and ``nsq_tail``;
- the sdist, installed with no C compiler reachable (``CC=/bin/false``, which setuptools' compiler honours, and a
  ``PATH`` without gcc or cc): the install succeeds without the extension and nsqd runs on the Python twins.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from protocol.version import NSQ_VERSION
from tests.integration.harness import REPO_ROOT, DaemonProcess, stop_all
from tests.integration.http_helpers import get, wait_for

pytestmark = pytest.mark.timeout(600)

PROGRAMS = (
    "nsqd",
    "nsqlookupd",
    "nsqadmin",
    "nsq_to_file",
    "nsq_tail",
    "to_nsq",
    "nsq_stat",
    "nsq_to_http",
    "nsq_to_nsq",
)
WITHOUT_VERSION_FLAG = {"to_nsq"}  # NSQ 1.3.0's to_nsq has no -version (NSQ-TOOLS-FACTS)
PACKAGES = ("protocol", "runtime", "nsqd", "lookupd", "admin", "spark_connector", "trionsq", "nsq_tools")


def package_version() -> str:
    """``__version__`` as trionsq/_version.py writes it (read, not imported)."""
    tree = ast.parse((REPO_ROOT / "trionsq" / "_version.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"]:
            return ast.literal_eval(node.value)
    raise AssertionError("trionsq/_version.py sets no __version__")


def run(argv: list, *, timeout: float, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """``argv`` run to its end (text output captured); with ``check``, its exit code must be 0."""
    done = subprocess.run([str(arg) for arg in argv], capture_output=True, text=True, timeout=timeout, **kwargs)
    if check:
        assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


@dataclass(frozen=True)
class Venv:
    """An installed copy and a directory outside the checkout to run it in."""

    path: Path
    outside: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def program(self, name: str) -> Path:
        return self.path / "bin" / name

    def env(self) -> dict[str, str]:
        return dict(os.environ, PYTHONPATH="", TRIONSQ_NO_SPEEDUPS="", PYTHONUNBUFFERED="1")

    def run(self, argv: list, *, check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        return run(argv, timeout=timeout, check=check, cwd=self.outside, env=self.env(), **kwargs)

    def python_says(self, code: str) -> str:
        """What ``code`` prints, run by the venv's interpreter in isolated mode (no cwd, no PYTHON* variables)."""
        return self.run([self.python, "-I", "-c", code]).stdout.strip()


def make_venv(tmp_path_factory, name: str, target: Path, env: dict[str, str] | None = None) -> Venv:
    path = tmp_path_factory.mktemp(name)
    run([sys.executable, "-m", "venv", "--without-pip", path], timeout=60)
    outside = tmp_path_factory.mktemp(f"{name}-cwd")
    run(
        [sys.executable, "-m", "pip", "--python", path / "bin" / "python", "install", "--quiet", target],
        timeout=300,
        cwd=outside,
        env=env,
    )
    return Venv(path, outside)


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    egg_info = REPO_ROOT / "trionsq.egg-info"  # the sdist step writes it into the checkout
    made_egg_info = not egg_info.exists()
    try:
        run([sys.executable, "-m", "build", "--outdir", out, REPO_ROOT], timeout=300, cwd=out)
    finally:
        if made_egg_info:
            shutil.rmtree(egg_info, ignore_errors=True)
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def wheel_venv(dists, tmp_path_factory) -> Venv:
    return make_venv(tmp_path_factory, "wheel-venv", dists["wheel"])


@pytest.fixture(scope="module")
def sdist_venv(dists, tmp_path_factory) -> Venv:
    no_compiler = tmp_path_factory.mktemp("no-compiler-bin")  # an empty PATH: no gcc, cc, clang
    env = dict(os.environ, PATH=str(no_compiler), CC="/bin/false", CXX="/bin/false")
    return make_venv(tmp_path_factory, "sdist-venv", dists["sdist"], env)


# -- what the files carry ------------------------------------------------------------------------------------------


def test_wheel_carries_the_accelerator_and_the_run_time_files(dists):
    wheel = dists["wheel"]
    assert not wheel.name.endswith("-none-any.whl"), f"{wheel.name} is not a platform wheel"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert any(n.startswith("nsqd/_speedups.") and n.endswith(".so") for n in names), sorted(names)
    shipped = {
        "admin/templates/index.html",
        *(f"admin/static/{p.name}" for p in (REPO_ROOT / "admin" / "static").iterdir()),
        "trionsq/py.typed",
        "protocol/py.typed",  # trionsq's errors derive from its ProtocolError
        "spark_connector/wal_pb2.py",
        "spark_connector/wal.proto",
    }
    assert shipped <= names, sorted(shipped - names)
    for package in PACKAGES:
        modules = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / package).rglob("*.py")}
        assert modules <= names, sorted(modules - names)
    assert not [n for n in names if n.startswith("tests/") or n.endswith(".c")], "the wheel carries sources or tests"


def test_sdist_carries_what_a_build_needs(dists):
    sdist = dists["sdist"]
    with tarfile.open(sdist) as archive:
        root = sdist.name.removesuffix(".tar.gz")
        names = {name.removeprefix(f"{root}/") for name in archive.getnames()}
    needed = {"setup.py", "pyproject.toml", "README.md", "CHANGELOG.md", "nsqd/_speedups.c", "PKG-INFO"}
    assert needed <= names, sorted(needed - names)
    assert not [n for n in names if n.startswith("tests/")], "the suite runs from a checkout"


def test_one_version_number(dists, wheel_venv):
    version = package_version()
    assert dists["wheel"].name.startswith(f"trionsq-{version}-"), dists["wheel"].name
    assert dists["sdist"].name == f"trionsq-{version}.tar.gz"
    said = wheel_venv.python_says(
        "import importlib.metadata, trionsq; print(trionsq.__version__, end=' ');"
        "print(importlib.metadata.version('trionsq'))"
    )
    assert said == f"{version} {version}"
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and "\nversion =" not in pyproject.split("[tool.")[0]
    # the changelog's newest numbered release is this version
    releases = [line for line in (REPO_ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## [")]
    assert releases[0] == "## [Unreleased]", releases[:2]
    assert releases[1].startswith(f"## [{version}] - "), releases[:2]


# -- the wheel, installed --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("program", PROGRAMS)
def test_console_script_version(wheel_venv, program):
    done = wheel_venv.run([wheel_venv.program(program), "--version"], check=False, timeout=30)
    if program in WITHOUT_VERSION_FLAG:
        assert done.returncode == 2, done
        assert "flag provided but not defined: -version" in done.stderr, done.stderr
        assert wheel_venv.run([wheel_venv.program(program), "-h"], check=False).returncode == 0
    else:
        assert done.returncode == 0, done
        # the NSQ version clients and tools expect, not the package's
        assert done.stdout.startswith(f"{program} v{NSQ_VERSION} (built w/python"), done.stdout


def test_imports_come_from_the_venv_with_the_accelerator(wheel_venv):
    site = wheel_venv.python_says("import sysconfig; print(sysconfig.get_paths()['purelib'])")
    files = wheel_venv.python_says(
        "import importlib\n"
        f"for name in {PACKAGES!r} + ('trionsq.blocking', 'spark_connector.wal_pb2', 'nsqd.server', 'admin.server'):\n"
        "    print(importlib.import_module(name).__file__)"
    ).splitlines()
    assert files and all(f.startswith(site + "/") for f in files), files
    assert wheel_venv.python_says("from nsqd import speedups; print(speedups.load() is not None)") == "True"


class InstalledDaemon(DaemonProcess):
    """A daemon started by its installed console script, outside the checkout."""

    def __init__(self, venv: Venv, program: str, args: list[str], ready: str = "TCP") -> None:
        super().__init__(args)
        self.module = program
        self.ready = ready
        self.venv = venv
        self.cwd = venv.outside
        self.env = {"PYTHONPATH": "", "TRIONSQ_NO_SPEEDUPS": ""}

    @property
    def argv(self) -> list[str]:
        return [str(self.venv.program(self.module)), *self.args]

    def address(self, listener: str) -> str:
        host, port = self.listening[listener]
        return f"{host}:{port}"


def publish_and_read(venv: Venv, nsqd: InstalledDaemon, lookupd: InstalledDaemon | None) -> None:
    """One message in through the installed ``to_nsq`` and out through the installed ``nsq_tail``, which finds
    nsqd through lookupd when there is one. The topic's message waits for the tool's channel (made when it
    subscribes), so the order needs no wait."""
    topic, body = "packaging", "one message through the installed tools"
    venv.run([venv.program("to_nsq"), f"--topic={topic}", f"--nsqd-tcp-address={nsqd.address('TCP')}"], input=body)
    if lookupd is None:
        source = f"--nsqd-tcp-address={nsqd.address('TCP')}"
    else:
        source = f"--lookupd-http-address={lookupd.address('HTTP')}"
        wait_for(
            lambda: get(lookupd.listening["HTTP"], f"/lookup?topic={topic}").status == 200,
            20,
            message=f"lookupd knows {topic}",
        )
    done = venv.run([venv.program("nsq_tail"), source, f"--topic={topic}", "--channel=read", "-n", "1"], timeout=60)
    assert done.stdout == body + "\n", done


def test_installed_daemons_carry_a_message(wheel_venv, tmp_path):
    lookupd = InstalledDaemon(wheel_venv, "nsqlookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"])
    daemons = [lookupd.start()]
    try:
        nsqd = InstalledDaemon(
            wheel_venv,
            "nsqd",
            [
                "--tcp-address=127.0.0.1:0",
                "--http-address=127.0.0.1:0",
                f"--data-path={tmp_path}",
                "--broadcast-address=127.0.0.1",
                f"--lookupd-tcp-address={lookupd.address('TCP')}",
            ],
        )
        daemons.append(nsqd.start())
        admin_args = ["--http-address=127.0.0.1:0", f"--lookupd-http-address={lookupd.address('HTTP')}"]
        admin = InstalledDaemon(wheel_venv, "nsqadmin", admin_args, ready="HTTP")
        daemons.append(admin.start())
        publish_and_read(wheel_venv, nsqd, lookupd)
        # nsqadmin's page and static files come from the installed package
        page = get(admin.listening["HTTP"], "/")
        assert page.status == 200 and b"<html" in page.body.lower(), page
        for static in sorted((REPO_ROOT / "admin" / "static").iterdir()):
            reply = get(admin.listening["HTTP"], f"/static/{static.name}")
            assert reply.status == 200 and reply.body == static.read_bytes(), (static.name, reply)
    finally:
        stop_all(daemons)


# -- the sdist, installed without a compiler -------------------------------------------------------------------------


def test_sdist_without_a_compiler_runs_on_the_python_twins(sdist_venv, tmp_path):
    site = Path(sdist_venv.python_says("import sysconfig; print(sysconfig.get_paths()['platlib'])"))
    assert (site / "nsqd" / "speedups.py").is_file()
    assert not list((site / "nsqd").glob("_speedups*")), "the extension was built without a compiler"
    assert sdist_venv.python_says("from nsqd import speedups; print(speedups.load())") == "None"
    args = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"]
    nsqd = InstalledDaemon(sdist_venv, "nsqd", args).start()
    try:
        publish_and_read(sdist_venv, nsqd, None)
    finally:
        stop_all([nsqd])
