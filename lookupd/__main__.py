"""``nsqlookupd`` entry point: flags, logging, listeners, signals."""

from __future__ import annotations

import functools
import sys

from protocol.daemon import instantiate_failure, run_daemon, serve_until_signalled

from .options import parse_options, validate
from .server import NSQLookupd


async def serve(opts) -> None:
    lookupd = NSQLookupd(opts)
    await lookupd.open_listeners()  # a port that is taken is refused before anything runs
    await serve_until_signalled(lookupd)


def main(argv: list[str] | None = None) -> int:
    # the startup checks' messages already read "failed to instantiate nsqlookupd - ..." where NSQ's do
    return run_daemon(argv, name="nsqlookupd", parse_options=parse_options, validate=validate, serve=serve,
                      refusal_text=functools.partial(instantiate_failure, "nsqlookupd"))


if __name__ == "__main__":
    sys.exit(main())
