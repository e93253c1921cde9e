"""nsq_tail: print the messages of one or more topics as they arrive, one per line.

As NSQ 1.3.0's tool does, every ``-topic`` gets a consumer of its own (``trionsq.Consumer``) on the same
channel, ``tail<6 random digits>#ephemeral`` unless ``-channel`` names one; each message is written to stdout
as its body and a newline, after ``<topic> | `` with ``-print-topic``; log lines (the tool's and the client's)
go to stderr.

``-n N`` counts per topic, like upstream, whose handler per consumer ends the process once *its* count reaches N:
the tool exits 0 as soon as one topic has shown N messages, and each consumer's max-in-flight is lowered to N
when N is smaller, so nsqd does not push much more than will be shown. Where upstream calls ``os.Exit`` inside
the handler (the N-th message is never finished), this one finishes the N-th message, puts back any message
that arrives after it (REQ without delay, not shown) and stops the consumers cleanly. SIGINT and SIGTERM stop
them the same way, exit code 0.
"""

from __future__ import annotations

import logging
import random
import sys
from typing import Any

from nsq_tools._cli import ToolFlags, consumer_config, fatal, run, setup_logging, write_stdout

__all__ = ["main", "default_channel"]

log = logging.getLogger("nsq_tail")


def build_flags() -> ToolFlags:
    flags = ToolFlags("nsq_tail")
    flags.add_version()
    flags.add_consumer()
    flags.add("n", "int", 0, "exit once a topic has shown this many messages (0: never)", in_config=False)
    flags.add("print-topic", "bool", False, "write each message as '<topic> | <body>'", in_config=False)
    return flags


def default_channel() -> str:
    """Upstream's name for a channel of its own, gone when the tool disconnects."""
    return f"tail{random.randrange(999999):06d}#ephemeral"


def check(values: dict[str, Any]) -> None:
    """Upstream's start-up checks, in its order."""
    from protocol.names import is_valid_channel_name, is_valid_topic_name

    nsqds, lookupds = values["nsqd_tcp_address"], values["lookupd_http_address"]
    if not nsqds and not lookupds:
        fatal("--nsqd-tcp-address or --lookupd-http-address required")
    if nsqds and lookupds:
        fatal("use --nsqd-tcp-address or --lookupd-http-address not both")
    if not values["topic"]:
        fatal("--topic required")
    # go-nsq's NewConsumer refuses bad names before connecting
    for topic in values["topic"]:
        if not is_valid_topic_name(topic):
            fatal("invalid topic name")
    if not is_valid_channel_name(values["channel"]):
        fatal("invalid channel name")


class _TailHandler:
    """One topic's handler: prints until the topic's count reaches ``-n``, then signals ``done``."""

    def __init__(self, topic: str, total: int, print_topic: bool, done) -> None:
        self.prefix = topic.encode() + b" | " if print_topic else b""
        self.total = total
        self.shown = 0
        self.done = done

    async def __call__(self, message) -> None:
        if self.total and self.shown >= self.total:
            message.requeue(0, backoff=False)  # not shown: leave it to the channel's other consumers
            return
        self.shown += 1
        write_stdout(self.prefix + message.body + b"\n")
        if self.total and self.shown >= self.total:
            self.done.set()


async def _consume(consumer, quit, task_status) -> None:
    async with consumer:
        task_status.started()
        await quit.wait()
    # leaving the block stops the consumer: RDY 0, in-flight handlers answered, CLS


async def _main(stop, values: dict[str, Any]) -> int:
    import trio

    from protocol.version import NSQ_VERSION
    from trionsq import ConnectError, Consumer, NSQError, __version__

    total = values["n"]
    max_in_flight = values["max_in_flight"]
    if 0 < total < max_in_flight:
        max_in_flight = total
    config = consumer_config(
        dict(values, max_in_flight=max_in_flight), user_agent=f"nsq_tail/{NSQ_VERSION} trionsq/{__version__}"
    )
    quit = trio.Event()
    async with trio.open_nursery() as nursery:

        async def quit_on_stop(task_status) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                await stop.wait()
                quit.set()

        watcher = await nursery.start(quit_on_stop)
        for topic in values["topic"]:
            log.info("Adding consumer for topic: %s", topic)
            consumer = Consumer(
                topic,
                values["channel"],
                _TailHandler(topic, total, values["print_topic"], quit),
                config=config,
                nsqd_tcp_addresses=values["nsqd_tcp_address"],
                lookupd_http_addresses=values["lookupd_http_address"],
            )
            try:
                await nursery.start(_consume, consumer, quit)
            except (ConnectError, NSQError, OSError) as exc:
                fatal(str(exc))
            # go-nsq's ConnectToNSQDs fails when a listed nsqd cannot be reached, and upstream ends there (the
            # client logged the reason just above); nsqd found through lookupd may come and go
            wanted = len(set(values["nsqd_tcp_address"]))
            if consumer.stats().connections < wanted:
                fatal(
                    f"failed to connect to {wanted - consumer.stats().connections} of the "
                    f"{wanted} --nsqd-tcp-address for topic {topic}"
                )
        await quit.wait()
        watcher.cancel()
        # the nursery now waits for every consumer to stop cleanly
    return 0


def main(argv: list[str] | None = None) -> int:
    values = build_flags().parse_or_exit(argv)
    if not values["channel"]:
        values["channel"] = default_channel()
    check(values)
    setup_logging()
    return run(_main, values)


if __name__ == "__main__":
    sys.exit(main())
