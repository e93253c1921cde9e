"""The wire side of the log path: one nsqd's log channel over ``trionsq.blocking`` (no trio), for
the driver (offsets, seek, commit) and for the executors (ranges).

The commands are nsqd's ``LOG``, ``LSEEK``, ``LREAD`` and ``LCOMMIT`` (``nsqd/LOG-PROTOCOL.md``;
encoders in ``protocol.log``), sent on a connection that has not subscribed, after the handshake
every connection of the connector shares (``connection.open_connection``: IDENTIFY, TLS,
snappy/deflate, AUTH). nsqd answers each in order, so ``LogNode`` keeps one connection and makes
one request at a time on it.

Which nsqd offer log channels: ``LOG`` is the probe. nsqd without them (NSQ's own, 1.3.0)
answers an unknown command with ``E_INVALID invalid command LOG`` and closes the connection:
``NoLogChannels``. Any other error is the answer of an nsqd that has the log (a bad name, AUTH
refused) and is raised as such.

Errors after a request: nsqd closes the connection after every error of these commands, so the
next request of a ``LogNode`` dials again. A connection lost or refused (nsqd restarting) is
``ConnectionClosed``; ``LogNode.call`` retries those with a capped backoff until its deadline, so
that a planner or a task rides over an nsqd restart; an ``NSQError`` is the request's own fault
and is not retried.
"""

from __future__ import annotations

import logging
import time

from protocol.errors import E_INVALID
from protocol.log import decode_offsets, encode_lcommit, encode_log, encode_lread, encode_lseek
from trionsq.blocking import BlockingConnection, ConnectionClosed, NSQError

from .connection import client_config, open_connection

__all__ = ["LogNode", "NoLogChannels"]

log = logging.getLogger("spark_connector.log_client")

_BACKOFF_MIN = 0.1
_BACKOFF_MAX = 2.0
# a range frame holds up to LREAD's max_bytes (capped at 64 MiB by nsqd): read it in a few recvs
_RECEIVE_SIZE = 1 << 20


class NoLogChannels(Exception):
    """The nsqd answered ``LOG`` as an unknown command: it has no log channels (NSQ's own nsqd)."""


def _unknown_command(exc: NSQError) -> bool:
    return exc.code == E_INVALID and str(exc).split(" ", 1)[-1].startswith("invalid command")


class LogNode:
    """The log channel ``topic``/``channel`` on the nsqd at ``address``, with ``options``' connection
    settings (a ``SourceOptions``). Not thread-safe: one per thread."""

    def __init__(self, address: str, options, *, heartbeats: bool = False) -> None:
        self.address = address
        self.options = options
        # between requests nothing reads the connection, so it asks nsqd for no heartbeats (nsqd
        # would drop a connection that misses two); a reader that keeps it busy may ask for them
        self.config = client_config(options) if heartbeats else client_config(options, heartbeat_interval=-1)
        self._conn: BlockingConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _connection(self) -> BlockingConnection:
        conn = self._conn
        if conn is not None and not conn.closed and conn.is_alive():
            return conn
        self.close()
        conn, _ = open_connection(self.address, self.options, self.config, receive_size=_RECEIVE_SIZE)
        self._conn = conn
        return conn

    def request(self, command: bytes, timeout: float | None = None, *, large: bool = False) -> bytes | bytearray:
        """One request on the current connection (dialled if needed); raises what it raised.
        ``large``: an answer of megabytes (LREAD), read into a buffer of its own size
        (``BlockingConnection.request_into``) rather than through the client's frame buffer."""
        conn = self._connection()
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            return conn.request_into(command, deadline) if large else conn.request(command, deadline)
        except BaseException:
            self.close()
            raise

    def call(self, command: bytes, retry_for: float, *, large: bool = False) -> bytes | bytearray:
        """``request``, dialling again after a lost or refused connection for up to ``retry_for``
        seconds; then the last ``ConnectionClosed`` (or ``TimeoutError``)."""
        deadline = time.monotonic() + retry_for
        backoff = _BACKOFF_MIN
        while True:
            try:
                return self.request(command, large=large)
            except (ConnectionClosed, TimeoutError) as exc:  # ConnectError is a ConnectionClosed
                if time.monotonic() + backoff >= deadline:
                    raise
                log.info("nsqd %s: %s; trying again in %.1fs", self.address, exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)

    # -- the commands ----------------------------------------------------------------------

    def offsets(self, retry_for: float = 0.0) -> dict[str, int]:
        """``LOG``: makes the channel a log (converting a backlog) and answers ``start``,
        ``committed``, ``end``. ``NoLogChannels`` from an nsqd without them."""
        opts = self.options
        try:
            return decode_offsets(self.call(encode_log(opts.topic, opts.channel), retry_for))
        except NSQError as exc:
            if _unknown_command(exc):
                raise NoLogChannels(f"nsqd {self.address} has no log channels ({exc})") from None
            raise

    def seek(self, timestamp_ns: int, retry_for: float = 0.0) -> int:
        """``LSEEK``: the first offset whose message was published at or after ``timestamp_ns``."""
        opts = self.options
        return decode_offsets(self.call(encode_lseek(opts.topic, opts.channel, timestamp_ns), retry_for))["offset"]

    def commit(self, offset: int, retry_for: float = 0.0) -> dict[str, int]:
        """``LCOMMIT``: everything below ``offset`` is finished (idempotent)."""
        opts = self.options
        return decode_offsets(self.call(encode_lcommit(opts.topic, opts.channel, offset), retry_for))

    def read(self, first: int, to: int, max_bytes: int, retry_for: float = 0.0) -> bytes | bytearray:
        """``LREAD``: one range frame's data, from ``first`` on, at least one message when
        ``first < to`` (``protocol.log``'s layout; ``log_source.range_batch`` makes columns of it,
        whose buffers are this one's)."""
        opts = self.options
        return self.call(encode_lread(opts.topic, opts.channel, first, to, max_bytes), retry_for, large=True)
