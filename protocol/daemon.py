"""What nsqd, nsqlookupd and nsqadmin share between the command line and their serving loops.

Like ``http_server``, this module drives trio; the rest of ``protocol`` stays free of I/O.

``run_daemon`` is each daemon's ``main``: it parses the flags, sets up the NSQ log lines, warns about the
NSQ flags that are accepted and ignored, runs the startup checks and then the daemon under trio until
SIGTERM or SIGINT. A daemon that refuses to start (a locked data directory, a bad TLS configuration, an
address that cannot be bound) prints one FATAL line and exits 1, as NSQ's daemons do, never a traceback.
Such a refusal may reach ``trio.run`` wrapped in exception groups by the nurseries it crossed;
``startup_failure`` finds it there.

The listener helpers give the three daemons one way to open ``host:port`` (``ListenError`` names the address
that cannot be bound) and one accept loop.
"""

from __future__ import annotations

import logging
import signal
import sys
from typing import Any, Awaitable, Callable, Protocol

import trio

from .http_server import format_address
from .logfmt import setup_logging

__all__ = [
    "ListenError",
    "accept_connections",
    "format_address",
    "instantiate_failure",
    "listen_tcp",
    "nsq_listen_failure",
    "nsq_text",
    "run_daemon",
    "serve_until_signalled",
    "split_address",
    "startup_failure",
]


class Daemon(Protocol):
    """What ``serve_until_signalled`` needs: ``run`` serves until a graceful stop that ``exit`` starts."""

    async def run(self) -> None: ...

    def exit(self) -> None: ...


# --------------------------------------------------------------------------------------------------------------
# addresses and listeners


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:4150`` for IPv6) into host and port; an empty host means every interface."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"invalid address {address!r}")
    return host.strip("[]"), int(port)


def nsq_listen_failure(address: str, reason: str) -> str:
    """NSQ's words for a listener that cannot be opened: ``listen (<addr>) failed - listen tcp <addr>: <reason>``."""
    return f"listen ({address}) failed - listen tcp {address}: {reason}"


class ListenError(OSError):
    """``address`` cannot be listened on. ``str()`` is ``[Errno N] listen (<addr>) failed - <reason>``;
    ``nsq_text`` gives NSQ's wording (``... listen tcp <addr>: bind: <reason>``)."""

    def __init__(self, address: str, cause: OSError) -> None:
        reason = cause.strerror or str(cause)
        super().__init__(cause.errno, f"listen ({address}) failed - {reason}")
        self.address = address
        self.reason = reason


def nsq_text(exc: BaseException) -> str:
    """A startup refusal in NSQ's words: a ``ListenError`` as Go's ``net.Listen`` error, anything else as is."""
    if isinstance(exc, ListenError):
        return nsq_listen_failure(exc.address, f"bind: {exc.reason[:1].lower()}{exc.reason[1:]}")
    return str(exc)


def instantiate_failure(program: str, reason: BaseException | str) -> str:
    """NSQ's FATAL text for a daemon that cannot start: ``failed to instantiate <program> - <reason>``, an
    exception's reason in NSQ's words (``nsq_text``)."""
    return f"failed to instantiate {program} - {reason if isinstance(reason, str) else nsq_text(reason)}"


async def listen_tcp(address: str) -> list[trio.SocketListener]:
    """The TCP listeners for ``host:port`` (every interface when the host is empty; port 0 picks one).

    Raises ``ListenError`` when the address cannot be bound."""
    host, port = split_address(address)
    try:
        return await trio.open_tcp_listeners(port, host=host or None)
    except OSError as exc:
        raise ListenError(address, exc) from None


async def accept_connections(listener, nursery: trio.Nursery, handle: Callable[[trio.SocketStream], Awaitable[Any]],
                             log: logging.Logger) -> None:
    """Accept on ``listener`` until cancelled, serving each connection with ``handle(stream)`` in ``nursery``.

    An accept error (EMFILE and friends) is logged and retried 50 ms later: backing off instead of spinning."""
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            log.error("TCP: accept error: %s", exc)
            await trio.sleep(0.05)
            continue
        nursery.start_soon(handle, stream)


# --------------------------------------------------------------------------------------------------------------
# running a daemon


async def serve_until_signalled(daemon: Daemon) -> None:
    """Run ``daemon.run()`` until the first SIGTERM or SIGINT, which calls ``daemon.exit()``; return once ``run``
    has returned (after its graceful stop). Later signals are swallowed while the daemon shuts down."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:

            async def exit_on_signal() -> None:
                async for _ in signals:
                    daemon.exit()
                    return

            nursery.start_soon(exit_on_signal)
            await daemon.run()
            nursery.cancel_scope.cancel()


def startup_failure(exc: BaseException, refusals: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first exception of a ``refusals`` type in ``exc``, looking inside exception groups; None otherwise."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = startup_failure(inner, refusals)
            if found is not None:
                return found
        return None
    if isinstance(exc, refusals):
        return exc
    return None


def run_daemon(argv: list[str] | None, *, name: str, parse_options: Callable[[list[str]], Any],
               validate: Callable[[Any], None], serve: Callable[[Any], Awaitable[None]],
               refusals: tuple[type[BaseException], ...] = (OSError,),
               invalid_text: Callable[[ValueError], str] = str,
               refusal_text: Callable[[BaseException], str] = str) -> int:
    """A daemon's ``main``; returns the exit code (0 after a graceful stop, 1 after a FATAL line).

    ``argv`` excludes the program name (``sys.argv[1:]`` when None). ``parse_options`` exits the process itself
    on usage errors, ``-h`` and ``--version``. The logger ``name`` gets NSQ's log lines with ``--log-prefix``
    and ``--log-level``; every flag in ``opts.ignored_flags`` (nsqd lists the NSQ flags it accepts and ignores)
    is warned about. A ``ValueError`` from ``validate`` is logged as ``FATAL: <invalid_text(exc)>``; then
    ``serve(opts)`` runs under trio, and an exception of a ``refusals`` type it raises, wrapped or not, is logged
    as ``FATAL: <refusal_text(exc)>``. Anything else propagates.
    """
    opts = parse_options(sys.argv[1:] if argv is None else argv)
    log = setup_logging(prefix=opts.log_prefix, level=opts.log_level, name=name)
    for flag in getattr(opts, "ignored_flags", ()):
        log.warning("flag --%s is accepted for compatibility and has no effect", flag)
    try:
        validate(opts)
    except ValueError as exc:
        log.critical("%s", invalid_text(exc))
        return 1
    try:
        trio.run(serve, opts)
    except BaseException as exc:
        failure = startup_failure(exc, refusals)
        if failure is None:
            raise
        log.critical("%s", refusal_text(failure))
        return 1
    return 0
