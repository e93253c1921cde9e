"""Blocking file work of a disk queue, off the event loop: a FIFO of jobs, and reads ahead.

Why. The broker calls its disk queues from the event loop, and a few of their system calls can take milliseconds:
removing a segment file (4-6 ms for a 100 MB file on ext4, the kernel frees its blocks in ``unlink``), fsync of a
data file or of the meta file's replacement, fsync of the directory after a file is created, and reads that miss the
page cache. Done inline they stall every channel and connection of the daemon, not only the queue's own consumers.

``FileWorker`` runs one queue's jobs one at a time, in the order they were submitted, on a thread of trio's thread
cache (``trio.lowlevel.start_thread_soon``: no thread of our own, nothing to join, and it works outside ``trio.run``,
as the unit tests use it). A thread is taken only while jobs are queued; an idle queue holds none. Ordering is what
keeps the files consistent: a meta file written by a later job never goes back to an older state, an fsync of a
file always runs before the job that closes its descriptor, a directory fsync before the meta that names the new
file. ``wait_idle()`` blocks the caller until every job submitted so far has run; the queue calls it before any work
it must do inline (a sync that must be on disk when it returns, emptying, closing), so inline and background work
never interleave.

File descriptors. A descriptor handed to a job belongs to the worker from then on: the queue stops using it, and a
later job in the same FIFO closes it. A descriptor is therefore never closed while a job still needs it, and its
number cannot be reused under a pending job.

``ReadAhead`` is one positioned read running on a thread of the same cache while the caller decodes what the
previous read brought. The caller must not close the descriptor before ``result()`` has returned (``DiskQueue``
collects or waits for it before closing its read file).

Priority. A thread running file work lowers its own CPU priority (niceness ``WORKER_NICENESS``; Linux sets it per
thread), once, and keeps it: trio's cache may later lend it to ``trio.to_thread`` (name lookups), which does not
mind. Measured with nsqd confined to one core (as the benchmarks run it) on a machine busy with other processes:
at the loop's own priority, waking a worker cost the loop 0.6-1.5 ms on average and up to 22 ms, because the woken
thread took the core and the loop went to the back of the queue behind the other processes; at niceness 10 the
wake-up costs 0.03-0.3 ms on average. The price is paid only where the loop waits for the worker (a sync that must
be inline, closing, emptying) while other processes compete for the core: the worker then gets a smaller share.

Errors. A job's ``OSError`` goes to the ``on_error`` callback given with it (the queue logs it and keeps it in
``last_error``); any other exception is logged, and the worker goes on with the next job.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial

from trio.lowlevel import start_thread_soon

__all__ = ["FileWorker", "ReadAhead", "remove_in_steps"]

_default_log = logging.getLogger("nsqd")


#: Niceness of the threads running file work: below the event loop's priority, so that waking one does not take the
#: core from the loop, and the kernel time of an unlink or an fsync is mostly spent while the loop waits anyway.
WORKER_NICENESS = 10

_background = threading.local()


def _lower_priority() -> None:
    """Once per thread (trio's cache reuses them): raise this thread's niceness to ``WORKER_NICENESS``."""
    if getattr(_background, "niced", False):
        return
    _background.niced = True
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), WORKER_NICENESS))
    except OSError:
        pass


def _ignore(outcome) -> None:
    pass


class FileWorker:
    """One queue's blocking file jobs, run in order on a cached thread (see the module notes)."""

    __slots__ = ("name", "log", "_jobs", "_lock", "_idle", "_running", "submitted", "completed")

    def __init__(self, name: str, logger: logging.Logger | None = None) -> None:
        self.name = name
        self.log = logger if logger is not None else _default_log
        # entries are [job, on_error, key]; an entry still in the deque has not started
        self._jobs: deque[list] = deque()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._running = False
        self.submitted = 0
        self.completed = 0

    @property
    def busy(self) -> bool:
        """True while a submitted job has not finished."""
        return self._running

    def submit(
        self, job: Callable[[], object], on_error: Callable[[OSError], None] | None = None, *, key: object = None
    ) -> None:
        """Queue ``job``; it runs after every job submitted before it. Never blocks. With a ``key``, a job that
        is the last one queued, has not started and was submitted with the same key is replaced instead: a
        newer meta file supersedes an older one that nobody has written yet, so a slow disk does not pile up
        syncs."""
        with self._lock:
            jobs = self._jobs
            if key is not None and jobs and jobs[-1][2] == key:
                jobs[-1][0] = job
                jobs[-1][1] = on_error
                return
            jobs.append([job, on_error, key])
            self.submitted += 1
            if self._running:
                return
            self._running = True
        start_thread_soon(self._run, _ignore)

    def discard_last(self, key: object) -> None:
        """Drop the last queued job if it has not started and was submitted with ``key`` (a sync about to be done
        inline makes a queued one useless)."""
        with self._lock:
            jobs = self._jobs
            if key is not None and jobs and jobs[-1][2] == key:
                jobs.pop()
                self.submitted -= 1

    def wait_idle(self) -> None:
        """Block until every job submitted so far has run."""
        with self._lock:
            while self._running:
                self._idle.wait()

    def _run(self) -> None:
        _lower_priority()
        jobs = self._jobs
        while True:
            with self._lock:
                if not jobs:
                    self._running = False
                    self._idle.notify_all()
                    return
                job, on_error, _ = jobs.popleft()
            try:
                job()
            except OSError as exc:
                if on_error is not None:
                    on_error(exc)
                else:
                    self.log.error("DISKQUEUE(%s): background file operation failed - %s", self.name, exc)
            except BaseException:  # a bug in a job must not stop the queue's later jobs
                self.log.exception("DISKQUEUE(%s): background file operation crashed", self.name)
            with self._lock:
                self.completed += 1


#: bytes a segment file loses per step when it is removed (``remove_in_steps``), and the pause between steps.
#: A step's kernel work runs to its end on the core it started on (a kernel without preemption holds the event
#: loop that long where they share a core): on a file system mounted with ``discard``, 8 MB steps took 0.6-0.7 ms
#: of CPU each, 1 MB steps 0.11 ms, for 11 ms per 100 MB file instead of 8-10 (bench/HISTORY.md, change 20).
REMOVE_STEP = 1 << 20
REMOVE_PAUSE = 0.001


def remove_in_steps(path: str) -> None:
    """Delete a file: unlink its name, cut it down ``REMOVE_STEP`` bytes at a time through a descriptor opened
    before, and close that, which frees what is left. Freeing a whole 100 MB segment's blocks and cached pages
    at once is milliseconds of kernel work in one system call, on the core the worker shares with the event loop
    (nsqd confined to one core: the latency of another channel's messages rose by about a millisecond at p99
    around each removal, measured in bench/HISTORY.md item 13); in steps with a pause between them the same work
    comes in short pieces.
    The name goes first (the open descriptor keeps the blocks until it is closed): a process killed part-way
    leaves the whole file or nothing, never a file cut short that a restart would take for a damaged one.
    Raises ``OSError`` as ``os.remove`` would (``FileNotFoundError`` included). A job for the worker."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.remove(path)
        size = os.fstat(fd).st_size
        while size > REMOVE_STEP:
            size -= REMOVE_STEP
            os.ftruncate(fd, size)
            time.sleep(REMOVE_PAUSE)
    finally:
        os.close(fd)


def _read(fd: int, size: int, pos: int) -> bytes:
    _lower_priority()
    return os.pread(fd, size, pos)


class ReadAhead:
    """``os.pread(fd, size, pos)`` started on a cached thread; ``result()`` waits for it if needed."""

    __slots__ = ("pos", "size", "_data", "_error", "_done")

    def __init__(self, fd: int, size: int, pos: int) -> None:
        self.pos = pos
        self.size = size
        self._data = b""
        self._error: OSError | None = None
        self._done = threading.Event()
        start_thread_soon(partial(_read, fd, size, pos), self._deliver)

    def _deliver(self, outcome) -> None:
        try:
            self._data = outcome.unwrap()
        except OSError as exc:
            self._error = exc
        except BaseException as exc:  # reported to the reader as a read error
            self._error = OSError(str(exc))
        self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        """Wait for the read to end, whatever its outcome (before its descriptor may be closed)."""
        self._done.wait()

    def result(self) -> bytes:
        """The bytes read (fewer than asked at the end of the file); raises the read's OSError."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._data
