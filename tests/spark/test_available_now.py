"""Trigger.AvailableNow on the driver path, driven as Spark drives it (no JVM): prepare, then plan
batches until one finds no new data, each plan committing the batch before it. The query must read
every message waiting at the start, past ``maxBacklogMessages`` (which holds the consumer at RDY 0
until Spark is done with a batch) and past ``maxInFlight`` in commit mode, across a pause of nsqd,
and then end by itself, also when another consumer of the channel holds messages in flight, and
without nsqd's HTTP API."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

import pytest

from spark_connector.stream_reader import NsqStreamReader
from tests.integration.harness import free_port
from tests.spark.conftest import bodies, publish, wait_until
from tests.spark.test_consumer import channel_stats, make_reader, partition_bodies

pytestmark = pytest.mark.timeout(120)


def nsqd_with_http_next(nsqd_at):
    """nsqd whose HTTP API is at its TCP port + 1 (NSQ's 4150 and 4151)."""
    while True:
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return nsqd_at(port, None, f"--http-address=127.0.0.1:{port + 1}")


def waiting_reader(tmp_path, nsqd, topic, prefix: str, count: int, **options) -> tuple[list[bytes], NsqStreamReader]:
    """``count`` messages published to ``topic``, and a driver-path reader of it with ``options``."""
    expected = bodies(prefix, 0, count)
    publish(nsqd, topic, expected)
    return expected, make_reader(tmp_path, **{"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic, **options})


def run_available_now(reader: NsqStreamReader, after_first_batch=None, timeout: float = 90) -> list[bytes]:
    """The bodies of every batch of an AvailableNow run, until a plan finds no new data."""
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    read: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"the query did not end; {len(read)} read"
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        if end == start:
            return read
        reader.commit(start)  # Spark commits a batch to the source once the next one is planned
        read += partition_bodies(reader.partitions(start, end))
        start = end
        if after_first_batch is not None:
            after_first_batch()
            after_first_batch = None


def test_reads_a_backlog_past_the_backlog_bound_then_ends(tmp_path, nsqd_at, topic):
    nsqd = nsqd_with_http_next(nsqd_at)
    expected, reader = waiting_reader(tmp_path, nsqd, topic, "a", 6000, maxBacklogMessages=1000, maxInFlight=200)
    late = bodies("late", 0, 3000)
    try:
        read = run_available_now(reader, after_first_batch=lambda: publish(nsqd, topic, late))
    finally:
        reader.stop()
    assert set(expected) <= set(read)
    # the end does not move with what is published after the start: at most one RDY window past it
    assert len(set(read)) <= len(expected) + 200


def test_nsqd_paused_for_seconds_does_not_end_it(tmp_path, nsqd_at, topic):
    """nsqd stopped (SIGSTOP) for two seconds after the first batch, as a loaded nsqd may pause."""
    nsqd = nsqd_with_http_next(nsqd_at)
    expected, reader = waiting_reader(tmp_path, nsqd, topic, "p", 3000, maxBacklogMessages=500, maxInFlight=100)
    resume = threading.Timer(2.0, os.kill, (nsqd.proc.pid, signal.SIGCONT))

    def pause() -> None:
        os.kill(nsqd.proc.pid, signal.SIGSTOP)
        resume.start()

    try:
        read = run_available_now(reader, after_first_batch=pause)
    finally:
        if resume.ident is not None:  # started: nsqd was stopped
            resume.join()
        reader.stop()
    assert set(read) == set(expected)


def test_commit_mode_reads_more_than_max_in_flight(tmp_path, nsqd_at, topic):
    """In commit mode nsqd sends no more while maxInFlight messages wait for their FIN: the
    messages of a finished batch are FIN'd when Spark plans the next one, not at its commit
    (which Spark sends only once that plan found new data)."""
    nsqd = nsqd_with_http_next(nsqd_at)
    expected, reader = waiting_reader(tmp_path, nsqd, topic, "c", 3000, ackMode="commit", maxInFlight=500)
    try:
        read = run_available_now(reader)
    finally:
        reader.stop()
    assert set(read) == set(expected)


def test_ends_when_another_consumer_holds_the_rest(tmp_path, nsqd_at, topic, caplog):
    from trionsq.blocking import connect

    nsqd = nsqd_with_http_next(nsqd_at)
    expected = bodies("s", 0, 1000)
    publish(nsqd, topic, expected)
    other = connect(nsqd.tcp_address)
    try:
        other.subscribe(topic, "spark")
        other.ready(300)  # takes 300 and never finishes them
        wait_until(lambda: channel_stats(nsqd, topic).get("in_flight_count") == 300, 10, "300 in flight to the other")
        reader = make_reader(tmp_path, **{"nsqd.tcp.addresses": nsqd.tcp_address, "topic": topic})
        try:
            with caplog.at_level(logging.INFO, logger="spark_connector.available_now"):
                read = run_available_now(reader)
        finally:
            reader.stop()
    finally:
        other.close()
    assert len(set(read)) == 700 and set(read) <= set(expected)
    assert "has nothing more for it" in caplog.text


def test_without_the_http_api_the_bound_does_not_end_it(tmp_path, nsqd, topic, caplog):
    expected, reader = waiting_reader(tmp_path, nsqd, topic, "f", 3000, maxBacklogMessages=500, maxInFlight=100)
    try:
        with caplog.at_level(logging.INFO, logger="spark_connector.available_now"):
            read = run_available_now(reader)
    finally:
        reader.stop()
    assert set(read) == set(expected)
    assert "HTTP API is not at its TCP port + 1" in caplog.text
