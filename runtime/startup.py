"""The light half of a daemon's start-up: the command line, the FATAL lines, and the listening sockets.

Nothing here imports trio: a daemon's ``main`` parses its flags, checks them and binds its addresses with this
module alone, and imports trio and its own serving code (most of its start-up time) only after that, so a client
that connects while the daemon starts waits in the kernel's accept queue instead of being refused (clients' own
test suites poll a freshly started nsqd for a second or two). ``runtime.daemon`` holds the trio half.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from .logfmt import log_flusher, setup_logging

__all__ = [
    "ListenError",
    "address_port",
    "bind_address",
    "bind_all",
    "bind_tcp",
    "bind_unix",
    "format_address",
    "instantiate_failure",
    "is_unix_address",
    "nsq_text",
    "remove_unix_sockets",
    "resolve_port",
    "run_daemon",
    "split_host_port",
    "startup_failure",
]

#: the accept queue asked for (the kernel caps it at net.core.somaxconn), as trio's listeners ask
LISTEN_BACKLOG = 0xFFFF


def format_address(sockaddr) -> str:
    """``ip:port``, ``[ip6]:port``; a unix socket's path (``@name`` in the abstract namespace), and ``@`` for a
    peer without a name, as Go prints them."""
    if isinstance(sockaddr, bytes):
        sockaddr = sockaddr.decode("utf-8", "surrogateescape")
    if isinstance(sockaddr, str):
        return "@" + sockaddr[1:] if sockaddr.startswith("\0") else sockaddr or "@"
    host, port = sockaddr[0], sockaddr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: str) -> tuple[str, str]:
    """Go's ``net.SplitHostPort``: ``host:port`` or ``[host]:port`` into host and port text (either may be empty);
    ``ValueError`` with Go's words (``address x: missing port in address``) otherwise."""

    def refuse(reason: str):
        return ValueError(f"address {address}: {reason}")

    colon = address.rfind(":")
    if colon < 0:
        raise refuse("missing port in address")
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise refuse("missing ']' in address")
        if end + 1 != colon:
            raise refuse(
                "too many colons in address" if address[end + 1 : end + 2] == ":" else "missing port in address"
            )
        host, rest_from = address[1:end], end + 1
        if "[" in address[1:]:
            raise refuse("unexpected '[' in address")
    else:
        host, rest_from = address[:colon], 0
        if ":" in host:
            raise refuse("too many colons in address")
        if "[" in address:
            raise refuse("unexpected '[' in address")
    if "]" in address[rest_from:]:
        raise refuse("unexpected ']' in address")
    return host, address[colon + 1 :]


def is_unix_address(address: str) -> bool:
    """nsqd's and nsqlookupd's rule for a listen address: what Go's ``net.SplitHostPort`` refuses (no colon, too
    many colons, ...) is the path of a unix socket; ``@name`` is a name in Linux's abstract namespace."""
    try:
        split_host_port(address)
    except ValueError:
        return True
    return False


def address_port(address: str | None, unix: int = -1) -> int:
    """The port of a bound ``ip:port`` address (as ``format_address`` writes it); ``unix`` for a unix socket's
    path or no address (nsqd's ``/info`` says -1, its lookupd registration 0)."""
    if not address or is_unix_address(address):
        return unix
    port = split_host_port(address)[1]
    return int(port) if port.isdigit() else unix


def resolve_port(service: str) -> int:
    """Go's reading of the port of a TCP address: empty is 0 (any free port), digits with an optional sign must
    be in [0, 65535], anything else is a service name (``http``); ``ValueError`` in Go's words otherwise."""
    digits = service[1:] if service[:1] in ("+", "-") else service
    if digits.isascii() and (digits.isdigit() or not digits):
        port = int(digits or "0") * (-1 if service[:1] == "-" else 1)
        if not 0 <= port <= 0xFFFF:
            raise ValueError(f"address {service}: invalid port")
        return port
    try:
        return socket.getservbyname(service, "tcp")
    except (OSError, ValueError, UnicodeError):
        raise ValueError(f"lookup tcp/{service}: unknown port") from None


class ListenError(OSError):
    """``address`` cannot be listened on; ``str()`` is NSQ's ``listen (<addr>) failed - <Go's net.Listen error>``,
    for example ``listen tcp 127.0.0.1:4150: bind: address already in use`` or ``listen tcp: address 99999:
    invalid port``."""

    def __init__(self, address: str, go_error: str) -> None:
        super().__init__(f"listen ({address}) failed - {go_error}")
        self.address = address
        self.go_error = go_error

    def __str__(self) -> str:
        return self.args[0]


def _os_reason(exc: BaseException) -> str:
    """An OS error's reason as Go words it (lower case); Python's own refusals of a socket path are Go's EINVAL."""
    reason = (exc.strerror if isinstance(exc, OSError) and exc.errno else None) or "invalid argument"
    return reason[:1].lower() + reason[1:]


def nsq_text(exc: BaseException) -> str:
    """A startup refusal in NSQ's words (a ``ListenError`` already has them)."""
    return str(exc)


def instantiate_failure(program: str, reason: BaseException | str) -> str:
    """NSQ's FATAL text for a daemon that cannot start: ``failed to instantiate <program> - <reason>``, an
    exception's reason in NSQ's words (``nsq_text``)."""
    return f"failed to instantiate {program} - {reason if isinstance(reason, str) else nsq_text(reason)}"


#: the paths of the unix sockets this process bound; ``remove_unix_sockets`` removes them at exit, as Go's unix
#: listener removes its file when it is closed
_BOUND_UNIX_PATHS: list[str] = []


def bind_unix(path: str) -> list[socket.socket]:
    """A listening unix socket at ``path`` (``@name``: in the abstract namespace, no file). An existing file is
    not replaced, as Go does not: a socket left by a killed daemon must be removed by hand."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if "\0" in path:
            raise ValueError("a NUL byte in a path")  # the kernel would cut the path there; Go refuses it
        sock.bind("\0" + path[1:] if path.startswith("@") else path)
        sock.listen(LISTEN_BACKLOG)
    except (OSError, ValueError) as exc:
        sock.close()
        raise ListenError(path, f"listen unix {path}: bind: {_os_reason(exc)}") from None
    if path and not path.startswith("@"):
        _BOUND_UNIX_PATHS.append(path)
    return [sock]


def remove_unix_sockets() -> None:
    """Remove the files of the unix sockets ``bind_unix`` made (called once the daemon has stopped)."""
    while _BOUND_UNIX_PATHS:
        with contextlib.suppress(OSError):
            os.unlink(_BOUND_UNIX_PATHS.pop())


def bind_tcp(address: str) -> list[socket.socket]:
    """Listening sockets for ``host:port`` (one per address the host resolves to, every interface when the
    host is empty; an empty port or 0 picks one), bound as trio's ``open_tcp_listeners`` binds them. Raises
    ``ListenError`` in Go's words when the address is malformed or cannot be bound (nothing stays open then)."""
    try:
        host, service = split_host_port(address) if address else ("", "")  # Go: "" is any port, every interface
        port = resolve_port(service)
    except ValueError as exc:
        raise ListenError(address, f"listen tcp: {exc}") from None
    try:
        infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except (OSError, ValueError, UnicodeError):
        raise ListenError(address, f"listen tcp: lookup {host}: no such host") from None
    opened: list[socket.socket] = []
    try:
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
        raise ListenError(address, f"listen tcp {address}: bind: {_os_reason(exc)}") from None
    return opened


def bind_address(address: str, *, unix: bool = True) -> list[socket.socket]:
    """The listening sockets of a daemon's address flag: a unix socket when ``unix`` is allowed and
    ``is_unix_address(address)`` (an empty path: an unnamed one, as Go's), else TCP (``bind_tcp``)."""
    return bind_unix(address) if unix and is_unix_address(address) else bind_tcp(address)


def bind_all(*addresses: tuple[str | None, bool]) -> list[list[socket.socket]]:
    """``bind_address(address, unix=unix)`` of each ``(address, unix)`` in turn (None, a listener turned off, gets
    no sockets); if one cannot be bound, those already bound are closed and its ``ListenError`` raised."""
    bound: list[list[socket.socket]] = []
    try:
        for address, unix in addresses:
            bound.append([] if address is None else bind_address(address, unix=unix))
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


def run_daemon(
    argv: list[str] | None,
    *,
    name: str,
    parse_options: Callable[[list[str]], Any],
    validate: Callable[[Any], None],
    serve: Callable[..., Awaitable[None]],  # serve(opts), or serve(opts, prebound) with ``prebind``
    refusals: tuple[type[BaseException], ...] = (OSError,),
    invalid_text: Callable[[ValueError], str] = str,
    refusal_text: Callable[[BaseException], str] = str,
    prebind: Callable[[Any], Any] | None = None,
) -> int:
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
    # no log line names its source file, thread or process: skip looking them up (logging's "Optimization")
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
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
        import trio  # imported here, after the listeners exist: see above

        flusher = log_flusher(log)  # the loop's INFO lines written once per turn (logfmt's notes)
        instruments: list[Any] = [flusher] if flusher is not None else []  # trio takes the hooks' duck type
        if prebind is None:
            trio.run(serve, opts, instruments=instruments)
        else:
            trio.run(serve, opts, prepared, instruments=instruments)
    except BaseException as exc:
        failure = startup_failure(exc, refusals)
        if failure is None:
            raise
        log.critical("%s", refusal_text(failure))
        return 1
    finally:
        remove_unix_sockets()
    return 0
