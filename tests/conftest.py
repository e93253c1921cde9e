"""Shared fixtures: nsqd subprocesses for the end-to-end suites (tests/integration, tests/compat)."""

from __future__ import annotations

import itertools
import os
import uuid

import pytest

from tests.integration.features import Certificates, make_certificates
from tests.integration.harness import WORKERS_ENV, NsqdProcess, stop_all

_daemon_numbers = itertools.count()


@pytest.fixture
def nsqd_factory(tmp_path_factory):
    """Start nsqd subprocesses with extra flags: ``nsqd_factory("--max-channel-consumers=1")``."""
    daemons: list[NsqdProcess] = []

    def start(*args: str) -> NsqdProcess:
        data_path = tmp_path_factory.mktemp(f"nsqd{next(_daemon_numbers)}")
        daemon = NsqdProcess(data_path, args)
        daemons.append(daemon)
        return daemon.start()

    yield start
    stop_all(daemons)


@pytest.fixture
def nsqd(nsqd_factory) -> NsqdProcess:
    """A fresh nsqd with default options for one test."""
    return nsqd_factory()


@pytest.fixture(scope="module")
def module_nsqd(tmp_path_factory) -> NsqdProcess:
    """One nsqd shared by a module's tests (each test uses its own topics); must still exit 0 at the end."""
    daemon = NsqdProcess(tmp_path_factory.mktemp("nsqd-module"))
    daemon.start()
    yield daemon
    stop_all([daemon])


@pytest.fixture(scope="session")
def certs(tmp_path_factory) -> Certificates:
    """One throw-away CA for the run: a server certificate for 127.0.0.1, client certificates, a foreign CA."""
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def topic() -> str:
    """A topic name no other test uses."""
    return f"t_{uuid.uuid4().hex[:16]}"


def pytest_addoption(parser):
    parser.addoption(
        "--no-speedups",
        action="store_true",
        help="run nsqd without its C accelerator (TRIONSQ_NO_SPEEDUPS=1), in-process and in subprocesses; "
        "tests/nsqd/test_fastpath.py and tests/integration/test_fastpath.py run both modes anyway",
    )
    parser.addoption(
        "--nsqd-workers",
        type=int,
        default=None,
        help=f"start every nsqd of the end-to-end suites with --workers=N (sets {WORKERS_ENV}); tests marked "
        "one_worker are skipped when N is above 1",
    )


def pytest_configure(config):
    if config.getoption("--no-speedups"):
        os.environ["TRIONSQ_NO_SPEEDUPS"] = "1"
    workers = config.getoption("--nsqd-workers")
    if workers is not None:
        os.environ[WORKERS_ENV] = str(workers)


def pytest_collection_modifyitems(config, items):
    """With nsqd on several workers, what they do not carry yet (``one_worker``) is skipped."""
    if int(os.environ.get(WORKERS_ENV) or 1) == 1:
        return
    skip = pytest.mark.skip(reason=f"needs nsqd on one process ({WORKERS_ENV}={os.environ[WORKERS_ENV]})")
    for item in items:
        if item.get_closest_marker("one_worker") is not None:
            item.add_marker(skip)
