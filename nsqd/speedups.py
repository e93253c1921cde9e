"""The C accelerator (``nsqd/_speedups.c``), where it may be used.

``pip install -e .`` builds it where a compiler is present; ``TRIONSQ_NO_SPEEDUPS=1`` (or pytest's
``--no-speedups``) leaves it unused, so the pure-Python twins run. Each module that has C twins asks ``load()``
once at import, so the rule that picks them is the same for all of them.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["load"]


def load() -> ModuleType | None:
    """``nsqd._speedups`` when it was built and ``TRIONSQ_NO_SPEEDUPS`` is unset (or 0); None otherwise."""
    if os.environ.get("TRIONSQ_NO_SPEEDUPS", "") not in ("", "0"):
        return None
    try:
        import nsqd._speedups as _speedups
    except ImportError:  # not built (no compiler at install time)
        return None
    return _speedups
