"""Scenarios for the real pynsq client (tornado IOLoop), run one per subprocess by test_pynsq.py.

Usage: python -m tests.compat.pynsq_scenarios <scenario> <nsqd host:port> <topic>
Prints one JSON object on stdout: what the client saw, plus every warning pynsq logged. Exits non-zero on timeout.
"""

from __future__ import annotations

import asyncio
import json
import sys

import nsq

from tests.compat.client_process import capture_warnings

WAIT = 20.0  # seconds any single step may take


async def wait_connected(writer: nsq.Writer) -> None:
    """Until one of the Writer's connections is ready (bounded by WAIT)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not any(conn.connected() for conn in writer.conns.values()):
        if loop.time() > deadline:
            raise TimeoutError("pynsq Writer did not connect")
        await asyncio.sleep(0.02)


async def connected_writer(address: str) -> nsq.Writer:
    writer = nsq.Writer([address])
    await wait_connected(writer)
    return writer


async def publish(writer: nsq.Writer, method: str, *args) -> str:
    """Call Writer.pub/mpub/dpub and return the server's answer as text."""
    answer: asyncio.Future = asyncio.get_running_loop().create_future()
    getattr(writer, method)(*args, callback=lambda conn, data: answer.done() or answer.set_result(data))
    data = await asyncio.wait_for(answer, WAIT)
    return data.decode() if isinstance(data, bytes) else f"error: {data!r}"


def describe(message: nsq.Message) -> dict:
    return {
        "id": message.id if isinstance(message.id, str) else message.id.decode(),
        "body": message.body.decode(),
        "attempts": message.attempts,
        "timestamp": message.timestamp,
    }


async def quiet(queue: asyncio.Queue, seconds: float) -> list:
    """Whatever arrives on `queue` within `seconds` (used to prove that nothing comes back)."""
    extra = []
    try:
        while True:
            extra.append(await asyncio.wait_for(queue.get(), seconds))
    except TimeoutError:
        return extra


async def scenario_publish_consume_finish(address: str, topic: str) -> dict:
    writer = await connected_writer(address)
    pub_answer = await publish(writer, "pub", topic, b"hello from pynsq")
    received: asyncio.Queue = asyncio.Queue()

    def handler(message):
        received.put_nowait(describe(message))
        return True  # Reader sends FIN

    reader = nsq.Reader(
        topic=topic,
        channel="pynsq",
        message_handler=handler,
        nsqd_tcp_addresses=[address],
        max_in_flight=1,
        msg_timeout=1,
    )
    first = await asyncio.wait_for(received.get(), WAIT)
    again = await quiet(received, 2.5)  # msg_timeout is 1 s: an unfinished message would be back by now
    reader.close()
    return {"pub": pub_answer, "first": first, "redelivered": again}


async def scenario_requeue_with_delay(address: str, topic: str) -> dict:
    writer = await connected_writer(address)
    pub_answer = await publish(writer, "pub", topic, b"requeue me")
    received: asyncio.Queue = asyncio.Queue()

    def handler(message):
        received.put_nowait(describe(message))
        message.enable_async()
        if message.attempts == 1:
            message.requeue(delay=1, backoff=False)  # REQ <id> 1000
        else:
            message.finish()

    reader = nsq.Reader(
        topic=topic, channel="pynsq", message_handler=handler, nsqd_tcp_addresses=[address], max_in_flight=1
    )
    first = await asyncio.wait_for(received.get(), WAIT)
    second = await asyncio.wait_for(received.get(), WAIT)
    reader.close()
    return {"pub": pub_answer, "first": first, "second": second}


async def scenario_touch(address: str, topic: str) -> dict:
    writer = await connected_writer(address)
    pub_answer = await publish(writer, "pub", topic, b"touch me")
    received: asyncio.Queue = asyncio.Queue()
    held: list = []

    def handler(message):
        received.put_nowait(describe(message))
        message.enable_async()
        held.append(message)

    reader = nsq.Reader(
        topic=topic,
        channel="pynsq",
        message_handler=handler,
        nsqd_tcp_addresses=[address],
        max_in_flight=2,
        msg_timeout=1,
    )
    first = await asyncio.wait_for(received.get(), WAIT)
    during = []
    for _ in range(8):  # 3.2 s of work against a 1 s msg_timeout, touching every 0.4 s
        during += await quiet(received, 0.4)
        held[0].touch()
    held[0].finish()
    after = await quiet(received, 2.5)
    reader.close()
    return {"pub": pub_answer, "first": first, "redelivered": during + after}


async def scenario_max_in_flight(address: str, topic: str) -> dict:
    writer = await connected_writer(address)
    pub_answer = await publish(writer, "mpub", topic, [b"m%02d" % i for i in range(50)])
    held: list = []
    bodies: list[str] = []
    peak = 0
    all_seen = asyncio.get_running_loop().create_future()

    def handler(message):
        nonlocal peak
        message.enable_async()
        held.append(message)
        bodies.append(message.body.decode())
        peak = max(peak, len(held))
        if len(held) == 10 or len(bodies) == 50:  # hold a full window, then release it
            for m in held:
                m.finish()
            held.clear()
        if len(bodies) == 50 and not all_seen.done():
            all_seen.set_result(None)

    reader = nsq.Reader(
        topic=topic, channel="pynsq", message_handler=handler, nsqd_tcp_addresses=[address], max_in_flight=10
    )
    await asyncio.wait_for(all_seen, WAIT)
    reader.close()
    return {"pub": pub_answer, "peak_in_flight": peak, "bodies": sorted(bodies)}


async def scenario_mpub_and_dpub(address: str, topic: str) -> dict:
    writer = await connected_writer(address)
    dpub_answer = await publish(writer, "dpub", topic, 2000, b"deferred")
    mpub_answer = await publish(writer, "mpub", topic, [b"batch-%d" % i for i in range(100)])
    received: asyncio.Queue = asyncio.Queue()

    def handler(message):
        received.put_nowait(message.body.decode())
        return True

    reader = nsq.Reader(
        topic=topic, channel="pynsq", message_handler=handler, nsqd_tcp_addresses=[address], max_in_flight=25
    )
    bodies = [await asyncio.wait_for(received.get(), WAIT) for _ in range(101)]
    reader.close()
    return {"dpub": dpub_answer, "mpub": mpub_answer, "bodies": bodies}


SCENARIOS = {name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")}


def main() -> None:
    scenario, address, topic = sys.argv[1:4]
    captured = capture_warnings()
    result = asyncio.run(asyncio.wait_for(SCENARIOS[scenario](address, topic), 60))
    result["warnings"] = captured.records
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
