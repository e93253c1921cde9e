"""nsqd's entry point: what stops it from starting is one FATAL line, in nsqd's words, and exit code 1."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys

import pytest

from nsqd.metadata import prebind
from nsqd.options import parse_options
from tests.integration.harness import assert_refused_start, taken_address


@pytest.mark.parametrize("flag", ["--tcp-address", "--http-address"])
def test_taken_port_is_fatal_and_named(tmp_path, flag):
    with taken_address() as taken:
        args = {"--tcp-address": "127.0.0.1:0", "--http-address": "127.0.0.1:0", flag: taken}
        assert_refused_start(
            "nsqd",
            [f"{name}={value}" for name, value in args.items()] + [f"--data-path={tmp_path}"],
            f"failed to instantiate nsqd - listen ({taken}) failed - listen tcp {taken}: bind: address already in use",
        )


@pytest.mark.parametrize("port_taken", [False, True])
def test_locked_data_path_is_fatal_before_ports_are_tried(tmp_path, port_taken):
    """A second nsqd started like the first (same directory, same ports) is told about the directory."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running nsqd holds
        with taken_address() as taken:
            tcp = taken if port_taken else "127.0.0.1:0"
            assert_refused_start(
                "nsqd",
                [f"--tcp-address={tcp}", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"],
                f"failed to instantiate nsqd - failed to lock data-path: cannot flock directory "
                f"{tmp_path} - resource temporarily unavailable "
                "(possibly in use by another instance of nsqd)",
            )
    finally:
        os.close(fd)


def test_addresses_are_bound_before_the_server_is_imported(tmp_path):
    """nsqd takes its lock and ports before trio and its server are imported (most of start-up), so a client
    connecting meanwhile waits in the accept queue instead of being refused."""
    for module in ("nsqd.__main__", "lookupd.__main__", "admin.__main__"):
        heavy = "{'trio', 'nsqd.server', 'lookupd.server', 'admin.server'} & set(sys.modules)"
        check = f"import sys, {module}; heavy = {heavy}; sys.exit(str(sorted(heavy)) if heavy else 0)"
        done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (module, done.stderr)

    opts = parse_options(["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"])
    prebound = prebind(opts)
    probe = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert [len(prebound.tcp), len(prebound.http), len(prebound.https)] == [1, 1, 0]
        with socket.create_connection(prebound.tcp[0].getsockname(), timeout=5):
            pass  # accepted by the kernel before any server runs
        with pytest.raises(BlockingIOError):  # the directory is held
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)
        for sock in prebound.tcp + prebound.http:
            sock.close()
        os.close(prebound.data_lock)
