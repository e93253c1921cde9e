"""The executor-side publisher of the ``nsq`` sink: one blocking connection per destination nsqd,
MPUB (and DPUB) commands pipelined on each, every one answered before the task may succeed.

A Spark task owns one ``Publisher`` for its partition. ``send`` hands a command (a prepared
header and its payload, the encoded messages) to the next connection in turn, so that the task's
batches spread evenly over the nsqd; each connection carries up to ``maxInFlight`` commands whose
answer has not come yet (nsqd answers a connection's commands in order), and ``finish`` waits for
every answer. A command refused by an nsqd (an error frame, the connection lost, no answer within
``responseTimeoutMs``) is sent again on another nsqd that has not refused it; when every nsqd has
refused it, the task fails with each nsqd's answer. nsqd closes the connection after an error to a
publish command, so the connection is not used again by this task, and the commands queued behind
the refused one (never run by that nsqd) go to the others.

At-least-once: a command whose answer was lost with its connection may have been stored by that
nsqd before it went away; it is published again elsewhere and counted in ``resent_messages``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from trionsq.blocking import (
    BlockingConnection,
    ConnectionClosed,
    ErrorReply,
    LookupdError,
    NSQError,
    Reply,
    nodes,
)

from .connection import NsqConnectionError, client_config, open_connection
from .options import SinkOptions

__all__ = ["Command", "NsqPublishError", "Publisher", "PublisherStats", "destinations"]

log = logging.getLogger("spark_connector.publisher")


class NsqPublishError(NsqConnectionError):
    """No nsqd accepted a command: the message has every nsqd's answer."""


@dataclass(eq=False)
class Command:
    """One MPUB or DPUB: ``header`` (the command line and sizes) then ``payload``; ``count``
    messages from row ``first_row`` of the task's partition."""

    header: bytes
    payload: bytes | memoryview
    count: int
    first_row: int
    refusals: dict[str, str] = field(default_factory=dict)  # nsqd -> its answer
    sent_before: bool = False  # a lost connection may have stored it already


@dataclass
class PublisherStats:
    messages: int = 0  # acknowledged by an nsqd
    commands: int = 0
    retried_commands: int = 0  # sent again after a refusal or a lost connection
    resent_messages: int = 0  # messages of commands whose first answer was lost: may be stored twice
    per_nsqd: dict[str, int] = field(default_factory=dict)


class _Link:
    def __init__(self, conn: BlockingConnection) -> None:
        self.address = conn.address
        self.conn = conn
        self.waiting: deque[Command] = deque()


def destinations(options: SinkOptions) -> list[str]:
    """The nsqd to publish to: the listed ones, then every nsqd lookupd knows (``/nodes``)."""
    found = list(options.nsqd_addresses)
    failures = []
    for lookupd in options.lookupd_addresses:
        try:
            for peer in nodes(lookupd, timeout=options.connect_timeout_ms / 1000):
                if peer.tcp_address not in found:
                    found.append(peer.tcp_address)
        except LookupdError as exc:
            failures.append(f"{lookupd}: {exc}")
    if not found:
        detail = "; ".join(failures) or "lookupd knows no nsqd"
        raise NsqConnectionError(f"nsq sink: no nsqd to publish to ({detail})")
    return found


class Publisher:
    def __init__(self, options: SinkOptions, addresses: list[str], first: int = 0) -> None:
        self.options = options
        # Tasks start at different nsqd, so that one-batch partitions spread too.
        n = len(addresses)
        self.addresses = [addresses[(first + i) % n] for i in range(n)]
        self.stats = PublisherStats()
        self._links: list[_Link] = []
        self._turn = 0
        self._retry: deque[Command] = deque()
        self._refused_at_connect: dict[str, str] = {}
        self._timeout = options.response_timeout_ms / 1000

    def open(self) -> Publisher:
        # replies are read only when a link has maxInFlight commands waiting, and a task may spend a
        # while on its next rows: no heartbeats to miss (nsqd drops a connection that misses two)
        config = client_config(self.options, heartbeat_interval=-1)
        for address in self.addresses:
            try:
                conn, _ = open_connection(address, self.options, config)
            except (ConnectionClosed, NSQError, ValueError) as exc:  # ConnectError is a ConnectionClosed
                self._refused_at_connect[address] = f"cannot connect ({exc})"
                log.warning("nsqd %s: cannot connect (%s); publishing to the others", address, exc)
                continue
            self._links.append(_Link(conn))
        if not self._links:
            raise NsqPublishError(
                "nsq sink: no nsqd accepted a connection: "
                + "; ".join(f"nsqd {a}: {why}" for a, why in self._refused_at_connect.items())
            )
        return self

    def close(self) -> None:
        for link in self._links:
            link.conn.close()
        self._links.clear()

    # -- sending -----------------------------------------------------------------------------

    def send(self, command: Command) -> None:
        self._retry.append(command)
        self._drain_retries()

    def finish(self) -> None:
        """Wait for every answer (and publish refused commands elsewhere)."""
        while True:
            self._drain_retries()
            busy = [link for link in self._links if link.waiting]
            if not busy and not self._retry:
                return
            for link in busy:
                self._await(link, 0)

    def _drain_retries(self) -> None:
        while self._retry:
            command = self._retry.popleft()
            link = self._pick(command)
            if command.refusals or command.sent_before:
                self.stats.retried_commands += 1
                if command.sent_before:
                    self.stats.resent_messages += command.count
            try:
                link.conn.send_command(b"".join((command.header, command.payload)), command)
            except ConnectionClosed as exc:
                command.sent_before = True  # part of it may have reached nsqd
                link.waiting.append(command)
                self._lost(link, f"connection lost ({exc})")
                continue
            link.waiting.append(command)
            self.stats.commands += 1
            if len(link.waiting) >= self.options.max_in_flight:
                self._await(link, self.options.max_in_flight - 1)

    def _pick(self, command: Command) -> _Link:
        n = len(self._links)
        for i in range(n):
            link = self._links[(self._turn + i) % n]
            if link.address not in command.refusals:
                self._turn = (self._turn + i + 1) % n
                return link
        refusals = {**self._refused_at_connect, **command.refusals}
        raise NsqPublishError(
            f"nsq sink: no nsqd took {command.count} messages from row {command.first_row}: "
            + "; ".join(f"nsqd {a}: {why}" for a, why in refusals.items())
        )

    # -- answers -----------------------------------------------------------------------------

    def _await(self, link: _Link, left: int) -> None:
        """Read answers on ``link`` until at most ``left`` commands wait for one."""
        conn = link.conn
        while len(link.waiting) > left:
            try:
                event = conn.read_event(time.monotonic() + self._timeout)
            except TimeoutError:
                self._lost(link, f"no answer within {self.options.response_timeout_ms} ms (option responseTimeoutMs)")
                return
            except ConnectionClosed as exc:
                self._lost(link, f"connection lost ({exc})")
                return
            if type(event) is ErrorReply and event.token is not None:
                command = link.waiting.popleft()
                error = event.error
                command.refusals[link.address] = str(error)
                log.warning(
                    "nsqd %s refused %d messages from row %d: %s", link.address, command.count, command.first_row, error
                )
                self._retry.append(command)
                if error.fatal:
                    self._lost(link, None)  # nsqd closes the connection after it
                    return
            elif type(event) is Reply:
                command = link.waiting.popleft()
                self.stats.messages += command.count
                self.stats.per_nsqd[link.address] = self.stats.per_nsqd.get(link.address, 0) + command.count
            elif type(event) is ErrorReply and not event.error.fatal:
                log.warning("nsqd %s: %s", link.address, event.error)
            else:
                self._lost(link, f"unexpected {event!r}")
                return

    def _lost(self, link: _Link, reason: str | None) -> None:
        """Stop using ``link``; what waits on it goes to the other nsqd. With ``reason`` (the
        connection failed), the fate of those commands is unknown: they may be stored twice."""
        if reason is not None:
            log.warning("nsqd %s: %s; %d commands go to the other nsqd", link.address, reason, len(link.waiting))
        for command in link.waiting:
            if reason is not None:
                command.refusals[link.address] = reason
                command.sent_before = True
            else:
                command.refusals.setdefault(link.address, "connection closed after an earlier error")
        self._retry.extend(link.waiting)
        link.waiting.clear()
        link.conn.close()
        self._links.remove(link)
        self._refused_at_connect[link.address] = reason or "connection closed after an error"
        if self._links:
            self._turn %= len(self._links)
