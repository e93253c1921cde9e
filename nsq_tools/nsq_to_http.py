"""nsq_to_http: consume a topic/channel and make one HTTP request per message (NSQ 1.3.0's tool).

Usage: ``nsq_to_http --topic=T (--nsqd-tcp-address=A | --lookupd-http-address=L) (--post=URL | --get=URL)``.

- ``--post URL`` (repeatable): ``POST`` with the message body as the request body, ``Content-Type`` from
  ``--content-type`` (default ``application/octet-stream``; giving another value without ``--post`` is an error).
  A 2xx answer is success.
- ``--get URL`` (repeatable): each URL holds exactly one ``%s``, replaced by the body query-escaped (Go's
  ``url.QueryEscape``: a space becomes ``+``); only a 200 answer is success.
- ``--header "Name: value"`` (repeatable): sent with every request (after ``User-Agent: nsq_to_http v1.3.0`` and
  the content type, so it may replace them); a header without a name or a value is a start-up error.
- Several URLs: ``--mode`` picks one per message (``hostpool``, the default, ``round-robin`` or ``epsilon-greedy``,
  see ``_relay``). Every message goes to one URL, not to all of them.
- ``-n`` requests at once (the consumer runs that many handler tasks); ``--max-in-flight`` bounds the messages
  held from nsqd.
- ``--sample P``: each message is sent with probability P and FIN'd unsent otherwise.
- A request that fails (no answer, a timeout, an unexpected status) requeues its message through the consumer's
  backoff, so a failing endpoint slows the stream instead of dropping it; a success FINs it.
- ``--status-every N``: every N requests a line with their 99th/95th percentile and mean duration (also per URL
  when there are several); 0 disables it.

Requests use the daemons' trio HTTP client (``runtime.http_client``): a connection per request, the connect bounded
by ``--http-client-connect-timeout`` and the whole exchange by ``--http-client-request-timeout`` (20s). SIGINT or
SIGTERM stops the consumer: requests under way finish and their messages are FIN'd or requeued, the rest of the
messages held are given back to nsqd (RDY 0, CLS), and the tool exits 0.
"""

from __future__ import annotations

import logging
import random
import sys
import time
from typing import Any
from urllib.parse import quote_plus

from nsq_tools._cli import ToolFlags, consumer_config, fatal, fatal_if, run, setup_logging
from nsq_tools._relay import Destinations, check_mode, destination_metrics
from protocol.names import is_valid_channel_name, is_valid_topic_name
from protocol.version import NSQ_VERSION
from runtime.flags import go_quote

__all__ = ["main", "parse_custom_headers"]

PROGRAM = "nsq_to_http"
DEFAULT_CONTENT_TYPE = "application/octet-stream"
# A reply body is read and dropped; one larger than this fails the request (a sane bound on memory).
_MAX_REPLY_BYTES = 64 * 1024 * 1024

log = logging.getLogger("nsq_tools.nsq_to_http")


def flag_set() -> ToolFlags:
    flags = ToolFlags(PROGRAM)
    flags.add_consumer(channel="nsq_to_http", topics=False)
    flags.add("topic", "str", "", "the topic to consume", in_config=False)
    flags.add("content-type", "str", DEFAULT_CONTENT_TYPE, "the Content-Type of POST requests", in_config=False)
    flags.add(
        "get",
        "str_list",
        [],
        "a URL to GET for each message, with one '%s' that is replaced by the query-escaped body (repeatable)",
        in_config=False,
    )
    flags.add(
        "post",
        "str_list",
        [],
        "a URL to POST each message to, the body as the request body (repeatable)",
        in_config=False,
    )
    flags.add("header", "str_list", [], "a header for every request, as 'Name: value' (repeatable)", in_config=False)
    flags.add_http_client_timeouts(request_timeout=20.0)
    flags.add(
        "mode",
        "str",
        "hostpool",
        "how a URL is picked per message: round-robin, hostpool or epsilon-greedy",
        in_config=False,
    )
    flags.add("n", "int", 100, "the number of concurrent HTTP requests", in_config=False)
    flags.add("sample", "float", 1.0, "the fraction of messages to send, between 0 and 1", in_config=False)
    flags.add(
        "status-every", "int", 250, "log timing percentiles every this many requests (0 disables)", in_config=False
    )
    flags.add_version()
    return flags


def parse_custom_headers(texts: list[str]) -> list[tuple[str, str]]:
    """``Name: value`` pairs, both sides trimmed; ``ValueError`` names the first one without a name or a value."""
    headers = []
    for text in texts:
        name, colon, value = text.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not name or not value:
            raise ValueError(f"Invalid header: {go_quote(text)}")
        headers.append((name, value))
    return headers


def check(values: dict[str, Any]) -> list[tuple[str, str]]:
    """NSQ's start-up checks in its order (each a fatal line); the parsed ``--header`` values."""
    if not values["topic"] or not values["channel"]:
        fatal("--topic and --channel are required")
    if values["content_type"] != DEFAULT_CONTENT_TYPE:
        if not values["post"]:
            fatal("--content-type only used with --post")
        if not values["content_type"]:
            fatal("--content-type requires a value when used")
    if not values["nsqd_tcp_address"] and not values["lookupd_http_address"]:
        fatal("--nsqd-tcp-address or --lookupd-http-address required")
    if values["nsqd_tcp_address"] and values["lookupd_http_address"]:
        fatal("use --nsqd-tcp-address or --lookupd-http-address not both")
    if not values["get"] and not values["post"]:
        fatal("--get or --post required")
    if values["get"] and values["post"]:
        fatal("use --get or --post not both")
    for url in values["get"]:
        if url.count("%s") != 1:
            fatal("invalid GET address - must be a printf string")
    problem = check_mode(values["mode"])
    if problem:
        fatal(problem)
    if not 0.0 <= values["sample"] <= 1.0:
        fatal("ERROR: --sample must be between 0.0 and 1.0")
    try:
        headers = parse_custom_headers(values["header"])
    except ValueError as exc:
        fatal(f"could not parse custom headers: {exc}")
    if values["n"] < 1:
        fatal("-n must be at least 1")
    if not is_valid_topic_name(values["topic"]):
        fatal("invalid topic name")
    if not is_valid_channel_name(values["channel"]):
        fatal("invalid channel name")
    return headers


class RequestFailed(Exception):
    """An HTTP request that did not succeed; its message is requeued."""


class Sender:
    """Turns a message into the request for one URL and judges the answer."""

    def __init__(self, values: dict[str, Any], headers: list[tuple[str, str]]) -> None:
        self.post = bool(values["post"])
        self.connect_timeout = values["http_client_connect_timeout"]
        self.request_timeout = values["http_client_request_timeout"]
        # Go's Header.Set: a later header of the same name replaces an earlier one (names compare case-blind);
        # a Host header is ignored by Go's client, which always sends the URL's.
        merged: dict[str, tuple[str, str]] = {"user-agent": ("User-Agent", f"nsq_to_http v{NSQ_VERSION}")}
        if self.post:
            merged["content-type"] = ("Content-Type", values["content_type"])
        for name, value in headers:
            if name.lower() != "host":
                merged[name.lower()] = (name, value)
        self.headers = list(merged.values())

    async def send(self, url: str, body: bytes) -> None:
        from runtime.http_client import HTTPClientError, fetch

        if self.post:
            method, target = "POST", url
        else:
            method, target = "GET", url.replace("%s", quote_plus(body), 1)
        try:
            reply = await fetch(
                method,
                target,
                body=body if self.post else b"",
                headers=self.headers,
                connect_timeout=self.connect_timeout,
                request_timeout=self.request_timeout,
                max_bytes=_MAX_REPLY_BYTES,
            )
        except HTTPClientError as exc:
            raise RequestFailed(str(exc)) from None
        ok = 200 <= reply.status < 300 if self.post else reply.status == 200
        if not ok:
            raise RequestFailed(f"got status code {reply.status}")


def make_handler(values: dict[str, Any], headers: list[tuple[str, str]], *, rng: random.Random | None = None):
    urls = values["post"] or values["get"]
    sender = Sender(values, headers)
    destinations = Destinations(urls, values["mode"])
    aggregate, per_url = destination_metrics(urls, values["status_every"])
    sample = values["sample"]
    rng = rng or random.Random()

    async def handle(message) -> None:
        if sample < 1.0 and rng.random() > sample:
            return  # not in the sample: FIN'd unsent
        started = time.monotonic()
        url = destinations.pick()
        try:
            await sender.send(url, message.body)
        except RequestFailed:
            destinations.mark(url, False)
            raise
        now = time.monotonic()
        destinations.mark(url, True, now - started)
        per_url[url].status(started, now)
        aggregate.status(started, now)

    return handle


async def _run(stop, values: dict[str, Any], headers: list[tuple[str, str]]) -> int:
    import trio

    import trionsq

    config = consumer_config(values, user_agent=f"nsq_to_http/{NSQ_VERSION} trionsq/{trionsq.__version__}")
    # a stop waits for the requests under way (each bounded by the request timeout), never cutting one short
    stop_timeout = max(30.0, values["http_client_request_timeout"] + 1.0)
    try:
        consumer = trionsq.Consumer(
            values["topic"],
            values["channel"],
            make_handler(values, headers),
            config=config,
            nsqd_tcp_addresses=values["nsqd_tcp_address"],
            lookupd_http_addresses=values["lookupd_http_address"],
            concurrency=values["n"],
            stop_timeout=stop_timeout,
        )
        async with consumer, trio.open_nursery() as nursery:

            async def stop_on_signal() -> None:
                await stop.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(stop_on_signal)
            await consumer.wait_closed()
            nursery.cancel_scope.cancel()
            # leaving the block stops the consumer: requests under way finish and are answered, the messages no
            # request has started for go back to nsqd at once
    except Exception as exc:
        # a bad address, a lookupd or nsqd refusing us: a fatal line, not a traceback
        fatal_if(exc, (ValueError, OSError, trionsq.NSQError, trionsq.ConnectError))
        raise
    return 0


def main(argv: list[str] | None = None) -> int:
    values = flag_set().parse_or_exit(argv)
    setup_logging()
    headers = check(values)
    return run(_run, values, headers)


if __name__ == "__main__":
    sys.exit(main())
