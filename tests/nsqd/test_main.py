"""nsqd's entry point: what stops it from starting is one FATAL line, in nsqd's words, and exit code 1."""

from __future__ import annotations

import fcntl
import os

import pytest

from tests.integration.harness import assert_refused_start, taken_address


@pytest.mark.parametrize("flag", ["--tcp-address", "--http-address"])
def test_taken_port_is_fatal_and_named(tmp_path, flag):
    with taken_address() as taken:
        args = {"--tcp-address": "127.0.0.1:0", "--http-address": "127.0.0.1:0", flag: taken}
        assert_refused_start("nsqd", [f"{name}={value}" for name, value in args.items()] + [f"--data-path={tmp_path}"],
                             f"failed to instantiate nsqd - listen ({taken}) failed - listen tcp {taken}: "
                             "bind: address already in use")


def test_locked_data_path_is_fatal(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running nsqd holds
        assert_refused_start("nsqd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                      f"--data-path={tmp_path}"],
                             f"failed to instantiate nsqd - failed to lock data-path: cannot flock directory "
                             f"{tmp_path} - resource temporarily unavailable (possibly in use by another instance of nsqd)")
    finally:
        os.close(fd)
