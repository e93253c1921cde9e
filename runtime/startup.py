"""The light half of a daemon's start-up: the command line, the FATAL lines, and the listening sockets.

Nothing here imports trio: a daemon's ``main`` parses its flags, checks them and binds its addresses with this
module alone, and imports trio and its own serving code (most of its start-up time) only after that, so a client
that connects while the daemon starts waits in the kernel's accept queue instead of being refused (clients' own
test suites poll a freshly started nsqd for a second or two). ``runtime.daemon`` holds the trio half.
"""

from __future__ import annotations

import socket
import sys
from typing import Any, Awaitable, Callable

from .logfmt import setup_logging

__all__ = [
    "ListenError",
    "bind_all",
    "bind_tcp",
    "format_address",
    "instantiate_failure",
    "nsq_listen_failure",
    "nsq_text",
    "run_daemon",
    "split_address",
    "startup_failure",
]

#: the accept queue asked for (the kernel caps it at net.core.somaxconn), as trio's listeners ask
LISTEN_BACKLOG = 0xFFFF


def format_address(sockaddr) -> str:
    """``ip:port``, ``[ip6]:port``; a unix socket peer has no address (``@`` as Go prints it)."""
    if isinstance(sockaddr, (str, bytes)):
        return "@"
    host, port = sockaddr[0], sockaddr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


def bind_tcp(address: str) -> list[socket.socket]:
    """Listening sockets for ``host:port`` (one per address the host resolves to, every interface when the
    host is empty; port 0 picks one), bound as trio's ``open_tcp_listeners`` binds them. Raises ``ListenError``
    when the address cannot be bound (nothing stays open then)."""
    host, port = split_address(address)
    opened: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
        for family, kind, proto, _name, sockaddr in infos:
            sock = socket.socket(family, kind, proto)
            opened.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(sockaddr)
            sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        for sock in opened:
            sock.close()
        raise ListenError(address, exc) from None
    return opened


def bind_all(*addresses: str) -> list[list[socket.socket]]:
    """``bind_tcp`` of each address in turn (an empty one gets no sockets); if one cannot be bound, those
    already bound are closed and its ``ListenError`` raised."""
    bound: list[list[socket.socket]] = []
    try:
        for address in addresses:
            bound.append(bind_tcp(address) if address else [])
    except BaseException:
        for sockets in bound:
            for sock in sockets:
                sock.close()
        raise
    return bound


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
               refusal_text: Callable[[BaseException], str] = str,
               prebind: Callable[[Any], Any] | None = None) -> int:
    """A daemon's ``main``; returns the exit code (0 after a graceful stop, 1 after a FATAL line).

    ``argv`` excludes the program name (``sys.argv[1:]`` when None). ``parse_options`` exits the process itself
    on usage errors, ``-h`` and ``--version``. The logger ``name`` gets NSQ's log lines with ``--log-prefix``
    and ``--log-level``; every flag in ``opts.ignored_flags`` (nsqd lists the NSQ flags it accepts and ignores)
    is warned about. A ``ValueError`` from ``validate`` is logged as ``FATAL: <invalid_text(exc)>``; then
    ``serve(opts)`` runs under trio, and an exception of a ``refusals`` type it raises, wrapped or not, is logged
    as ``FATAL: <refusal_text(exc)>``. Anything else propagates. With ``prebind``, ``prepared = prebind(opts)``
    runs first (before trio is imported: it should take the listening addresses with ``bind_tcp``), its refusals
    are reported the same way, and ``serve(opts, prepared)`` runs instead.
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
        # the addresses are taken before trio and the daemon are imported (most of start-up): a client that
        # connects meanwhile waits in the kernel's accept queue instead of being refused
        prepared = prebind(opts) if prebind is not None else None
        import trio  # noqa: PLC0415 (imported here, after the listeners exist: see above)

        if prebind is None:
            trio.run(serve, opts)
        else:
            trio.run(serve, opts, prepared)
    except BaseException as exc:
        failure = startup_failure(exc, refusals)
        if failure is None:
            raise
        log.critical("%s", refusal_text(failure))
        return 1
    return 0
