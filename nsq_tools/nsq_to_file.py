"""nsq_to_file: write the messages of one or more topics to local files, NSQ 1.3.0's tool with its flags.

    nsq_to_file --topic=events --nsqd-tcp-address=127.0.0.1:4150 --output-dir=/var/log/nsq

Shape (NSQ's ``TopicDiscoverer`` and ``FileLogger``). One consumer per topic, on channel ``--channel``
(``nsq_to_file``), each with its own files and its own router task. The topics are the ``--topic`` list, or, without
one, every topic the ``--lookupd-http-address`` list knows that ``--topic-pattern`` matches (an unanchored regular
expression), asked again every ``--topic-refresh``; the first query comes one refresh after the start, as in NSQ.
A topic whose file name cannot be built is logged as an error and skipped (asked again at the next refresh).

The router (``TopicLogger._route``) is the only writer of its topic's files. The consumer's handler only disables
the automatic answer and passes the message on through a memory channel; the router takes whatever has arrived in
one go, writes it in a worker thread (file I/O blocks), and FINs, on the event loop, what the last fsync covered
(``_file_logger.TopicWriter`` decides when: each ``--sync-interval``, at ``--max-in-flight`` pending, after a
rotation, and whenever ``Consumer.is_starved()``, go-nsq's ``IsStarved``: a connection has 85% of its RDY in
flight, so nsqd sends nothing more until some are answered). A message is never FIN'd before it is on disk.

Signals. SIGINT or SIGTERM: each router syncs and FINs what it holds, asks its consumer to stop (RDY 0; what the
handler already passed on is written, synced and FIN'd at once; messages it had not taken yet, and late ones nsqd
sent before reading RDY 0, go back to nsqd at once without being written), and once the consumer has closed,
closes its file (moving it out of ``--work-dir``); the tool exits 0. So a message is either in a file and FIN'd or
back in nsqd, never both; messages never written are not FIN'd, and nsqd delivers them again to the next run.
SIGHUP syncs and closes every file; the next message opens a new one (for external log rotation).

Log lines are NSQ's: ``[nsq_to_file] 2026/11/27 12:00:00.123456 INFO: [topic/channel] opening ...`` at
``--log-level``; the client's own lines (connections) are Go's plain log lines, as go-nsq prints them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import sys
from typing import Any

from nsq_tools._cli import ToolFlags, consumer_config, fatal, run, setup_logging
from nsq_tools._file_logger import (
    DEFAULT_DATETIME_FORMAT,
    DEFAULT_FILENAME_FORMAT,
    FileError,
    FileLogger,
    FileOptions,
    TopicWriter,
    compute_filename_format,
)

PROGRAM = "nsq_to_file"
LOG_LEVELS = ("debug", "info", "warn", "error", "fatal")

log = logging.getLogger("nsq_to_file")


def flag_set() -> ToolFlags:
    flags = ToolFlags(PROGRAM)
    flags.add_version()
    flags.add("log-level", "str", "info", "log verbosity: debug, info, warn, error or fatal", in_config=False)
    flags.add("log-prefix", "str", "[nsq_to_file] ", "prefix of every log line", in_config=False)
    flags.add_consumer(channel="nsq_to_file")
    flags.add("output-dir", "str", "/tmp", "directory the finished files are written to", in_config=False)
    flags.add(
        "work-dir",
        "str",
        "",
        "directory for the files being written, moved to -output-dir when closed (-output-dir when empty)",
        in_config=False,
    )
    flags.add(
        "datetime-format",
        "str",
        DEFAULT_DATETIME_FORMAT,
        "strftime format of <DATETIME> in the file name",
        in_config=False,
    )
    flags.add(
        "filename-format",
        "str",
        DEFAULT_FILENAME_FORMAT,
        "file name format; <TOPIC>, <HOST>, <PID>, "
        "<DATETIME> and <REV> are replaced (<REV> grows when a file of that name already exists)",
        in_config=False,
    )
    flags.add(
        "host-identifier",
        "str",
        "",
        "<HOST> in file names instead of the short hostname (<SHORT_HOST> and <HOSTNAME> are replaced in it)",
        in_config=False,
    )
    flags.add("gzip-level", "int", 6, "gzip compression level, 1 (fastest) to 9 (smallest)", in_config=False)
    flags.add("gzip", "bool", False, "gzip the files", in_config=False)
    flags.add("skip-empty-files", "bool", False, "do not create files no message was written to", in_config=False)
    flags.add(
        "topic-refresh", "duration", 60.0, "how often the topic list is asked again from lookupd", in_config=False
    )
    flags.add("topic-pattern", "str", "", "log only the topics this regular expression matches", in_config=False)
    flags.add("rotate-size", "int", 0, "rotate a file once it grows past `rotate-size` bytes", in_config=False)
    flags.add("rotate-interval", "duration", 0.0, "rotate a file once it is this old", in_config=False)
    flags.add(
        "sync-interval",
        "duration",
        30.0,
        "how often the files are synced to disk (and their messages FIN'd)",
        in_config=False,
    )
    flags.add_http_client_timeouts()
    return flags


def check(flags: ToolFlags, values: dict[str, Any]) -> None:
    """NSQ 1.3.0's start-up checks, in its order, each a fatal line and exit code 1."""
    if flags.args:
        fatal(f"unknown arguments: [{' '.join(flags.args)}]")
    if values["log_level"].lower() not in LOG_LEVELS:
        fatal("--log-level is invalid")
    if not values["channel"]:
        fatal("--channel is required")
    if values["http_client_connect_timeout"] <= 0:
        fatal("--http-client-connect-timeout should be positive")
    if values["http_client_request_timeout"] <= 0:
        fatal("--http-client-request-timeout should be positive")
    if not values["nsqd_tcp_address"] and not values["lookupd_http_address"]:
        fatal("--nsqd-tcp-address or --lookupd-http-address required.")
    if values["nsqd_tcp_address"] and values["lookupd_http_address"]:
        fatal("use --nsqd-tcp-address or --lookupd-http-address not both")
    if not 1 <= values["gzip_level"] <= 9:
        fatal(f"invalid --gzip-level value ({values['gzip_level']}), should be 1-9")
    if not values["topic"] and not values["topic_pattern"]:
        fatal("--topic or --topic-pattern required")
    if not values["topic"] and not values["lookupd_http_address"]:
        fatal("--lookupd-http-address must be specified when no --topic specified")
    # NSQ's ticker panics on a non-positive interval; a clear line instead
    if values["sync_interval"] <= 0:
        fatal("--sync-interval should be positive")
    if not values["work_dir"]:
        values["work_dir"] = values["output_dir"]


def file_options(values: dict[str, Any]) -> FileOptions:
    return FileOptions(
        output_dir=values["output_dir"],
        work_dir=values["work_dir"],
        datetime_format=values["datetime_format"],
        filename_format=values["filename_format"],
        host_identifier=values["host_identifier"],
        gzip=values["gzip"],
        gzip_level=values["gzip_level"],
        skip_empty_files=values["skip_empty_files"],
        rotate_size=values["rotate_size"],
        rotate_interval=values["rotate_interval"],
        max_in_flight=values["max_in_flight"],
        channel=values["channel"],
    )


def _log(level: int, text: str) -> None:
    log.log(level, text)


# --- one topic -------------------------------------------------------------------------------------------------------


class _Control:
    """A request to the router, sent through the messages' channel so that it keeps its place among them."""

    def __init__(self, name: str) -> None:
        self.name = name


_STOP, _HUP, _STOPPED = _Control("stop"), _Control("hup"), _Control("stopped")


class TopicLogger:
    """One topic: its consumer and the router that owns its files (see the module notes)."""

    def __init__(self, topic: str, values: dict[str, Any], config: Any, writer: TopicWriter) -> None:
        import trio

        self.topic = topic
        self.values = values
        self.config = config
        self.writer = writer
        self._send, self._receive = trio.open_memory_channel[Any](math.inf)

    def stop(self) -> None:
        self._control(_STOP)

    def hup(self) -> None:
        self._control(_HUP)

    def _control(self, control: _Control) -> None:
        import trio

        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):  # the router has ended
            self._send.send_nowait(control)

    async def _handle(self, message: Any) -> None:
        import trio

        message.disable_auto_response()
        try:
            self._send.send_nowait(message)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            message.requeue(0, backoff=False)  # the files are closed: let the next run have it

    async def run(self) -> bool:
        """Consume and write until stopped; False when the consumer could not start (NSQ logs it and skips the
        topic, asking again at the next refresh)."""
        import trio

        from trionsq import Consumer

        values = self.values
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    consumer = Consumer(
                        self.topic,
                        values["channel"],
                        self._handle,
                        self.config,
                        nsqd_tcp_addresses=values["nsqd_tcp_address"],
                        lookupd_http_addresses=values["lookupd_http_address"],
                    )
                    await stack.enter_async_context(consumer)
                except Exception as exc:  # go-nsq's NewConsumer or first ConnectToNSQD failing
                    log.error("couldn't create logger for new topic %s: %s", self.topic, exc)
                    return False
                async with trio.open_nursery() as nursery:
                    await self._route(consumer, nursery)
        except* FileError:
            raise SystemExit(1) from None  # logged as FATAL where it happened; NSQ exits at once
        finally:
            self._receive.close()
        return True

    async def _route(self, consumer: Any, nursery: Any) -> None:
        import trio

        writer = self.writer
        interval = self.values["sync_interval"]
        next_tick = trio.current_time() + interval
        closing = False

        async def in_thread(func: Any, *args: Any, **kwargs: Any) -> None:
            done = await trio.to_thread.run_sync(functools.partial(func, *args, **kwargs))
            for message in done:
                message.finish()

        async def stop_consumer() -> None:
            await consumer.stop()
            self._control(_STOPPED)

        while True:
            items: list[Any] = []
            with trio.move_on_at(math.inf if closing else next_tick):
                items.append(await self._receive.receive())
            while True:
                try:
                    items.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            if not items:
                next_tick = max(next_tick + interval, trio.current_time())
                await in_thread(writer.tick)
                continue
            batch: list[Any] = []
            for item in items + [None]:
                if item is not None and not isinstance(item, _Control):
                    if not item.has_responded:  # not requeued by a stop that gave up waiting for the files
                        batch.append(item)
                    continue
                if batch:
                    await in_thread(writer.write, batch, sync=closing or consumer.is_starved())
                    batch = []
                if item is _STOP and not closing:
                    closing = True
                    await in_thread(writer.flush)
                    nursery.start_soon(stop_consumer)
                elif item is _HUP:
                    await in_thread(writer.close)
                elif item is _STOPPED:
                    await in_thread(writer.close)
                    return


# --- the topics -------------------------------------------------------------------------------------------------------


class TopicDiscoverer:
    """The topics being logged: the ``--topic`` list, or lookupd's topics matching ``--topic-pattern``."""

    def __init__(self, values: dict[str, Any], config: Any, opts: FileOptions) -> None:
        self.values = values
        self.config = config
        self.opts = opts
        self.topics: dict[str, TopicLogger] = {}
        self._nursery: Any = None
        pattern = values["topic_pattern"]
        try:
            self._pattern = re.compile(pattern) if pattern else None
        except re.error:
            self._pattern = None
            self._bad_pattern = True
        else:
            self._bad_pattern = False

    def _allowed(self, topic: str) -> bool:
        if self._bad_pattern:
            return False  # NSQ: a pattern that does not compile matches nothing
        return self._pattern is None or self._pattern.search(topic) is not None

    def update_topics(self, topics: list[str]) -> None:
        for topic in topics:
            if topic in self.topics:
                continue
            if not self._allowed(topic):
                log.warning("skipping topic %s (doesn't match pattern %s)", topic, self.values["topic_pattern"])
                continue
            try:
                name_format = compute_filename_format(self.opts, topic)
            except (ValueError, OSError) as exc:
                log.error("couldn't create logger for new topic %s: %s", topic, exc)
                continue
            writer = TopicWriter(FileLogger(self.opts, topic, name_format, _log))
            logger = TopicLogger(topic, self.values, self.config, writer)
            self.topics[topic] = logger
            self._nursery.start_soon(self._run_topic, logger)

    async def _run_topic(self, logger: TopicLogger) -> None:
        if not await logger.run():
            del self.topics[logger.topic]

    def hup(self) -> None:
        for logger in self.topics.values():
            logger.hup()

    async def run(self, stop: Any) -> None:
        import trio

        values = self.values
        refresh = values["topic_refresh"]
        # NSQ asks lookupd only when no --topic is given, and first after one refresh interval
        polling = not values["topic"] and refresh > 0
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.update_topics(values["topic"])
            next_poll = trio.current_time() + refresh
            while not stop.is_set():
                with trio.move_on_at(next_poll if polling else math.inf):
                    await stop.wait()
                if stop.is_set():
                    break
                next_poll = max(next_poll + refresh, trio.current_time())
                try:
                    topics = await lookupd_topics(
                        values["lookupd_http_address"],
                        values["http_client_connect_timeout"],
                        values["http_client_request_timeout"],
                    )
                except LookupError as exc:
                    log.error("could not retrieve topic list: %s", exc)
                    continue
                self.update_topics(topics)
            for logger in self.topics.values():
                logger.stop()


async def lookupd_topics(addresses: list[str], connect_timeout: float, request_timeout: float) -> list[str]:
    """The sorted union of every lookupd's ``/topics``; ``LookupError`` when any lookupd failed (NSQ skips a
    partial answer as well)."""
    import trio

    from runtime.http_client import HTTPClientError, fetch
    from trionsq._lookupd import ACCEPT_V1, MAX_BODY, LookupdError, lookup_url, parse_topics

    found: set[str] = set()
    errors: list[str] = []

    async def query(address: str) -> None:
        url = lookup_url(address, "/topics")
        try:
            reply = await fetch(
                "GET",
                url,
                headers=[ACCEPT_V1],
                connect_timeout=connect_timeout,
                request_timeout=request_timeout,
                max_bytes=MAX_BODY,
            )
            found.update(parse_topics(url, reply.status, reply.body))
        except (HTTPClientError, LookupdError, ValueError) as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as nursery:
        for address in addresses:
            nursery.start_soon(query, address)
    if errors and len(errors) == len(addresses):
        raise LookupError("Failed to query any nsqlookupd: " + "; ".join(errors))
    if errors:
        raise LookupError("; ".join(errors))
    return sorted(found)


# --- main -------------------------------------------------------------------------------------------------------------


async def _run(stop: Any, discoverer: TopicDiscoverer) -> int:
    await discoverer.run(stop)
    return 0


def main(argv: list[str] | None = None) -> int:
    flags = flag_set()
    values = flags.parse_or_exit(argv)
    check(flags, values)
    from runtime.logfmt import setup_logging as setup_nsq_logging

    setup_logging()  # the client's lines, as go-nsq's default logger prints them
    setup_nsq_logging(values["log_prefix"], values["log_level"].lower(), name="nsq_to_file")
    from protocol.version import NSQ_VERSION
    from trionsq import __version__

    config = consumer_config(values, user_agent=f"nsq_to_file/{NSQ_VERSION} trionsq/{__version__}")
    config.max_in_flight = values["max_in_flight"]  # NSQ sets it after the --consumer-opt list
    discoverer = TopicDiscoverer(values, config, file_options(values))
    return run(_run, discoverer, on_hup=discoverer.hup)


if __name__ == "__main__":
    sys.exit(main())
