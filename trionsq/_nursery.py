"""Leaving a nursery that an ``async with`` object entered by hand in its ``__aenter__``.

``Connection`` and ``Producer`` own a nursery for their tasks and expose themselves as async context
managers. On the way out they close gracefully (``close()``) when the block ended normally, or
abandon their tasks when it raised; then the nursery is left. Trio wraps every exception that
leaves a nursery in an ``ExceptionGroup``; a lone exception of the block's own (a ``NSQError`` from
a publish, a cancellation) is given back as itself, so callers catch what they would catch without
the nursery.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


async def leave_nursery(
    manager: Any,
    exc_info: tuple[Any, Any, Any],
    close: Callable[[], Awaitable[None]],
    abandon: Callable[[], None],
) -> bool:
    """The body of an ``__aexit__``: ``close()`` or ``abandon()``, then leave ``manager``'s nursery."""
    error = exc_info[1]
    if error is None:
        try:
            await close()
        except BaseException as exc:  # cancelled while closing: the nursery is still to be left
            error = exc
            abandon()
    else:
        abandon()
    try:
        suppressed = bool(
            await manager.__aexit__(type(error) if error else None, error, error.__traceback__ if error else None)
        )
    except BaseExceptionGroup as group:
        if error is None or len(group.exceptions) != 1 or group.exceptions[0] is not error:
            raise
        suppressed = False
    if error is not None and error is not exc_info[1] and not suppressed:
        raise error
    return suppressed
