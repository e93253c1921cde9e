"""HeldIndex: which record of a replica store holds a message, by message ID, with a few entries per record.

A replica holds millions of an origin's messages; one dict entry per message cost a tenth of its loop and, now
and then, a resize of 10-37 ms. Message IDs come from one factory per node (``nsqd/guid.py``): they increase
over a node's publishes, so a MESSAGES frame's IDs are a sorted run, and the frames of an origin come with
ranges that do not overlap. Such a record is one *span*: its IDs as received (a sorted tuple), its first and
last ID, the set of those released so far (``gone``, None until the first) and how many it still holds. Spans
are kept sorted by their first ID in two parallel lists: the span of an ID is found by bisection, its place in
the span by bisection too.

Not every record is a span. A record whose IDs are not strictly increasing, or whose range overlaps a span's,
or that repeats an ID held already, is *loose*: its fresh IDs go in a dict (ID -> token), one entry per
message as before. That covers the streams where IDs are not monotonic: an origin re-replicating messages it
adopted (they carry another node's IDs, and come around a ring), a backfill (a message named once per channel
that holds it), a frame sent again. Each held ID is held by exactly one record (a span or the dict); a new
record never takes an ID that is held.

FINs come in batches of one channel, mostly in publish order: ``runs`` splits a batch into the IDs of each
record with one sort (nearly sorted already: timsort makes it linear) and two bisections per span, and a
batch that is a contiguous part of a span's IDs is checked with one comparison of slices. Only a batch with
gaps (FINs that skip a message still in flight) builds the span's set of IDs, once.

Tokens are the disk queue's record numbers (ints). Not thread-safe; the store calls it from the event loop.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterator
from itertools import groupby, islice, repeat
from operator import itemgetter, lt

__all__ = ["HeldIndex"]

_first = itemgetter(0)
_second = itemgetter(1)


class _Span:
    __slots__ = ("token", "ids", "lo", "hi", "gone", "members", "left")

    def __init__(self, token: int, ids: tuple[bytes, ...]) -> None:
        self.token = token
        self.ids = ids  # strictly increasing
        self.lo = ids[0]
        self.hi = ids[-1]
        self.gone: set[bytes] | None = None  # released IDs
        self.members: frozenset[bytes] | None = None  # ``ids`` as a set, built once the span is released in part
        self.left = len(ids)

    def held_of(self, run: list[bytes]) -> list[bytes]:
        """Those of ``run`` (sorted, within ``lo``..``hi``) this span holds."""
        ids = self.ids
        start = bisect_left(ids, run[0])
        if ids[start : start + len(run)] != tuple(run):  # not a contiguous part of the span: look at each ID
            members = self.members
            if members is None:
                members = self.members = frozenset(ids)
            run = [msg_id for msg_id in run if msg_id in members]
        gone = self.gone
        if gone and not gone.isdisjoint(run):
            run = [msg_id for msg_id in run if msg_id not in gone]
        return run

    def holds(self, msg_id: bytes) -> bool:
        ids = self.ids
        at = bisect_left(ids, msg_id)
        return at < len(ids) and ids[at] == msg_id and (self.gone is None or msg_id not in self.gone)


class _Loose:
    __slots__ = ("token", "ids", "left")

    def __init__(self, token: int, ids: tuple[bytes, ...]) -> None:
        self.token = token
        self.ids = ids  # those it took (held by no record when it came)
        self.left = len(ids)


class HeldIndex:
    """Message ID -> token of the record that holds it (see the module notes). ``len``, ``in`` and iteration
    see the held IDs."""

    __slots__ = ("_los", "_spans", "_by_token", "_loose", "_count")

    def __init__(self) -> None:
        self._los: list[bytes] = []  # the spans' first IDs, sorted
        self._spans: list[_Span] = []  # in the same order
        self._by_token: dict[int, _Span | _Loose] = {}
        #: message id -> token, for the loose records: int values keep it out of the garbage collector's passes
        self._loose: dict[bytes, int] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, msg_id: bytes) -> bool:
        return self.get(msg_id) is not None

    def __iter__(self) -> Iterator[bytes]:
        yield from self._loose
        for span in self._spans:
            gone = span.gone
            yield from (span.ids if gone is None else (msg_id for msg_id in span.ids if msg_id not in gone))

    @property
    def loose(self) -> int:
        """How many held IDs are in the dict (not in spans)."""
        return len(self._loose)

    @property
    def spans(self) -> int:
        return len(self._spans)

    def add(self, token: int, ids: tuple[bytes, ...]) -> tuple[bytes, ...]:
        """Hold for record ``token`` those of ``ids`` held by no record; returns them (``ids`` itself when all)."""
        if not ids:
            return ()
        loose = self._loose
        lo, hi = ids[0], ids[-1]
        if (
            (len(ids) == 1 or all(map(lt, ids, islice(ids, 1, None))))
            and not self._overlaps(lo, hi)
            and (not loose or loose.keys().isdisjoint(ids))
        ):
            span = _Span(token, ids)
            at = bisect_right(self._los, lo)
            self._los.insert(at, lo)
            self._spans.insert(at, span)
            self._by_token[token] = span
            self._count += len(ids)
            return ids
        get = self.get
        fresh = tuple(dict.fromkeys(msg_id for msg_id in ids if get(msg_id) is None))
        if fresh:
            loose.update(dict.fromkeys(fresh, token))
            self._by_token[token] = _Loose(token, fresh)
            self._count += len(fresh)
        return fresh

    def _overlaps(self, lo: bytes, hi: bytes) -> bool:
        # spans do not overlap: the one that starts last at or before ``hi`` ends last among those
        at = bisect_right(self._los, hi) - 1
        return at >= 0 and self._spans[at].hi >= lo

    def _span_of(self, msg_id: bytes) -> _Span | None:
        at = bisect_right(self._los, msg_id) - 1
        if at < 0:
            return None
        span = self._spans[at]
        return span if msg_id <= span.hi else None

    def get(self, msg_id: bytes) -> int | None:
        """The token of the record that holds ``msg_id``, None if none does."""
        loose = self._loose
        if loose:
            token = loose.get(msg_id)
            if token is not None:
                return token
        span = self._span_of(msg_id)
        return span.token if span is not None and span.holds(msg_id) else None

    def runs(self, ids) -> list[tuple[int, list[bytes]]]:
        """``ids`` grouped by the record that holds them: ``(token, its held IDs among them)``; the IDs no
        record holds are left out. A record may come more than once (loose records: once per run)."""
        out: list[tuple[int, list[bytes]]] = []
        loose = self._loose
        rest = ids
        if loose:
            tokens = list(map(loose.get, ids))
            for token, run in groupby(zip(tokens, ids, strict=True), key=_first):
                if token is not None:
                    out.append((token, list(map(_second, run))))
            rest = [msg_id for token, msg_id in zip(tokens, ids, strict=True) if token is None]
        spans, los = self._spans, self._los
        if not spans or not rest:
            return out
        rest = sorted(rest)
        pos, end = 0, len(rest)
        while pos < end:
            msg_id = rest[pos]
            at = bisect_right(los, msg_id) - 1
            if at < 0 or spans[at].hi < msg_id:  # between spans: go on at the next span's first ID
                if at + 1 >= len(spans):
                    break
                pos = bisect_left(rest, los[at + 1], pos)
                continue
            span = spans[at]
            stop = bisect_right(rest, span.hi, pos)
            held = span.held_of(rest[pos:stop])
            if held:
                out.append((span.token, held))
            pos = stop
        return out

    def release(self, token: int, ids) -> int:
        """Release those of ``ids`` (IDs of record ``token``) that it holds; returns how many."""
        entry = self._by_token.get(token)
        if entry is None:
            return 0
        if isinstance(entry, _Loose):
            loose = self._loose
            mine = [msg_id for msg_id in ids if loose.get(msg_id) == token]
            before = len(loose)
            deque(map(loose.pop, mine, repeat(None)), maxlen=0)
            count = before - len(loose)
            entry.left -= count
            self._count -= count
            if entry.left == 0:
                del self._by_token[token]
            return count
        gone = entry.gone
        if gone is None and len(ids) == entry.left and (ids if type(ids) is tuple else tuple(ids)) == entry.ids:
            count = entry.left  # the whole span at once (its FINs in order): no set of them
        else:
            # only the span's own IDs not released yet count: a wrong count would let the disk queue drop the
            # record while it still holds messages
            members = entry.members
            if members is None:
                members = entry.members = frozenset(entry.ids)
            fresh = members.intersection(ids)
            if gone is None:
                entry.gone = set(fresh)
            else:
                fresh -= gone
                gone |= fresh
            count = len(fresh)
        entry.left -= count
        self._count -= count
        assert entry.left >= 0, "released IDs a span does not hold"
        if entry.left == 0:
            self._drop(entry)
        return count

    def _drop(self, span: _Span) -> None:
        at = bisect_left(self._los, span.lo)
        assert self._spans[at] is span
        del self._los[at]
        del self._spans[at]
        del self._by_token[span.token]

    def held_ids(self, token: int) -> list[bytes]:
        """The IDs record ``token`` holds, in its order."""
        entry = self._by_token.get(token)
        if entry is None:
            return []
        if type(entry) is _Span:
            gone = entry.gone
            return list(entry.ids) if not gone else [msg_id for msg_id in entry.ids if msg_id not in gone]
        loose = self._loose
        return [msg_id for msg_id in entry.ids if loose.get(msg_id) == token]

    def pop(self, msg_id: bytes) -> int | None:
        """Release ``msg_id``; returns the token of the record that held it (None if none did)."""
        token = self.get(msg_id)
        if token is not None:
            self.release(token, (msg_id,))
        return token

    def clear(self) -> None:
        self._los.clear()
        self._spans.clear()
        self._by_token.clear()
        self._loose.clear()
        self._count = 0
