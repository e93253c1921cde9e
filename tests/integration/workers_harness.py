"""nsqd with ``--workers=2`` for tests written against one process: ``TwoWorkers`` starts once both workers
listen (its ``kill``, as every daemon's, is a kill -9 of every process of the node). ``DurableLoad``: the load of
the durable kill -9 loops with workers, and what it was told and given."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .harness import NsqdProcess, RawClient, stop_all
from .persistence_helpers import DataDir, consume_holding_some, publish_until_stopped, receive

__all__ = ["DurableLoad", "TwoWorkers", "TwoWorkersDataDir", "consume_all", "two_workers_starter"]


class TwoWorkers(NsqdProcess):
    def __init__(self, data_path, args=(), startup_timeout: float = 20.0) -> None:
        super().__init__(data_path, ["--workers=2", *args], startup_timeout)

    def start(self) -> TwoWorkers:
        super().start()
        for index in range(2):
            self.wait_for_log(rf"NSQ: worker {index} of 2", self.startup_timeout)
        line = 0
        for _ in range(2):
            line = self.lines.index(self.wait_for_log(r"HTTP: listening on ", 20, line).string, line) + 1
        return self


class TwoWorkersDataDir(DataDir):
    def start(self, process_class=TwoWorkers, **kwargs) -> NsqdProcess:
        return super().start(process_class, **kwargs)


def two_workers_starter(new_data_path: Callable[[], Path]) -> Iterator[Callable[..., TwoWorkers]]:
    """A fixture's generator: yields ``start(*flags)``, which starts a node on a new data directory; stops every
    node it started when resumed."""
    nodes: list[TwoWorkers] = []

    def start(*args: str) -> TwoWorkers:
        node = TwoWorkers(new_data_path(), args)
        nodes.append(node)
        return node.start()

    yield start
    stop_all(nodes)


def consume_all(node: NsqdProcess, topic: str, expected: set[bytes], timeout: float = 30.0) -> set[bytes]:
    """What channel ``c`` of ``topic`` delivers (FIN'd) until every body of ``expected`` came."""
    got: set[bytes] = set()
    with RawClient(node.tcp) as client:
        client.subscribe(topic, "c", ready=200)
        deadline = time.monotonic() + timeout
        while not expected <= got:
            left = deadline - time.monotonic()
            assert left > 0, f"{len(expected - got)} acknowledged message(s) of {topic} never delivered"
            got.update(m.body for m in receive(client, 1, timeout=left))
    return got


class DurableLoad:
    """PUBs and MPUBs to ``topics`` on three connections, each topic's channel ``c`` consumed with some messages
    held in flight, run against one node after another until each crashes; ``acked`` holds every (topic, body)
    that got OK, ``received`` counts every delivery."""

    def __init__(self, topics: list[str]) -> None:
        self.topics = topics
        self.acked: list[tuple[str, bytes]] = []
        self.received: collections.Counter[tuple[str, bytes]] = collections.Counter()
        self._counter = iter(range(10**9))  # body numbers, unique across the nodes

    def _acknowledged(self, topic: str, bodies: list[bytes]) -> None:
        self.acked.extend((topic, body) for body in bodies)

    def until_crash(self, node: NsqdProcess, crash: Callable[[NsqdProcess], None], more: int = 300) -> None:
        """Load ``node`` until ``more`` further publishes were acknowledged (within 60 s), then ``crash(node)``
        (a kill -9 of the node or of a worker) and stop the load."""
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=publish_until_stopped,
                args=(node.tcp, self.topics, stop, self._counter, self._acknowledged),
                daemon=True,
            )
            for _ in range(3)
        ]
        threads += [
            threading.Thread(
                target=consume_holding_some,
                args=(node.tcp, topic, stop, self.received, lambda body, t=topic: (t, body)),
                daemon=True,
            )
            for topic in self.topics
        ]
        for thread in threads:
            thread.start()
        target = len(self.acked) + more
        deadline = time.monotonic() + 60
        while len(self.acked) < target:
            assert time.monotonic() < deadline, f"only {len(self.acked)} acknowledged; log:\n{node.log_text()[-3000:]}"
            time.sleep(0.01)
        crash(node)
        stop.set()
        for thread in threads:
            thread.join(30)
            assert not thread.is_alive()

    def drain(self, node: NsqdProcess) -> int:
        """Consume every acknowledged message not delivered yet from ``node`` (each must come within 60 s);
        returns how many deliveries were duplicates."""
        for topic in self.topics:
            missing = {body for t, body in self.acked if t == topic} - {body for t, body in self.received if t == topic}
            consume_all(node, topic, missing, timeout=60)
        return sum(n - 1 for n in self.received.values() if n > 1)
