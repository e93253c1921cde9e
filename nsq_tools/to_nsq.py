"""to_nsq: stdin, cut at a one-byte delimiter, published to a topic on every given nsqd.

As in NSQ 1.3.0, every piece goes to *each* ``-nsqd-tcp-address`` (one producer per address, no fail-over: the
tool copies a stream into several nsqd, it does not balance it), empty pieces are skipped, ``-rate N`` throttles
to N messages a second (a token bucket that starts with one token and holds at most N, upstream's ticker) and
``-producer-opt name,value`` is passed to the producer's Config. At EOF the tool waits for every publish to be
answered, closes its connections and exits 0. The first error (an nsqd that cannot be reached, an error frame
such as E_BAD_TOPIC) ends it as ``log.Fatal`` does: the error on one line, exit code 1.

One difference from upstream, on purpose: a last piece not followed by the delimiter is published whole.
Upstream trims one byte from it as if it ended with the delimiter (so ``printf 'a\\nbc'`` published ``a`` and
``b``); here it publishes ``a`` and ``bc``.

Speed: upstream waits for each PUB's answer before reading on. Here the PUBs are pipelined: each address has
up to ``WINDOW`` publishes waiting for their answers, the reader stops when a window is full (so memory stays
bounded and a slow nsqd slows the reader rather than queueing without end). The order of the messages on each
connection is the order of stdin (see ``_Pipeline``). stdin is read in large blocks by a worker thread
(abandoned when a signal stops the tool).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from nsq_tools._cli import ToolFlags, fatal, producer_config, run, setup_logging

__all__ = ["WINDOW", "main", "split_pieces"]

#: publishes in flight per nsqd address
WINDOW = 512
_READ_SIZE = 1 << 20

log = logging.getLogger("to_nsq")


def build_flags() -> ToolFlags:
    flags = ToolFlags("to_nsq")
    flags.add("topic", "str", "", "the topic to publish to", in_config=False)
    flags.add("delimiter", "str", "\n", "the one byte that ends each message read from stdin", in_config=False)
    flags.add(
        "nsqd-tcp-address",
        "str_list",
        [],
        "an nsqd TCP address to publish to; each gets every message (repeatable)",
        in_config=False,
    )
    flags.add_producer_opt()
    flags.add("rate", "int", 0, "at most this many messages a second (0: no limit)", in_config=False)
    return flags


def check(values: dict[str, Any]) -> bytes:
    """Upstream's start-up checks; returns the delimiter as its one byte."""
    if not values["topic"]:
        fatal("--topic required")
    delimiter = os.fsencode(values["delimiter"])
    if len(delimiter) != 1:
        fatal("--delimiter must be a single byte")
    if not values["nsqd_tcp_address"]:
        fatal("--nsqd-tcp-address required")
    return delimiter


def split_pieces(buffer: bytearray, delimiter: bytes) -> list[bytes]:
    """Take every complete piece out of ``buffer`` (what follows the last delimiter stays); empty ones are
    dropped, as upstream drops them."""
    end = buffer.rfind(delimiter)
    if end < 0:
        return []
    pieces = [piece for piece in bytes(buffer[:end]).split(delimiter) if piece]
    del buffer[: end + 1]
    return pieces


class _Throttle:
    """Upstream's throttle: one token to start with, one more every 1/rate seconds, at most ``rate`` saved."""

    def __init__(self, rate: int) -> None:
        import trio

        self._trio = trio
        self.rate = rate
        self.tokens = 1.0
        self.stamp = trio.current_time()

    async def take(self) -> None:
        now = self._trio.current_time()
        self.tokens = min(float(self.rate), self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            await self._trio.sleep((1.0 - self.tokens) / self.rate)
            self.tokens, self.stamp = 1.0, self._trio.current_time()
        self.tokens -= 1.0


class _Pipeline:
    """One nsqd's producer with at most ``WINDOW`` publishes awaiting their answers, made in stdin's order.

    Each publish is a task (it waits for its own answer), numbered as it is started. The client queues a
    command when ``publish`` is called, so the tasks must call it in number order; trio runs the tasks made ready
    together in an order of its choosing, so a task whose turn has not come parks, and every publish wakes the
    parked ones to look again. Tasks are started without a checkpoint between them while the window has room,
    so many commands are queued before the connection's writer runs: one write carries many PUBs.
    """

    def __init__(self, producer, topic: str) -> None:
        import trio

        self._trio = trio
        self.producer = producer
        self.topic = topic
        self.window = trio.Semaphore(WINDOW)
        self.started = 0  # numbers given to publish tasks
        self.turn = 0  # the number whose publish is to be called next
        self.waiting = trio.lowlevel.ParkingLot()
        self.connected = False

    async def send(self, nursery, body: bytes) -> None:
        if not self.connected:
            # the producer dials on its first publish, and publishes made while it dials would resume in any
            # order: the first one goes alone
            self.started += 1
            self.window.acquire_nowait()
            await self._publish(0, body)
            self.connected = True
            return
        try:
            self.window.acquire_nowait()  # no checkpoint: the next tasks start in the same scheduling round
        except self._trio.WouldBlock:
            await self.window.acquire()
        nursery.start_soon(self._publish, self.started, body)
        self.started += 1

    async def _publish(self, number: int, body: bytes) -> None:
        from trionsq import ConnectError, ConnectionClosed, NoAvailableNsqd, NSQError

        while self.turn != number:
            await self.waiting.park()
        self.turn += 1
        self.waiting.unpark_all()
        try:
            await self.producer.publish(self.topic, body)  # queued before this task's first checkpoint
        except NoAvailableNsqd as exc:
            # one address per producer: its one error says it all
            fatal(str(next(iter(exc.errors.values()), exc)))
        except (NSQError, ConnectError, ConnectionClosed, OSError) as exc:
            fatal(str(exc))
        finally:
            self.window.release()


async def _read_or_stop(stdin: int, stop) -> bytes | None:
    """The next block of stdin (b"" at EOF), or None once ``stop`` is set (the read is abandoned)."""
    import trio

    block = None
    async with trio.open_nursery() as nursery:

        async def read() -> None:
            nonlocal block
            # abandoned on cancel: a read blocked on a quiet pipe must not hold up a signal's stop
            block = await trio.to_thread.run_sync(os.read, stdin, _READ_SIZE, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

        async def wait_stop() -> None:
            await stop.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(read)
        nursery.start_soon(wait_stop)
    return block


async def _read_and_publish(stdin: int, delimiter: bytes, pipelines: list[_Pipeline], rate: int, stop) -> None:
    import trio

    throttle = _Throttle(rate) if rate >= 1 else None
    buffer = bytearray()
    async with trio.open_nursery() as publishes:
        at_eof = False
        while not at_eof and not stop.is_set():
            block = await _read_or_stop(stdin, stop)
            if block is None:
                break
            if block:
                buffer += block
                pieces = split_pieces(buffer, delimiter)
            else:
                at_eof = True
                pieces = [bytes(buffer)] if buffer else []
            for piece in pieces:
                if stop.is_set():
                    break
                if throttle is not None:
                    await throttle.take()
                for pipeline in pipelines:
                    await pipeline.send(publishes, piece)
        # leaving the nursery waits for every answer: nothing started is lost, at EOF or on a signal


async def _main(stop, values: dict[str, Any], delimiter: bytes) -> int:
    import trio

    from protocol.version import NSQ_VERSION
    from trionsq import Producer, __version__

    config = producer_config(values, user_agent=f"to_nsq/{NSQ_VERSION} trionsq/{__version__}")
    addresses = list(dict.fromkeys(values["nsqd_tcp_address"]))
    if values["rate"] >= 1:
        log.info("Throttling messages rate to max:%d/second", values["rate"])
    async with trio.open_nursery() as nursery:
        producers = [Producer([address], config=config) for address in addresses]
        for producer in producers:
            await nursery.start(_hold, producer)
        pipelines = [_Pipeline(producer, values["topic"]) for producer in producers]
        await _read_and_publish(sys.stdin.fileno(), delimiter, pipelines, values["rate"], stop)
        nursery.cancel_scope.cancel()
    return 0


async def _hold(producer, task_status) -> None:
    """Keep ``producer`` open (its connection opens on the first publish) until the tool's nursery ends."""
    import trio

    async with producer:
        task_status.started()
        await trio.sleep_forever()


def main(argv: list[str] | None = None) -> int:
    values = build_flags().parse_or_exit(argv)
    delimiter = check(values)
    setup_logging()
    return run(_main, values, delimiter)


if __name__ == "__main__":
    sys.exit(main())
