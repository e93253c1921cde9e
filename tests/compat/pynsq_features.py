"""pynsq (tornado) with nsqd's connection features, one run per subprocess (test_features_pynsq.py).

Usage: python -m tests.compat.pynsq_features <options JSON> <nsqd host:port> <topic>
options: {"tls": <CA file or absent>, "snappy": bool, "deflate": <level or absent>, "auth_secret": str}
A Writer publishes (PUB and MPUB) and a Reader consumes and finishes everything, both with the options.
Prints one JSON object: whether every body came back, the IDENTIFY and AUTH answers pynsq saw, the socket
layers it stacked, and every warning pynsq logged before the script closed its connections. Exits non-zero
on timeout.
"""

from __future__ import annotations

import asyncio
import json
import sys

import nsq

from tests.compat.client_process import Captured, capture_warnings, connection_options
from tests.compat.pynsq_scenarios import WAIT, publish, wait_connected


def layers(conn) -> list[str]:
    """The socket wrappers pynsq stacked, outermost first (SnappySocket, DeflateSocket, SSLSocket...)."""
    names = []
    sock = conn.socket
    while sock is not None:
        names.append(type(sock).__name__)
        sock = vars(sock).get("_socket") if hasattr(sock, "__dict__") else None
    return names


def watch(client, seen: dict) -> None:
    """Record the IDENTIFY and AUTH answers of the client's connections (hooks bound before it connects)."""
    for name, key in (("_on_connection_identify_response", "identify"), ("_on_connection_auth_response", "auth")):
        original = getattr(client, name)

        def hook(conn, data, _original=original, _key=key, **kwargs):
            seen[_key] = data
            return _original(conn=conn, data=data, **kwargs)

        setattr(client, name, hook)


async def run(options: dict, address: str, topic: str, captured: Captured) -> dict:
    kwargs = connection_options(options)
    writer_seen: dict = {}
    writer = nsq.Writer([address], **kwargs)
    watch(writer, writer_seen)
    await wait_connected(writer)
    [writer_conn] = writer.conns.values()
    bodies = [b"single %d " % i * 50 for i in range(5)]
    batch = [b"batch %d " % i * (i + 1) for i in range(40)] + [b"big" * 30000]
    answers = [await publish(writer, "pub", topic, body) for body in bodies]
    answers.append(await publish(writer, "mpub", topic, batch))

    received: asyncio.Queue = asyncio.Queue()
    reader_seen: dict = {}
    reader = nsq.Reader(
        topic=topic,
        channel="features",
        message_handler=lambda m: received.put_nowait(m.body) or True,
        nsqd_tcp_addresses=[address],
        max_in_flight=20,
        **kwargs,
    )
    watch(reader, reader_seen)
    got = [await asyncio.wait_for(received.get(), WAIT) for _ in range(len(bodies) + len(batch))]
    reader_layers = [layers(conn) for conn in reader.conns.values()]
    warnings_before_close = list(captured.records)  # closing makes pynsq log read errors of its own
    reader.close()
    writer_conn.close()
    return {
        "answers": answers,
        "complete": sorted(got) == sorted(bodies + batch),
        "writer_identify": writer_seen.get("identify"),
        "writer_auth": writer_seen.get("auth"),
        "reader_identify": reader_seen.get("identify"),
        "writer_layers": layers(writer_conn),
        "reader_layers": reader_layers,
        "warnings": warnings_before_close,
    }


def main() -> None:
    options, address, topic = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    captured = capture_warnings()
    result = asyncio.run(asyncio.wait_for(run(options, address, topic, captured), 60))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
