"""Fixtures of nsqd's unit tests."""

from __future__ import annotations

import pytest

from nsqd.options import Options
from nsqd.server import NSQD


@pytest.fixture
def nsqd(tmp_path):
    """An in-process daemon (not started: no listener) with the 0.99 and 0.5 end-to-end latency percentiles. It
    stands in here for tests/conftest.py's ``nsqd`` subprocess; a module may define its own with other options."""
    daemon = NSQD(Options(data_path=str(tmp_path), node_id=1, e2e_processing_latency_percentiles=[0.99, 0.5]))
    yield daemon
    for topic in list(daemon.topics.values()):
        topic.close(persist=False)
