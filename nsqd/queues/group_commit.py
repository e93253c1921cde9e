"""Group commit for disk queues: one fsync for every publish acknowledged in the same turn of the event loop.

With ``--sync-every=1`` each publish must be on disk before its ``OK``. Syncing inside every publish costs one
fsync per message even when many connections publish at once. Instead a publish made with ``defer_sync=True``
leaves its queue in the barrier, and each connection's writer calls ``commit()`` just before it sends bytes: the
first writer of the turn syncs every queue that joined, the others find the barrier empty. No ``OK`` can leave
before the commit that covers it, because the commit runs, without awaiting, before the ``send_all`` of any
writer, and a publish is handled before its ``OK`` is queued. Queues that were closed or deleted meanwhile are
skipped (closing syncs; a deleted queue's files must not come back).

A sync that fails (an I/O error from ``fsync``) leaves its queue owing, and ``commit`` returns False: the writer
of a connection whose publish is not yet covered by a successful commit then closes that connection instead of
sending the ``OK`` (the producer sees no answer and publishes again, elsewhere if it must), and the next commit
tries that queue again.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["SyncBarrier", "Syncable"]


class Syncable(Protocol):
    """What can owe a sync: a disk queue (``diskqueue.DiskQueue``), nsqd.dat's writer. The barrier needs no more, so
    it does not import the disk queue, which imports it."""

    @property
    def closed(self) -> bool: ...

    def sync(self) -> None: ...


class SyncBarrier:
    """Queues owing a sync that was put off until an acknowledgement leaves (see the module notes)."""

    __slots__ = ("_owing", "commits", "failures")

    def __init__(self) -> None:
        self._owing: dict[Syncable, None] = {}  # insertion-ordered set
        self.commits = 0
        self.failures = 0  # commits that left a queue unsynced

    def __bool__(self) -> bool:
        return bool(self._owing)

    def owe(self, queue: Syncable) -> None:
        """``queue`` (a disk queue, or nsqd.dat's writer) syncs at the next commit."""
        self._owing[queue] = None

    def commit(self) -> bool:
        """Sync every queue that owes one; False when one of them failed (it is logged, kept in the queue's
        ``last_error``, and the queue still owes its sync)."""
        owing, self._owing = self._owing, {}
        synced = True
        for queue in owing:
            if not queue.closed:
                try:
                    queue.sync()
                except OSError:
                    self._owing[queue] = None
                    synced = False
        self.commits += 1
        if not synced:
            self.failures += 1
        return synced
