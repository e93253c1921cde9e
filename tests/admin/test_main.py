"""nsqadmin's entry point: a port it cannot listen on, or a client TLS file it cannot read, is one FATAL line
and exit code 1."""

from __future__ import annotations

import errno
import os

from tests.integration.harness import assert_refused_start, taken_address

IN_USE = os.strerror(errno.EADDRINUSE)


def test_taken_port_is_fatal():
    with taken_address() as taken:
        assert_refused_start("admin", [f"--http-address={taken}", "--nsqd-http-address=127.0.0.1:4151"],
                             f"failed to instantiate nsqadmin - listen ({taken}) failed - listen tcp {taken}: "
                             f"bind: {IN_USE[:1].lower()}{IN_USE[1:]}")


def test_unreadable_tls_file_is_fatal(tmp_path):
    missing = tmp_path / "missing-ca.pem"
    assert_refused_start("admin", ["--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:4151",
                                   f"--http-client-tls-root-ca-file={missing}"],
                         f"failed to instantiate nsqadmin - [Errno {errno.ENOENT}] {os.strerror(errno.ENOENT)}")
