"""The blocking, pipelined producer with fail-over; its design is told in ``trionsq.blocking``.

One connection at a time (the current address's) carries the commands; ``_waiting`` holds those
written and not yet answered, in order (nsqd answers in order, and the core hands each reply the
token it was registered with), ``_queue`` those still to write: first sends, and the commands put
back when a connection failed. A command remembers where it failed, so that it tries each address
once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from protocol.commands import encode_dpub, encode_mpub, encode_pub
from protocol.errors import E_DPUB_FAILED, E_MPUB_FAILED, E_PUB_FAILED

from ._blocking_connection import BlockingConnection, connect
from ._config import Config
from ._core import ErrorReply, Reply, check_topic, split_address
from ._errors import ConnectError, ConnectionClosed, NoAvailableNsqd, NSQError

__all__ = ["Producer", "ProducerStats"]

logger = logging.getLogger("trionsq.blocking")

#: errors after which another nsqd may well succeed (the others are the request's own fault)
SERVER_FAILURES = frozenset({E_PUB_FAILED, E_MPUB_FAILED, E_DPUB_FAILED})


class _Command:
    __slots__ = ("data", "messages", "failures", "sent_before")

    def __init__(self, data: bytes, messages: int) -> None:
        self.data = data
        self.messages = messages
        self.failures: dict[str, BaseException] = {}  # address -> why it failed there
        self.sent_before = False  # its reply was lost: it may be stored already


@dataclass(frozen=True)
class ProducerStats:
    """What a blocking `Producer` did since it was made (`Producer.stats`).

    Attributes:
        messages: Messages acknowledged by an nsqd.
        commands: Commands written, retries included.
        retried_commands: Commands written again after a failure.
        resent_messages: Messages in commands whose reply was lost: they may be stored twice.
        connects: Connections made.
        per_nsqd: Acknowledged messages by address.
    """

    messages: int  # acknowledged by an nsqd
    commands: int  # written (retries included)
    retried_commands: int  # written again after a failure
    resent_messages: int  # in commands whose reply was lost: they may be stored twice
    connects: int
    per_nsqd: dict[str, int]  # acknowledged messages by address


class Producer:
    """Blocking, pipelined publishing with fail-over: the first address that works stays current.

    `send` writes an encoded PUB, MPUB or DPUB on the current nsqd's connection and reads replies only
    when ``max_in_flight`` commands wait for one; `flush` waits for every reply; `publish`,
    `multi_publish` and `deferred_publish` are `send` then `flush`. Used as a context manager, it
    flushes and closes on leaving the block (closes only, after an exception).

    Fail-over: a lost connection, no reply within ``response_timeout``, or ``E_PUB_FAILED``,
    ``E_MPUB_FAILED``, ``E_DPUB_FAILED`` moves to the next address and sends the unanswered commands
    there, each command trying each address once. Delivery is at least once: ``resent_messages`` in
    `stats` counts the messages whose first reply was lost.

    With no thread of its own, a producer cannot answer heartbeats while idle, so its connections
    IDENTIFY with heartbeats off; before writing on a connection that had nothing to wait for, it
    checks without blocking that nsqd did not close it meanwhile, and reconnects to the same address
    if it did (an nsqd restart between publishes is not a failure). Not thread-safe: one per thread.

    Args:
        addresses: ``host:port`` of each nsqd's TCP listener, in the order they are tried (one string
            for one).
        config: Connection options; ``Config()`` when omitted.
        max_in_flight: Commands that may wait for their reply.
        response_timeout: How long the oldest command waits for its reply before its nsqd is given
            up; default ``config.read_timeout``.

    Raises:
        ValueError: No address, one that is not ``host:port``, or ``max_in_flight`` below 1.
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        config: Config | None = None,
        *,
        max_in_flight: int = 16,
        response_timeout: float | None = None,
    ) -> None:
        addresses = [addresses] if isinstance(addresses, str) else list(addresses)
        if not addresses:
            raise ValueError("a Producer needs at least one nsqd address")
        for address in addresses:
            split_address(address)
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.addresses = addresses
        self.config = config if config is not None else Config()
        # no reader runs between calls to answer heartbeats, and nsqd drops a connection that misses
        # two: a producer's connections ask for none (nsqd then sets no read deadline either)
        self._connect_config = self.config.copy(heartbeat_interval=-1)
        self.max_in_flight = max_in_flight
        self.response_timeout = self.config.read_timeout if response_timeout is None else response_timeout
        self._current = 0
        self._conn: BlockingConnection | None = None
        self._waiting: deque[_Command] = deque()  # written on _conn, reply not read yet
        self._queue: deque[_Command] = deque()  # to write (first sends and retries)
        self._messages = self._commands = self._retried = self._resent = self._connects = 0
        self._per_nsqd: dict[str, int] = {}

    # -- publishing ----------------------------------------------------------------------------------

    def publish(self, topic: str, body: bytes) -> None:
        """Publish one message (PUB), then `flush`: returns once nsqd acknowledged it and everything
        sent before.

        Raises:
            NSQError: A request error (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``...), or an invalid topic name,
                raised at once; the commands pipelined behind a refused one are sent again by the next
                `send` or `flush`.
            NoAvailableNsqd: A command failed on every address; ``errors`` holds each one's failure.
        """
        self.send(encode_pub(check_topic("PUB", topic), body))
        self.flush()

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """Publish ``bodies`` in one MPUB (all or none stored), then `flush`.

        Raises:
            NSQError: A request error (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``...), or an invalid topic name,
                raised at once; the commands pipelined behind a refused one are sent again by the next
                `send` or `flush`.
            NoAvailableNsqd: A command failed on every address; ``errors`` holds each one's failure.
        """
        self.send(encode_mpub(check_topic("MPUB", topic), list(bodies)), len(bodies))
        self.flush()

    def deferred_publish(self, topic: str, delay: float, body: bytes) -> None:
        """Publish one message (DPUB) delivered ``delay`` seconds from now (sent as whole
        milliseconds), then `flush`.

        Raises:
            NSQError: A request error (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``...), or an invalid topic name,
                raised at once; the commands pipelined behind a refused one are sent again by the next
                `send` or `flush`.
            NoAvailableNsqd: A command failed on every address; ``errors`` holds each one's failure.
        """
        self.send(encode_dpub(check_topic("DPUB", topic), max(0, int(delay * 1000)), body))
        self.flush()

    def send(self, command: bytes, messages: int = 1) -> None:
        """Write one encoded PUB, MPUB or DPUB without waiting for its reply, unless ``max_in_flight``
        replies are due.

        Args:
            command: The command's bytes (``protocol.commands.encode_pub``, ``encode_mpub``,
                ``encode_dpub``).
            messages: How many messages it carries, for `stats`.

        Raises:
            NSQError: A request error (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``...), or an invalid topic name,
                raised at once; the commands pipelined behind a refused one are sent again by the next
                `send` or `flush`.
            NoAvailableNsqd: A command failed on every address; ``errors`` holds each one's failure.
        """
        self._queue.append(_Command(command, messages))
        self._pump()

    def flush(self) -> None:
        """Wait until every command sent so far is acknowledged.

        Raises:
            NSQError: A request error (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``...), or an invalid topic name,
                raised at once; the commands pipelined behind a refused one are sent again by the next
                `send` or `flush`.
            NoAvailableNsqd: A command failed on every address; ``errors`` holds each one's failure.
        """
        self._pump()
        while self._waiting or self._queue:
            self._read_replies(0)
            self._pump()

    def stats(self) -> ProducerStats:
        """Counts of messages, commands, retries and connections so far."""
        return ProducerStats(
            self._messages, self._commands, self._retried, self._resent, self._connects, dict(self._per_nsqd)
        )

    def close(self) -> None:
        """Close the connection; replies not read yet are abandoned (call `flush` first)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._waiting.clear()
        self._queue.clear()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()

    # -- machinery ---------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Write the queued commands, reading replies whenever ``max_in_flight`` are due."""
        queue = self._queue
        while queue:
            command = queue.popleft()
            conn = self._connection_for(command)
            if command.failures or command.sent_before:
                self._retried += 1
                if command.sent_before:
                    self._resent += command.messages
            self._waiting.append(command)
            self._commands += 1
            try:
                conn.send_command(command.data, command)
            except ConnectionClosed as exc:
                command.sent_before = True  # some of it may have gone out
                self._lost(exc)
                continue
            if len(self._waiting) >= self.max_in_flight:
                self._read_replies(self.max_in_flight - 1)

    def _connection_for(self, command: _Command) -> BlockingConnection:
        """The current connection if ``command`` has not failed there, else one to the next address
        it has not failed at; ``NoAvailableNsqd`` (and every unacknowledged command forgotten) when
        there is none."""
        addresses = self.addresses
        for _ in range(len(addresses)):
            address = addresses[self._current]
            if address not in command.failures:
                conn = self._conn
                # between publishes nsqd may have gone away (restarted): found before writing, that is
                # no failure of this command, just a new connection
                if conn is not None and conn.address == address and (self._waiting or conn.is_alive()):
                    return conn
                self._drop()
                try:
                    self._conn = connect(address, self._connect_config)
                except (ConnectError, NSQError) as exc:
                    logger.warning("%s", exc)
                    command.failures[address] = exc
                else:
                    self._connects += 1
                    return self._conn
            self._next_address()
        self._drop()
        self._queue.clear()
        raise NoAvailableNsqd(command.failures)

    def _read_replies(self, left: int) -> None:
        """Read replies until at most ``left`` commands wait for one."""
        waiting = self._waiting
        while len(waiting) > left:
            conn = self._conn
            assert conn is not None
            try:
                event = conn.read_event(time.monotonic() + self.response_timeout)
            except TimeoutError:
                self._lost(ConnectionClosed(f"no reply from nsqd {conn.address} within {self.response_timeout} s"))
                return
            except ConnectionClosed as exc:
                self._lost(exc)
                return
            if type(event) is Reply:
                command = waiting.popleft()
                assert event.token is command
                self._messages += command.messages
                self._per_nsqd[conn.address] = self._per_nsqd.get(conn.address, 0) + command.messages
            elif type(event) is ErrorReply and event.token is None and not event.error.fatal:
                logger.warning("nsqd %s: %s", conn.address, event.error)
            elif type(event) is ErrorReply and event.token is not None:
                command = waiting.popleft()
                assert event.token is command
                error = event.error
                self._drop()  # nsqd closes the connection after a refused publish
                if error.code not in SERVER_FAILURES:
                    raise error
                logger.warning("nsqd %s: %s; trying the next nsqd", conn.address, error)
                command.failures[conn.address] = error
                self._queue.appendleft(command)
                self._next_address()
                return
            else:
                self._lost(ConnectionClosed(f"unexpected {event!r} from nsqd {conn.address}"))
                return

    def _lost(self, cause: BaseException) -> None:
        """The connection failed: what waits on it may or may not be stored; it goes to the next
        address."""
        conn = self._conn
        assert conn is not None
        logger.warning("%s; %d commands go to the next nsqd", cause, len(self._waiting))
        for command in self._waiting:
            command.failures[conn.address] = cause
            command.sent_before = True
        self._drop()
        self._next_address()

    def _drop(self) -> None:
        """Close the current connection; the commands waiting on it are written again (first)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._queue.extendleft(reversed(self._waiting))
        self._waiting.clear()

    def _next_address(self) -> None:
        self._current = (self._current + 1) % len(self.addresses)
