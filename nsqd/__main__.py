"""``nsqd`` entry point: flags, logging, signals."""

from __future__ import annotations

import sys

from protocol.daemon import run_daemon, serve_until_signalled

from .metadata import DataDirLocked
from .options import parse_options, validate
from .server import NSQD
from .tls import TLSConfigError


async def serve(opts) -> None:
    nsqd = NSQD(opts)
    nsqd.lock_data_path()  # before anything runs, so a refusal leaves nothing to stop
    await serve_until_signalled(nsqd)


def main(argv: list[str] | None = None) -> int:
    return run_daemon(argv, name="nsqd", parse_options=parse_options, validate=validate, serve=serve,
                      refusals=(DataDirLocked, TLSConfigError, OSError))


if __name__ == "__main__":
    sys.exit(main())
