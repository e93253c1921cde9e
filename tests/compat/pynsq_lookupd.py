"""The real pynsq Reader finding nsqd through nsqlookupd, run as a subprocess by test_lookupd_discovery.py.

Usage: python -m tests.compat.pynsq_lookupd <lookupd http host:port,...> <topic> <message count>
Consumes (and finishes) ``count`` messages using only ``lookupd_http_addresses``, then prints one JSON object:
the bodies, the nsqd the Reader connected to, and every warning pynsq logged. Exits non-zero on timeout.
"""

from __future__ import annotations

import asyncio
import json
import sys

import nsq

from tests.compat.client_process import capture_warnings
from tests.compat.pynsq_scenarios import WAIT


async def consume(lookupds: list[str], topic: str, count: int) -> dict:
    received: asyncio.Queue = asyncio.Queue()

    def handler(message):
        received.put_nowait(message.body.decode())
        return True  # Reader sends FIN

    reader = nsq.Reader(
        topic=topic,
        channel="pynsq_lookupd",
        message_handler=handler,
        lookupd_http_addresses=[f"http://{address}" for address in lookupds],
        lookupd_poll_interval=1,
        max_in_flight=20,
    )
    bodies = [await asyncio.wait_for(received.get(), WAIT) for _ in range(count)]
    connected = sorted(reader.conns)
    reader.close()
    return {"bodies": bodies, "nsqd": connected}


def main() -> None:
    lookupds, topic, count = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
    captured = capture_warnings()
    result = asyncio.run(asyncio.wait_for(consume(lookupds, topic, count), 60))
    result["warnings"] = captured.records
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
