"""A ring of nsqd with three copies (each node replicating to the next two), for the tests of three copies and of
a peer replaced."""

from __future__ import annotations

from pathlib import Path

from tests.integration.harness import NsqdProcess, RawClient, free_port
from tests.integration.http_helpers import post, stats, wait_for

__all__ = ["CopiesRing"]


class CopiesRing:
    """A ring where node i keeps copies on nodes i + 1 and i + 2 (three copies), started and replicating."""

    #: how long the ring may take to replicate once started
    ready_timeout = 30.0

    def __init__(
        self,
        tmp_path,
        daemons,
        size: int = 3,
        *args: str,
        candidates: bool = False,
        node_args: dict[int, tuple[str, ...]] | None = None,
    ) -> None:
        self.tmp_path = tmp_path
        self.daemons = daemons
        self.size = size
        self.args = args
        self.node_args = node_args or {}  # flags of one node, after (so over) the ring's
        self.candidates = candidates  # node i may replace a peer by i + 3 .. i - 1
        self.ports = [free_port() for _ in range(size)]
        self.nodes: list[NsqdProcess] = []
        self.live = list(range(size))
        for index in range(size):
            self.nodes.append(self.start(index))
        wait_for(self.healthy, timeout=self.ready_timeout, message="ring replicating")

    def address(self, index: int) -> str:
        return f"127.0.0.1:{self.ports[index % self.size]}"

    def node_dir(self, index: int) -> Path:
        return self.tmp_path / f"node{index}"

    def start(self, index: int) -> NsqdProcess:
        node = NsqdProcess(
            self.node_dir(index),
            [
                "--broadcast-address=127.0.0.1",
                f"--tcp-address={self.address(index)}",
                f"--replicate-to={self.address(index + 1)}",
                f"--replicate-to={self.address(index + 2)}",
                "--replica-takeover-timeout=1s",
                f"--node-id={index + 1}",
                *self.args,
                *self.node_args.get(index, ()),
                *(
                    f"--replication-candidates={self.address(index + k)}"
                    for k in range(3, self.size)
                    if self.candidates
                ),
            ],
        )
        self.daemons.append(node)
        node.start()
        if len(self.nodes) > index:
            self.nodes[index] = node
        return node

    def doc(self, index: int) -> dict:
        return stats(self.nodes[index].http())

    def healthy(self) -> bool:
        for index in self.live:
            doc = self.doc(index)["replication"]
            if doc["state"] != "replicating" or any(peer["pending_messages"] for peer in doc["peers"]):
                return False
            if any(peer["state"] != "connected" or peer["lagging"] for peer in doc["peers"]):
                return False
        return True

    def held(self, holder: int, origin: int) -> int:
        for entry in self.doc(holder)["replication"]["replicas"]:
            if entry["node"] == self.address(origin):
                return entry["held_messages"]
        return 0

    def depth(self, index: int, channel: str = "c") -> int:
        for topic in self.doc(index)["topics"] or ():
            if topic["topic_name"] == "t":
                for entry in topic["channels"]:
                    if entry["channel_name"] == channel:
                        return entry["depth"] + entry["in_flight_count"] + entry["deferred_count"]
        return 0

    def publish(self, index: int, count: int, tag: str) -> None:
        post(self.nodes[index].http(), "/topic/create?topic=t")
        post(self.nodes[index].http(), "/channel/create?topic=t&channel=c")
        with RawClient(self.nodes[index].tcp) as producer:
            for number in range(count):
                producer.publish("t", f"{tag}-{number}".encode())
