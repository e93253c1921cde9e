"""A real pynsq Reader that finds nsqd through nsqlookupd and runs until it is killed, for the replication ring
test (test_replication_ring.py).

Usage: python -m tests.compat.pynsq_stream <lookupd http host:port> <topic> <channel>
Prints each message body on its own line (flushed) before it finishes the message.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import nsq


async def consume(lookupd: str, topic: str, channel: str) -> None:
    def handler(message):
        sys.stdout.write(message.body.decode() + "\n")
        sys.stdout.flush()
        return True  # Reader sends FIN

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    nsq.Reader(
        topic=topic,
        channel=channel,
        message_handler=handler,
        lookupd_http_addresses=[f"http://{lookupd}"],
        lookupd_poll_interval=1,
        max_in_flight=20,
    )
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(consume(*sys.argv[1:4]))
