"""nsqlookupd's entry point: an address it cannot listen on is one FATAL line and exit code 1."""

from __future__ import annotations

import errno
import os

import pytest

from tests.integration.harness import assert_refused_start, taken_address

IN_USE = os.strerror(errno.EADDRINUSE)


@pytest.mark.parametrize("listener", ["tcp", "http"])
def test_taken_port_is_fatal(listener):
    with taken_address() as taken:
        addresses = {"tcp": "127.0.0.1:0", "http": "127.0.0.1:0", listener: taken}
        assert_refused_start(
            "lookupd",
            [f"--tcp-address={addresses['tcp']}", f"--http-address={addresses['http']}"],
            f"failed to instantiate nsqlookupd - listen ({taken}) failed - listen tcp {taken}: "
            f"bind: {IN_USE[:1].lower()}{IN_USE[1:]}",
        )
