"""``nsqlookupd`` entry point: flags, logging, listeners, signals."""

from __future__ import annotations

import signal
import sys

import trio

from protocol.logfmt import setup_logging

from .options import listen_failure, parse_options, validate
from .server import NSQLookupd


async def serve(lookupd: NSQLookupd) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(lookupd.run)
            async for _ in signals:
                lookupd.exit()
                break


async def _main(opts, log) -> int:
    lookupd = NSQLookupd(opts)
    try:
        await lookupd.open_listeners()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        log.critical("%s", listen_failure(exc.filename or "", f"bind: {reason[:1].lower()}{reason[1:]}"))
        return 1
    await serve(lookupd)
    return 0


def main(argv: list[str] | None = None) -> int:
    opts = parse_options(sys.argv[1:] if argv is None else argv)
    log = setup_logging(prefix=opts.log_prefix, level=opts.log_level, name="nsqlookupd")
    try:
        validate(opts)
    except ValueError as exc:
        log.critical("%s", exc)
        return 1
    return trio.run(_main, opts, log)


if __name__ == "__main__":
    sys.exit(main())
