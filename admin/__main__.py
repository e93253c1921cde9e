"""``nsqadmin`` entry point: flags, logging, listener, signals."""

from __future__ import annotations

import functools
import sys

from runtime.startup import bind_tcp, instantiate_failure, run_daemon

from .options import parse_options, validate


def prebind(opts) -> list:
    """The HTTP sockets, bound before trio and the server are imported (see ``runtime.startup``)."""
    return bind_tcp(opts.http_address)


async def serve(opts, prebound: list) -> None:
    from runtime.daemon import serve_until_signalled  # after the sockets exist

    from .server import NSQAdmin

    admin = NSQAdmin(opts)
    await admin.open_listener(prebound)
    await serve_until_signalled(admin)


def main(argv: list[str] | None = None) -> int:
    fatal_text = functools.partial(instantiate_failure, "nsqadmin")
    return run_daemon(
        argv,
        name="nsqadmin",
        parse_options=parse_options,
        validate=validate,
        serve=serve,
        invalid_text=fatal_text,
        refusal_text=fatal_text,
        prebind=prebind,
    )


if __name__ == "__main__":
    sys.exit(main())
