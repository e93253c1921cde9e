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
import logging
import ssl
import sys

import nsq

WAIT = 20.0


class Captured(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record):
        self.records.append(f"{record.name} {record.levelname} {record.getMessage()}")


def conn_options(options: dict) -> dict:
    kwargs = {}
    if options.get("tls"):
        kwargs["tls_v1"] = True
        kwargs["tls_options"] = {"cert_reqs": ssl.CERT_REQUIRED, "ca_certs": options["tls"]}
    if options.get("snappy"):
        kwargs["snappy"] = True
    if options.get("deflate"):
        kwargs["deflate"] = True
        kwargs["deflate_level"] = options["deflate"]
    if options.get("auth_secret"):
        kwargs["auth_secret"] = options["auth_secret"]
    return kwargs


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


async def publish(writer: nsq.Writer, method: str, *args) -> str:
    answer: asyncio.Future = asyncio.get_running_loop().create_future()
    getattr(writer, method)(*args, callback=lambda conn, data: answer.done() or answer.set_result(data))
    data = await asyncio.wait_for(answer, WAIT)
    return data.decode() if isinstance(data, bytes) else f"error: {data!r}"


async def run(options: dict, address: str, topic: str) -> dict:
    kwargs = conn_options(options)
    writer_seen: dict = {}
    writer = nsq.Writer([address], **kwargs)
    watch(writer, writer_seen)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while not any(conn.connected() for conn in writer.conns.values()):
        if loop.time() > deadline:
            raise TimeoutError("pynsq Writer did not get ready")
        await asyncio.sleep(0.02)
    [writer_conn] = writer.conns.values()
    bodies = [b"single %d " % i * 50 for i in range(5)]
    batch = [b"batch %d " % i * (i + 1) for i in range(40)] + [b"big" * 30000]
    answers = [await publish(writer, "pub", topic, body) for body in bodies]
    answers.append(await publish(writer, "mpub", topic, batch))

    received: asyncio.Queue = asyncio.Queue()
    reader_seen: dict = {}
    reader = nsq.Reader(topic=topic, channel="features", message_handler=lambda m: received.put_nowait(m.body) or True,
                        nsqd_tcp_addresses=[address], max_in_flight=20, **kwargs)
    watch(reader, reader_seen)
    got = [await asyncio.wait_for(received.get(), WAIT) for _ in range(len(bodies) + len(batch))]
    reader_layers = [layers(conn) for conn in reader.conns.values()]
    warnings_before_close = list(CAPTURED.records)  # closing makes pynsq log read errors of its own
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


CAPTURED = Captured()


def main() -> None:
    options, address, topic = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    logging.getLogger().addHandler(CAPTURED)
    logging.getLogger().setLevel(logging.INFO)
    result = asyncio.run(asyncio.wait_for(run(options, address, topic), 60))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
