"""Fixtures of the client tests: nsqd's /stats read back, an auth server for nsqd, a fake nsqd, a cluster with a
lookupd."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial

import pytest
import trio

from tests.integration.harness import NsqdProcess, http_get
from tests.integration.lookupd_harness import Cluster
from tests.integration.test_auth import AuthServer


def nsqd_stats(daemon: NsqdProcess) -> dict:
    """nsqd's GET /stats?format=json."""
    status, body = http_get(daemon.http(), "/stats?format=json")
    assert status == 200, body
    return json.loads(body)


def topic_message_count(daemon: NsqdProcess, topic: str) -> int:
    for entry in nsqd_stats(daemon)["topics"]:
        if entry["topic_name"] == topic:
            return entry["message_count"]
    return 0


def producer_entries(daemon: NsqdProcess) -> list[dict]:
    """The /stats entries of the connections that published (NSQ 1.3.0's "producers")."""
    return nsqd_stats(daemon).get("producers", [])


@pytest.fixture
def cluster(tmp_path_factory):
    """One nsqlookupd and one nsqd registered with it (more nsqd with ``cluster.start_nsqd()``)."""
    built = Cluster(tmp_path_factory.mktemp, lookupds=1, nsqds=1)
    yield built
    built.stop()


@pytest.fixture(scope="module")
def auth_server():
    """nsqd's --auth-http-address: secret "everything" grants all (identity "alice")."""
    with AuthServer() as server:
        yield server


@pytest.fixture
def fake_nsqd(nursery) -> Callable:
    """A listener speaking just enough V2 to test failures real nsqd does not produce on demand.

    ``await fake_nsqd(script)`` returns "host:port"; ``script(stream, first_bytes)`` runs for each
    connection after the magic and IDENTIFY were read (``first_bytes`` holds whatever came
    beyond them) and decides what the client sees next.
    """

    async def start(script) -> str:
        async def handle(stream: trio.SocketStream) -> None:
            data = b""
            while b"IDENTIFY\n" not in data or len(data) < data.index(b"IDENTIFY\n") + 13:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            start = data.index(b"IDENTIFY\n") + 9
            size = int.from_bytes(data[start : start + 4], "big")
            while len(data) < start + 4 + size:
                data += await stream.receive_some(65536)
            async with stream:
                await script(stream, data[start + 4 + size :])

        listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        return f"127.0.0.1:{port}"

    return start
