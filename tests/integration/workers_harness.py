"""nsqd with ``--workers=2`` for tests written against one process: ``TwoWorkers`` starts once both workers
listen (its ``kill``, as every daemon's, is a kill -9 of every process of the node)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from .harness import NsqdProcess, stop_all
from .persistence_helpers import DataDir

__all__ = ["TwoWorkers", "TwoWorkersDataDir", "two_workers_starter"]


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
