"""The NSQ version this implementation speaks, as clients and tools see it.

``/info``, ``/stats``, the IDENTIFY response, lookupd registrations and ``--version`` all report
``NSQ_VERSION``; clients gate features on it, so it names the NSQ release whose behaviour is
implemented, not this package's own version (``trionsq.__version__``, written in trionsq/_version.py).
"""

from __future__ import annotations

import platform

__all__ = ["NSQ_VERSION", "version_string"]

NSQ_VERSION = "1.3.0"


def version_string(app: str = "nsqd") -> str:
    """``--version`` text in NSQ's form: ``nsqd v1.3.0 (built w/python3.11.7)``."""
    return f"{app} v{NSQ_VERSION} (built w/python{platform.python_version()})"
