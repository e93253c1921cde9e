"""What nsqd, nsqlookupd and nsqadmin share between the command line and their serving loops.

Like ``http_server``, this module drives trio; ``protocol`` stays free of I/O.

``run_daemon`` (from ``runtime.startup``, which imports no trio) is each daemon's ``main``: it parses the
flags, sets up the NSQ log lines, warns about the NSQ flags that are accepted and ignored, runs the startup
checks, binds the addresses, and then runs the daemon under trio until SIGTERM or SIGINT
(``serve_until_signalled``). A daemon that refuses to start (a locked data directory, a bad TLS configuration,
an address that cannot be bound) prints one FATAL line and exits 1, as NSQ's daemons do, never a traceback.
Such a refusal may reach ``trio.run`` wrapped in exception groups by the nurseries it crossed;
``startup_failure`` finds it there.

The listener helpers give the three daemons one way to open ``host:port`` or a unix socket's path (``ListenError`` names
the address that cannot be bound), to adopt sockets bound before trio started, and one accept loop.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from .startup import (
    ListenError,
    address_port,
    bind_address,
    bind_tcp,
    format_address,
    instantiate_failure,
    nsq_text,
    run_daemon,
    startup_failure,
)

__all__ = [
    "ListenError",
    "accept_connections",
    "address_port",
    "adopt_listeners",
    "bind_address",
    "bind_tcp",
    "format_address",
    "instantiate_failure",
    "listen",
    "listen_tcp",
    "nsq_text",
    "run_daemon",
    "serve_until_signalled",
    "startup_failure",
]


class Daemon(Protocol):
    """What ``serve_until_signalled`` needs: ``run`` serves until a graceful stop that ``exit`` starts."""

    async def run(self) -> None: ...

    def exit(self) -> None: ...


# --------------------------------------------------------------------------------------------------------------
# addresses and listeners


def adopt_listeners(sockets: list) -> list[trio.SocketListener]:
    """trio listeners for sockets ``bind_tcp`` bound before trio started."""
    return [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]


async def listen_tcp(address: str) -> list[trio.SocketListener]:
    """The TCP listeners for ``host:port`` (every interface when the host is empty; port 0 picks one), bound
    by ``bind_tcp`` as the entry points bind them before trio starts. Raises ``ListenError`` when the address
    cannot be bound."""
    return adopt_listeners(bind_tcp(address))


async def listen(address: str) -> list[trio.SocketListener]:
    """``listen_tcp``, or a unix socket's listener when ``address`` is a path (``bind_address``)."""
    return adopt_listeners(bind_address(address))


async def accept_connections(
    listener, nursery: trio.Nursery, handle: Callable[[trio.SocketStream], Awaitable[Any]], log: logging.Logger
) -> None:
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


#: the signals that stop a daemon gracefully
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _stopping_already(signum: int, frame: Any) -> None:
    """A stop signal after the daemon stopped serving (see ``serve_until_signalled``): it is stopping already."""


async def serve_until_signalled(daemon: Daemon) -> None:
    """Run ``daemon.run()`` until the first SIGTERM or SIGINT, which calls ``daemon.exit()``; return once ``run``
    has returned (after its graceful stop). Later signals are swallowed while the daemon shuts down.

    No stop signal may meet the default action (death, half stopped) from here to the process's end. Until the
    receiver is set, they wait blocked (nsqd's workers are forked with them blocked: ``nsqd/supervisor.py``).
    When the receiver closes, trio delivers again what it holds unread (a second SIGTERM, as ``pkill`` and then
    nsqd's parent send each worker) to the handler it replaced: that is a handler that ignores them, not the
    default. Then SIG_IGN, which the interpreter's exit keeps (it puts the default back in place of Python's)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stopping_already)  # (a pending signal stays pending: only SIG_IGN drops it)
    try:
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            async with trio.open_nursery() as nursery:

                async def exit_on_signal() -> None:
                    async for _ in signals:
                        daemon.exit()
                        return

                nursery.start_soon(exit_on_signal)
                await daemon.run()
                nursery.cancel_scope.cancel()
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
