"""Fixtures of the compatibility tests."""

from __future__ import annotations

import pytest

from tests.compat.client_runs import nsqjs_missing


@pytest.fixture
def require_nsqjs():
    """Skip the test where node or nsqjs is not installed (``pytest.mark.usefixtures("require_nsqjs")``)."""
    reason = nsqjs_missing()
    if reason is not None:
        pytest.skip(reason)
