"""The Spark side: offsets, partitions and Arrow batches over the write-ahead log.

Where each method runs: Spark builds this reader in several Python processes (the planner that
pickles ``read``, the source runner, every executor task). Only the source runner calls the
driver methods (``initialOffset``, ``latestOffset``, ``partitions``, ``commit``, ``stop``), and the
first of those calls starts the consumers (``ConsumerGroup``); ``__init__`` only keeps options,
and pickling drops the running state, so no other process ever opens a socket or the log.

Offsets have one fixed JSON shape: ``{"version": 1, "positions": {"<nsqd host:port>": <int>}}``,
keys sorted, where a position counts messages in that nsqd's log (end exclusive) and an absent
key means 0. A batch [start, end) of a log becomes one ``NsqPartition`` (or, with
``minPartitions``, several of consecutive messages, so that more Spark tasks share the work)
carrying the messages themselves (so executors need neither the log nor the network), and
``read`` turns it into Arrow record batches without a Python object per message.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .consumer import ConsumerGroup
from .options import SourceOptions
from .wal import ID_SIZE, Columns, WalError

__all__ = ["OFFSET_VERSION", "SCHEMA", "NsqPartition", "NsqStreamReader", "make_offset", "parse_offset"]

OFFSET_VERSION = 1

SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("body", BinaryType()),
        StructField("timestamp", TimestampType()),
        StructField("attempts", IntegerType()),
        StructField("nsqd", StringType()),
        StructField("topic", StringType()),
        StructField("channel", StringType()),
    ]
)

# Arrow batches handed to Spark stay under these bounds (binary offsets are 32-bit in Spark).
_MAX_ROWS_PER_BATCH = 1 << 17
_MAX_BYTES_PER_BATCH = 256 << 20


def make_offset(positions: Mapping[str, int]) -> dict:
    """The offset JSON object; zero positions are left out so that an idle new nsqd does not
    make an empty micro-batch."""
    return {
        "version": OFFSET_VERSION,
        "positions": {key: int(positions[key]) for key in sorted(positions) if positions[key] > 0},
    }


def parse_offset(offset: Mapping) -> dict[str, int]:
    if not isinstance(offset, Mapping) or offset.get("version") != OFFSET_VERSION:
        raise WalError(
            f"nsq source: offset {offset!r} is not of this source's format "
            f'{{"version": {OFFSET_VERSION}, "positions": {{...}}}}; was the checkpoint written by another source?'
        )
    positions = offset.get("positions")
    if not isinstance(positions, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in positions.items()
    ):
        raise WalError(f"nsq source: offset {offset!r} has malformed positions")
    return dict(positions)


class NsqPartition(InputPartition):
    """Messages [start, end) of one nsqd's log, with their columns: ``ids`` (16 bytes each),
    ``timestamps`` (int64 ns), ``attempts`` (uint16) and ``body_sizes`` (uint32) as arrays in
    native byte order, ``bodies`` concatenated."""

    def __init__(self, nsqd: str, topic: str, channel: str, start: int, end: int, columns: Columns) -> None:
        self.nsqd, self.topic, self.channel, self.start, self.end = nsqd, topic, channel, start, end
        self.ids = columns.ids
        self.timestamps = columns.timestamps.tobytes()
        self.attempts = columns.attempts.tobytes()
        self.body_sizes = columns.body_sizes.tobytes()
        self.bodies = columns.bodies
        self.value = None

    def __repr__(self) -> str:
        return f"NsqPartition(nsqd={self.nsqd!r}, start={self.start}, end={self.end})"


def _share(start: dict[str, int], available: dict[str, int], budget: int) -> dict[str, int]:
    """Spread ``budget`` messages over the logs, evenly, giving what one log cannot use to the
    others (water filling). Returns the new end positions."""
    end = {key: start.get(key, 0) for key in available}
    active = sorted(key for key in available if available[key] > end[key])
    while budget > 0 and active:
        share = max(1, budget // len(active))
        for key in list(active):
            give = min(share, available[key] - end[key], budget)
            end[key] += give
            budget -= give
            if end[key] == available[key]:
                active.remove(key)
            if budget == 0:
                break
    return end


def _split(ranges: list[tuple[str, int, int]], min_partitions: int | None) -> list[tuple[str, int, int]]:
    """Cut the logs' ranges into pieces of at most ``ceil(total / min_partitions)`` messages, so
    that a batch makes at least about ``min_partitions`` Spark tasks (one per range without it)."""
    total = sum(hi - lo for _, lo, hi in ranges)
    if not min_partitions or len(ranges) >= min_partitions or total == 0:
        return ranges
    piece = -(-total // min_partitions)
    out = []
    for key, lo, hi in ranges:
        count = -(-(hi - lo) // piece)
        step = -(-(hi - lo) // count)
        out.extend((key, start, min(start + step, hi)) for start in range(lo, hi, step))
    return out


class NsqStreamReader(DataSourceStreamReader):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._group: ConsumerGroup | None = None

    def __getstate__(self) -> dict:
        return {"options": self.options, "_group": None}

    # -- driver side -----------------------------------------------------------------------

    def _started(self, floor: dict[str, int] | None = None) -> ConsumerGroup:
        if self._group is None:
            group = ConsumerGroup(self.options)
            group.start(floor)
            self._group = group
        self._group.raise_if_failed()
        return self._group

    def initialOffset(self) -> dict:
        group = self._started()
        committed = group.wal.read_committed()
        return make_offset(parse_offset(committed) if committed else {})

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_messages_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def _available(self, group: ConsumerGroup, start: dict[str, int]) -> dict[str, int]:
        logs = group.wal.snapshot()
        for key, position in start.items():
            mlog = logs.get(key)
            end = mlog.synced_end if mlog is not None else 0
            if position > end:
                raise WalError(
                    f"nsq source: the checkpoint is at position {position} of nsqd {key} but the "
                    f"write-ahead log in {self.options.wal_path} ends at {end}: the walPath was "
                    f"changed or its files deleted; restore it or start with a new checkpoint"
                )
        return {key: mlog.synced_end for key, mlog in logs.items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = parse_offset(start)
        group = self._started(begin)
        available = self._available(group, begin)
        if isinstance(limit, ReadMaxRows):
            end = _share(begin, available, limit.max_rows)
        else:
            end = {key: max(begin.get(key, 0), pos) for key, pos in available.items()}
        for key, position in begin.items():
            end.setdefault(key, position)
        return make_offset(end)

    def reportLatestOffset(self) -> dict | None:
        if self._group is None or self._group.wal is None:
            return None
        return make_offset({k: m.synced_end for k, m in self._group.wal.snapshot().items()})

    def partitions(self, start: dict, end: dict) -> list[NsqPartition]:
        begin = parse_offset(start)
        finish = parse_offset(end)
        group = self._started(finish)
        logs = group.wal.snapshot()
        ranges = []
        for key in sorted(finish):
            lo = begin.get(key, 0)
            if key in group.rebased:
                # below its first position, a log continued from the checkpoint has nothing: those
                # messages were not committed, nsqd delivers them again, at new positions
                lo = max(lo, logs[key].first_retained())
            if finish[key] > lo:
                ranges.append((key, lo, finish[key]))
        parts = []
        for key, lo, hi in _split(ranges, self.options.min_partitions):
            mlog = logs.get(key)
            if mlog is None:
                raise WalError(
                    f"nsq source: the write-ahead log in {self.options.wal_path} has no log of "
                    f"nsqd {key}, which the checkpoint refers to; was the walPath changed?"
                )
            parts.append(NsqPartition(key, self.options.topic, self.options.channel, lo, hi, mlog.read(lo, hi)))
        return parts

    def commit(self, end: dict) -> None:
        positions = parse_offset(end)
        self._started(positions).commit(positions)

    def stop(self) -> None:
        if self._group is not None:
            self._group.stop()
            self._group = None

    # -- executor side ---------------------------------------------------------------------

    def read(self, partition: NsqPartition) -> Iterator:
        return arrow_batches(partition)


def arrow_batches(p: NsqPartition) -> Iterator:
    """Arrow record batches of a partition, in SCHEMA's column order and types. Every column is
    built by Arrow from the partition's buffers (body offsets by a cumulative sum, ids by a cast
    of 16-byte values, the constant columns by ``pa.repeat``), with no Python work per message."""
    import pyarrow as pa
    import pyarrow.compute as pc

    schema = pa.schema(
        [
            ("id", pa.string()),
            ("body", pa.binary()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("attempts", pa.int32()),
            ("nsqd", pa.string()),
            ("topic", pa.string()),
            ("channel", pa.string()),
        ]
    )
    n = len(p.timestamps) // 8
    if n == 0:
        return
    sizes = pa.Array.from_buffers(pa.uint32(), n, [None, pa.py_buffer(p.body_sizes)])
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(sizes.cast(pa.int64()))])
    offsets_buf = offsets.buffers()[1]
    bodies_buf = pa.py_buffer(p.bodies)
    ids = pa.Array.from_buffers(pa.binary(ID_SIZE), n, [None, pa.py_buffer(p.ids)]).cast(pa.binary()).view(pa.string())
    ts = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(p.timestamps)])
    timestamps = pc.divide(ts, 1000).cast(pa.timestamp("us", tz="UTC"))
    attempts = pa.Array.from_buffers(pa.uint16(), n, [None, pa.py_buffer(p.attempts)]).cast(pa.int32())
    constants = [pa.scalar(value, pa.string()) for value in (p.nsqd, p.topic, p.channel)]

    lo = 0
    while lo < n:
        hi = min(n, lo + _MAX_ROWS_PER_BATCH)
        # Shrink the chunk until its bodies fit (at least one row per chunk).
        while hi > lo + 1 and offsets[hi].as_py() - offsets[lo].as_py() > _MAX_BYTES_PER_BATCH:
            hi = lo + max(1, (hi - lo) // 2)
        m = hi - lo
        body = pa.Array.from_buffers(pa.large_binary(), m, [None, offsets_buf, bodies_buf], offset=lo).cast(pa.binary())
        yield pa.RecordBatch.from_arrays(
            [ids.slice(lo, m), body, timestamps.slice(lo, m), attempts.slice(lo, m),
             *(pa.repeat(value, m) for value in constants)],
            schema=schema,
        )
        lo = hi
