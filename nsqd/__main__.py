"""``nsqd`` entry point: flags, logging, signals."""

from __future__ import annotations

import signal
import sys

import trio

from protocol.logfmt import setup_logging

from .options import parse_options, validate
from .metadata import DataDirLocked
from .server import NSQD
from .tls import TLSConfigError


async def serve(opts) -> None:
    nsqd = NSQD(opts)
    nsqd.lock_data_path()  # before any nursery, so a refusal is a plain exception
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(nsqd.run)

            async def wait_for_signal() -> None:
                async for _ in signals:
                    nsqd.exit()
                    return

            nursery.start_soon(wait_for_signal)
            await nsqd._stopped.wait()
            nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    opts = parse_options(sys.argv[1:] if argv is None else argv)
    log = setup_logging(prefix=opts.log_prefix, level=opts.log_level)
    for name in opts.ignored_flags:
        log.warning("flag --%s is accepted for compatibility and has no effect", name)
    try:
        validate(opts)
    except ValueError as exc:
        log.critical("%s", exc)
        return 1
    try:
        trio.run(serve, opts)
    except BaseException as exc:
        failure = startup_failure(exc)
        if failure is None:
            raise
        log.critical("%s", failure)
        return 1
    return 0


def startup_failure(exc: BaseException) -> BaseException | None:
    """The refusal to start hidden in ``exc`` (possibly inside exception groups): a locked data
    directory, a bad TLS configuration, or an address that cannot be bound. None otherwise."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = startup_failure(inner)
            if found is not None:
                return found
        return None
    if isinstance(exc, (DataDirLocked, TLSConfigError, OSError)):
        return exc
    return None


if __name__ == "__main__":
    sys.exit(main())
