"""The Spark side: which path a query takes, and the driver path's offsets, partitions and Arrow
batches over the write-ahead log.

Two paths (``readMode``): the *log path* (``log_source``: the driver plans offset ranges of nsqd's
log channels, the executors read them from nsqd) when every nsqd the query reads answers ``LOG``;
the *driver path* (below: a consumer in the driver writes a write-ahead log, the partitions carry
the messages) when one does not (NSQ's own nsqd answers ``E_INVALID invalid command LOG``), or with
``readMode=driver``. The choice is made at the first driver call and logged (``nsq source: the
log path ...`` / ``nsq source: the driver path ...``); a query restarted on a checkpoint stays on
the path whose offsets the checkpoint holds (version 2: log, version 1: driver).

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

import logging
from collections.abc import Iterator, Mapping

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .available_now import AvailableNowEnd
from .connection import NsqSourceError
from .consumer import ConsumerGroup
from .log_source import LOG_OFFSET_VERSION, LogPartition, LogPlanner, lookupd_nodes, probe, read_partition
from .options import READ_DRIVER, READ_LOG, SourceOptions
from .ranges import share, split
from .wal import ID_SIZE, Columns, WalError

log = logging.getLogger("spark_connector.stream_reader")

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


class NsqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._group: ConsumerGroup | None = None
        self._planner: LogPlanner | None = None
        self._path: str | None = None  # "log" or "driver", once chosen
        self._available_now: AvailableNowEnd | None = None  # the driver path's Trigger.AvailableNow end
        self._capped = False  # the driver path's byte bound applied (logged once)

    def __getstate__(self) -> dict:
        return {
            "options": self.options,
            "_group": None,
            "_planner": None,
            "_path": None,
            "_available_now": None,
            "_capped": False,
        }

    # -- which path ------------------------------------------------------------------------

    def _log_path(self, start: dict | None = None) -> LogPlanner | None:
        """The planner when the query is on the log path, None on the driver path (chosen at the
        first call: by the checkpoint's offsets when there is one, else by asking every nsqd)."""
        if self._path is None:
            self._path = self._choose(start)
        elif self._planner is not None and isinstance(start, dict) and start.get("version") == OFFSET_VERSION:
            # a driver-path checkpoint restarted in its first batch: Spark asked initialOffset (which
            # probed) before it named the checkpoint's offsets
            self._planner.stop()
            self._planner = None
            self._path = self._driver_path("the checkpoint was written on it")
        return self._planner

    def _choose(self, start: dict | None) -> str:
        opts = self.options
        version = start.get("version") if isinstance(start, dict) else None
        if opts.read_mode == READ_DRIVER or version == OFFSET_VERSION:
            why = "readMode=driver" if opts.read_mode == READ_DRIVER else "the checkpoint was written on it"
            return self._driver_path(why)
        addresses = list(opts.nsqd_addresses)
        if opts.lookupd_addresses:
            addresses += [a for a in lookupd_nodes(opts) if a not in addresses]
        found, without = probe(opts, addresses)
        if without and version == LOG_OFFSET_VERSION:
            raise NsqSourceError(
                f"nsq source: the checkpoint was written on the log path, but nsqd "
                f"{', '.join(without)} has no log channels"
            )
        if without:
            if opts.read_mode == READ_LOG:
                raise NsqSourceError(f"nsq source: readMode=log, but nsqd {', '.join(without)} has no log channels")
            return self._driver_path(f"nsqd {', '.join(without)} has no log channels")
        if not found:
            raise NsqSourceError("nsq source: no nsqd to read (lookupd lists none for the topic yet)")
        self._planner = LogPlanner(opts, found)
        return READ_LOG

    def _driver_path(self, why: str) -> str:
        if not self.options.wal_path:
            raise NsqSourceError(
                f"nsq source: the driver path ({why}) needs option walPath, a directory of its own "
                f"for the query's write-ahead log"
            )
        log.warning(
            "nsq source: the driver path (%s): a consumer in the driver reads %s/%s into the write-ahead log in %s",
            why,
            self.options.topic,
            self.options.channel,
            self.options.wal_path,
        )
        return READ_DRIVER

    def prepareForTriggerAvailableNow(self) -> None:
        planner = self._log_path()
        if planner is not None:
            planner.prepare_available_now()
        else:
            self._available_now = AvailableNowEnd(self.options.topic, self.options.channel)

    # -- driver side -----------------------------------------------------------------------

    def _started(self, floor: dict[str, int] | None = None) -> ConsumerGroup:
        if self._group is None:
            group = ConsumerGroup(self.options)
            group.start(floor)
            self._group = group
        self._group.raise_if_failed()
        return self._group

    def initialOffset(self) -> dict:
        planner = self._log_path()
        if planner is not None:
            return planner.initial_offset()
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
        planner = self._log_path(start)
        if planner is not None:
            return planner.latest_offset(start, limit)
        begin = parse_offset(start)
        group = self._started(begin)
        group.release(begin)  # the batches below it are in Spark's commit log
        if self._available_now is not None:
            bound = self._available_now.bound(group, begin)  # may wait for the consumers: before the ends are read
            available = {k: min(v, bound.get(k, begin.get(k, 0))) for k, v in self._available(group, begin).items()}
        else:
            available = self._available(group, begin)
        if isinstance(limit, ReadMaxRows):
            end = share(begin, available, limit.max_rows)
        else:
            end = {key: max(begin.get(key, 0), pos) for key, pos in available.items()}
        cap = self.options.batch_byte_cap
        if cap is not None:
            end = self._within_bytes(group, begin, end, cap)
        for key, position in begin.items():
            end.setdefault(key, position)
        return make_offset(end)

    def _within_bytes(
        self, group: ConsumerGroup, begin: dict[str, int], end: dict[str, int], cap: int
    ) -> dict[str, int]:
        """``end`` brought down so that the batch carries at most ``cap`` bytes of the logs, shared
        among the nsqd as ``maxOffsetsPerTrigger`` is (``share``, in bytes). Every message of a
        batch passes through the driver: pickled into the partitions by the source runner, held by
        the driver's JVM and copied into the tasks; without a bound, a backlog is one batch."""
        logs = group.wal.snapshot()
        sizes = {key: logs[key].bytes_between(begin.get(key, 0), pos) for key, pos in end.items() if key in logs}
        if sum(sizes.values()) <= cap:
            return end
        budgets = share(dict.fromkeys(sizes, 0), sizes, cap)
        bounded = dict(end)
        for key, budget in budgets.items():
            bounded[key] = logs[key].position_within(begin.get(key, 0), end[key], budget)
        if not self._capped:
            self._capped = True
            log.warning(
                "nsq source: the driver path: a micro-batch carries at most %d bytes of messages through the "
                "driver (%s); the backlog is read in batches of that size",
                cap,
                "maxBytesPerTrigger"
                if self.options.max_bytes_per_trigger
                else "the default; option maxBytesPerTrigger",
            )
        return bounded

    def reportLatestOffset(self) -> dict | None:
        if self._planner is not None:
            return self._planner.report_latest()
        if self._group is None or self._group.wal is None:
            return None
        return make_offset({k: m.synced_end for k, m in self._group.wal.snapshot().items()})

    def partitions(self, start: dict, end: dict) -> list:
        planner = self._log_path(end)
        if planner is not None:
            return planner.partitions(start, end)
        if start.get("version") != OFFSET_VERSION:
            start = self.initialOffset()
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
        for key, lo, hi in split(ranges, self.options.min_partitions):
            mlog = logs.get(key)
            if mlog is None:
                raise WalError(
                    f"nsq source: the write-ahead log in {self.options.wal_path} has no log of "
                    f"nsqd {key}, which the checkpoint refers to; was the walPath changed?"
                )
            parts.append(NsqPartition(key, self.options.topic, self.options.channel, lo, hi, mlog.read(lo, hi)))
        return parts

    def commit(self, end: dict) -> None:
        planner = self._log_path(end)
        if planner is not None:
            planner.commit(end)
            return
        positions = parse_offset(end)
        self._started(positions).commit(positions)

    def stop(self) -> None:
        if self._planner is not None:
            self._planner.stop()
            self._planner = None
        if self._group is not None:
            self._group.stop()
            self._group = None

    # -- executor side ---------------------------------------------------------------------

    def read(self, partition) -> Iterator:
        if isinstance(partition, LogPartition):
            return read_partition(self.options, partition)
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
            [
                ids.slice(lo, m),
                body,
                timestamps.slice(lo, m),
                attempts.slice(lo, m),
                *(pa.repeat(value, m) for value in constants),
            ],
            schema=schema,
        )
        lo = hi
