"""Group commit for disk queues: one fsync for every publish acknowledged in the same turn of the event loop.

With ``--sync-every=1`` each publish must be on disk before its ``OK``. Syncing inside every publish costs one
fsync per message even when many connections publish at once. Instead a publish made with ``defer_sync=True``
leaves its queue in the barrier, and each connection's writer calls ``commit()`` just before it sends bytes: the
first writer of the turn syncs every queue that joined, the others find the barrier empty. No ``OK`` can leave
before the commit that covers it, because the commit runs, without awaiting, before the ``send_all`` of any
writer, and a publish is handled before its ``OK`` is queued. Queues that were closed or deleted meanwhile are
skipped (closing syncs; a deleted queue's files must not come back).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .diskqueue import DiskQueue

__all__ = ["SyncBarrier"]


class SyncBarrier:
    """Queues owing a sync that was put off until an acknowledgement leaves (see the module notes)."""

    __slots__ = ("_owing", "commits")

    def __init__(self) -> None:
        self._owing: dict[DiskQueue, None] = {}  # insertion-ordered set
        self.commits = 0

    def __bool__(self) -> bool:
        return bool(self._owing)

    def owe(self, queue: DiskQueue) -> None:
        """``queue`` (a disk queue, or anything with ``closed`` and ``sync()``: nsqd.dat's writer) syncs at the next commit."""
        self._owing[queue] = None

    def commit(self) -> None:
        """Sync every queue that owes one (errors are logged and kept in the queue's ``last_error``)."""
        owing, self._owing = self._owing, {}
        for queue in owing:
            if not queue.closed:
                try:
                    queue.sync()
                except OSError:
                    pass
        self.commits += 1
