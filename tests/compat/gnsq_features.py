"""gnsq (gevent) with nsqd's connection features, one run per subprocess (test_features_gnsq.py).

Usage: python -m tests.compat.gnsq_features <options JSON> <nsqd host:port> <topic>
options: {"tls": <CA file>, "snappy": bool, "deflate": <level>, "auth_secret": str}
gnsq's connection class publishes (PUB and MPUB), then consumes and publishes on the same connection, and a gnsq
Consumer receives and finishes everything, all with the options. Prints one JSON object; exits non-zero when something
does not arrive in time.
"""

from __future__ import annotations

import json
import sys

import gevent
import gevent.event
import gnsq

from tests.compat.client_process import Captured, capture_warnings, connection_options

WAIT = 20.0


def run(options: dict, address: str, topic: str, captured: Captured) -> dict:
    kwargs = connection_options(options, secret_as_bytes=True)  # gnsq takes the secret as bytes
    responses = {}
    # gnsq.Producer cannot take the OK that confirms an upgrade (its response queue for the connection does
    # not exist yet: KeyError in Producer.handle_response), so publish on gnsq's connection class directly.
    host, port = address.rsplit(":", 1)
    producer = gnsq.NsqdTCPClient(host, int(port), **kwargs)

    @producer.on_auth.connect
    def on_auth(conn, response):
        responses["auth"] = response

    singles = [b"single %d " % i * 40 for i in range(5)]
    batch = [b"batch %d " % i * (i + 1) for i in range(40)] + [b"big" * 30000]
    answers = []
    with gevent.Timeout(WAIT):
        producer.connect()
        responses["identify"] = producer.identify()
        for body in singles:
            producer.publish(topic, body)
            answers.append(producer.read_response()[1].decode())
        producer.multipublish(topic, batch)
        answers.append(producer.read_response()[1].decode())
        # the same connection consumes too (a topic of its own): check_ok takes the next frame and raises on a
        # message frame, so the PUB's answer has to come before the message it delivers back here
        own = topic + "_own"
        producer.subscribe(own, "own")
        producer.check_ok()
        producer.ready(1)
        producer.publish(own, b"to myself")
        producer.check_ok()
        frame, message = producer.read_response()
        responses["own"] = message.body.decode()
        message.finish()

    expected = singles + batch
    received: list[bytes] = []
    done = gevent.event.Event()
    consumer = gnsq.Consumer(topic, "features", [address], max_in_flight=20, **kwargs)

    @consumer.on_message.connect
    def on_message(consumer, message):
        received.append(message.body)
        message.finish()
        if len(received) == len(expected):
            done.set()

    consumer.start(block=False)
    complete = done.wait(WAIT)
    warnings = list(captured.records)
    consumer.close()
    producer.close_stream()
    with gevent.Timeout(WAIT):
        consumer.join()
    return {
        "answers": answers,
        "complete": bool(complete) and sorted(received) == sorted(expected),
        "received": len(received),
        "identify": responses.get("identify"),
        "auth": responses.get("auth"),
        "own": responses.get("own"),
        "warnings": warnings,
    }


def main() -> None:
    options, address, topic = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    captured = capture_warnings()
    print(json.dumps(run(options, address, topic, captured)), flush=True)


if __name__ == "__main__":
    main()
