"""Load for the replication fault tests: producers that record every publish's outcome and how long it took, and
consumers that count what each channel received.

``Publisher`` runs one thread publishing in turn with TCP PUB, TCP MPUB (``MPUB_SIZE`` bodies) and HTTP ``/pub``
to the node ``choose()`` names, each body unique; a refused or failed publish is recorded and, when ``retry`` is
set, tried on the next node (as a producer with several addresses does), else dropped. One TCP connection is kept
per node; one that its node closed meanwhile (the node died or restarted while this producer published elsewhere)
is replaced before a publish goes on it, as a producer library that reads its connections knows to: a publish on it
would be sent to a process that is gone. ``acked`` holds the bodies answered OK (or 200). ``Readers`` keeps one
consumer per (node, channel) reading and finishing what it receives, reconnecting when its node goes away, and
counts every body per channel."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass

from protocol.frames import FRAME_TYPE_MESSAGE
from protocol.message import decode_message
from tests.integration.harness import RawClient, command, consumer
from tests.integration.http_helpers import post

__all__ = ["Outcome", "Publisher", "Readers"]

MPUB_SIZE = 5


@dataclass
class Outcome:
    kind: str  # pub, mpub, http
    node: int
    bodies: list[str]
    started: float  # time.monotonic()
    ended: float
    ok: bool
    error: str = ""

    @property
    def duration(self) -> float:
        return self.ended - self.started


class Publisher:
    """One producer thread (see the module notes). ``addresses(index)``: that node's (tcp, http) addresses, None
    while the test knows it is down; ``choose()``: the node to try first."""

    def __init__(
        self,
        name: str,
        topic: str,
        addresses,
        choose,
        *,
        nodes: int = 1,
        retry: bool = False,
        timeout: float = 30.0,
        pause: float = 0.005,
    ) -> None:
        self.name = name
        self.topic = topic
        self.addresses = addresses
        self.choose = choose
        self.nodes = nodes
        self.retry = retry
        self.timeout = timeout
        self.pause = pause
        self.outcomes: list[Outcome] = []
        self.acked: list[str] = []
        #: kept connections found closed by their node before a publish went on them (not publishes: none was sent)
        self.found_closed = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"publisher-{name}", daemon=True)
        self._clients: dict[int, RawClient] = {}

    def start(self) -> Publisher:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(self.timeout + 10)
        assert not self.thread.is_alive(), f"publisher {self.name} stuck"

    def outcomes_after(self, moment: float) -> list[Outcome]:
        return [o for o in list(self.outcomes) if o.started >= moment]

    def _publish(self, kind: str, index: int, bodies: list[str]) -> None:
        address = self.addresses(index)
        if address is None:
            raise ConnectionRefusedError("node down")
        tcp, http = address
        if kind == "http":
            reply = post(http, f"/pub?topic={self.topic}", bodies[0].encode(), timeout=self.timeout)
            assert reply.status == 200, f"HTTP {reply.status} {reply.body!r}"
            return
        client = self._clients.get(index)
        if client is not None and client.closed_by_server():
            # the node closed it while this producer published elsewhere (it died, or restarted, since): a producer
            # that reads its connections knew, and publishes on a new one to the node as it is now
            self._clients.pop(index).close()
            self.found_closed += 1
            client = None
        if client is None:
            client = self._clients[index] = RawClient(tcp, timeout=self.timeout)
        try:
            if kind == "pub":
                client.publish(self.topic, bodies[0].encode())
            else:
                client.publish_many(self.topic, [body.encode() for body in bodies])
        except BaseException:
            self._clients.pop(index).close()
            raise

    def _run(self) -> None:
        kinds = itertools.cycle(("pub", "mpub", "http"))
        number = 0
        while not self.stopping.is_set():
            kind = next(kinds)
            bodies = [f"{self.name}-{number + i}" for i in range(MPUB_SIZE if kind == "mpub" else 1)]
            number += len(bodies)
            first = self.choose()
            for attempt in range(3 * self.nodes if self.retry else 1):
                index = (first + attempt) % self.nodes
                started = time.monotonic()
                try:
                    self._publish(kind, index, bodies)
                except Exception as exc:  # refused, failed, closed, timed out: recorded
                    self.outcomes.append(
                        Outcome(
                            kind, index, bodies, started, time.monotonic(), False, f"{type(exc).__name__}: {exc}"[:200]
                        )
                    )
                    if self.stopping.is_set():
                        break
                    time.sleep(0.05)
                    continue
                self.outcomes.append(Outcome(kind, index, bodies, started, time.monotonic(), True))
                self.acked.extend(bodies)
                break
            time.sleep(self.pause)
        for client in self._clients.values():
            client.close()


class Readers:
    """One consumer thread per (node, channel): reads with ``ready`` in flight, finishes each message, counts its
    body in ``received[channel]``; reconnects (every 0.2 s) while its node is down or away."""

    def __init__(self, topic: str, channels: tuple[str, ...], addresses, nodes: int, ready: int = 20) -> None:
        self.topic = topic
        self.channels = channels
        self.addresses = addresses
        self.ready = ready
        self.received: dict[str, Counter] = {channel: Counter() for channel in channels}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(index, channel), daemon=True)
            for index in range(nodes)
            for channel in channels
        ]

    def start(self) -> Readers:
        for thread in self.threads:
            thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(10)

    def missing(self, acked) -> dict[str, set[str]]:
        with self.lock:
            return {channel: set(acked) - counts.keys() for channel, counts in self.received.items()}

    def duplicates(self, acked) -> dict[str, int]:
        acked = set(acked)
        with self.lock:
            return {
                channel: sum(n - 1 for body, n in counts.items() if body in acked)
                for channel, counts in self.received.items()
            }

    def _run(self, index: int, channel: str) -> None:
        while not self.stopping.is_set():
            address = self.addresses(index)
            if address is None:
                time.sleep(0.2)
                continue
            try:
                with consumer(address[0], self.topic, channel, ready=self.ready) as client:
                    while not self.stopping.is_set():
                        frame = client.poll_frame(0.2)
                        if frame is None or frame.frame_type != FRAME_TYPE_MESSAGE:
                            continue
                        message = decode_message(frame.data)
                        with self.lock:
                            self.received[channel][message.body.decode()] += 1
                        client.send(command("FIN", message.id))
            except Exception:  # the node went away, or refused the subscription: again shortly
                time.sleep(0.2)
