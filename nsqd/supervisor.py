"""``--workers N`` above 1: the parent process that starts N workers and watches them (no trio here).

The entry point has locked the data directory and bound every listening socket (``metadata.prebind``) before
this runs, so an address given with port 0 is resolved once and every worker serves the same one: the workers
are forked from the parent and inherit the listening sockets (TCP, HTTP, HTTPS and unix sockets alike; each
listening socket is one file shared by N processes, and the kernel hands each new connection to one of the
processes waiting in ``accept``), the data directory's lock and one unix socketpair to each other worker
(``workers.WorkerMesh``: what crosses between them, and why); each worker but 0 has a second one to worker 0, on
which it waits, blocked, for nsqd.dat to be written in durable mode (``workers.RelayMetadata.sync``).

The parent serves no client. It waits for its workers: SIGTERM or SIGINT is passed on to every worker, each of
which stops gracefully (its topics persisted as by one nsqd), and the parent exits 0 once all have. A worker that
ends otherwise (killed, crashed, or stopped on its own) stops the node: the others are stopped gracefully and the
parent exits 1, as one nsqd exits after a crash, for its supervisor (systemd, a container runtime) to restart.
No topic is served by a half node: every topic has exactly one owner, and a node without one of its owners is
not a node. Each worker dies with the parent (``PR_SET_PDEATHSIG``), so a killed parent leaves no orphan holding
the sockets.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import time

from .metadata import Prebound

__all__ = ["MeshSockets", "start_workers"]

log = logging.getLogger("nsqd")

_PR_SET_PDEATHSIG = 1


class MeshSockets:
    """What a worker takes from the parent: its number, the number of workers, its end of the socketpair to each
    other worker (``peer -> socket``) and of those that ask worker 0 to write nsqd.dat (``metadata_links``: in
    worker 0 one per other worker, in the others the one to worker 0)."""

    __slots__ = ("index", "count", "links", "start_time", "metadata_links")

    def __init__(
        self,
        index: int,
        count: int,
        links: dict[int, socket.socket],
        start_time: int,
        metadata_links: dict[int, socket.socket] | None = None,
    ) -> None:
        self.index = index
        self.count = count
        self.links = links
        self.start_time = start_time  # the node's, for /stats and /info: the same in every worker
        self.metadata_links = metadata_links or {}


_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def start_workers(opts, prebound: Prebound) -> Prebound:
    """Fork ``opts.workers`` workers. In each worker: returns ``prebound`` with its ``mesh`` set. In the parent:
    supervises them and never returns (``SystemExit`` with the node's exit code)."""
    from .queues.atomic_file import remove_stray_temporaries  # light

    for name in remove_stray_temporaries(opts.data_path or os.getcwd()):  # before any worker writes one
        log.info("NSQ: removed %s, a temporary file left by an interrupted write", name)
    count = opts.workers
    pairs = {(i, j): socket.socketpair() for i in range(count) for j in range(i + 1, count)}
    pairs.update({(0, -j): socket.socketpair() for j in range(1, count)})  # nsqd.dat's (``MeshSockets``)
    children: dict[int, int] = {}
    parent = os.getpid()
    start_time = int(time.time())
    # a SIGTERM before the parent's handler is set waits for it (``_supervise``), not the default (death); a
    # worker keeps them blocked until its trio receiver is set (``runtime.daemon.serve_until_signalled``)
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    for index in range(count):
        pid = os.fork()
        if pid == 0:
            return _become_worker(prebound, index, count, pairs, parent, start_time)
        children[pid] = index
    for left, right in pairs.values():
        left.close()
        right.close()
    log.info("NSQ: started %d workers (pids %s)", count, " ".join(str(pid) for pid in children))
    raise SystemExit(_supervise(children))


def _become_worker(prebound: Prebound, index: int, count: int, pairs: dict, parent: int, start_time: int) -> Prebound:
    from runtime import startup  # light; only a worker needs it here

    startup._BOUND_UNIX_PATHS.clear()  # the parent removes the socket files, once, at the end
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before the call above
        raise SystemExit(1)
    links: dict[int, socket.socket] = {}
    metadata_links: dict[int, socket.socket] = {}
    for (i, j), (left, right) in pairs.items():
        if j < 0:  # worker 0 and worker -j, for nsqd.dat
            if index == 0:
                metadata_links[-j] = left
                right.close()
            elif index == -j:
                metadata_links[0] = right
                left.close()
            else:
                left.close()
                right.close()
        elif i == index:
            links[j] = left
            right.close()
        elif j == index:
            links[i] = right
            left.close()
        else:
            left.close()
            right.close()
    prebound.mesh = MeshSockets(index, count, links, start_time, metadata_links)
    return prebound


def _supervise(children: dict[int, int]) -> int:
    """Wait for every worker; the node's exit code (0: all stopped after a signal, 1 otherwise)."""
    state = {"stopping": False, "code": 0}

    def stop_all() -> None:
        state["stopping"] = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def on_signal(signum, frame) -> None:
        if not state["stopping"]:
            log.info("NSQ: %s: stopping %d workers", signal.Signals(signum).name, len(children))
            stop_all()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    while children:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        index = children.pop(pid, None)
        if index is None:
            continue
        if os.WIFSIGNALED(status):
            how = f"was killed by signal {os.WTERMSIG(status)}"
        else:
            how = f"exited with code {os.waitstatus_to_exitcode(status)}"
        if state["stopping"] and how.endswith(" 0"):
            continue
        if state["stopping"]:
            log.error("NSQ: worker %d (pid %d) %s", index, pid, how)
        else:
            log.error("NSQ: worker %d (pid %d) %s: stopping the node", index, pid, how)
            stop_all()
        state["code"] = 1
    for signum in _STOP_SIGNALS:  # the node has stopped: a late signal must not kill the interpreter's exit
        signal.signal(signum, signal.SIG_IGN)
    return state["code"]
