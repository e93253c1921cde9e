"""nsq_stat: one channel's figures, summed over every nsqd that has its topic, printed every ``-interval``.

Like NSQ 1.3.0's tool, each round finds the topic's producers afresh (``/lookup?topic=`` on every
``-lookupd-http-address``, or ``/stats?topic=`` then ``/info`` on every ``-nsqd-http-address`` that has the topic),
reads ``/stats?format=json&topic=&channel=&include_clients=false`` from each producer's broadcast HTTP address,
and adds the channel's counters up. The first round only takes a reference; every later round prints one line:
the rates are the differences of ``message_count`` (ingress) and of ``message_count`` minus the change in depth
(egress) since the round before, divided by the interval in seconds and truncated, as upstream computes them.
The two header lines come first and again every 25 rounds. ``-count N`` ends the tool (exit 0) after N lines;
without it the tool runs until SIGINT, SIGTERM or SIGHUP (exit 0).

Any failed query ends the tool as upstream does, with one ``log.Fatal`` line (``ERROR: failed to get ...``) and
exit code 1: a partial answer would make the sums, and so the rates, jump. The requests within a round run
concurrently (one task per address, in a nursery the round owns) through the repository's trio HTTP client,
each bounded by ``-http-client-connect-timeout`` and ``-http-client-request-timeout``.
"""

from __future__ import annotations

import http
import json
import re
import sys
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import quote

from nsq_tools._cli import ToolFlags, fatal, run, write_stdout

__all__ = ["ChannelFigures", "format_header", "format_line", "main"]

HEADER_EVERY = 25
_ACCEPT_V1 = ("Accept", "application/vnd.nsq; version=1.0")
_MAX_BODY = 64 << 20


def _parse_count(text: str) -> int:
    """Go's ``strconv.ParseInt(s, 10, 32)``, the parser of upstream's ``-count``."""
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ValueError(f'strconv.ParseInt: parsing "{text}": invalid syntax')
    value = int(text)
    if not -(1 << 31) <= value < (1 << 31):
        raise ValueError(f'strconv.ParseInt: parsing "{text}": value out of range')
    return value


def build_flags() -> ToolFlags:
    flags = ToolFlags("nsq_stat")
    flags.add_version()
    flags.add("topic", "str", "", "the topic whose channel to watch", in_config=False)
    flags.add("channel", "str", "", "the channel to watch", in_config=False)
    flags.add("interval", "duration", 2.0, "time between two polls (and two printed lines)", in_config=False)
    flags.add_http_client_timeouts()
    flags.add(
        "count",
        "int",
        None,
        "how many lines to print before exiting (unset: until stopped)",
        convert=_parse_count,
        in_config=False,
    )
    flags.add("nsqd-http-address", "str_list", [], "an nsqd HTTP address to poll (repeatable)", in_config=False)
    flags.add(
        "lookupd-http-address",
        "str_list",
        [],
        "an nsqlookupd HTTP address to find the topic's nsqd from (repeatable)",
        in_config=False,
    )
    return flags


def check(values: dict[str, Any]) -> None:
    """Upstream's start-up checks, in its order, each a fatal line."""
    if not values["topic"] or not values["channel"]:
        fatal("--topic and --channel are required")
    if values["interval"] <= 0:
        fatal("--interval should be positive")
    if values["http_client_connect_timeout"] <= 0:
        fatal("--http-client-connect-timeout should be positive")
    if values["http_client_request_timeout"] <= 0:
        fatal("--http-client-request-timeout should be positive")
    if values["count"] is not None and values["count"] <= 0:
        fatal("--count should be positive")
    nsqds, lookupds = values["nsqd_http_address"], values["lookupd_http_address"]
    if not nsqds and not lookupds:
        fatal("--nsqd-http-address or --lookupd-http-address required")
    if nsqds and lookupds:
        fatal("use --nsqd-http-address or --lookupd-http-address not both")
    for flag, addresses in (("nsqd-http-address", nsqds), ("lookupd-http-address", lookupds)):
        if any(address.startswith("http") for address in addresses):
            fatal(f"--{flag} error - address should not contain scheme")


# --------------------------------------------------------------------------------------------------------------
# The figures and their lines


@dataclass
class ChannelFigures:
    """One channel's counters, summed over nodes (nsqd's /stats names)."""

    depth: int = 0
    memory_depth: int = 0
    backend_depth: int = 0
    in_flight_count: int = 0
    deferred_count: int = 0
    requeue_count: int = 0
    timeout_count: int = 0
    message_count: int = 0
    client_count: int = 0

    def add(self, entry: dict[str, Any]) -> None:
        """Add one node's channel entry; memory depth is derived as upstream derives it (depth - backend)."""
        for field in fields(self):
            if field.name != "memory_depth":
                setattr(self, field.name, getattr(self, field.name) + int(entry.get(field.name) or 0))
        self.memory_depth += int(entry.get("depth") or 0) - int(entry.get("backend_depth") or 0)


def format_header() -> str:
    return (
        "------rate------+----------------depth----------------+--------------metadata---------------\n"
        f"{'ingress':>7} {'egress':>7} | {'total':>7} {'mem':>7} {'disk':>7} {'inflt':>5} {'def':>5} | "
        f"{'req':>7} {'t-o':>7} {'msgs':>12} {'clients':>7}\n"
    )


def format_line(now: ChannelFigures, before: ChannelFigures, interval: float) -> str:
    ingress = int((now.message_count - before.message_count) / interval)
    egress = int((now.message_count - before.message_count - (now.depth - before.depth)) / interval)
    return (
        f"{ingress:7d} {egress:7d} | {now.depth:7d} {now.memory_depth:7d} {now.backend_depth:7d} "
        f"{now.in_flight_count:5d} {now.deferred_count:5d} | {now.requeue_count:7d} {now.timeout_count:7d} "
        f"{now.message_count:12d} {now.client_count:7d}\n"
    )


# --------------------------------------------------------------------------------------------------------------
# Queries


class QueryError(Exception):
    pass


class _Poller:
    def __init__(self, values: dict[str, Any]) -> None:
        self.topic: str = values["topic"]
        self.channel: str = values["channel"]
        self.nsqds: list[str] = values["nsqd_http_address"]
        self.lookupds: list[str] = values["lookupd_http_address"]
        self.connect_timeout: float = values["http_client_connect_timeout"]
        self.request_timeout: float = values["http_client_request_timeout"]

    async def get_json(self, url: str) -> Any:
        """Go's ``http_api.Client.GETV1``: a 200 answer's JSON, anything else an error with upstream's wording."""
        from runtime.http_client import HTTPClientError, fetch  # keeps -h free of trio

        try:
            reply = await fetch(
                "GET",
                url,
                headers=[_ACCEPT_V1],
                connect_timeout=self.connect_timeout,
                request_timeout=self.request_timeout,
                max_bytes=_MAX_BODY,
            )
        except HTTPClientError as exc:
            raise QueryError(str(exc)) from None
        if reply.status != 200:
            try:
                status = f"{reply.status} {http.HTTPStatus(reply.status).phrase}"
            except ValueError:
                status = str(reply.status)
            body = reply.body.decode("utf-8", "replace")
            raise QueryError(f"got response {status} {json.dumps(body, ensure_ascii=False)}")
        try:
            return json.loads(reply.body)
        except ValueError as exc:
            raise QueryError(f"GET {url}: bad JSON: {exc}") from None

    async def _gather(self, what: str, addresses: list[str], query) -> list:
        """``query(address)`` for every address at once; upstream's error rules (all failed, or some)."""
        import trio

        results: list = []
        errors: list[str] = []

        async def one(address: str) -> None:
            try:
                results.extend(await query(address))
            except QueryError as exc:
                errors.append(str(exc))

        async with trio.open_nursery() as nursery:
            for address in addresses:
                nursery.start_soon(one, address)
        if len(errors) == len(addresses):
            raise QueryError(f"failed to query any {what}: " + "\n".join(errors))
        if errors:
            raise QueryError("\n".join(errors))
        return results

    async def producers(self) -> list[str]:
        """The HTTP addresses (broadcast address and HTTP port) of the nsqd that have the topic."""
        topic = quote(self.topic, safe="")
        if self.lookupds:

            async def from_lookupd(address: str) -> list[str]:
                answer = await self.get_json(f"http://{address}/lookup?topic={topic}")
                return [
                    _join(p.get("broadcast_address", ""), p.get("http_port", 0))
                    for p in (answer or {}).get("producers") or []
                ]

            found = await self._gather("nsqlookupd", self.lookupds, from_lookupd)
        else:

            async def from_nsqd(address: str) -> list[str]:
                answer = await self.get_json(f"http://{address}/stats?format=json&topic={topic}&include_clients=false")
                if not any(t.get("topic_name") == self.topic for t in (answer or {}).get("topics") or []):
                    return []
                info = await self.get_json(f"http://{address}/info") or {}
                if not info.get("broadcast_address"):
                    return [address]
                return [_join(info["broadcast_address"], info.get("http_port", 0))]

            found = await self._gather("nsqd", self.nsqds, from_nsqd)
        return list(dict.fromkeys(found))

    async def figures(self, producers: list[str]) -> ChannelFigures | None:
        """The channel's sums over the producers; None when no producer has the channel."""
        query = f"topic={quote(self.topic, safe='')}&channel={quote(self.channel, safe='')}&include_clients=false"

        async def from_nsqd(address: str) -> list[dict]:
            answer = await self.get_json(f"http://{address}/stats?format=json&{query}") or {}
            return [
                channel
                for topic in answer.get("topics") or []
                if topic.get("topic_name") == self.topic
                for channel in topic.get("channels") or []
                if channel.get("channel_name") == self.channel
            ]

        entries = await self._gather("nsqd", producers, from_nsqd)
        if not entries:
            return None
        total = ChannelFigures()
        for entry in entries:
            total.add(entry)
        return total


def _join(host: str, port: int | str) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _stat_loop(values: dict[str, Any]) -> None:
    import trio

    poller = _Poller(values)
    interval: float = values["interval"]
    count: int | None = values["count"]
    before: ChannelFigures | None = None
    round_number = 0
    while count is None or round_number <= count:
        try:
            producers = await poller.producers()
        except QueryError as exc:
            fatal(f"ERROR: failed to get topic producers - {exc}")
        try:
            now = await poller.figures(producers)
        except QueryError as exc:
            fatal(f"ERROR: failed to get nsqd stats - {exc}")
        if now is None:
            fatal(f"ERROR: failed to find channel({poller.channel}) in stats metadata for topic({poller.topic})")
        out = format_header() if round_number % HEADER_EVERY == 0 else ""
        if before is not None:
            out += format_line(now, before, interval)
        if out:
            write_stdout(out)
        before = now
        round_number += 1
        if count is not None and round_number > count:
            break  # upstream sleeps once more before exiting; nothing is printed in that time
        await trio.sleep(interval)


async def _main(stop, values: dict[str, Any]) -> int:
    import trio

    async with trio.open_nursery() as nursery:

        async def stop_on_signal() -> None:
            await stop.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(stop_on_signal)
        await _stat_loop(values)
        nursery.cancel_scope.cancel()
    return 0


def main(argv: list[str] | None = None) -> int:
    values = build_flags().parse_or_exit(argv)
    check(values)
    return run(_main, values)


if __name__ == "__main__":
    sys.exit(main())
