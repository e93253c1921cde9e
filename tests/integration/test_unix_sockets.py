"""Unix sockets, as nsqd 1.3.0 and nsqlookupd accept them: an address that is not ``host:port`` is a socket's path.

nsqd serves the V2 protocol and HTTP on such sockets, reports ``tcp_port``/``http_port`` -1 in ``/info``, and
removes the files when it stops (as Go's unix listener does); nsqlookupd serves its V1 protocol and HTTP there.
No client library here speaks to a unix socket (pynsq, gnsq and nsqjs dial TCP only), so the clients are raw.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

import pytest

from .harness import NsqdProcess, RawClient, assert_refused_start, stop_all
from .http_helpers import get, post, wait_for
from .lookupd_harness import LookupdProcess, RawPeer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def sock_dir():
    """A short directory for socket files (a unix socket's path has at most 107 bytes)."""
    path = tempfile.mkdtemp(prefix="nsq", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _is_socket(path: str) -> bool:
    return os.path.exists(path) and stat.S_ISSOCK(os.stat(path).st_mode)


def test_nsqd_serves_tcp_and_http_on_unix_sockets(tmp_path, sock_dir):
    tcp, http = os.path.join(sock_dir, "nsqd.sock"), os.path.join(sock_dir, "http.sock")
    daemon = NsqdProcess(tmp_path, [f"--tcp-address={tcp}", f"--http-address={http}"]).start()
    try:
        daemon.wait_for_log(r"HTTP: listening on " + http, 10)
        assert daemon.addresses == {"TCP": tcp, "HTTP": http}
        assert _is_socket(tcp) and _is_socket(http)
        info = get(http, "/info").json()
        assert (info["tcp_port"], info["http_port"]) == (-1, -1)

        assert post(http, "/pub?topic=ux", b"over http").status == 200
        with RawClient(tcp) as client:
            client.publish("ux", b"over the V2 protocol")
            client.subscribe("ux", "c", ready=2)
            bodies = sorted(client.read_message().body for _ in range(2))
            assert bodies == [b"over http", b"over the V2 protocol"]
            clients = get(http, "/stats?format=json&topic=ux").json()["topics"][0]["channels"][0]["clients"]
            assert [entry["remote_address"] for entry in clients] == ["@"]  # a unix peer has no address
    finally:
        assert daemon.stop() == 0
    assert not os.path.exists(tcp) and not os.path.exists(http), os.listdir(sock_dir)


def test_nsqd_refuses_a_socket_path_that_exists(tmp_path, sock_dir):
    taken = os.path.join(sock_dir, "taken.sock")
    open(taken, "w").close()
    assert_refused_start(
        "nsqd",
        [f"--tcp-address={taken}", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"],
        f"failed to instantiate nsqd - listen ({taken}) failed - listen unix {taken}: bind: address already in use",
    )
    assert os.path.exists(taken)  # not its file: left alone


def test_nsqlookupd_serves_tcp_and_http_on_unix_sockets(tmp_path, sock_dir):
    tcp, http = os.path.join(sock_dir, "lookupd.sock"), os.path.join(sock_dir, "http.sock")
    lookupd = LookupdProcess(tmp_path, [f"--tcp-address={tcp}", f"--http-address={http}"]).start()
    try:
        assert lookupd.addresses == {"TCP": tcp, "HTTP": http}
        with RawPeer(tcp) as peer:
            answer = peer.identify(tcp_port=4150, http_port=4151)
            assert (answer["tcp_port"], answer["http_port"]) == (-1, -1)
            assert peer.command(b"REGISTER ux c\n") == b"OK"
            producers = get(http, "/lookup?topic=ux").json()["producers"]
            assert [(p["broadcast_address"], p["tcp_port"], p["remote_address"]) for p in producers] == [
                ("127.0.0.1", 4150, "@")
            ]
    finally:
        assert lookupd.stop() == 0
    assert not os.path.exists(tcp) and not os.path.exists(http)


def test_nsqd_on_unix_sockets_registers_with_the_ports_it_is_told(tmp_path, sock_dir):
    """On a unix socket nsqd has no port to announce: as in NSQ, lookupd refuses it (IDENTIFY needs ports)
    unless --broadcast-tcp-port and --broadcast-http-port name the ports a proxy in front of it serves."""
    lookupd = LookupdProcess(tmp_path / "lookupd").start()

    def on_unix_sockets(name: str, *extra: str) -> NsqdProcess:
        return NsqdProcess(
            tmp_path / name,
            [
                f"--tcp-address={os.path.join(sock_dir, name + '.tcp')}",
                f"--http-address={os.path.join(sock_dir, name + '.http')}",
                f"--lookupd-tcp-address={lookupd.tcp_address}",
                "--broadcast-address=127.0.0.1",
                *extra,
            ],
        ).start()

    refused = on_unix_sockets("n1")
    told = on_unix_sockets("n2", "--broadcast-tcp-port=14150", "--broadcast-http-port=14151")
    try:
        refused.wait_for_log(r"ERROR: LOOKUPD\(.*IDENTIFY missing fields", 10)
        post(told.http(), "/topic/create?topic=ux")
        producers = wait_for(
            lambda: get(lookupd.http_address, "/lookup?topic=ux").json().get("producers"),
            message="the nsqd with broadcast ports registered",
        )
        assert [(p["tcp_port"], p["http_port"]) for p in producers] == [(14150, 14151)]
        refused.assert_running()
    finally:
        stop_all([refused, told, lookupd])
