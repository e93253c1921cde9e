"""Fixtures shared by the integration tests: data directories of restartable nsqd, and the daemons a test starts."""

from __future__ import annotations

import pytest

from tests.integration.harness import NsqdProcess
from tests.integration.persistence_helpers import DataDir, data_dirs


@pytest.fixture
def data_dir(tmp_path):
    """``data_dir(*flags)`` makes a data directory whose ``start()`` runs nsqd on it with ``flags``; each is cleaned
    up at the test's end."""
    yield from data_dirs(tmp_path, DataDir)


@pytest.fixture
def daemons():
    """The list a test appends the nsqd it starts to; those still running are killed at its end."""
    started: list[NsqdProcess] = []
    yield started
    for daemon in started:
        if daemon.is_running():
            daemon.kill()
