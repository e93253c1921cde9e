"""The answers of the log commands (``LOG``, ``LSEEK``, ``LREAD``, ``LCOMMIT``; LOG-PROTOCOL.md) in the process
that owns the topic.

A connection checks a command first (state, parameters, permission, shutdown: ``Connection._log_request``); the
answer is then made here, from the request alone, by the worker that owns the topic: the connection's own with one
process, else the owner, to which the request crosses (``workers.WorkerMesh.log_command``) and whose answer frame
comes back. A refusal raises ``ProtocolError``, which the connection answers as its own.
"""

from __future__ import annotations

from collections.abc import Callable

from protocol.errors import ProtocolError
from protocol.frames import FRAME_TYPE_RESPONSE, encode_frame
from protocol.log import (
    DEFAULT_MAX_BYTES,
    E_LOG_BAD_RANGE,
    E_LOG_BEFORE_START,
    E_LOG_FAILED,
    E_LOG_NOT_LOG,
    E_LOG_PAST_END,
    E_LOG_UNKNOWN,
    MAX_MAX_BYTES,
    LogRequest,
    encode_offsets,
)

from .queues.offset_log import LogRangeError

__all__ = ["answer"]


def answer(nsqd, request: LogRequest) -> bytes:
    """The response frame of a checked log command, or ``ProtocolError``."""
    if nsqd.exiting:  # (checked by the connection too: the owner may be stopping on its own)
        raise ProtocolError(E_LOG_FAILED, f"{request.verb} failed exiting")
    return _ANSWERS[request.verb](nsqd, request)


def _log_channel(nsqd, request: LogRequest):
    """The log channel LSEEK, LREAD and LCOMMIT name (they create nothing)."""
    topic = nsqd.get_existing_topic(request.topic)
    channel = topic.channels.get(request.channel) if topic is not None else None
    name = f"{request.topic}:{request.channel}"
    if channel is None:
        raise ProtocolError(E_LOG_UNKNOWN, f"{request.verb} unknown topic or channel {name}")
    if channel.log is None:
        raise ProtocolError(E_LOG_NOT_LOG, f"{request.verb} channel {name} is not a log (LOG makes it one)")
    return channel


def _range_error(request: LogRequest, error: LogRangeError) -> ProtocolError:
    name = f"{request.topic}:{request.channel}"
    if error.kind == "bad_range":
        return ProtocolError(E_LOG_BAD_RANGE, f"{request.verb} from {error.offset} > to {error.bound}")
    if error.kind == "before_start":
        return ProtocolError(
            E_LOG_BEFORE_START,
            f"{request.verb} offset {error.offset} before the oldest retained offset {error.bound} of {name}",
        )
    return ProtocolError(E_LOG_PAST_END, f"{request.verb} offset {error.offset} past the end {error.bound} of {name}")


def _offsets_frame(channel_log, **extra) -> bytes:
    return encode_frame(FRAME_TYPE_RESPONSE, encode_offsets(*channel_log.offsets(), **extra))


def _log(nsqd, request: LogRequest) -> bytes:
    channel = nsqd.get_topic(request.topic).get_channel(request.channel)
    try:
        channel_log = channel.make_log()
    except OSError as exc:
        raise ProtocolError(E_LOG_FAILED, f"LOG failed {exc}") from None
    return _offsets_frame(channel_log, **channel_log.notes)  # a takeover's notes, when there are


def _lseek(nsqd, request: LogRequest) -> bytes:
    channel_log = _log_channel(nsqd, request).log
    try:
        offset = channel_log.seek(request.numbers[0])
    except OSError as exc:
        raise ProtocolError(E_LOG_FAILED, f"LSEEK failed {exc}") from None
    return _offsets_frame(channel_log, offset=offset)


def _lread(nsqd, request: LogRequest) -> bytes:
    channel_log = _log_channel(nsqd, request).log
    first, to, max_bytes = request.numbers
    max_bytes = min(max_bytes or DEFAULT_MAX_BYTES, MAX_MAX_BYTES)
    try:
        data = channel_log.read(first, to, max_bytes)
    except LogRangeError as error:
        raise _range_error(request, error) from None
    except OSError as exc:
        raise ProtocolError(E_LOG_FAILED, f"LREAD failed {exc}") from None
    return encode_frame(FRAME_TYPE_RESPONSE, data)


def _lcommit(nsqd, request: LogRequest) -> bytes:
    channel = _log_channel(nsqd, request)
    try:
        channel.log_commit(request.numbers[0])
    except LogRangeError as error:
        raise _range_error(request, error) from None
    except OSError as exc:
        raise ProtocolError(E_LOG_FAILED, f"LCOMMIT failed {exc}") from None
    return _offsets_frame(channel.log)


_ANSWERS: dict[str, Callable[..., bytes]] = {"LOG": _log, "LSEEK": _lseek, "LREAD": _lread, "LCOMMIT": _lcommit}
