"""What the client scripts (pynsq_*.py, gnsq_features.py) share inside their own process: the warnings the
client library logs, which each script reports in its JSON result, and the connection options of a feature run.

Imports only the standard library, so it loads next to gevent or tornado without pulling in pytest or trio.
"""

from __future__ import annotations

import logging
import ssl

__all__ = ["Captured", "capture_warnings", "connection_options"]


class Captured(logging.Handler):
    """Keeps every warning and error logged, as ``<logger> <LEVEL> <message>``."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record):
        self.records.append(f"{record.name} {record.levelname} {record.getMessage()}")


def capture_warnings() -> Captured:
    """Capture the warnings of every logger (the root logger at INFO, so the libraries' loggers emit)."""
    captured = Captured()
    logging.getLogger().addHandler(captured)
    logging.getLogger().setLevel(logging.INFO)
    return captured


def connection_options(options: dict, *, secret_as_bytes: bool = False) -> dict:
    """pynsq's and gnsq's connection keyword arguments for a feature run's options:
    ``{"tls": <CA file>, "snappy": bool, "deflate": <level>, "auth_secret": str}``."""
    kwargs = {}
    if options.get("tls"):
        kwargs["tls_v1"] = True
        kwargs["tls_options"] = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": options["tls"]}
    if options.get("snappy"):
        kwargs["snappy"] = True
    if options.get("deflate"):
        kwargs["deflate"] = True
        kwargs["deflate_level"] = options["deflate"]
    if options.get("auth_secret"):
        secret = options["auth_secret"]
        kwargs["auth_secret"] = secret.encode() if secret_as_bytes else secret
    return kwargs
