"""A message delivered to a consumer, and how it answers nsqd.

``finish()``, ``requeue()`` and ``touch()`` are synchronous: each builds its command's bytes and hands
them to the message's *responder*, the connection it arrived on, which queues them on its write
buffer and wakes its writer (the trio ``Connection``), or writes them (the blocking driver). So a
handler never awaits to answer, and a batch of answers leaves in one write.

A responder is any object with:

- ``config``: the ``Config`` (for the default requeue delay and its cap);
- ``_message_finished(message, data)``: FIN given;
- ``_message_requeued(message, data, backoff)``: REQ given (``backoff``: count it as a failure);
- ``_message_touched(message, data)``: TOUCH given.

Only the first FIN or REQ counts; later ones (and touches after it) are ignored, because nsqd
would answer a second one with ``E_FIN_FAILED``/``E_REQ_FAILED``.

Requeue delay: ``requeue(delay=None)`` uses go-nsq's linear rule, ``default_requeue_delay *
attempts`` capped at ``max_requeue_delay``; an explicit delay is used as given (seconds, sent as
whole milliseconds, never negative).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from protocol.commands import encode_fin, encode_req, encode_touch
from protocol.errors import E_BAD_MESSAGE
from protocol.message import MESSAGE_HEADER_SIZE

from ._errors import NSQError

if TYPE_CHECKING:
    from ._config import Config

__all__ = ["Message", "requeue_delay"]

_unpack_header = struct.Struct(">qH16s").unpack_from


def requeue_delay(config: Config, attempts: int) -> float:
    """go-nsq's default requeue delay: linear in the attempts, capped."""
    return min(config.default_requeue_delay * attempts, config.max_requeue_delay)


class Message:
    """One delivery, and its answers to nsqd.

    `finish`, `requeue` and `touch` are synchronous: each queues its command on the connection the message came
    from, so a handler never awaits to answer and a batch of answers leaves in one write. Only the first FIN or REQ
    counts; later ones, and touches after it, are ignored (nsqd would refuse them). An answer after the connection
    closed is dropped: nsqd has requeued the message already.

    Attributes:
        id: The message ID, 16 ASCII hex bytes.
        body: The message.
        timestamp: When it was published, in nanoseconds since the epoch.
        attempts: Deliveries so far, this one included.
        nsqd_address: ``host:port`` of the nsqd it came from.
    """

    __slots__ = (
        "id",
        "body",
        "timestamp",
        "attempts",
        "nsqd_address",
        "_responder",
        "_responded",
        "_auto_response_disabled",
    )

    def __init__(
        self,
        id: bytes,
        body: bytes,
        timestamp: int,
        attempts: int,
        nsqd_address: str,
        responder: Any,
    ) -> None:
        self.id = id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.nsqd_address = nsqd_address
        self._responder = responder
        self._responded = False
        self._auto_response_disabled = False

    @classmethod
    def from_frame_data(cls, data: bytes, nsqd_address: str, responder: Any) -> Message:
        """Decode a message frame's data (``protocol.message`` draws the layout)."""
        if len(data) < MESSAGE_HEADER_SIZE:
            raise NSQError(E_BAD_MESSAGE, f"invalid message buffer size ({len(data)})")
        timestamp, attempts, msg_id = _unpack_header(data)
        return cls(msg_id, data[MESSAGE_HEADER_SIZE:], timestamp, attempts, nsqd_address, responder)

    # -- answers ----------------------------------------------------------------------------------

    @property
    def has_responded(self) -> bool:
        """True once FIN or REQ was given."""
        return self._responded

    @property
    def auto_response_disabled(self) -> bool:
        """True after `disable_auto_response`: the application answers this message itself."""
        return self._auto_response_disabled

    def disable_auto_response(self) -> None:
        """The handler answers this message itself (possibly later): a consumer does not FIN or
        REQ it when the handler returns or raises."""
        self._auto_response_disabled = True

    def finish(self) -> None:
        """FIN: processed. Queued on the connection at once; a second answer is a no-op."""
        if self._responded:
            return
        self._responded = True
        self._responder._message_finished(self, encode_fin(self.id))

    def requeue(self, delay: float | None = None, backoff: bool = True) -> None:
        """REQ: ask nsqd to deliver the message again after ``delay`` seconds. A no-op once answered.

        Args:
            delay: Seconds, sent as whole milliseconds (never negative); None: go-nsq's rule,
                ``default_requeue_delay * attempts`` capped at ``max_requeue_delay``.
            backoff: Count this as a failure, so that a consumer backs off.
        """
        if self._responded:
            return
        self._responded = True
        if delay is None:
            delay = requeue_delay(self._responder.config, self.attempts)
        delay_ms = max(0, int(delay * 1000))
        self._responder._message_requeued(self, encode_req(self.id, delay_ms), backoff)

    def touch(self) -> None:
        """TOUCH: reset this message's timeout on nsqd (no-op once answered)."""
        if self._responded:
            return
        self._responder._message_touched(self, encode_touch(self.id))

    def __repr__(self) -> str:
        return (
            f"Message(id={self.id!r}, body=<{len(self.body)} bytes>, attempts={self.attempts}, "
            f"nsqd_address={self.nsqd_address!r})"
        )
