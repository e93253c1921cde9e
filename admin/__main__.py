"""``nsqadmin`` entry point: flags, logging, listener, signals."""

from __future__ import annotations

import signal
import sys

import trio

from protocol.logfmt import setup_logging

from .options import parse_options, validate
from .server import NSQAdmin


async def _main(opts, log) -> int:
    admin = NSQAdmin(opts)
    try:
        await admin.open_listener()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        log.critical("failed to instantiate nsqadmin - listen (%s) failed - listen tcp %s: bind: %s",
                     opts.http_address, opts.http_address, reason[:1].lower() + reason[1:])
        return 1
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(admin.run)
            async for _ in signals:
                admin.exit()
                break
    return 0


def main(argv: list[str] | None = None) -> int:
    opts = parse_options(sys.argv[1:] if argv is None else argv)
    log = setup_logging(prefix=opts.log_prefix, level=opts.log_level, name="nsqadmin")
    try:
        validate(opts)
    except ValueError as exc:
        log.critical("failed to instantiate nsqadmin - %s", exc)
        return 1
    return trio.run(_main, opts, log)


if __name__ == "__main__":
    sys.exit(main())
