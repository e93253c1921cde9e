"""nsqadmin's entry point: a port it cannot listen on, or a client TLS file it cannot read, is one FATAL line
and exit code 1; a start logs the version first (nsqlookupd's too)."""

from __future__ import annotations

import errno
import os
import re

import pytest

from tests.admin.cluster import Daemon
from tests.integration.harness import assert_refused_start, taken_address

IN_USE = os.strerror(errno.EADDRINUSE)


def test_taken_port_is_fatal():
    with taken_address() as taken:
        assert_refused_start(
            "admin",
            [f"--http-address={taken}", "--nsqd-http-address=127.0.0.1:4151"],
            f"failed to instantiate nsqadmin - listen ({taken}) failed - listen tcp {taken}: "
            f"bind: {IN_USE[:1].lower()}{IN_USE[1:]}",
        )


def test_unreadable_tls_file_is_fatal(tmp_path):
    missing = tmp_path / "missing-ca.pem"
    assert_refused_start(
        "admin",
        [
            "--http-address=127.0.0.1:0",
            "--nsqd-http-address=127.0.0.1:4151",
            f"--http-client-tls-root-ca-file={missing}",
        ],
        f"failed to instantiate nsqadmin - [Errno {errno.ENOENT}] {os.strerror(errno.ENOENT)}",
    )


@pytest.mark.parametrize(
    ("module", "program", "args"),
    [
        ("admin", "nsqadmin", ["--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:4151"]),
        ("lookupd", "nsqlookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]),
    ],
)
def test_start_up_logs_the_version_first(module, program, args):
    daemon = Daemon(module, args).start()
    try:
        first = daemon.log_text().splitlines()[0]
    finally:
        daemon.stop()
    assert re.fullmatch(rf"\[{program}\] [\d/]+ [\d:.]+ INFO: {program} v1\.3\.0 \(built w/python\S+\)", first), first
