"""nsqd with ``--workers=2`` for tests written against one process: ``TwoWorkers`` starts once both workers
listen, and its ``kill`` is a kill -9 of the whole node (``crash``), not of the parent alone (which its workers
outlive long enough to stop gracefully)."""

from __future__ import annotations

import os
import signal

from .harness import NsqdProcess
from .persistence_helpers import DataDir

__all__ = ["TwoWorkers", "TwoWorkersDataDir", "crash", "worker_pids"]


def worker_pids(node: NsqdProcess) -> list[int]:
    assert node.proc is not None
    with open(f"/proc/{node.proc.pid}/task/{node.proc.pid}/children") as handle:
        return [int(pid) for pid in handle.read().split()]


def crash(node: NsqdProcess) -> None:
    """kill -9 of the whole node at once: every process stopped first, so that none sees another die."""
    assert node.proc is not None
    if node.proc.poll() is None:
        pids = [node.proc.pid, *worker_pids(node)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        node.proc.wait(10)
    node.stop()  # joins the log reader


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

    def kill(self) -> None:
        if self.proc is not None:
            crash(self)


class TwoWorkersDataDir(DataDir):
    def start(self, process_class=TwoWorkers, **kwargs) -> NsqdProcess:
        return super().start(process_class, **kwargs)
