"""nsq_to_nsq: consume topics from one set of nsqd and publish every message to another (NSQ 1.3.0's tool).

Usage: ``nsq_to_nsq --topic=T [--topic=U ...] (--nsqd-tcp-address=A | --lookupd-http-address=L)
--destination-nsqd-tcp-address=D [--destination-nsqd-tcp-address=E ...]``.

- Each ``--topic`` is consumed on ``--channel`` (default ``nsq_to_nsq``) and published to the topic of the same
  name, or to ``--destination-topic`` for all of them.
- Several destinations: ``--mode`` picks one per message (``hostpool``, the default, ``round-robin`` or
  ``epsilon-greedy``, see ``_relay``); each destination has its own producer connection.
- A message is FIN'd only once its publish got nsqd's OK; a publish that fails requeues it through the consumer's
  backoff (and, in hostpool modes, marks that destination as failing).
- ``--require-json-field F``: only JSON objects with field F are published (``--require-json-value V``: and whose
  F is the string V, or a number equal to V when V reads as a number). A message without F is FIN'd unpublished,
  except when a value is required too: then NSQ's tool logs ``ERROR: missing field to check required value`` and
  requeues it (with backoff), so it comes back until the consumer gives it up after ``max_attempts``. A message
  with F and another value is FIN'd unpublished.
- ``--whitelist-json-field F`` (repeatable): the published body is a JSON object holding only those top-level
  fields (a field name is taken whole: ``a.b`` names a key ``"a.b"``, as in NSQ), written as Go writes JSON
  (``_gojson``).
- With either JSON option, a body that is not a JSON object is logged (``ERROR: Unable to decode json: ...``) and
  FIN'd unpublished. Without them bodies are copied byte for byte.
- ``--status-every N``: every N publishes a line with their 99th/95th percentile and mean duration (also per
  destination when there are several); 0 disables it.
- ``--consumer-opt``/``--producer-opt``: go-nsq options for the consumers and the producers.

The handler awaits its publish, so the consumer runs ``--max-in-flight`` handler tasks: as many publishes are in
flight (pipelined on the producers' connections) as messages held, as NSQ's tool allows with its asynchronous
publishes. SIGINT or SIGTERM stops the consumers: publishes under way finish and their messages are FIN'd (or
requeued), the messages not yet handled go back to nsqd, then the producers close; the tool exits 0.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

from nsq_tools._cli import ToolFlags, consumer_config, fatal, fatal_if, producer_config, run, setup_logging
from nsq_tools._gojson import decode_object, encode, int_if_whole
from nsq_tools._relay import Destinations, check_mode, destination_metrics
from protocol.names import is_valid_channel_name, is_valid_topic_name
from protocol.version import NSQ_VERSION
from runtime.flags import parse_go_float

__all__ = ["JsonRules", "main"]

PROGRAM = "nsq_to_nsq"

log = logging.getLogger("nsq_tools.nsq_to_nsq")


def flag_set() -> ToolFlags:
    flags = ToolFlags(PROGRAM)
    flags.add_consumer(channel="nsq_to_nsq")
    flags.add_producer_opt()
    flags.add(
        "destination-nsqd-tcp-address",
        "str_list",
        [],
        "an nsqd TCP address to publish to (repeatable)",
        in_config=False,
    )
    flags.add(
        "destination-topic",
        "str",
        "",
        "the topic to publish every consumed topic to",
        in_config=False,
        default_text="is consumed topic name",
    )
    flags.add(
        "mode",
        "str",
        "hostpool",
        "how a destination is picked per message: round-robin, hostpool or epsilon-greedy",
        in_config=False,
    )
    flags.add("require-json-field", "str", "", "publish only JSON messages that have this field", in_config=False)
    flags.add(
        "require-json-value",
        "str",
        "",
        "with --require-json-field: publish only JSON messages whose field has this value",
        in_config=False,
    )
    flags.add(
        "status-every", "int", 250, "log timing percentiles every this many publishes (0 disables)", in_config=False
    )
    flags.add(
        "whitelist-json-field",
        "str_list",
        [],
        "publish JSON messages with only this field (repeatable)",
        in_config=False,
    )
    flags.add_version()
    return flags


def check(values: dict[str, Any]) -> None:
    """NSQ's start-up checks in its order, each a fatal line."""
    if not values["topic"] or not values["channel"]:
        fatal("--topic and --channel are required")
    for topic in values["topic"]:
        if not is_valid_topic_name(topic):
            fatal("--topic is invalid")
    if values["destination_topic"] and not is_valid_topic_name(values["destination_topic"]):
        fatal("--destination-topic is invalid")
    if not is_valid_channel_name(values["channel"]):
        fatal("--channel is invalid")
    if not values["nsqd_tcp_address"] and not values["lookupd_http_address"]:
        fatal("--nsqd-tcp-address or --lookupd-http-address required")
    if values["nsqd_tcp_address"] and values["lookupd_http_address"]:
        fatal("use --nsqd-tcp-address or --lookupd-http-address not both")
    if not values["destination_nsqd_tcp_address"]:
        fatal("--destination-nsqd-tcp-address required")
    problem = check_mode(values["mode"])
    if problem:
        fatal(problem)


class Skip(Exception):
    """Not to be published; ``requeue`` says whether to requeue (with backoff) rather than FIN."""

    def __init__(self, requeue: bool = False) -> None:
        super().__init__("backoff" if requeue else "skipped")
        self.requeue = requeue


class PublishFailed(Exception):
    """A publish that got no OK; its message is requeued (the consumer logs this text)."""


class JsonRules:
    """``--require-json-field``/``--require-json-value`` and ``--whitelist-json-field`` applied to a body."""

    def __init__(self, require_field: str, require_value: str, whitelist: list[str]) -> None:
        self.require_field = require_field
        self.require_value = require_value
        self.whitelist = list(whitelist)
        self.active = bool(require_field or whitelist)
        try:
            self.required_number: float | None = parse_go_float(require_value) if require_value else None
        except ValueError:
            self.required_number = None

    def passes(self, obj: dict[str, Any]) -> bool:
        """Whether ``obj`` may be published; ``Skip(requeue=True)`` when the field to compare is missing."""
        if not self.require_field:
            return True
        if self.require_field not in obj:
            if self.require_value:
                log.error("ERROR: missing field to check required value")
                raise Skip(requeue=True)
            return False
        if not self.require_value:
            return True
        value = obj[self.require_field]
        if isinstance(value, str):
            return value == self.require_value
        if self.required_number is not None:
            # both sides float64, as in Go: 1, 1.0 and 1e0 are equal
            return type(value) is float and value == self.required_number
        return False  # neither a string nor a number to compare

    def apply(self, body: bytes) -> bytes:
        """The body to publish; ``Skip`` when it is not to be published."""
        if not self.active:
            return body
        try:
            obj = decode_object(body)
        except ValueError:
            log.error("ERROR: Unable to decode json: %s", body.decode("utf-8", errors="replace"))
            raise Skip() from None
        if not self.passes(obj):
            raise Skip()
        if not self.whitelist:
            return body
        kept = {key: int_if_whole(obj[key]) for key in self.whitelist if key in obj}
        return encode(kept)


def make_handler(
    rules: JsonRules,
    destinations: Destinations,
    producers: dict[str, Any],
    topic: str,
    metrics: tuple[Any, dict[str, Any]],
):
    import trionsq

    publish_errors = (
        trionsq.NSQError,
        trionsq.NoAvailableNsqd,
        trionsq.ConnectionClosed,
        trionsq.ConnectError,
        OSError,
    )
    aggregate, per_address = metrics

    async def handle(message) -> None:
        try:
            body = rules.apply(message.body)
        except Skip as skip:
            if skip.requeue:
                raise
            return
        started = time.monotonic()
        address = destinations.pick()
        error: BaseException | None = None
        try:
            await producers[address].publish(topic, body)
        except publish_errors as exc:
            error = exc
        now = time.monotonic()
        destinations.mark(address, error is None, now - started)
        per_address[address].status(started, now)  # NSQ's tool times failed publishes as well
        aggregate.status(started, now)
        if error is not None:
            raise PublishFailed(f"publishing to {address} failed: {error}") from None

    return handle


async def _run(stop, values: dict[str, Any]) -> int:
    import trio

    import trionsq

    user_agent = f"nsq_to_nsq/{NSQ_VERSION} trionsq/{trionsq.__version__}"
    cconfig = consumer_config(values, user_agent=user_agent)
    pconfig = producer_config(values, user_agent=user_agent)
    addresses = values["destination_nsqd_tcp_address"]
    rules = JsonRules(values["require_json_field"], values["require_json_value"], values["whitelist_json_field"])
    destinations = Destinations(addresses, values["mode"])
    metrics = destination_metrics(addresses, values["status_every"])
    try:
        async with AsyncExitStack() as stack:
            producers = {}
            for address in dict.fromkeys(addresses):
                producers[address] = await stack.enter_async_context(trionsq.Producer([address], config=pconfig))
            consumers = []
            for topic in values["topic"]:
                handler = make_handler(rules, destinations, producers, values["destination_topic"] or topic, metrics)
                consumer = trionsq.Consumer(
                    topic,
                    values["channel"],
                    handler,
                    config=cconfig,
                    nsqd_tcp_addresses=values["nsqd_tcp_address"],
                    lookupd_http_addresses=values["lookupd_http_address"],
                    concurrency=max(1, cconfig.max_in_flight),
                )
                consumers.append(await stack.enter_async_context(consumer))
            async with trio.open_nursery() as nursery:

                async def all_closed() -> None:
                    for consumer in consumers:
                        await consumer.wait_closed()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(all_closed)
                await stop.wait()
                nursery.cancel_scope.cancel()
            # leaving the stack stops the consumers (publishes under way finish and are answered, the messages no
            # publish has started for go back to nsqd at once), then closes the producers
    except Exception as exc:
        # a bad address, a lookupd or nsqd refusing us: a fatal line, not a traceback
        fatal_if(exc, (ValueError, OSError, trionsq.NSQError, trionsq.ConnectError, trionsq.NoAvailableNsqd))
        raise
    return 0


def main(argv: list[str] | None = None) -> int:
    values = flag_set().parse_or_exit(argv)
    setup_logging()
    check(values)
    return run(_run, values)


if __name__ == "__main__":
    sys.exit(main())
