"""The connection set-up every path of the connector shares: the driver path's consumer, the log
path's ``LogNode`` and the sink's publisher.

``client_config`` turns a ``SourceOptions`` or ``SinkOptions`` into a ``trionsq.Config``;
``open_connection`` dials one nsqd through the handshake of ``trionsq.blocking`` (IDENTIFY, TLS,
snappy/deflate, AUTH) within ``connectTimeoutMs``. The errors are the connector's own: the
source's (``NsqSourceError``, raised to Spark at the next driver call) and the one for an nsqd or
lookupd that cannot be reached or refuses (``NsqConnectionError``).
"""

from __future__ import annotations

import os
import socket
import time

from trionsq.blocking import BlockingConnection, Config, HandshakeError, connect

__all__ = ["USER_AGENT", "NsqConnectionError", "NsqSourceError", "client_config", "open_connection"]

USER_AGENT = "trionsq-spark/0.1"


class NsqSourceError(Exception):
    """The source cannot go on; the message says why (raised to Spark at the next driver call)."""


class NsqConnectionError(NsqSourceError):
    """An nsqd or lookupd could not be reached or refused the consumer."""


def client_config(opts, **changes) -> Config:
    """The client settings of a ``SourceOptions`` or ``SinkOptions`` (their connection fields have
    the same names)."""
    return Config(
        client_id=opts.client_id or f"spark-{socket.gethostname()}-{os.getpid()}",
        hostname=opts.hostname,
        user_agent=USER_AGENT,
        dial_timeout=opts.connect_timeout_ms / 1000,
        tls_v1=opts.tls,
        tls_root_ca_file=opts.tls_ca_file,
        tls_cert=opts.tls_cert_file,
        # a certificate file may hold its key too (ssl's load_cert_chain reads both from one file)
        tls_key=opts.tls_key_file or opts.tls_cert_file,
        tls_insecure_skip_verify=opts.tls_insecure,
        snappy=opts.snappy,
        deflate=opts.deflate,
        deflate_level=opts.deflate_level,
        auth_secret=opts.auth_secret,
        msg_timeout=None if opts.msg_timeout_ms is None else opts.msg_timeout_ms / 1000,
        **changes,
    )


def open_connection(address: str, opts, config: Config, **kwargs) -> tuple[BlockingConnection, float]:
    """Connect to the nsqd at ``address`` through the handshake every connection of the connector
    shares; returns it and the deadline of its set-up (``connectTimeoutMs`` from now), for the
    command that follows (SUB, or the first publish)."""
    deadline = time.monotonic() + opts.connect_timeout_ms / 1000
    try:
        conn = connect(address, config, deadline=deadline, server_hostname=opts.tls_server_name, **kwargs)
        return conn, deadline
    except HandshakeError as exc:
        if exc.features.auth_required and not opts.auth_secret:
            raise HandshakeError(f"{exc}: set the auth.secret option", exc.features) from None
        raise
