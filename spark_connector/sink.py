"""The ``nsq`` sink: ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Rows: ``body`` (binary or string) is required; ``topic`` (string), when present, routes each row to
its own topic (the ``topic`` option is the default for rows whose ``topic`` is null, and is not
needed when every row has one); ``deferMs`` (an integer), when present and above 0, sends the row
with ``DPUB`` so that nsqd delivers it after that many milliseconds. Other columns are ignored.

Each Spark task publishes its partition from the executor it runs on (``Publisher``): Spark hands
the rows over as Arrow record batches, and every batch becomes MPUB commands without a Python
object per row. The ``[size][body]`` pairs of an MPUB are built by Arrow: the big-endian sizes
(``array.byteswap`` of the lengths) as a 4-byte binary column joined element-wise to the bodies
(``binary_join_element_wise``) give one buffer whose offsets cut it into commands of at most
``batchMessages`` messages and ``batchBytes`` bytes; each command is its header plus a slice of that
buffer. A bad row (null or empty body, a body over ``maxMessageBytes``, an invalid or missing
topic, a negative ``deferMs``) fails the task with the row's position in the partition and the
reason; rows before it may already be published.

The task succeeds only when every command has nsqd's ``OK``. At-least-once: a task attempt after
a failed one, or a micro-batch run again after a restart, publishes its rows again; the commit
messages count what may have been published twice (``republished_rows``: rows of a task attempt
after the first; ``resent_messages``: messages sent again after a connection was lost), and the
driver logs them at each commit (and appends them to ``metricsPath`` as JSON lines when set).

======================== ========== ===============================================================
option                   default    meaning
======================== ========== ===============================================================
nsqd.tcp.addresses       --         comma-separated ``host:port`` of the nsqd to publish to
lookupd.http.addresses   --         nsqlookupd HTTP APIs: publish to every nsqd they know (/nodes);
                                    one of the two address options is required (both: the union)
topic                    --         topic of rows without a ``topic`` column value
batchMessages            500        messages per MPUB
batchBytes               5 MiB      MPUB body bytes at most (nsqd's ``--max-body-size``)
maxMessageBytes          1 MiB      largest body (nsqd's ``--max-msg-size``); larger rows fail
maxInFlight              8          MPUB commands awaiting nsqd's answer, per connection
responseTimeoutMs        30000      an nsqd that does not answer in this time is given up
metricsPath              --         file the driver appends each commit's counts to (JSON lines)
connectTimeoutMs, clientId, hostname, tls*, snappy, deflate*, auth.secret: as for the source
======================== ========== ===============================================================
"""

from __future__ import annotations

import json
import logging
import struct
import sys
import time
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, ByteType, IntegerType, LongType, ShortType, StringType, StructType

from protocol.names import is_valid_topic_name

from .options import SinkOptions
from .publisher import Command, Publisher, destinations

__all__ = ["NsqBadRowError", "NsqCommitMessage", "NsqStreamWriter", "NsqWriter", "check_schema"]

log = logging.getLogger("spark_connector.sink")

_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
_pack_mpub_sizes = struct.Struct(">ii").pack
_pack_size = struct.Struct(">i").pack


class NsqBadRowError(ValueError):
    """A row cannot be published; the message names its position and why."""


@dataclass
class NsqCommitMessage(WriterCommitMessage):
    partition: int
    attempt: int
    rows: int = 0
    messages: int = 0
    commands: int = 0
    retried_commands: int = 0
    resent_messages: int = 0
    republished_rows: int = 0
    per_nsqd: dict[str, int] = field(default_factory=dict)


def check_schema(schema: StructType, options: SinkOptions) -> dict[str, str]:
    """The real names of the ``body``, ``topic`` and ``deferMs`` columns (case-insensitive), after
    checking their types; raises ValueError with every problem."""
    by_name = {f.name.lower(): f for f in schema.fields}
    errors = []
    columns = {}
    body = by_name.get("body")
    if body is None:
        errors.append(f"a body column (binary or string) is required; the columns are {schema.fieldNames()}")
    elif not isinstance(body.dataType, (BinaryType, StringType)):
        errors.append(f"column body must be binary or string, not {body.dataType.simpleString()}")
    else:
        columns["body"] = body.name
    topic = by_name.get("topic")
    if topic is not None:
        if not isinstance(topic.dataType, StringType):
            errors.append(f"column topic must be a string, not {topic.dataType.simpleString()}")
        columns["topic"] = topic.name
    elif options.topic is None:
        errors.append("set the topic option or give the rows a topic column")
    defer = by_name.get("deferms")
    if defer is not None:
        if not isinstance(defer.dataType, _INTEGERS):
            errors.append(f"column deferMs must be an integer, not {defer.dataType.simpleString()}")
        columns["deferMs"] = defer.name
    if errors:
        raise ValueError("nsq sink: " + "; ".join(errors))
    return columns


def _task_context() -> tuple[int, int]:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return 0, 0
    return context.partitionId(), context.attemptNumber()


class _PartitionWriter:
    """Publishes one partition: Arrow batches in, commands to the ``Publisher``."""

    def __init__(self, options: SinkOptions, columns: dict[str, str], partition: int) -> None:
        self.options = options
        self.columns = columns
        self.partition = partition
        self.rows = 0
        self.publisher: Publisher | None = None
        self._valid_topics: set[str] = set()

    def bad(self, row: int, reason: str) -> NsqBadRowError:
        return NsqBadRowError(f"nsq sink: row {row} of partition {self.partition}: {reason}")

    def run(self, batches: Iterator) -> None:
        try:
            for batch in batches:
                if batch.num_rows:
                    self._write(batch)
                    self.rows += batch.num_rows
            if self.publisher is not None:
                self.publisher.finish()
        finally:
            if self.publisher is not None:
                self.publisher.close()

    def _send(self, command: Command) -> None:
        if self.publisher is None:
            self.publisher = Publisher(self.options, destinations(self.options), self.partition).open()
        self.publisher.send(command)

    def _write(self, batch) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        body = batch.column(self.columns["body"])
        if pa.types.is_string(body.type):
            body = body.view(pa.binary())
        elif pa.types.is_large_string(body.type):
            body = body.view(pa.large_binary())
        base = self.rows
        topic_name = self.columns.get("topic")
        defer_name = self.columns.get("deferMs")
        if topic_name is None and defer_name is None:
            topic = self.options.topic
            assert topic is not None  # options require a topic without a topic column
            self._check_topic(topic, base)
            self._mpub(topic, body, base, None)
            return
        n = batch.num_rows
        immediate = None
        if defer_name is not None:
            defer = pc.fill_null(batch.column(defer_name), 0)
            negative = pc.less(defer, 0)
            if pc.any(negative).as_py():
                row = pc.index(negative, True).as_py()
                raise self.bad(base + row, f"deferMs {defer[row].as_py()} is negative")
            deferred = pc.greater(defer, 0)
            if pc.any(deferred).as_py():
                immediate = pc.invert(deferred)
                self._dpub(batch, body, base, pc.indices_nonzero(deferred), defer)
            else:
                defer_name = None
        if topic_name is None:
            topics = None
            groups: list[Any] = [self.options.topic]  # set: options require a topic without a topic column
        else:
            topics = batch.column(topic_name)
            if self.options.topic is not None:
                topics = pc.fill_null(topics, self.options.topic)
            elif topics.null_count:
                row = pc.index(pc.is_null(topics), True).as_py()
                raise self.bad(base + row, "its topic is null and the topic option is not set")
            groups = pc.unique(topics).to_pylist()
        for topic in groups:
            mask = immediate if topics is None else pc.equal(topics, topic)
            if topics is not None:
                self._check_topic(topic, base + pc.index(topics, topic).as_py())
                if immediate is not None:
                    mask = pc.and_(mask, immediate)
            if mask is None:
                self._mpub(topic, body, base, None)
                continue
            indices = pc.indices_nonzero(mask)
            if len(indices) == n:
                self._mpub(topic, body, base, None)
            elif len(indices):
                self._mpub(topic, body.take(indices), base, indices)

    def _check_topic(self, topic: str, row: int) -> None:
        if topic in self._valid_topics:
            return
        if not is_valid_topic_name(topic):
            raise self.bad(row, f"topic {topic!r} is not a valid NSQ topic name")
        self._valid_topics.add(topic)

    def _check_bodies(self, body, base: int, indices) -> Any:
        """The bodies' lengths (int32 or int64); raises for the first null, empty or too large."""
        import pyarrow.compute as pc

        lengths = pc.binary_length(body)
        limit = self.options.max_message_bytes
        least, most = pc.min_max(lengths).values()
        if body.null_count == 0 and least.as_py() > 0 and most.as_py() <= limit:
            return lengths

        def row(k: int) -> int:
            return base + (k if indices is None else indices[k].as_py())

        if body.null_count:
            raise self.bad(row(pc.index(pc.is_null(body), True).as_py()), "its body is null")
        filled = pc.fill_null(lengths, 0)
        if least.as_py() == 0:
            raise self.bad(row(pc.index(filled, 0).as_py()), "its body is empty (nsqd refuses empty messages)")
        k = pc.index(pc.greater(filled, limit), True).as_py()
        raise self.bad(
            row(k), f"its body is {filled[k].as_py()} bytes, over maxMessageBytes={limit} (nsqd's --max-msg-size)"
        )

    def _mpub(self, topic: str, body, base: int, indices) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(body)
        lengths = self._check_bodies(body, base, indices).cast(pa.int32())
        sizes = array("i")
        sizes.frombytes(memoryview(lengths.buffers()[1])[lengths.offset * 4 : (lengths.offset + n) * 4])
        if sys.byteorder == "little":
            sizes.byteswap()
        prefix = pa.Array.from_buffers(pa.binary(4), n, [None, pa.py_buffer(sizes)]).cast(body.type)
        joined = pc.binary_join_element_wise(prefix, body, pa.scalar(b"", body.type))
        offsets = memoryview(joined.buffers()[1]).cast("q" if pa.types.is_large_binary(joined.type) else "i")
        offsets = offsets[joined.offset : joined.offset + n + 1]
        data = memoryview(joined.buffers()[2])
        line = b"MPUB " + topic.encode() + b"\n"
        per_command = self.options.batch_messages
        room = self.options.batch_bytes - 4  # the message count is part of MPUB's body
        i = 0
        while i < n:
            j = min(i + per_command, n)
            start = offsets[i]
            if offsets[j] - start > room:
                j = max(i + 1, bisect_right(offsets, start + room, i + 1, j + 1) - 1)
            end = offsets[j]
            first = base + (i if indices is None else indices[i].as_py())
            self._send(Command(line + _pack_mpub_sizes(end - start + 4, j - i), data[start:end], j - i, first))
            i = j

    def _dpub(self, batch, body, base: int, rows, defer) -> None:
        """Deferred rows, one DPUB each (a Python object per deferred row: DPUB has no batch form)."""
        topics = batch.column(self.columns["topic"]) if "topic" in self.columns else None
        subset = body.take(rows)
        self._check_bodies(subset, base, rows)
        for row, data in zip(rows.to_pylist(), subset.to_pylist(), strict=True):
            topic = topics[row].as_py() if topics is not None else None
            topic = topic if topic is not None else self.options.topic
            if topic is None:
                raise self.bad(base + row, "its topic is null and the topic option is not set")
            self._check_topic(topic, base + row)
            header = f"DPUB {topic} {defer[row].as_py()}\n".encode() + _pack_size(len(data))
            self._send(Command(header, data, 1, base + row))


def write_partition(options: SinkOptions, columns: dict[str, str], batches: Iterator) -> NsqCommitMessage:
    partition, attempt = _task_context()
    writer = _PartitionWriter(options, columns, partition)
    writer.run(batches)
    message = NsqCommitMessage(partition=partition, attempt=attempt, rows=writer.rows)
    if writer.publisher is not None:
        stats = writer.publisher.stats
        message.messages = stats.messages
        message.commands = stats.commands
        message.retried_commands = stats.retried_commands
        message.resent_messages = stats.resent_messages
        message.per_nsqd = dict(stats.per_nsqd)
    if attempt > 0:
        message.republished_rows = writer.rows
    return message


def summarize(messages: list, options: SinkOptions, batch_id: int | None, outcome: str) -> dict:
    """Totals of the tasks' commit messages; logged on the driver, appended to ``metricsPath``."""
    tasks = [m for m in messages if isinstance(m, NsqCommitMessage)]
    total = {"outcome": outcome, "tasks": len(tasks), "time": time.time()}
    if batch_id is not None:
        total["batchId"] = batch_id
    for key in ("rows", "messages", "commands", "retried_commands", "resent_messages", "republished_rows"):
        total[key] = sum(getattr(m, key) for m in tasks)
    per_nsqd: dict[str, int] = {}
    for m in tasks:
        for address, count in m.per_nsqd.items():
            per_nsqd[address] = per_nsqd.get(address, 0) + count
    total["per_nsqd"] = per_nsqd
    total["task_messages"] = [asdict(m) for m in tasks]
    log.info("nsq sink %s: %s", outcome, json.dumps({k: v for k, v in total.items() if k != "task_messages"}))
    if options.metrics_path:
        with open(options.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(total) + "\n")
    return total


class NsqWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, columns: dict[str, str]) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator) -> NsqCommitMessage:
        return write_partition(self.options, self.columns, iterator)

    def commit(self, messages: list) -> None:
        summarize(messages, self.options, None, "committed")

    def abort(self, messages: list) -> None:
        summarize(messages, self.options, None, "aborted")


class NsqStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, columns: dict[str, str]) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator) -> NsqCommitMessage:
        return write_partition(self.options, self.columns, iterator)

    def commit(self, messages: list, batchId: int) -> None:  # Spark's name
        summarize(messages, self.options, batchId, "committed")

    def abort(self, messages: list, batchId: int) -> None:  # Spark's name
        summarize(messages, self.options, batchId, "aborted")
