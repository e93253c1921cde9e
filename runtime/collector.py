"""Short full collections on a daemon that keeps many objects for long.

CPython's cyclic collector walks every container object in its oldest generation at each full collection, and makes
one each time that generation has grown by a quarter since the last. A node with 10,000 topics, 20,000 channels and
5,000 connections keeps most of a million such objects, and each full collection of them takes 0.5-0.7 s of CPU: on
an idle node, one falling in a 30-second window is two thirds of its CPU there; on a busy one, a stall of that long.

``FreezingCollector`` freezes (``gc.freeze``) what survives each full collection: it leaves the collector's
generations and is never walked again, so the next full collection (which still comes when CPython's rule says)
walks only what was made since. Frozen objects that become garbage are still freed by reference counting, as almost
everything in the daemons is (messages, buffers, requests); only a reference cycle (a topic and its channels, a
connection and its tasks) outlives its last outside reference until the collector sees it. So the daemon tells the
collector what it lets go of (``release``: a deleted topic or channel, a closed connection), and once that is more
than a quarter of what it keeps (and at least ``RELEASED_MIN``), everything frozen is handed back (``gc.unfreeze``):
the next full collection walks all of it once, frees those cycles, and freezes the survivors again. The memory held
by what was let go is so bounded by a quarter of what is kept (or by a few hundred objects on a small node), as the
growth between two full collections is by CPython's own rule.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

__all__ = ["RELEASED_MIN", "FreezingCollector"]

#: ...and at least this many: a small node would otherwise hand back everything frozen (the modules frozen at
#: start-up among it) at every few objects it lets go of, and walk it all at the next full collection
RELEASED_MIN = 256


class FreezingCollector:
    """Freezes what survives each full collection; hands it back once what the daemon let go of since outnumbers
    a quarter of what it keeps (``kept()``: the count of the same kind of objects, e.g. topics, channels and
    connections). ``install`` hooks it to the collector (process-wide); ``release`` works with or without."""

    def __init__(self, kept: Callable[[], int]) -> None:
        self._kept = kept
        self.released = 0  # objects let go of since the last unfreeze
        self.freezes = 0
        self.unfreezes = 0

    def install(self) -> None:
        if self._collected not in gc.callbacks:
            gc.callbacks.append(self._collected)

    def uninstall(self) -> None:
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)

    def _collected(self, phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 2:
            # (``released`` stays: what was let go of while frozen is still frozen, and a cycle among it still held)
            gc.freeze()
            self.freezes += 1

    def release(self, count: int = 1) -> None:
        """``count`` objects of the kind ``kept`` counts were let go of (they may be frozen, in a cycle)."""
        self.released += count
        if self.released >= RELEASED_MIN and self.released * 4 > self._kept() and gc.get_freeze_count():
            gc.unfreeze()  # the next full collection walks everything once (then freezes again)
            self.unfreezes += 1
            self.released = 0
