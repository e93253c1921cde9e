"""``--workers=2`` with ``TRIONSQ_SPREAD``: a busy owner gives producers of its hot topic to the other worker, so
that both workers read the topic's MPUBs; every acknowledged message is in the topic once, in each connection's
order, and the client sees one connection throughout."""

from __future__ import annotations

import re
import time

import pytest

from nsqd.workers import owner_of

from .harness import FRAME_TYPE_MESSAGE, NsqdProcess, RawClient, consumer, decode_message, fin, stop_all
from .http_helpers import post, stats
from .test_workers import owned_topics

pytestmark = pytest.mark.timeout(90)

PRODUCERS = 4
BATCH = 20  # 20 bodies of 200 bytes: a read of ~4 KiB, above the read poller's light reads
ROUNDS_AFTER = 15  # MPUBs each producer sends once a producer was spread


def body(producer: int, number: int) -> bytes:
    return f"{producer}:{number:07d}:".encode().ljust(200, b"x")


def test_a_busy_owners_producers_spread_and_every_message_stays_once_in_order(tmp_path):
    """``TRIONSQ_SPREAD=0,0``: whatever its load and the machine's, the owner gives one producer of big reads to
    the other worker every half second. The producers publish MPUBs in a closed loop until the owner has given
    one away and the other worker took it, then go on: both workers then read MPUBs of the topic (the worker's own
    counters, logged at its stop: the owner spread producers, the other worker acknowledged messages for the
    owner's topic beyond what the producers' first MPUBs carried), the topic holds each acknowledged message
    once, and one consumer gets each producer's messages in the order it published them."""
    topic = owned_topics("spread")[0]
    owner = owner_of(topic, 2)
    node = NsqdProcess(tmp_path / "data", ["--workers=2"])
    node.env["TRIONSQ_SPREAD"] = "0,0"
    node.start()
    try:
        for index in range(2):
            node.wait_for_log(rf"NSQ: worker {index} of 2", 20)
        node.wait_for_log(r"HTTP: listening on ", 20)
        http = node.listening["HTTP"]
        assert post(http, f"/topic/create?topic={topic}").status == 200
        assert post(http, f"/channel/create?topic={topic}&channel=all").status == 200
        producers = [RawClient(node.tcp) for _ in range(PRODUCERS)]
        for index, producer in enumerate(producers):
            producer.identify({"user_agent": f"spread-{index}"})
        sent = [0] * PRODUCERS

        def one_round() -> None:
            for index, producer in enumerate(producers):
                producer.publish_many(topic, [body(index, sent[index] + k) for k in range(BATCH)])
                sent[index] += BATCH

        deadline = time.monotonic() + 30
        while not re.search(rf"WORKERS: a producer goes to worker {1 - owner}", node.log_text()):
            assert time.monotonic() < deadline, node.log_text()
            one_round()
        node.wait_for_log(r"taken over from another worker", 10)
        for _ in range(ROUNDS_AFTER):
            one_round()
        total = sum(sent)
        document = stats(http, f"topic={topic}")
        assert document["topics"][0]["message_count"] == total
        assert sorted(entry["user_agent"] for entry in document["producers"]) == [
            f"spread-{index}" for index in range(PRODUCERS)
        ]
        counts = {entry["user_agent"]: entry["pub_counts"] for entry in document["producers"]}
        for index in range(PRODUCERS):
            assert counts[f"spread-{index}"] == [{"topic": topic, "count": sent[index]}]

        listener = consumer(node.tcp, topic, "all", ready=500)
        got: dict[int, list[int]] = {index: [] for index in range(PRODUCERS)}
        received = 0
        deadline = time.monotonic() + 30
        while received < total:
            assert time.monotonic() < deadline, f"received {received} of {total}"
            frame = listener.poll_frame(0.5)
            if frame is None:
                continue
            assert frame.frame_type == FRAME_TYPE_MESSAGE, frame
            message = decode_message(frame.data)
            producer, number, _ = message.body.split(b":", 2)
            got[int(producer)].append(int(number))
            received += 1
            listener.send(fin(message.id))
        assert listener.poll_frame(0.3) is None
        for index in range(PRODUCERS):
            assert got[index] == list(range(sent[index])), f"producer {index}: out of order, lost or repeated"
        listener.close()
        for producer in producers:
            producer.close()
    finally:
        stop_all([node])
    counters = {}
    for match in re.finditer(
        r"NSQ: worker (\d) sent .* spread (\d+) producer\(s\), acknowledged (\d+) message\(s\)", node.log_text()
    ):
        counters[int(match[1])] = (int(match[2]), int(match[3]))
    assert counters[owner][0] >= 1, counters  # the owner gave producers away
    # the other worker read MPUBs of the owner's topic: more than the first MPUB of each producer it accepted
    assert counters[1 - owner][1] > PRODUCERS * BATCH, counters
    assert counters[1 - owner][1] < total  # and the owner read some itself
