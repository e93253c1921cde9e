"""Errors of the V2 protocol: one type carrying the wire code, the human text and the fatal flag.

The connection loop is the only place that decides what to do with an error: it sends
``err.payload()`` in an error frame and closes the connection when ``err.fatal`` is true.
Causes (the exception an error was raised from) are for logs and never reach the client.
"""

from __future__ import annotations

__all__ = [
    "E_AUTH_DISABLED",
    "E_AUTH_ERROR",
    "E_AUTH_FAILED",
    "E_AUTH_FIRST",
    "E_BAD_BODY",
    "E_BAD_CHANNEL",
    "E_BAD_MESSAGE",
    "E_BAD_PROTOCOL",
    "E_BAD_TOPIC",
    "E_DPUB_FAILED",
    "E_FIN_FAILED",
    "E_IDENTIFY_FAILED",
    "E_INVALID",
    "E_MPUB_FAILED",
    "E_PUB_FAILED",
    "E_REQ_FAILED",
    "E_SUB_FAILED",
    "E_TOUCH_FAILED",
    "E_UNAUTHORIZED",
    "NON_FATAL_CODES",
    "LineTooLong",
    "ProtocolError",
]

E_INVALID = "E_INVALID"
E_BAD_BODY = "E_BAD_BODY"
E_BAD_TOPIC = "E_BAD_TOPIC"
E_BAD_CHANNEL = "E_BAD_CHANNEL"
E_BAD_MESSAGE = "E_BAD_MESSAGE"
E_BAD_PROTOCOL = "E_BAD_PROTOCOL"
E_PUB_FAILED = "E_PUB_FAILED"
E_MPUB_FAILED = "E_MPUB_FAILED"
E_DPUB_FAILED = "E_DPUB_FAILED"
E_SUB_FAILED = "E_SUB_FAILED"
E_FIN_FAILED = "E_FIN_FAILED"
E_REQ_FAILED = "E_REQ_FAILED"
E_TOUCH_FAILED = "E_TOUCH_FAILED"
E_IDENTIFY_FAILED = "E_IDENTIFY_FAILED"
E_AUTH_FAILED = "E_AUTH_FAILED"
E_AUTH_FIRST = "E_AUTH_FIRST"
E_AUTH_DISABLED = "E_AUTH_DISABLED"
E_AUTH_ERROR = "E_AUTH_ERROR"
E_UNAUTHORIZED = "E_UNAUTHORIZED"

# Only these three leave the connection open: a consumer racing a timeout must not lose its socket.
NON_FATAL_CODES = frozenset({E_FIN_FAILED, E_REQ_FAILED, E_TOUCH_FAILED})


class ProtocolError(Exception):
    """An error the server reports to the client as ``<code> <description>``.

    ``fatal`` defaults to true for every code except those in ``NON_FATAL_CODES``.
    Descriptions may carry raw wire bytes decoded with ``surrogateescape`` (names and numbers
    as the client sent them); ``payload()`` turns them back into the original bytes.
    """

    def __init__(self, code: str, description: str = "", fatal: bool | None = None) -> None:
        super().__init__(code, description)
        self.code = code
        self.description = description
        self.fatal = (code not in NON_FATAL_CODES) if fatal is None else fatal

    def payload(self) -> bytes:
        """The body of the error frame."""
        if not self.description:
            return self.code.encode("utf-8", "surrogateescape")
        return f"{self.code} {self.description}".encode("utf-8", "surrogateescape")

    def __str__(self) -> str:
        return f"{self.code} {self.description}" if self.description else self.code

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.description!r}, fatal={self.fatal!r})"

    def __reduce__(
        self,
    ) -> tuple[type[ProtocolError], tuple[str, str, bool]]:  # keep ``fatal`` when pickled (e.g. across Spark workers)
        return (type(self), (self.code, self.description, self.fatal))


class LineTooLong(Exception):
    """A command line did not fit the server's 16 KiB read buffer.

    NSQ drops such a connection without sending an error frame, so this is deliberately not a
    ``ProtocolError``: the connection loop closes silently.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(f"command line longer than {limit} bytes")
        self.limit = limit
