"""The HTTP answers that a running daemon rarely gives, checked on an in-process NSQD: /ping and /stats while a
disk queue is failing, and publishing while nsqd exits (503 EXITING)."""

from __future__ import annotations

import json

import pytest

from nsqd.http_api import build_router
from nsqd.options import Options
from nsqd.server import NSQD
from protocol.http import Request


@pytest.fixture
def nsqd(tmp_path):
    daemon = NSQD(Options(data_path=str(tmp_path), node_id=1))
    yield daemon
    for topic in list(daemon.topics.values()):
        topic.close(persist=False)


async def call(router, method: str, path: str, query: bytes = b"", body: bytes = b""):
    return await router.handle(Request(method, path, query, body=body, remote_address="127.0.0.1:1"))


async def test_unhealthy_ping_and_stats(nsqd):
    router = build_router(nsqd)
    topic = nsqd.get_topic("sick")
    response = await call(router, "GET", "/ping")
    assert (response.status, response.body) == (200, b"OK")
    topic.backend._record_error("write", OSError(28, "No space left on device"))  # as a failed write records it
    response = await call(router, "GET", "/ping")
    assert response.status == 500
    assert response.body == b"NOK - [Errno 28] No space left on device"
    assert response.header("X-Nsq-Content-Type") is None
    document = json.loads((await call(router, "GET", "/stats", b"format=json")).body)
    assert document["health"] == "NOK - [Errno 28] No space left on device"
    assert b"Health: NOK - [Errno 28]" in (await call(router, "GET", "/stats")).body


@pytest.mark.parametrize(
    "path, query, body",
    [
        ("/pub", b"topic=t", b"m"),
        ("/pub", b"topic=new_one", b"m"),
        ("/mpub", b"topic=t", b"a\nb"),
        ("/topic/create", b"topic=new_two", b""),
    ],
)
async def test_publishing_while_exiting_is_503(nsqd, path, query, body):
    router = build_router(nsqd)
    nsqd.get_topic("t")
    nsqd.exiting = True
    response = await call(router, "POST", path, query, body)
    assert (response.status, response.body) == (503, b'{"message":"EXITING"}')
    assert set(nsqd.topics) == {"t"}
    assert nsqd.topics["t"].message_count == 0
