"""``--workers=2``: what a client sees of the node as a whole, whichever worker answers it: ``PUT /config``,
``/metrics``'s ``process_*`` figures, statsd's pushes, and a stop that one worker starts.

A test that must reach a given worker keeps an HTTP connection open to it: the kernel hands each new connection
to one of the workers, and /proc tells which one holds the server's end (``connections_to_each_worker``)."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.process_collector import ProcessCollector

from .harness import NsqdProcess, RawClient, consumer, stop_all
from .http_helpers import stats, wait_for
from .lookupd_harness import LookupdProcess, wait_for_producers
from .test_workers import owned_topics, start_node

pytestmark = pytest.mark.timeout(60)


def worker_pids_in_order(node: NsqdProcess) -> list[int]:
    """The workers' pids, worker 0 first (the parent logs them in that order)."""
    return [int(pid) for pid in node.wait_for_log(r"NSQ: started \d+ workers \(pids ([\d ]+)\)", 5).group(1).split()]


def _server_socket_inode(server_port: int, client_port: int) -> str:
    """The inode of the server's end of the loopback TCP connection between these ports."""
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[1].endswith(f":{server_port:04X}") and fields[2].endswith(f":{client_port:04X}"):
                return fields[9]
    raise AssertionError(f"no connection from port {client_port} to port {server_port} in /proc/net/tcp")


def serving_worker(node: NsqdProcess, connection: http.client.HTTPConnection) -> int:
    """The worker that holds the server's end of ``connection`` (which has had one answer: it was accepted)."""
    assert connection.sock is not None
    return accepting_worker(node, connection.sock)


def accepting_worker(node: NsqdProcess, sock: socket.socket) -> int:
    """The worker that holds the server's end of the TCP connection ``sock`` (answered once: it was accepted)."""
    inode = _server_socket_inode(sock.getpeername()[1], sock.getsockname()[1])
    for index, pid in enumerate(worker_pids_in_order(node)):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return index
            except OSError:
                continue
    raise AssertionError(f"no worker holds socket {inode}")


def call(connection: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None):
    connection.request(method, path, body=body)
    response = connection.getresponse()
    return response.status, response.read()


def connections_to_each_worker(node: NsqdProcess, count: int = 2) -> list[http.client.HTTPConnection]:
    """One kept-alive HTTP connection to each worker, worker 0's first (new connections until each is reached)."""
    host, port = node.listening["HTTP"]
    found: dict[int, http.client.HTTPConnection] = {}
    for _ in range(100):
        connection = http.client.HTTPConnection(host, port, timeout=10)
        assert call(connection, "GET", "/ping")[0] == 200
        index = serving_worker(node, connection)
        if index in found:
            connection.close()
        else:
            found[index] = connection
        if len(found) == count:
            return [found[index] for index in range(count)]
    raise AssertionError(f"100 connections reached only workers {sorted(found)}")


def test_put_config_changes_every_worker(tmp_path):
    lookupd = LookupdProcess(tmp_path / "lookupd").start()
    node = start_node(tmp_path / "data", "--broadcast-address=127.0.0.1")
    connections = connections_to_each_worker(node)
    try:
        for writer, reader in ((1, 0), (0, 1)):
            for level, number in (("debug", 1), ("warn", 3)):
                assert call(connections[writer], "PUT", "/config/log_level", level.encode()) == (200, b"%d" % number)
                assert call(connections[reader], "GET", "/config/log_level") == (200, b"%d" % number)
        # worker 0 alone registers the node: a change that worker 1 answers reaches it
        addresses = json.dumps([lookupd.tcp_address]).encode()
        assert call(connections[1], "PUT", "/config/nsqlookupd_tcp_addresses", addresses)[0] == 200
        assert json.loads(call(connections[0], "GET", "/config/nsqlookupd_tcp_addresses")[1]) == [lookupd.tcp_address]
        topics = owned_topics("configured")
        for name in topics:
            consumer(node.tcp, name, "c", ready=0).close()
        for name in topics:
            assert len(wait_for_producers(lookupd, name, {node.tcp[1]})) == 1
    finally:
        for connection in connections:
            connection.close()
        stop_all([node, lookupd])


def _process_figures(pid: int) -> dict[str, float]:
    return {
        family.name: family.samples[0].value for family in ProcessCollector(pid=lambda: pid, registry=None).collect()
    }


def _scraped_process_figures(connection: http.client.HTTPConnection) -> dict[str, float]:
    status, body = call(connection, "GET", "/metrics")
    assert status == 200
    return {
        family.name: family.samples[0].value
        for family in text_string_to_metric_families(body.decode())
        if family.name.startswith("process_")
    }


def test_metrics_process_figures_are_the_whole_nodes(tmp_path):
    node = start_node(tmp_path / "data")
    connections = connections_to_each_worker(node)
    assert node.proc is not None
    pids = [node.proc.pid, *worker_pids_in_order(node)]
    try:
        for connection in connections:
            before = [_process_figures(pid) for pid in pids]
            scraped = _scraped_process_figures(connection)
            after = [_process_figures(pid) for pid in pids]
            cpu = "process_cpu_seconds"
            assert sum(f[cpu] for f in before) <= scraped[cpu] <= sum(f[cpu] for f in after), (before, scraped)
            resident = "process_resident_memory_bytes"
            low, high = sum(f[resident] for f in before), sum(f[resident] for f in after)
            assert 0.8 * min(low, high) <= scraped[resident] <= 1.2 * max(low, high), (before, scraped, after)
            assert scraped["process_start_time_seconds"] == before[0]["process_start_time_seconds"]
            assert 0 < scraped["process_open_fds"] <= scraped["process_max_fds"]
    finally:
        for connection in connections:
            connection.close()
        stop_all([node])


_STATSD_LINE = re.compile(r"^nsq\.[^.]+\.(.+):(-?\d+)\|([cg])$")


def test_statsd_gets_one_push_per_interval_for_the_node(tmp_path):
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(1.0)
    address = f"127.0.0.1:{receiver.getsockname()[1]}"
    node = start_node(tmp_path / "data", f"--statsd-address={address}", "--statsd-interval=300ms")
    try:
        topics = owned_topics("pushed")
        producer = RawClient(node.tcp)
        for count, name in enumerate(topics, 3):
            producer.publish_many(name, [b"m"] * count)
        producer.close()
        pushes: list[dict[str, list[int]]] = []
        current: dict[str, list[int]] = {}
        deadline = time.monotonic() + 30
        while len(pushes) < 4 or [
            sum(push.get(f"topic.{name}.message_count", [0])[0] for push in pushes) for name in topics
        ] != [3, 4]:
            assert time.monotonic() < deadline, pushes
            try:
                datagram = receiver.recv(65536)
            except TimeoutError:
                continue
            for line in datagram.decode().splitlines():
                match = _STATSD_LINE.match(line)
                assert match, line
                current.setdefault(match.group(1), []).append(int(match.group(2)))
                if match.group(1) == "mem.gc_runs":  # the last line of a push
                    pushes.append(current)
                    current = {}
        for push in pushes:  # each push is the node's: both workers' topics and one set of memory figures
            for name in topics:
                assert len(push[f"topic.{name}.depth"]) == 1, push
            assert len(push["mem.heap_objects"]) == 1, push
        assert all(push[f"topic.{topics[0]}.depth"] == [3] for push in pushes[-2:])
    finally:
        receiver.close()
        stop_all([node])


def test_a_stop_signal_to_one_worker_stops_the_node_at_once(tmp_path):
    """A worker that stops alone tells the others (``drained``), which stop with it at once instead of waiting out
    the bound for a word that would never come; every topic is kept."""
    data = tmp_path / "data"
    node = start_node(data)
    topics = owned_topics("alone")
    producer = RawClient(node.tcp)
    for name in topics:
        producer.publish_many(name, [b"kept"] * 5)
    producer.close()
    os.kill(worker_pids_in_order(node)[1], signal.SIGTERM)
    assert node.proc is not None
    assert node.proc.wait(30) == 1  # a worker stopped on its own: the node stopped (for its supervisor to restart)
    node.wait_for_log(r"INFO: WORKERS: worker 1 is stopping: stopping", 5)
    assert not [line for line in node.lines if "is gone" in line or "no word in" in line], node.log_text()
    node = start_node(data)
    try:
        wait_for(lambda: sorted(t["depth"] for t in stats(node.listening["HTTP"])["topics"]) == [5, 5], 10)
    finally:
        stop_all([node])


def test_channels_created_just_before_a_stop_are_in_nsqd_dat(tmp_path):
    """Worker 0 writes nsqd.dat for the node: what another worker created just before a stop reaches it before it
    writes the file for the last time (or a restart would not load those channels, their messages left unread)."""
    data = tmp_path / "data"
    topics = owned_topics("listed")
    for round_number in range(3):
        node = start_node(data)
        try:
            for name in topics:
                for number in range(4):
                    consumer(node.tcp, name, f"c{round_number}-{number}", ready=0).close()
        finally:
            stop_all([node])
        listed = json.loads((data / "nsqd.dat").read_text())["topics"]
        channels = {entry["name"]: sorted(c["name"] for c in entry["channels"]) for entry in listed}
        expected = sorted(f"c{r}-{number}" for r in range(round_number + 1) for number in range(4))
        assert channels == dict.fromkeys(topics, expected)
