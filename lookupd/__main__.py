"""``nsqlookupd`` entry point: flags, logging, listeners, signals."""

from __future__ import annotations

import functools
import sys

from runtime.startup import bind_all, instantiate_failure, run_daemon

from .options import parse_options, validate


def prebind(opts) -> list:
    """The TCP and HTTP sockets, bound before trio and the server are imported (see ``runtime.startup``)."""
    return bind_all((opts.tcp_address, True), (opts.http_address, True))  # a path is a unix socket


async def serve(opts, prebound: list) -> None:
    from runtime.daemon import serve_until_signalled  # after the sockets exist

    from .server import NSQLookupd

    lookupd = NSQLookupd(opts)
    await lookupd.open_listeners(prebound)
    await serve_until_signalled(lookupd)


def main(argv: list[str] | None = None) -> int:
    # the startup checks' messages already read "failed to instantiate nsqlookupd - ..." where NSQ's do
    return run_daemon(
        argv,
        name="nsqlookupd",
        parse_options=parse_options,
        validate=validate,
        serve=serve,
        refusal_text=functools.partial(instantiate_failure, "nsqlookupd"),
        prebind=prebind,
    )


if __name__ == "__main__":
    sys.exit(main())
