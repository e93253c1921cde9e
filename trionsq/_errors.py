"""The client's exceptions.

Three things can go wrong with a request, and a caller reacts differently to each:

- ``NSQError``: nsqd answered with an error frame. ``code`` says which (``E_BAD_TOPIC``,
  ``E_PUB_FAILED``...), ``fatal`` says whether nsqd closes the connection after it (every code but
  ``E_FIN_FAILED``, ``E_REQ_FAILED`` and ``E_TOUCH_FAILED``). It is ``protocol.ProtocolError``'s
  client-side twin, so it pickles with its flag (Spark ships exceptions between processes).
- ``ConnectionClosed``: the connection ended (EOF, reset, read timeout, a corrupt stream) while
  the request was pending, or was already closed. ``ConnectError`` is the same for a connection
  that never got through its handshake (refused, dial timeout, TLS or upgrade failure), so one
  ``except ConnectionClosed`` covers "this connection is unusable".
- ``NoAvailableNsqd``: a producer tried every address and each one failed; ``errors`` holds the
  failure per address, the last one is also ``__cause__``.
"""

from __future__ import annotations

from protocol.errors import ProtocolError

__all__ = ["ConnectError", "ConnectionClosed", "NSQError", "NoAvailableNsqd"]


class NSQError(ProtocolError):
    """An error frame from nsqd: ``str(err)`` is the frame's text, e.g.
    ``E_BAD_TOPIC PUB topic name "a b" is not valid``.

    Invalid topic and channel names are refused before sending, with the same text. It pickles with its flag
    (Spark ships exceptions between processes).

    Attributes:
        code: The error code, e.g. ``E_BAD_TOPIC``, ``E_PUB_FAILED``.
        description: The rest of the frame's text.
        fatal: Whether nsqd closes the connection after it: every code but ``E_FIN_FAILED``, ``E_REQ_FAILED`` and
            ``E_TOUCH_FAILED``.
    """

    @classmethod
    def from_frame(cls, data: bytes) -> NSQError:
        """Split an error frame's data into code and description (at the first space)."""
        text = data.decode("utf-8", "replace")
        code, _, description = text.partition(" ")
        return cls(code, description)

    def __repr__(self) -> str:
        return f"NSQError({self.code!r}, {self.description!r}, fatal={self.fatal!r})"


class ConnectionClosed(Exception):
    """The connection to nsqd ended (EOF, reset, read timeout, a corrupt stream) while the request was pending, or
    was already closed. One ``except ConnectionClosed`` covers "this connection is unusable"."""


class ConnectError(ConnectionClosed):
    """The connection could not be established: refused, timed out, or its TLS upgrade or handshake failed."""


class NoAvailableNsqd(Exception):
    """Every nsqd address was tried for one request and each failed; the last failure is also ``__cause__``.

    Attributes:
        errors: Each address tried, mapped to the exception it failed with, in the order tried.
    """

    def __init__(self, errors: dict[str, BaseException]) -> None:
        self.errors = dict(errors)
        detail = "; ".join(f"{address}: {exc}" for address, exc in self.errors.items())
        super().__init__(f"no nsqd available ({detail})" if detail else "no nsqd address given")
