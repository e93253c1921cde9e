"""The C accelerator (``nsqd/_speedups.c``), where it may be used.

``pip install -e .`` builds it where a compiler is present; ``TRIONSQ_NO_SPEEDUPS=1`` (or pytest's
``--no-speedups``) leaves it unused, so the pure-Python twins run. Each module that has C twins asks ``load()``
once at import, so the rule that picks them is the same for all of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

__all__ = ["load", "twin"]

F = TypeVar("F", bound=Callable[..., Any])


def load() -> ModuleType | None:
    """``nsqd._speedups`` when it was built and ``TRIONSQ_NO_SPEEDUPS`` is unset (or 0); None otherwise."""
    if os.environ.get("TRIONSQ_NO_SPEEDUPS", "") not in ("", "0"):
        return None
    try:
        import nsqd._speedups as _speedups
    except ImportError:  # not built (no compiler at install time)
        return None
    return _speedups


def twin(name: str, python_twin: F, layout: str | None = None, *classes_and_constants: object) -> F:
    """The accelerator's function ``name`` where ``load()`` gives it, ``python_twin`` otherwise. ``layout``: the
    accelerator's function that learns, once, where the Python classes among ``classes_and_constants`` keep the
    slots ``name`` reads and writes (a Python twin's own attribute accesses), called with them first."""
    speedups = load()
    if speedups is None or not hasattr(speedups, name):
        return python_twin
    if layout is not None:
        getattr(speedups, layout)(*classes_and_constants)
    return getattr(speedups, name)
