"""The trio Consumer: one topic/channel read from many nsqd, found by address or through nsqlookupd.

Shape
    A ``Consumer`` is an async context manager that owns one nursery. In it run: one task per nsqd (connect,
    SUB, wait for the connection's end, reconnect), ``concurrency`` handler workers, the RDY timer task, and the
    lookupd poller when lookupd addresses are given. Each connection's ``on_message`` callback is synchronous: it
    counts the message and appends it to one queue (a deque) that the workers share. The queue needs no bound of
    its own: nsqd sends no more than the RDY counts allow, and their sum never passes ``max_in_flight``.

Cost per message
    A consumer is dominated by what it pays per message, so the path is built for batches. A connection's reader
    decodes a whole read in one pass and appends its messages to the queue; only a worker that is parked idle is
    woken (one wake-up per worker and read, not per message). A worker then takes messages off the queue and runs
    their handlers back to back: a handler that completes without suspending costs no trip through trio's
    scheduler, and the worker checkpoints once per ``_BATCH`` messages (or parks when the queue is empty), not once
    per message. The FINs those handlers produce are queued on their connection's write buffer, whose writer task
    runs only when the worker yields, so a batch of answers leaves in one write. A handler that does suspend lets
    the other workers take the next messages, so ``concurrency`` still bounds the handlers running at once. RDY is
    a standing window and is written only when the distribution changes, never per message.

Answers
    A message answers through its connection (``finish()``/``requeue()`` queue FIN/REQ there, without awaiting),
    whose ``on_response`` hook tells the consumer's ``_Link``: it counts the answer and feeds it to the RDY
    controller as a success or a failure. So a FIN from a handler, from the auto response, or from application code
    much later all take the same path. A handler that returns FINs its message, one that raises REQs it with go-nsq's
    delay (``default_requeue_delay * attempts``, at most ``max_requeue_delay``) and a backoff signal; neither
    happens after ``message.disable_auto_response()``. A message delivered more than ``max_attempts`` times
    (0: no limit) is FIN'd without calling the handler, logged, and passed to ``on_give_up`` if given.

Flow control
    ``trionsq._rdy.ReadyController`` decides every RDY count (spread, rotation, backoff); this module only feeds it
    events and the clock, and writes the counts it returns. Its timers run in one task that sleeps until the
    controller's next deadline and is woken when an input moves that deadline earlier.

Discovery and reconnects
    Listed nsqd (``nsqd_tcp_addresses``) are connected before the ``async with`` block starts; a first attempt that
    fails is raised there (``fail_fast``, go-nsq's ``ConnectToNSQD``) or retried in the background. After a loss
    they are redialled forever, the delay doubling from 0.25 s up to ``lookupd_poll_interval`` (go-nsq waits that
    interval every time). nsqd found
    through lookupd are polled every ``lookupd_poll_interval`` (the first poll after a random part,
    ``lookupd_poll_jitter``, of it, so consumers restarted together spread out), querying every lookupd and taking
    the union: a new nsqd is joined, one that no lookupd lists any more is drained and closed (only when every
    lookupd answered, so one lookupd down does not drop the nsqd it alone knew). A discovered nsqd whose connection
    ends is not redialled blindly; lookupd is asked again at once, as go-nsq does.

Stopping
    ``stop()`` never cuts a handler short that it can wait for, so no message is both handled and requeued: a
    handler's side effect (a publish, an HTTP request) is never repeated because of a stop. It sends RDY 0 on every
    connection; from then on every message not yet handed to a handler, whether waiting in the channel or arriving
    late (nsqd sent it before it read RDY 0), is REQ'd at once without backoff or delay, so another consumer gets
    it now. The handlers already running finish and their FIN/REQ are sent; the idle workers end; messages whose
    answer the application gives itself (``disable_auto_response``) are waited for too. All that is bounded by
    ``stop_timeout``: a handler still running then is cancelled and whatever is still unanswered is REQ'd (logged).
    Then CLS on every connection, and each is closed once nsqd answers CLOSE_WAIT. Leaving the ``async with`` block
    normally calls ``stop()``; leaving it with an exception cancels everything at once (unanswered messages go back
    to the queue when nsqd's timeout expires, which is what at-least-once delivery promises).
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import trio

from protocol.names import is_valid_channel_name, is_valid_topic_name

from ._config import Config
from ._connection import Connection
from ._core import split_address
from ._errors import ConnectionClosed, NSQError
from ._lookupd import LookupdError, lookup, lookup_url
from ._message import Message
from ._rdy import ReadyController

__all__ = ["Consumer", "ConsumerStats"]

log = logging.getLogger("trionsq.consumer")

Handler = Callable[[Message], Awaitable[Any]]
GiveUpHook = Callable[[Message], Any]

RECONNECT_MIN_DELAY = 0.25
DRAIN_TIMEOUT = 30.0  # go-nsq gives its handlers 30 s at Stop
_BATCH = 128  # handlers a worker runs back to back before it checkpoints (lets the writer and the reader run)

_reschedule = trio.lowlevel.reschedule
_wait_task_rescheduled = trio.lowlevel.wait_task_rescheduled
_checkpoint = trio.lowlevel.checkpoint
_SUCCEEDED = trio.lowlevel.Abort.SUCCEEDED


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """What a `Consumer` did since it started, and its state now (`Consumer.stats`).

    Attributes:
        received: Messages delivered by nsqd.
        finished: Messages answered with FIN (by the handler's return, the application, or a give-up).
        requeued: Messages answered with REQ.
        given_up: Messages FIN'd without the handler because they passed ``max_attempts``.
        connections: Subscribed connections now.
        in_flight: Messages delivered and not answered yet.
        backoff_level: 0 when not backing off; each failure raises it, each success lowers it.
        total_rdy: The sum of the RDY counts of the connections now.
    """

    received: int
    finished: int
    requeued: int
    given_up: int  # FIN'd without the handler: attempts > max_attempts
    connections: int
    in_flight: int  # delivered and not answered yet
    backoff_level: int
    total_rdy: int


class _Link:
    """The consumer's side of one connection: what it delivered and has not seen answered."""

    __slots__ = ("consumer", "address", "conn", "unanswered", "closed", "drained", "closing", "_rdy")

    def __init__(self, consumer: Consumer, address: str) -> None:
        self.consumer = consumer
        self.address = address
        self.conn = Connection(
            address, consumer.config, on_message=self.on_message, on_response=self.on_response, on_close=self.on_close
        )
        self.unanswered: dict[bytes, Message] = {}
        self.closed = trio.Event()
        self.drained: trio.Event | None = None
        self.closing = False  # stopping or retired: RDY 0 sent, CLS to follow
        self._rdy = consumer._rdy

    # the connection's callbacks (sync, from its reader task or from whoever answered a message); the per-message
    # path, kept flat
    def on_message(self, message: Message) -> None:
        consumer = self.consumer
        consumer._received += 1
        self.unanswered[message.id] = message
        if consumer._stopping:  # sent by nsqd before it read RDY 0 (or CLS): no handler will take it
            message.requeue(0, backoff=False)
            return
        self._rdy.message_received(self.address, self.conn.last_message_time)
        consumer._queue.append(message)
        idle = consumer._idle
        if idle:  # a parked worker takes it (the busy ones come back to the queue by themselves)
            _reschedule(idle.pop())

    def on_response(self, message: Message, finished: bool, backoff: bool) -> None:
        unanswered = self.unanswered
        unanswered.pop(message.id, None)
        if not unanswered and self.drained is not None:
            self.drained.set()
        consumer = self.consumer
        if finished:
            consumer._finished += 1
            if self._rdy.backoff_level:  # a success only matters to the controller while backing off
                consumer._apply(self._rdy.succeeded(trio.current_time()))
        else:
            consumer._requeued += 1
            consumer._apply(self._rdy.failed(trio.current_time(), backoff=backoff))

    def on_close(self, conn: Connection) -> None:
        self.closed.set()

    async def drain(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) until every message delivered here is answered."""
        if self.unanswered:
            self.drained = trio.Event()
            with trio.move_on_after(timeout):
                await self.drained.wait()
        return not self.unanswered


class Consumer:
    """Read ``topic``/``channel`` from nsqd and run ``handler`` on each message.

    Use it as ``async with Consumer(...) as consumer:``. Entering the block connects to every listed nsqd (and
    SUBs) and takes nsqlookupd's first answer; leaving it normally calls `stop`, leaving it with an exception
    cancels everything at once (unanswered messages then come back when nsqd's timeout expires).

    Answers: a handler that returns FINs its message; one that raises REQs it after ``default_requeue_delay *
    attempts`` (at most ``max_requeue_delay``) and counts as a failure for backoff. After
    ``message.disable_auto_response()`` the application answers itself, at any time. A message delivered more
    than ``max_attempts`` times (0: no limit) is FIN'd without the handler, logged, and given to ``on_give_up``.

    Flow control as go-nsq's: ``max_in_flight`` is spread over the connections (never above nsqd's
    ``max_rdy_count``), rotated when there are more connections than ``max_in_flight``, and each failure raises a
    backoff level (RDY 0 everywhere for a while, then RDY 1 on one connection as a trial).

    Discovery: every lookupd is asked ``/lookup?topic=`` every ``lookupd_poll_interval``; a new nsqd is joined,
    and one that no lookupd lists any more is drained and closed. A listed nsqd that is lost is redialled with a
    delay doubling from 0.25 s up to ``lookupd_poll_interval``.

    Args:
        topic: The topic to read.
        channel: The channel to read (created by nsqd on SUB; ``#ephemeral`` names work as in NSQ).
        handler: An async function of a `Message`; ``concurrency`` copies of it run at once.
        config: Connection and consumer options (``max_in_flight``, ``max_attempts``, backoff, lookupd polling...);
            ``Config()`` when omitted.
        nsqd_tcp_addresses: nsqd to connect to directly (``host:port``, one string for one).
        lookupd_http_addresses: nsqlookupd HTTP addresses to find the topic's nsqd through.
        concurrency: How many handlers may run at once.
        on_give_up: Called (sync or async) with each message dropped for passing ``max_attempts``.
        stop_timeout: How long `stop` waits for running handlers and for answers the application gives itself.
        fail_fast: Entering the block raises the error of a listed nsqd whose first connection or SUB failed, as
            go-nsq's ``ConnectToNSQD`` does; when false, that nsqd is redialled in the background like a lost one.

    Raises:
        ValueError: An invalid topic or channel name, ``concurrency`` below 1, no address at all, or an address
            that cannot be used.
        ConnectError: On entering the block with ``fail_fast``: a listed nsqd could not be reached or its handshake
            failed.
        NSQError: On entering the block with ``fail_fast``: a listed nsqd refused IDENTIFY, AUTH or SUB.
        RuntimeError: The consumer was entered a second time (a ``Consumer`` runs once).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        handler: Handler,
        config: Config | None = None,
        *,
        nsqd_tcp_addresses: Iterable[str] | str = (),
        lookupd_http_addresses: Iterable[str] | str = (),
        concurrency: int = 1,
        on_give_up: GiveUpHook | None = None,
        stop_timeout: float = DRAIN_TIMEOUT,
        fail_fast: bool = True,
    ) -> None:
        if not is_valid_topic_name(topic):
            raise ValueError(f"invalid topic name {topic!r}")
        if not is_valid_channel_name(channel):
            raise ValueError(f"invalid channel name {channel!r}")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.topic = topic
        self.channel = channel
        self.handler = handler
        self.config = config if config is not None else Config()
        self.nsqd_tcp_addresses = _addresses(nsqd_tcp_addresses)
        self.lookupd_http_addresses = _addresses(lookupd_http_addresses)
        if not self.nsqd_tcp_addresses and not self.lookupd_http_addresses:
            raise ValueError("give at least one nsqd TCP address or nsqlookupd HTTP address")
        for address in self.nsqd_tcp_addresses:
            split_address(address)  # ValueError naming the address
        for address in self.lookupd_http_addresses:
            try:
                lookup_url(address, "/lookup", topic=topic)
            except LookupdError as exc:
                raise ValueError(str(exc)) from None
        self.concurrency = concurrency
        self.on_give_up = on_give_up
        self.stop_timeout = stop_timeout
        self.fail_fast = fail_fast

        self._rng = random.Random()
        self._rdy: ReadyController[str] = ReadyController(
            max_in_flight=self.config.max_in_flight,
            backoff_multiplier=self.config.backoff_multiplier,
            max_backoff_duration=self.config.max_backoff_duration,
            backoff_strategy=self.config.backoff_strategy,
            low_rdy_idle_timeout=self.config.low_rdy_idle_timeout,
            low_rdy_timeout=self.config.low_rdy_timeout,
            redistribute_interval=self.config.rdy_redistribute_interval,
            rng=self._rng,
        )
        self._links: dict[str, _Link] = {}  # subscribed connections
        self._tasks: dict[str, trio.CancelScope] = {}  # one per nsqd being connected or connected
        self._discovered: set[str] = set()
        self._queue: deque[Message] = deque()  # delivered, not yet taken by a worker
        self._idle: list[trio.lowlevel.Task] = []  # workers parked until the queue has something
        self._nursery_manager: Any = None
        self._nursery: trio.Nursery | None = None
        self._workers = trio.CancelScope()
        self._workers_done = trio.Event()
        self._worker_tasks: set[Any] = set()
        self._discovery = trio.CancelScope()
        self._recheck = trio.Event()
        self._rdy_wakeup = trio.Event()
        self._rdy_armed = math.inf
        self._stopping = False
        self._closed = trio.Event()
        self._received = self._finished = self._requeued = self._given_up = 0

    # --- lifecycle --------------------------------------------------------------------------------------------------
    async def __aenter__(self) -> Consumer:
        if self._nursery_manager is not None:
            raise RuntimeError("a Consumer runs once")
        self._nursery_manager = trio.open_nursery()
        self._nursery = nursery = await self._nursery_manager.__aenter__()
        failures: list[BaseException] = []
        try:
            nursery.start_soon(self._run_workers)
            nursery.start_soon(self._rdy_loop)
            # the first round of connects (and lookupd's first answer) happens before the block starts, as go-nsq's
            # ConnectToNSQD and ConnectToNSQLookupd do it before returning
            async with trio.open_nursery() as first:
                for address in self.nsqd_tcp_addresses:
                    first.start_soon(self._start_nsqd, address, failures)
            if not (failures and self.fail_fast) and self.lookupd_http_addresses:
                await self._query_lookupds()
                nursery.start_soon(self._discovery_loop)
        except BaseException as exc:
            self._stopping = True
            nursery.cancel_scope.cancel()
            if not await self._nursery_manager.__aexit__(type(exc), exc, exc.__traceback__):
                raise
        if failures and self.fail_fast:
            self._stopping = True
            nursery.cancel_scope.cancel()
            await self._nursery_manager.__aexit__(None, None, None)
            raise failures[0]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        assert self._nursery is not None
        if exc_type is None:
            await self.stop()
        self._stopping = True
        self._nursery.cancel_scope.cancel()
        self._closed.set()
        suppressed: bool = await self._nursery_manager.__aexit__(exc_type, exc, tb)
        return suppressed

    async def wait_closed(self) -> None:
        """Return once the consumer has stopped."""
        await self._closed.wait()

    async def stop(self) -> None:
        """Stop cleanly, so that no message is both handled and requeued.

        RDY 0 on every connection; every message no handler has taken yet (waiting, or arriving late because nsqd
        sent it before it read RDY 0) is REQ'd at once without backoff or delay; the running handlers finish and
        their FIN or REQ is sent, and answers the application gives itself are waited for, all within
        ``stop_timeout``, after which a handler still running is cancelled and what is left is REQ'd (logged). Then
        CLS and close on every connection.

        Called from a handler, it starts the stop and returns at once (waiting there would wait for that handler
        itself). A second call waits for the first.
        """
        if self._stopping:
            if trio.lowlevel.current_task() not in self._worker_tasks:
                await self._closed.wait()
            return
        if trio.lowlevel.current_task() in self._worker_tasks:
            assert self._nursery is not None
            self._nursery.start_soon(self.stop)
            return
        self._stopping = True  # from here on _Link.on_message puts every new message back at once
        log.info("[%s/%s] stopping", self.topic, self.channel)
        deadline = trio.current_time() + self.stop_timeout
        self._discovery.cancel()
        for address, scope in list(self._tasks.items()):
            if address not in self._links:  # still dialling or waiting to redial
                scope.cancel()
        links = list(self._links.values())
        for link in links:
            link.closing = True
        self._apply(self._rdy.stop(trio.current_time()))
        put_back = 0
        queue = self._queue
        while queue:  # delivered, but no handler has it: back to nsqd now, not after the handlers
            message = queue.popleft()
            if not message.has_responded:
                message.requeue(0, backoff=False)
                put_back += 1
        if put_back:
            log.info("[%s/%s] %d messages not yet handled requeued", self.topic, self.channel, put_back)
        while self._idle:  # the idle workers end; the busy ones end after their handler (the queue stays empty)
            _reschedule(self._idle.pop())
        with trio.move_on_at(deadline):
            await self._workers_done.wait()
        with trio.move_on_at(deadline):  # answers the application gives itself, later
            async with trio.open_nursery() as nursery:
                for link in links:
                    nursery.start_soon(link.drain, math.inf)
        self._workers.cancel()  # only handlers that outlived stop_timeout are still there
        for link in links:
            left = list(link.unanswered.values())
            if left:
                log.warning(
                    "(%s) %d messages unanswered after %.1fs: requeued", link.address, len(left), self.stop_timeout
                )
            for message in left:
                message.requeue(0, backoff=False)
        async with trio.open_nursery() as nursery:
            for link in links:
                nursery.start_soon(self._close_link, link)
        for scope in self._tasks.values():
            scope.cancel()
        self._closed.set()
        log.info("[%s/%s] stopped", self.topic, self.channel)

    def stats(self) -> ConsumerStats:
        """Counts of messages received and answered so far, and the connections, RDY and backoff now."""
        rdy = self._rdy.stats()
        return ConsumerStats(
            received=self._received,
            finished=self._finished,
            requeued=self._requeued,
            given_up=self._given_up,
            connections=len(self._links),
            in_flight=sum(len(link.unanswered) for link in self._links.values()),
            backoff_level=rdy.backoff_level,
            total_rdy=rdy.total_rdy,
        )

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change ``max_in_flight`` while running; 0 pauses delivery (RDY 0 everywhere) until it is raised again.

        Args:
            max_in_flight: The new bound on messages delivered and not yet answered, over all connections.
        """
        self._apply(self._rdy.set_max_in_flight(max_in_flight, trio.current_time()))

    def is_starved(self) -> bool:
        """go-nsq's ``IsStarved``: some connection that is not closing has messages in flight (delivered, not
        answered) and at least 85% of its last RDY count in flight. A consumer that batches its answers (as
        nsq_to_file does) should answer now: nsqd will send nothing more on that connection until it does."""
        for link in self._links.values():
            in_flight = len(link.unanswered)
            if in_flight and not link.closing and in_flight >= int(link.conn.rdy * 0.85):
                return True
        return False

    # --- RDY ---------------------------------------------------------------------------------------------------------
    def _apply(self, updates: list[tuple[str, int]]) -> None:
        """Write the RDY counts the controller chose, and wake its timer task if its deadline moved earlier."""
        for address, count in updates:
            link = self._links.get(address)
            if link is not None:
                log.debug("(%s) RDY %d", address, count)
                with contextlib.suppress(ConnectionClosed):  # its task is about to remove it
                    link.conn.ready(count)
        if self._rdy.next_deadline() < self._rdy_armed:
            self._rdy_wakeup.set()

    # --- tasks ------------------------------------------------------------------------------------------------------
    async def _rdy_loop(self) -> None:
        while True:
            self._rdy_armed = self._rdy.next_deadline()
            self._rdy_wakeup = trio.Event()
            with trio.move_on_at(self._rdy_armed):
                await self._rdy_wakeup.wait()
            self._rdy_armed = math.inf
            updates = self._rdy.tick(trio.current_time())
            if updates:
                log.debug("RDY timers: %s", updates)
            self._apply(updates)

    async def _run_workers(self) -> None:
        with self._workers:
            async with trio.open_nursery() as nursery:
                for _ in range(self.concurrency):
                    nursery.start_soon(self._worker)
        self._workers_done.set()

    async def _worker(self) -> None:
        """Run handlers on queued messages, back to back, until ``stop()`` (see "Cost per message")."""
        task = trio.lowlevel.current_task()
        self._worker_tasks.add(task)
        queue = self._queue
        idle = self._idle
        handler = self.handler
        max_attempts = self.config.max_attempts

        def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
            if task in idle:
                idle.remove(task)
            return _SUCCEEDED

        while True:
            if not queue:
                if self._stopping:  # stop() emptied the queue and nothing is added any more
                    return
                idle.append(task)
                await _wait_task_rescheduled(abort)
                continue
            for _ in range(_BATCH):
                if not queue:
                    break
                message = queue.popleft()
                if message._responded:  # answered while it waited here
                    continue
                if max_attempts and message.attempts > max_attempts:
                    await self._give_up(message)
                    continue
                try:
                    await handler(message)
                except Exception as exc:
                    log.error(
                        "handler failed (%s: %s) for message %s (attempt %d)",
                        type(exc).__name__,
                        exc,
                        message.id.decode(),
                        message.attempts,
                        exc_info=log.isEnabledFor(logging.DEBUG),
                    )
                    if not message._auto_response_disabled:
                        message.requeue()
                else:
                    if not message._auto_response_disabled:
                        message.finish()
            else:
                await _checkpoint()  # a full batch and more waiting: let the writer, the reader and others run

    async def _give_up(self, message: Message) -> None:
        log.warning("message %s attempted %d times, giving up", message.id.decode(), message.attempts)
        self._given_up += 1
        if self.on_give_up is not None:
            try:
                result = self.on_give_up(message)
                if hasattr(result, "__await__"):
                    await result
            except Exception as exc:
                log.error("on_give_up failed for message %s: %s: %s", message.id.decode(), type(exc).__name__, exc)
        message.finish()

    async def _start_nsqd(self, address: str, failures: list[BaseException] | None = None) -> None:
        """Start the task of ``address`` and return after its first attempt (its error, if any, in ``failures``)."""
        assert self._nursery is not None
        if address not in self._tasks and not self._stopping:
            error = await self._nursery.start(self._run_nsqd, address)
            if error is not None and failures is not None:
                failures.append(error)

    async def _run_nsqd(
        self, address: str, *, task_status: trio.TaskStatus[BaseException | None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Connect, SUB, serve until the connection ends; listed addresses are redialled, discovered ones are left
        to the next lookupd answer. ``started`` after the first attempt, with its error or None."""
        scope = self._tasks[address] = trio.CancelScope()
        started = _Once(task_status.started)
        attempt = 0
        try:
            with scope:
                while not self._stopping:
                    if await self._session(address, started):
                        attempt = 0
                    if self._stopping:
                        return
                    if address not in self.nsqd_tcp_addresses:
                        if address in self._discovered:  # lost, not retired: is it still there? (as go-nsq asks)
                            self._recheck.set()
                        return
                    delay = min(
                        RECONNECT_MIN_DELAY * 2**attempt, max(self.config.lookupd_poll_interval, RECONNECT_MIN_DELAY)
                    )
                    attempt += 1
                    log.info("(%s) re-connecting in %.2fs", address, delay)
                    await trio.sleep(delay)
        finally:
            started(None)
            if self._tasks.get(address) is scope:
                del self._tasks[address]

    async def _session(self, address: str, started: Callable[[BaseException | None], None]) -> bool:
        """One connection's life: False if it never got subscribed."""
        link = _Link(self, address)
        conn = link.conn
        log.info("(%s) connecting to nsqd", address)
        async with trio.open_nursery() as nursery:  # the connection's reader and writer live here
            try:
                await nursery.start(conn.run)
                await conn.subscribe(self.topic, self.channel)
            except (ConnectionClosed, NSQError) as exc:
                log.error("(%s) error connecting to nsqd - %s", address, exc)
                started(exc)
                await conn.close()
                return False
            assert conn.features is not None
            max_rdy = conn.features.max_rdy_count
            if max_rdy < self.config.max_in_flight:
                log.warning(
                    "(%s) max RDY count %d < consumer max in flight %d, truncation possible",
                    address,
                    max_rdy,
                    self.config.max_in_flight,
                )
            self._links[address] = link
            log.info("(%s) subscribed to %s/%s", address, self.topic, self.channel)
            self._apply(self._rdy.add(address, max_rdy, trio.current_time()))
            started(None)
            try:
                await link.closed.wait()
            finally:
                if self._links.get(address) is link:
                    del self._links[address]
                if address in self._rdy:
                    self._apply(self._rdy.remove(address, trio.current_time()))
                if not self._stopping:
                    log.warning(
                        "(%s) connection closed (%s); %d connections left", address, conn.close_reason, len(self._links)
                    )
                with trio.CancelScope(shield=True):
                    await conn.close()
        return True

    async def _close_link(self, link: _Link) -> None:
        """CLS, wait for CLOSE_WAIT (bounded by ``Connection.close``), close."""
        await link.conn.close()
        link.closed.set()

    async def _retire(self, link: _Link) -> None:
        """An nsqd no lookupd lists any more: no new messages, answer those delivered, then close."""
        log.info("(%s) no longer listed by nsqlookupd: closing", link.address)
        link.closing = True
        if link.address in self._rdy:
            self._apply(self._rdy.remove(link.address, trio.current_time()))
        with contextlib.suppress(ConnectionClosed):
            link.conn.ready(0)
        await link.drain(self.stop_timeout)
        await self._close_link(link)

    # --- lookupd ----------------------------------------------------------------------------------------------------
    async def _discovery_loop(self) -> None:
        interval = self.config.lookupd_poll_interval
        deadline = trio.current_time() + self._rng.random() * self.config.lookupd_poll_jitter * interval
        with self._discovery:
            while True:
                with trio.move_on_at(deadline):
                    await self._recheck.wait()
                self._recheck = trio.Event()
                if trio.current_time() >= deadline:
                    deadline = trio.current_time() + interval
                await self._query_lookupds()

    async def _query_lookupds(self) -> None:
        answers: dict[str, list[str]] = {}
        timeout = self.config.lookupd_poll_timeout
        secret = self.config.auth_secret if self.config.skip_lookupd_authorization else None

        async def query(lookupd: str) -> None:
            log.info("querying nsqlookupd %s", lookupd)
            try:
                answers[lookupd] = await lookup(lookupd, self.topic, timeout=timeout, authorization=secret)
            except LookupdError as exc:
                log.error("error querying nsqlookupd (%s) - %s", lookupd, exc)

        async with trio.open_nursery() as nursery:
            for lookupd in self.lookupd_http_addresses:
                nursery.start_soon(query, lookupd)
        if self._stopping:
            return
        found = {address for addresses in answers.values() for address in addresses}
        if len(answers) == len(self.lookupd_http_addresses):
            for address in self._discovered - found:
                link = self._links.get(address)
                if address in self.nsqd_tcp_addresses:
                    continue
                if link is not None:
                    assert self._nursery is not None
                    self._nursery.start_soon(self._retire, link)
                elif address in self._tasks:
                    self._tasks[address].cancel()
            self._discovered = found
        else:
            self._discovered |= found
        async with trio.open_nursery() as nursery:
            for address in sorted(found):
                if address not in self._tasks:
                    nursery.start_soon(self._start_nsqd, address)


def _addresses(value: Iterable[str] | str) -> list[str]:
    items = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        item = item.strip()
        if not item:
            raise ValueError("empty address")
        if item not in out:
            out.append(item)
    return out


class _Once:
    """Call ``fn`` the first time only (a task's ``started`` may be reached on several paths)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn: Callable[[Any], Any] | None = fn

    def __call__(self, value: Any) -> None:
        fn, self.fn = self.fn, None
        if fn is not None:
            fn(value)
