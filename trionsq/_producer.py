"""Publishing to a list of nsqd with fail-over.

A ``Producer`` keeps at most one pipelined ``Connection`` per address, opened on first use, and
sends every request to its *current* address. Many tasks may publish at once: their commands share
the connection's writer (one write per batch) and their replies come back in order.

Fail-over, per request: when the current address cannot take it (the dial fails, the connection is
lost before the reply, or nsqd answers with a server-side failure: ``E_PUB_FAILED``,
``E_MPUB_FAILED``, ``E_DPUB_FAILED``), the request is retried on the next address in the list, each
address at most once, and the first address that succeeds becomes the current one. An error that
the request itself caused (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``, ``E_BAD_BODY``, ``E_INVALID``,
``E_UNAUTHORIZED``, an error frame during the handshake such as ``E_AUTH_FAILED``) is raised at
once: another nsqd would refuse it too. When every address failed, ``NoAvailableNsqd`` carries each
address's error. A request whose connection died after it was written may have been published
anyway; the retry makes delivery at-least-once, as NSQ is.

A connection found closed (nsqd restarted, read timeout) is replaced on the next request to its
address; concurrent requests share one dial. The connections' tasks run in the producer's nursery,
so ``Producer`` is used as ``async with``; leaving the block closes the connections (CLS).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import trio

from protocol.errors import E_DPUB_FAILED, E_MPUB_FAILED, E_PUB_FAILED

from ._config import Config
from ._connection import Connection
from ._core import split_address
from ._errors import ConnectionClosed, NoAvailableNsqd, NSQError
from ._nursery import leave_nursery

__all__ = ["Producer", "ProducerStats"]

logger = logging.getLogger("trionsq.producer")

#: nsqd could not store the message; another nsqd may
_SERVER_FAILURES = frozenset({E_PUB_FAILED, E_MPUB_FAILED, E_DPUB_FAILED})

_PUB, _MPUB, _DPUB = 0, 1, 2


@dataclass(frozen=True)
class ProducerStats:
    """What a `Producer` did since it was made (`Producer.stats`).

    Attributes:
        messages_published: Messages acknowledged by an nsqd (an MPUB counts each of its bodies).
        requests: PUB, MPUB and DPUB requests made, whatever their outcome.
        requests_failed: Requests that raised: a request error, or every address failed.
        failovers: Requests that succeeded on another address than the first one tried.
        connections: Connections open right now.
        current_address: The address requests go to first.
    """

    messages_published: int
    requests: int
    requests_failed: int
    failovers: int  # requests that had to move to another address
    connections: int  # open right now
    current_address: str


class Producer:
    """Publishes to a list of nsqd with pipelining and fail-over.

    Use it as ``async with Producer(addresses, config) as producer:``; leaving the block closes its connections
    (CLS). It keeps at most one connection per address, dialled on first use, and sends every request to its
    *current* address. Any number of tasks may publish at once: their commands share one write per batch and
    their replies come back in order.

    Fail-over, per request: when the current address cannot take it (the dial fails, the connection is lost
    before the reply, or nsqd answers ``E_PUB_FAILED``, ``E_MPUB_FAILED`` or ``E_DPUB_FAILED``), the request is
    tried on the next address, each address at most once, and the first that succeeds becomes the current one.
    Delivery is at least once: a request whose connection died after it was written may have been stored.
    A connection found closed (nsqd restarted, a read timeout) is dialled again on the next request to it.

    Args:
        addresses: ``host:port`` of each nsqd's TCP listener, in the order they are tried (one string for one).
        config: Connection options (TLS, compression, AUTH, timeouts); ``Config()`` when omitted.

    Raises:
        ValueError: No address, or one that is not ``host:port``.
    """

    def __init__(self, addresses: list[str] | str, config: Config | None = None) -> None:
        if isinstance(addresses, str):
            addresses = [addresses]
        if not addresses:
            raise ValueError("Producer needs at least one nsqd address")
        for address in addresses:
            split_address(address)  # a bad address is refused here, not at the first publish
        self.addresses = list(addresses)
        self.config = config if config is not None else Config()
        self._connections: list[Connection | None] = [None] * len(addresses)
        self._dialing: dict[int, trio.Event] = {}
        self._dial_errors: dict[int, BaseException] = {}
        self._current = 0
        self._nursery: trio.Nursery | None = None
        self._nursery_manager: Any = None
        self._closed = False
        self._published = 0
        self._requests = 0
        self._failed = 0
        self._failovers = 0

    # -- lifetime ---------------------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        self._nursery_manager = trio.open_nursery()
        self._nursery = await self._nursery_manager.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool:
        return await leave_nursery(self._nursery_manager, exc_info, self.close, self._abandon)

    def _abandon(self) -> None:
        self._closed = True
        self._nursery.cancel_scope.cancel()  # type: ignore[union-attr]

    async def close(self) -> None:
        """Close every connection (CLS, then nsqd's CLOSE_WAIT), in parallel.

        Leaving the ``async with`` block calls it; a publish afterwards raises ``RuntimeError``.
        """
        self._closed = True
        async with trio.open_nursery() as nursery:
            for conn in self._connections:
                if conn is not None and not conn.closed:
                    nursery.start_soon(conn.close)

    # -- publishing -------------------------------------------------------------------------------

    async def publish(self, topic: str, body: bytes) -> None:
        """Publish one message (PUB) and return once an nsqd answered ``OK``.

        Args:
            topic: A valid NSQ topic name (checked before sending).
            body: The message, at most nsqd's ``--max-msg-size``.

        Raises:
            NSQError: A request error, raised at once without fail-over (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``,
                ``E_UNAUTHORIZED``, ``E_AUTH_FAILED`` during a handshake...).
            NoAvailableNsqd: Every address failed; ``errors`` holds each one's failure.
            RuntimeError: The producer is not open (outside ``async with``, or closed).
        """
        await self._request(_PUB, topic, body, None, 1)

    async def multi_publish(self, topic: str, bodies: list[bytes]) -> None:
        """Publish several messages in one MPUB: nsqd stores all of them or none.

        Args:
            topic: A valid NSQ topic name.
            bodies: The messages; together at most nsqd's ``--max-body-size``.

        Raises:
            NSQError: A request error (``E_BAD_BODY``, ``E_BAD_MESSAGE``...), without fail-over.
            NoAvailableNsqd: Every address failed.
            RuntimeError: The producer is not open.
        """
        await self._request(_MPUB, topic, bodies, None, len(bodies))

    async def deferred_publish(self, topic: str, delay_seconds: float, body: bytes) -> None:
        """Publish one message (DPUB) that nsqd delivers ``delay_seconds`` from now.

        Args:
            topic: A valid NSQ topic name.
            delay_seconds: The delay, sent as whole milliseconds; at most nsqd's ``--max-req-timeout``.
            body: The message.

        Raises:
            NSQError: A request error (``E_INVALID`` for a delay out of range...), without fail-over.
            NoAvailableNsqd: Every address failed.
            RuntimeError: The producer is not open.
        """
        await self._request(_DPUB, topic, body, delay_seconds, 1)

    def stats(self) -> ProducerStats:
        """Counts of requests, failures and fail-overs so far, and the current address."""
        return ProducerStats(
            messages_published=self._published,
            requests=self._requests,
            requests_failed=self._failed,
            failovers=self._failovers,
            connections=sum(1 for c in self._connections if c is not None and not c.closed),
            current_address=self.addresses[self._current],
        )

    async def _request(self, kind: int, topic: str, payload: Any, delay: float | None, count: int) -> None:
        if self._nursery is None or self._closed:
            raise RuntimeError("Producer is not open (use it as 'async with Producer(...)')")
        self._requests += 1
        errors: dict[str, BaseException] = {}
        start = self._current
        total = len(self.addresses)
        for step in range(total):
            index = (start + step) % total
            try:
                conn = self._connections[index]
                if conn is None or conn.closed:
                    conn = await self._connect(index)
                if kind == _PUB:
                    await conn.publish(topic, payload)
                elif kind == _MPUB:
                    await conn.multi_publish(topic, payload)
                else:
                    await conn.deferred_publish(topic, delay, payload)  # type: ignore[arg-type]
            except NSQError as exc:
                if exc.code not in _SERVER_FAILURES:
                    self._failed += 1
                    raise
                errors[self.addresses[index]] = exc
            except ConnectionClosed as exc:  # includes ConnectError
                errors[self.addresses[index]] = exc
            else:
                if step:
                    self._failovers += 1
                    if self._current == start:
                        self._current = index
                        logger.warning("now publishing to %s (%s)", self.addresses[index], _summary(errors))
                self._published += count
                return
        self._failed += 1
        error = NoAvailableNsqd(errors)
        raise error from list(errors.values())[-1]

    async def _connect(self, index: int) -> Connection:
        """The connection to ``addresses[index]``, dialled once for all the tasks that need it."""
        dialing = self._dialing.get(index)
        if dialing is not None:
            await dialing.wait()
            conn = self._connections[index]
            if conn is None or conn.closed:
                raise self._dial_errors[index]
            return conn
        done = self._dialing[index] = trio.Event()
        try:
            conn = Connection(self.addresses[index], self.config)
            await self._nursery.start(conn.run)  # type: ignore[union-attr]
            self._connections[index] = conn
            self._dial_errors.pop(index, None)
            return conn
        except (ConnectionClosed, NSQError) as exc:
            self._dial_errors[index] = exc
            logger.warning("%s: %s", self.addresses[index], exc)
            raise
        finally:
            del self._dialing[index]
            done.set()


def _summary(errors: dict[str, BaseException]) -> str:
    return "; ".join(f"{address}: {exc}" for address, exc in errors.items())
