"""How a micro-batch's offsets are shared and cut, the same on both paths: positions are per nsqd
(the driver path's write-ahead log positions, or nsqd's log offsets), ranges ``[lo, hi)``.

- ``share``: a ``maxOffsetsPerTrigger`` budget spread over the nsqd evenly, what one cannot use
  going to the others (water filling), so that a busy nsqd does not starve a quiet one.
- ``split``: ranges cut into pieces of at most ``ceil(total / minPartitions)`` messages, so that
  a batch makes at least about ``minPartitions`` Spark tasks (one per nsqd without it).
"""

from __future__ import annotations

__all__ = ["share", "split"]


def share(start: dict[str, int], available: dict[str, int], budget: int) -> dict[str, int]:
    """The new end positions when at most ``budget`` messages are taken above ``start`` out of
    ``available`` (each nsqd's end)."""
    end = {key: start.get(key, 0) for key in available}
    active = sorted(key for key in available if available[key] > end[key])
    while budget > 0 and active:
        each = max(1, budget // len(active))
        for key in list(active):
            give = min(each, available[key] - end[key], budget)
            end[key] += give
            budget -= give
            if end[key] == available[key]:
                active.remove(key)
            if budget == 0:
                break
    return end


def split(ranges: list[tuple[str, int, int]], min_partitions: int | None) -> list[tuple[str, int, int]]:
    """``ranges`` (nsqd, lo, hi) cut so that there are at least about ``min_partitions`` of
    consecutive messages; unchanged without ``min_partitions`` or when there are enough."""
    total = sum(hi - lo for _, lo, hi in ranges)
    if not min_partitions or len(ranges) >= min_partitions or total == 0:
        return ranges
    piece = -(-total // min_partitions)
    out: list[tuple[str, int, int]] = []
    for key, lo, hi in ranges:
        count = -(-(hi - lo) // piece)
        step = -(-(hi - lo) // count)
        out.extend((key, start, min(start + step, hi)) for start in range(lo, hi, step))
    return out
