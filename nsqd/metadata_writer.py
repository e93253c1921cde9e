"""Keeping ``nsqd.dat`` (``metadata.py``) following the daemon's topics, off the event loop.

nsqd 1.3.0 persists the whole file from a goroutine after every create and delete of a topic or channel (the
request that caused it does not wait), and synchronously, before answering, after an HTTP pause or unpause; at start-up
after loading, and at shutdown. Rewriting every topic and channel inline at each change grows with the number of topics
and holds the event loop (and every client) meanwhile: 7 ms per create at 2,000 topics. Here a change only marks its
topic: the writer task re-encodes the marked topics' entries (each topic keeps its encoded entry, so the work per change
follows that topic's channels, not the node's topics), joins the entries and hands the bytes to a file worker thread
(``queues/file_worker.py``), which writes the temporary file, fsyncs it and renames it. Changes are coalesced: one write
at most every ``interval`` (10 ms), or four times the last write's duration if longer (a large file on a slow disk keeps
the writer busy a fifth of the time at most), or fifty times the CPU the last write took (the writer uses 2% of a core
at most), the newest state each time.

Why CPU counts. The worker thread shares the loop's core when nsqd is confined to one (and often when it is not):
replacing the file of 10,000 topics takes it 1.7-2.3 ms of CPU, the kernel's copy of the new file into the page
cache, the fsync's submission and the old file's pages freed. Written every 10-14 ms through a storm of creates,
that was 10% of the core, taken in stretches of about a millisecond: the loop waited 200 ms in the run queue over
10,000 creates, and the p99 round trip of PUBs on another connection rose from 0.3 to 1.2-1.5 ms. Bounded by CPU
the file follows the storm every 100 ms or so (a single change after a quiet spell is still written at once), and
its pieces are written with short pauses between them (``replace_file``'s ``pause``), so the core comes back to
the loop between them. As in nsqd, creates and deletes are answered without waiting (the file follows within
``interval`` plus one write); a pause waits, like a durable publish waits for its group commit, for the write that
covers it (``flush``), and asks for it without the coalescing delay. Start-up and shutdown write inline
(``write_now``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from json.encoder import encode_basestring_ascii

import trio

from protocol.version import NSQ_VERSION

from .metadata import FILE_NAME, log
from .queues.atomic_file import replace_file
from .queues.file_worker import FileWorker

__all__ = ["MetadataWriter", "document_parts", "encode_topic"]


def encode_topic(topic) -> bytes:
    """One topic's entry of the ``topics`` list, as in ``json.dumps(snapshot(...), separators=(",", ":"))``, written
    directly (``json.dumps`` cost 8 us a topic: a storm of creates re-encodes every new one)."""
    channels = [
        f'{{"name":{_quote(c.name)},"paused":{_BOOLEAN[bool(c.paused)]}}}'
        for c in topic.channels.values()
        if not c.ephemeral
    ]
    listed = f"[{','.join(channels)}]" if channels else "null"
    return f'{{"name":{_quote(topic.name)},"paused":{_BOOLEAN[bool(topic.paused)]},"channels":{listed}}}'.encode()


#: a JSON string as ``json.dumps`` writes it (ASCII, escaped)
_quote = encode_basestring_ascii
_BOOLEAN = ("false", "true")


_DOCUMENT_END = b'],"version":"' + NSQ_VERSION.encode() + b'"}'
_EMPTY_DOCUMENT = b'{"topics":null,"version":"' + NSQ_VERSION.encode() + b'"}'


def document_parts(entries: list[bytes]) -> list[bytes]:
    """The whole file from the topics' encoded entries, in pieces to be written one after the other (byte for byte
    ``json.dumps`` of ``snapshot``, compact). Not joined: the file worker writes them with ``writev``, the
    interpreter lock released, where joining them made a new buffer of the file's size at each write with the lock
    held (0.2-9 ms for 670 KB at 10,000 topics here, the page faults of a fresh buffer dominating), and the event loop
    waited for it. Made without a loop of bytecode (a thread running bytecode keeps the lock for the interpreter's
    switch interval, 5 ms, while the loop asks for it)."""
    if not entries:
        return [_EMPTY_DOCUMENT]
    parts = [b","] * (2 * len(entries) + 1)
    parts[1:-1:2] = entries
    parts[0] = b'{"topics":['
    parts[-1] = _DOCUMENT_END
    return parts


class MetadataWriter:
    """Keeps ``nsqd.dat`` following the topics of ``topics`` (a live name -> ``Topic`` mapping), off the event loop
    and coalesced (see the module notes). ``mark(name)`` after any change to a topic, its channels or their paused
    flags; ``run`` is the writer task; ``flush()`` waits until the file holds every change marked before it."""

    #: the least time between the starts of two writes (the most a change waits before its write begins); during a
    #: storm of creates at 2,000 topics, 5 ms cost 0.43 ms of CPU per create (writes included), 20 ms 0.27 ms
    INTERVAL = 0.01
    #: and at least this many times the last write's duration: the writer is busy a fifth of the time at most (a
    #: 1.1 MB file, 10,000 topics with 2 channels each, takes 14 ms and 1.3 ms of CPU to replace here)
    BUSY_FACTOR = 4
    #: and at least this many times the CPU the last write took (its thread's time, kernel included)
    CPU_FACTOR = 50
    #: seconds between two ``writev`` of a write in the background (``replace_file``'s ``pause``); none inline
    WRITE_PAUSE = 0.0002

    def __init__(
        self, data_path: str, topics: dict, *, interval: float = INTERVAL, logger: logging.Logger | None = None
    ) -> None:
        self.path = os.path.join(data_path, FILE_NAME)
        self.topics = topics
        self.interval = interval
        self.log = logger if logger is not None else log
        self.entries: dict[str, bytes] = {}  # name -> encoded entry, in file order (non-ephemeral topics only)
        self.dirty: dict[str, None] = {}  # marked names, in order: a new topic's entry goes after the older ones
        self.changes = 0  # marks so far
        self.written = 0  # marks covered by the last finished write
        self.writes = 0
        self.worker = FileWorker(FILE_NAME, logger)
        self._running = False
        self._wake = trio.Event()  # a mark while the writer waits for one, or a flush
        self._idle = False  # the writer waits for a change (not for the coalescing delay to pass)
        self._urgent = False  # a flush waits: skip the coalescing delay
        self._written = trio.Event()  # set (and replaced) after each write
        self._next_start = 0.0
        self._last_duration = 0.0
        self._last_cpu = 0.0  # the worker thread's CPU for the last write (set there, read after its end)

    def mark(self, name: str) -> None:
        """The topic ``name`` (created, deleted, paused, or one of its channels) must be written again. Wakes the
        writer only when it waits for a change: while it waits out the coalescing delay, only a flush wakes it (a
        storm of creates would otherwise switch to it and back at each one)."""
        self.dirty[name] = None
        self.changes += 1
        if self._idle:
            self._wake.set()

    def mark_all(self) -> None:
        for name in self.topics:
            self.mark(name)

    def _build(self) -> list[bytes]:
        """Re-encode the marked topics; the entries of the file, in order. Costs the marked topics' channels and a
        copy of the list of entries (pointers), never an encoding of the unchanged ones."""
        entries = self.entries
        for name in self.dirty:
            topic = self.topics.get(name)
            if topic is None or topic.ephemeral:
                entries.pop(name, None)
            else:
                entries[name] = encode_topic(topic)
        self.dirty.clear()
        return list(entries.values())

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self._running = True
        task_status.started()
        try:
            while True:
                if self.written == self.changes:
                    self._idle = True
                    try:
                        await self._wake.wait()
                    finally:
                        self._idle = False
                    self._wake = trio.Event()
                    continue
                delay = self._next_start - trio.current_time()
                if delay > 0 and not self._urgent:
                    with trio.move_on_after(delay):
                        while not self._urgent:  # only a flush cuts the delay short
                            await self._wake.wait()
                            self._wake = trio.Event()
                await self._write()
        finally:
            self._running = False
            self._written.set()  # flushes still waiting write inline

    async def _write(self) -> None:
        self._urgent = False
        generation = self.changes
        entries = self._build()
        started = trio.current_time()
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def job() -> None:
            cpu = time.thread_time()
            try:
                self._replace(entries, self.WRITE_PAUSE)
            finally:
                self._last_cpu = time.thread_time() - cpu
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(done.set)

        self.worker.submit(job)
        with trio.CancelScope(shield=True):  # a write already handed over finishes before the task ends
            await done.wait()
        self._last_duration = trio.current_time() - started
        self._next_start = started + max(
            self.interval, self.BUSY_FACTOR * self._last_duration, self.CPU_FACTOR * self._last_cpu
        )
        self.written = generation
        self._written.set()
        self._written = trio.Event()

    def _replace(self, entries: list[bytes], pause: float = 0.0) -> None:
        self.log.info("NSQ: persisting topic/channel metadata to %s", self.path)
        try:
            replace_file(self.path, document_parts(entries), pause=pause)
            self.writes += 1
        except OSError as exc:  # as nsqd: logged, and the next change tries again
            self.log.error("failed to persist metadata - %s", exc)

    async def flush(self) -> None:
        """Return once a write that began after this call (so covering every change marked before it) has ended;
        at once when nothing is marked. Without the writer task running, writes inline."""
        target = self.changes
        while self.written < target:
            if not self._running:
                self.write_now()
                return
            self._urgent = True
            self._wake.set()
            written = self._written
            await written.wait()

    async def wait_written(self) -> None:
        """Return after the next write ends."""
        await self._written.wait()

    # -- durable mode: the sync barrier's group commit writes the file before an acknowledgement leaves --------
    closed = False

    def sync(self) -> None:
        """Write now if a change is not yet on disk (``SyncBarrier.commit``: in durable mode a publish to a topic
        created a moment ago is acknowledged only once nsqd.dat names the topic and its channels, or a kill -9
        would leave its messages in files no restart opens)."""
        if self.written < self.changes:
            self.write_now()

    def write_now(self) -> None:
        """Write the current state inline (start-up, shutdown), after any write in progress."""
        self.worker.wait_idle()
        generation = self.changes
        self._replace(self._build())
        self.written = max(self.written, generation)
