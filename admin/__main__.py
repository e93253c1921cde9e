"""``nsqadmin`` entry point: flags, logging, listener, signals."""

from __future__ import annotations

import functools
import sys

from protocol.daemon import instantiate_failure, run_daemon, serve_until_signalled

from .options import parse_options, validate
from .server import NSQAdmin


async def serve(opts) -> None:
    admin = NSQAdmin(opts)
    await admin.open_listener()  # a port that is taken is refused before anything runs
    await serve_until_signalled(admin)


def main(argv: list[str] | None = None) -> int:
    fatal_text = functools.partial(instantiate_failure, "nsqadmin")
    return run_daemon(argv, name="nsqadmin", parse_options=parse_options, validate=validate, serve=serve,
                      invalid_text=fatal_text, refusal_text=fatal_text)


if __name__ == "__main__":
    sys.exit(main())
