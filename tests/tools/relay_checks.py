"""Checks shared by the nsq_to_http and nsq_to_nsq tests: nsqd's /stats read for a topic or channel, a bounded wait
until a channel is drained, the consumer options that make requeues quick, and the fatal line of a refused start."""

from __future__ import annotations

import re

from tests.integration.http_helpers import stats
from tests.tools.conftest import run_tool, wait_for

__all__ = ["FAST_RETRY", "channel_stats", "fatal_text", "published_count", "topic_stats", "wait_drained"]

# quick requeues and backoff, so a failed message comes back within a test's time
FAST_RETRY = ("--consumer-opt=default_requeue_delay,50ms", "--consumer-opt=max_backoff_duration,50ms")

_FATAL_LINE = re.compile(rb"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d (.*)\n\Z")


def topic_stats(nsqd, topic: str) -> dict | None:
    for entry in stats(nsqd.http(), f"topic={topic}")["topics"] or []:  # null while the topic does not exist
        if entry["topic_name"] == topic:
            return entry
    return None


def channel_stats(nsqd, topic: str, channel: str) -> dict | None:
    for chan in (topic_stats(nsqd, topic) or {}).get("channels", []):
        if chan["channel_name"] == channel:
            return chan
    return None


def published_count(nsqd, topic: str) -> int:
    return (topic_stats(nsqd, topic) or {}).get("message_count", 0)


def wait_drained(nsqd, topic: str, channel: str, timeout: float = 30.0) -> dict:
    """The channel's stats once nothing is left in it: no depth, nothing in flight or deferred."""

    def drained():
        chan = channel_stats(nsqd, topic, channel)
        if chan and chan["depth"] == 0 and chan["in_flight_count"] == 0 and chan["deferred_count"] == 0:
            return chan
        return None

    return wait_for(drained, timeout, 0.1, f"channel {topic}/{channel} drained")


def fatal_text(tool: str, *args: str) -> str:
    """Run ``tool``, which must end as Go's ``log.Fatal`` does (exit code 1, one dated line): that line's text."""
    result = run_tool(tool, *args)
    assert result.returncode == 1, result.stderr
    match = _FATAL_LINE.match(result.stderr)
    assert match, result.stderr
    return match.group(1).decode()
