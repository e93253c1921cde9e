"""nsqd's entry point: an address it cannot listen on is one FATAL line and exit code 1."""

from __future__ import annotations

import errno
import os

from tests.integration.harness import assert_refused_start, taken_address


def test_taken_tcp_port_is_fatal(tmp_path):
    with taken_address() as taken:
        assert_refused_start("nsqd", [f"--tcp-address={taken}", "--http-address=127.0.0.1:0",
                                      f"--data-path={tmp_path}"],
                             f"[Errno {errno.EADDRINUSE}] listen ({taken}) failed - {os.strerror(errno.EADDRINUSE)}")
