"""The log path: the driver plans offset ranges and commits them; each executor task reads its range
straight from its nsqd and makes Arrow batches of the frames' bytes.

When every nsqd a query reads offers log channels (``nsqd/LOG-PROTOCOL.md``), no message passes
through the driver: ``LogPlanner`` (in Spark's source runner) only asks each nsqd for its offsets
(``LOG``, one short request per nsqd and trigger), cuts ``[from, to)`` per nsqd into partitions,
and at Spark's commit sends ``LCOMMIT`` (everything below is finished in nsqd: out of the depth,
files removed, replicas told). A ``LogPartition`` is three values; the task that reads it opens
its own connection (``log_client.LogNode``), sends ``LREAD`` for what is left of its range, at
most ``fetchMaxBytes`` per answer, and turns each answer into one Arrow record batch with numpy
over the frame (``range_batch``): no write-ahead log, no Python object per message.

Offsets: ``{"version": 2, "nsqd": {"<host:port>": <offset>}}``, keys sorted; the offset is nsqd's
(the next message to read on that node). The driver path's offsets are version 1, so a checkpoint
tells which path wrote it and a restarted query stays on that path.

Exactly once with a replayable sink (Spark's file sink and a checkpoint): a batch's ranges are in
Spark's offset log before any task runs, a range reads the same messages every time (nsqd keeps
them until the commit), and the commit that finishes them in nsqd comes after the sink committed
the batch. A task retried, a driver restarted on its checkpoint, an nsqd restarted with its data
(SIGTERM; SIGKILL in durable mode): the batch is read again, the same messages. A range's nsqd
that does not answer (restarting) is dialled again for ``readRetryMs`` by the task (and by the
planner, which otherwise keeps that nsqd's offset where it was for this trigger).

Starting positions of a new query (``startingOffsets``, ``startingTimestamp``): ``committed``
(default: every message of the channel not finished yet, as a new consumer of an ordinary
channel would get; a channel that held a backlog is converted by ``LOG`` and its backlog read),
``earliest`` (the oldest retained, with nsqd's ``--log-retention-*``), ``latest``, an offset per
nsqd, or a time (``LSEEK``). An nsqd found later (lookupd) starts at its ``committed``.

After a takeover (replication): the replica's channel gets the origin's unfinished messages as
its own, appended to its log at new offsets (LOG-PROTOCOL.md, "Replication"); the source reads
them there like any other message of the replica, from where it stands on the replica (it reads
the replica already, or finds it through lookupd). nsqd's LOG answer tells a takeover from a loss,
and the source carries on by it (``TakeoverNotes``):

- an nsqd that does not answer and that another nsqd's LOG lists as ``adopted`` (not ``settled``)
  was taken over: the planner plans nothing more on it and sends it no commits; a task of a range
  planned on it before gives the range up at once, logged as adopted by that replica (not data
  loss: the replica delivers those messages);
- an nsqd back after a takeover answers ``handed_over``: a position of the query in
  ``[from, through)`` moves to ``through`` (logged and counted), in the planner and in a task that
  had planned a range there, whatever ``failOnDataLoss``.

Without those notes (no replication, or an nsqd that predates them) nothing changes: a range
whose nsqd stays away fails its task after ``readRetryMs``, or with ``failOnDataLoss=false`` is
given up (logged). Duplicates across a takeover: the replica adopted every message the origin had
not committed, so what the query had written in a committed batch whose ``LCOMMIT`` the origin did
not acknowledge comes again from the replica. The planner cannot tell which of its planned ranges
the tasks had read before the origin died, so it logs the bound: the origin's offsets it had
planned and the origin had not acknowledged as committed (``takeover_duplicates``, at most); nsqd
counts the rest (commits whose FINs had not reached the replica) as ``duplicates_after_takeover``
when the origin comes back.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from protocol.log import E_LOG_BEFORE_START, RANGE_HEADER_SIZE, RANGE_MAGIC
from trionsq.blocking import ConnectionClosed, LookupdError, NSQError, lookup

from .connection import NsqConnectionError, NsqSourceError
from .log_client import LogNode, NoLogChannels
from .options import START_COMMITTED, START_EARLIEST, START_LATEST, SourceOptions
from .ranges import share, split

__all__ = [
    "LOG_OFFSET_VERSION",
    "LogPartition",
    "LogPlanner",
    "TakeoverNotes",
    "make_log_offset",
    "parse_log_offset",
    "range_batch",
    "read_partition",
]

log = logging.getLogger("spark_connector.log_source")

LOG_OFFSET_VERSION = 2
_RANGE_HEADER = struct.Struct(">4sIQQ")
# how long the planner waits for an nsqd at each trigger before it plans without it
_PLAN_TIMEOUT = 2.0


def make_log_offset(offsets: Mapping[str, int]) -> dict:
    return {"version": LOG_OFFSET_VERSION, "nsqd": {key: int(offsets[key]) for key in sorted(offsets)}}


def parse_log_offset(offset: Mapping) -> dict[str, int]:
    nodes = offset.get("nsqd") if isinstance(offset, Mapping) and offset.get("version") == LOG_OFFSET_VERSION else None
    if not isinstance(nodes, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in nodes.items()
    ):
        raise NsqSourceError(
            f"nsq source: offset {offset!r} is not of the log path's format "
            f'{{"version": {LOG_OFFSET_VERSION}, "nsqd": {{...}}}}'
        )
    return dict(nodes)


class LogPartition(InputPartition):
    """Messages ``[lo, hi)`` of the log channel on the nsqd at ``nsqd``; ``others``: the query's
    other nsqd, asked whether one adopted ``nsqd``'s messages when it does not answer."""

    def __init__(self, nsqd: str, lo: int, hi: int, others: tuple[str, ...] = ()) -> None:
        self.nsqd, self.lo, self.hi, self.others = nsqd, lo, hi, tuple(others)
        self.value = None

    def __repr__(self) -> str:
        return f"LogPartition(nsqd={self.nsqd!r}, lo={self.lo}, hi={self.hi})"


class TakeoverNotes:
    """What LOG answers about takeovers (LOG-PROTOCOL.md, "Replication"), read from offsets dicts."""

    @staticmethod
    def adopter(node: str, infos: Mapping[str, Mapping]) -> str | None:
        """The nsqd among ``infos`` (address -> LOG's answer) whose log adopted ``node``'s messages in
        a takeover that ``node`` has not come back from (``adopted``, not ``settled``); None: none."""
        for address, info in sorted(infos.items()):
            if address != node and any(
                isinstance(e, Mapping) and e.get("node") == node and not e.get("settled")
                for e in info.get("adopted") or ()
            ):
                return address
        return None

    @staticmethod
    def handed_over(position: int, info: Mapping) -> tuple[int, str] | None:
        """``(through, replica)`` when ``position`` lies in a span this nsqd handed over to a replica
        at a takeover (``handed_over``: ``[from, through)``, those messages are the replica's); None
        otherwise."""
        for entry in reversed(info.get("handed_over") or ()):
            if isinstance(entry, Mapping) and entry.get("from", 0) <= position < entry.get("through", 0):
                return int(entry["through"]), str(entry.get("by", "?"))
        return None


def probe(options: SourceOptions, addresses: list[str]) -> tuple[dict[str, dict], list[str]]:
    """Ask every nsqd for its log channel (``LOG``, which makes the channel a log). Returns the
    offsets of those that have log channels and the addresses of those that have none. An nsqd
    that cannot be reached within ``connectTimeoutMs`` fails the query, as on the driver path."""
    found: dict[str, dict] = {}
    without: list[str] = []
    for address in addresses:
        node = LogNode(address, options)
        try:
            found[address] = node.offsets(retry_for=options.connect_timeout_ms / 1000)
        except NoLogChannels:
            without.append(address)
        except (ConnectionClosed, TimeoutError) as exc:
            raise NsqConnectionError(
                f"cannot reach nsqd {address} (topic {options.topic!r}, channel {options.channel!r}): {exc} "
                f"within {options.connect_timeout_ms} ms (option connectTimeoutMs)"
            ) from None
        except NSQError as exc:
            raise NsqConnectionError(
                f"nsqd {address} refused the log channel {options.topic}/{options.channel}: {exc}"
            ) from None
        finally:
            node.close()
    return found, without


def lookupd_nodes(options: SourceOptions) -> list[str]:
    """The nsqd lookupd lists for the topic (every lookupd that answers; none raises)."""
    found: list[str] = []
    failures = []
    for lookupd in options.lookupd_addresses:
        try:
            found.extend(a for a in lookup(lookupd, options.topic, timeout=5.0) if a not in found)
        except LookupdError as exc:
            failures.append(f"{lookupd}: {exc}")
    if failures and len(failures) == len(options.lookupd_addresses):
        raise NsqConnectionError("cannot reach any lookupd: " + "; ".join(failures))
    if failures:
        log.warning("lookupd unreachable: %s", "; ".join(failures))
    return found


class LogPlanner:
    """The driver's side of the log path (Spark's source runner): offsets, partitions, commits.
    ``known``: the offsets the probe found (address -> LOG's answer)."""

    def __init__(self, options: SourceOptions, known: dict[str, dict]) -> None:
        self.options = options
        self.nodes: dict[str, LogNode] = {}
        self.info: dict[str, dict] = {}  # address -> the last offsets nsqd answered
        for address, info in known.items():
            self._add(address, info)
        self._target: dict[str, int] | None = None  # Trigger.AvailableNow's end
        # takeovers (TakeoverNotes): nsqd gone and adopted -> the replica; and per nsqd the last end
        # planned and the last commit nsqd acknowledged
        self.adopted: dict[str, str] = {}
        self.planned: dict[str, int] = {}
        self.acknowledged: dict[str, int] = {a: i["committed"] for a, i in known.items()}
        self.takeover_skipped = 0  # offsets of nsqd back after a takeover that the query moved past
        # offsets of nsqd taken over that the query had planned and the nsqd had not acknowledged as
        # committed: each may have been written and come again from the replica (duplicates at most)
        self.takeover_duplicates = 0
        self._bounded: dict[str, int] = {}  # per nsqd, the offset up to which they were counted
        self._moved: set[tuple[str, int]] = set()
        self._next_lookup = time.monotonic() + options.lookupd_poll_interval_ms / 1000
        log.warning(
            "nsq source: the log path: executors read %s/%s from nsqd %s by offset",
            options.topic,
            options.channel,
            ", ".join(sorted(known)),
        )

    def _add(self, address: str, info: dict) -> None:
        self.nodes[address] = LogNode(address, self.options)
        self.info[address] = info

    def stop(self) -> None:
        for node in self.nodes.values():
            node.close()

    # -- offsets -------------------------------------------------------------------------------

    def _refresh(self, retry_for: float = _PLAN_TIMEOUT) -> dict[str, dict]:
        """Ask every known nsqd (and, every ``lookupd.pollIntervalMs``, lookupd for new ones) for its
        offsets; an nsqd that does not answer keeps its last ones (and is asked again next time)."""
        if self.options.lookupd_addresses and time.monotonic() >= self._next_lookup:
            self._next_lookup = time.monotonic() + self.options.lookupd_poll_interval_ms / 1000
            try:
                new = [a for a in lookupd_nodes(self.options) if a not in self.nodes]
            except NsqConnectionError as exc:
                log.warning("%s", exc)
                new = []
            if new:
                found, without = probe(self.options, new)
                if without:
                    raise NsqSourceError(
                        f"nsq source: nsqd {', '.join(without)} joined the topic but has no log "
                        f"channels; this query reads on the log path (restart it with "
                        f"readMode=driver to read every nsqd through the driver)"
                    )
                for address, info in found.items():
                    log.info("nsq source: nsqd %s joined; reading it from offset %d", address, info["committed"])
                    self._add(address, info)
        silent = []
        for address, node in self.nodes.items():
            try:
                self.info[address] = node.offsets(retry_for=0.0 if address in self.adopted else retry_for)
            except (ConnectionClosed, TimeoutError) as exc:
                silent.append(address)
                if address not in self.adopted:
                    log.warning("nsq source: nsqd %s does not answer (%s); planning without it this time", address, exc)
            except NoLogChannels as exc:
                raise NsqSourceError(
                    f"nsq source: {exc}; it did before (was it replaced by an nsqd without log channels?)"
                ) from None
            else:
                if self.adopted.pop(address, None) is not None:
                    log.warning("nsq source: nsqd %s, taken over, answers again", address)
        for address in silent:
            replica = TakeoverNotes.adopter(address, {a: i for a, i in self.info.items() if a not in silent})
            if replica is not None and address not in self.adopted:
                self._taken_over(address, replica)
        return self.info

    def _taken_over(self, address: str, replica: str) -> None:
        """``address`` is gone and ``replica`` adopted its messages: plan nothing more there, count."""
        self.adopted[address] = replica
        acked = self.acknowledged.get(address, 0)
        planned = max(self.planned.get(address, acked), acked)
        self._count_duplicates(address, planned)
        log.warning(
            "nsq source: nsqd %s was taken over by %s: its offsets from %d on are adopted by %s (not data "
            "loss); of them [%d, %d) were planned by the query, which may have written some in committed "
            "batches: those come again from %s (takeover_duplicates at most %d); reading %s on",
            address,
            replica,
            acked,
            replica,
            acked,
            planned,
            replica,
            self.takeover_duplicates,
            replica,
        )

    def _count_duplicates(self, address: str, planned: int) -> None:
        """Offsets ``[acknowledged, planned)`` of a node taken over go to ``takeover_duplicates`` (once)."""
        counted = max(self._bounded.get(address, 0), self.acknowledged.get(address, 0))
        if planned > counted:
            self.takeover_duplicates += planned - counted
            self._bounded[address] = planned

    def _position(self, address: str, position: int, node_info: dict) -> int:
        """Where the query stands on ``address``: ``position``, moved past a span that nsqd handed
        over to a replica at a takeover (logged and counted once)."""
        moved = TakeoverNotes.handed_over(position, node_info)
        if moved is None:
            return position
        through, replica = moved
        if (address, through) not in self._moved:
            self._moved.add((address, through))
            self.takeover_skipped += through - position
            self._count_duplicates(address, position)
            log.warning(
                "nsq source: nsqd %s handed offsets [%d, %d) over to %s at a takeover (adopted by %s, not "
                "data loss): going on from %d (takeover_skipped %d, takeover_duplicates at most %d)",
                address,
                position,
                through,
                replica,
                replica,
                through,
                self.takeover_skipped,
                self.takeover_duplicates,
            )
        return through

    def initial_offset(self) -> dict:
        opts = self.options
        info = self._refresh(retry_for=opts.connect_timeout_ms / 1000)
        named = dict(opts.starting_offsets_by_nsqd)
        offsets = {}
        for address, node_info in info.items():
            if opts.starting_timestamp_ms is not None:
                offsets[address] = self.nodes[address].seek(
                    opts.starting_timestamp_ms * 1_000_000, retry_for=opts.connect_timeout_ms / 1000
                )
                continue
            how = named.get(address, opts.starting_offsets)
            if how == START_EARLIEST:
                offsets[address] = node_info["start"]
            elif how == START_LATEST:
                offsets[address] = node_info["end"]
            elif how == START_COMMITTED:
                offsets[address] = node_info["committed"]
            else:
                offsets[address] = self._checked_start(address, int(how), node_info)  # an offset: words are above
        for address in named:
            if address not in info:
                log.warning("nsq source: startingOffsets names nsqd %s, which this query does not read", address)
        log.info("nsq source: starting at %s", offsets)
        return make_log_offset(offsets)

    def _checked_start(self, address: str, offset: int, node_info: dict) -> int:
        if node_info["start"] <= offset <= node_info["end"]:
            return offset
        if offset > node_info["end"] or self.options.fail_on_data_loss:
            raise NsqSourceError(
                f"nsq source: startingOffsets asks offset {offset} of nsqd {address}, whose log holds "
                f"[{node_info['start']}, {node_info['end']})"
                + ("" if offset > node_info["end"] else " (set failOnDataLoss=false to start at the oldest retained)")
            )
        return node_info["start"]

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: the query ends at the offsets nsqd holds now."""
        self._target = {
            address: info["end"]
            for address, info in self._refresh(retry_for=self.options.connect_timeout_ms / 1000).items()
        }
        log.info("nsq source: Trigger.AvailableNow reads up to %s", self._target)

    def latest_offset(self, start: dict, limit: ReadLimit) -> dict:
        begin = parse_log_offset(start)
        info = self._refresh()
        available = {}
        for address in set(begin) | set(info):
            if address not in info or address in self.adopted:  # gone from lookupd; taken over
                available[address] = begin.get(address, info.get(address, {}).get("committed", 0))
                continue
            if address in begin:
                begin[address] = self._position(address, begin[address], info[address])
            end = info[address]["end"]
            if self._target is not None:
                end = min(end, self._target.get(address, begin.get(address, info[address]["committed"])))
            lo = begin.get(address)
            if lo is None:
                # a new nsqd: it enters the offsets at its commit point; its messages come next trigger
                available[address] = info[address]["committed"]
                continue
            self._check_loss(address, lo, info[address])
            available[address] = max(lo, end)
        if isinstance(limit, ReadMaxRows):
            ends = share({a: begin.get(a, available[a]) for a in available}, available, limit.max_rows)
        else:
            ends = available
        for address, end in ends.items():
            self.planned[address] = max(self.planned.get(address, 0), end)
        return make_log_offset(ends)

    def _check_loss(self, address: str, position: int, node_info: dict) -> None:
        """An offset the query has not read yet that nsqd no longer holds: committed by another reader
        of the channel, removed by retention, or a log that started over (nsqd's data lost)."""
        if node_info["start"] <= position <= node_info["end"]:
            return
        what = (
            f"nsqd {address}'s log holds [{node_info['start']}, {node_info['end']}) but the query is at offset "
            f"{position}"
        )
        if self.options.fail_on_data_loss:
            raise NsqSourceError(
                f"nsq source: {what}: messages were lost or read by another query of the channel "
                f"(set failOnDataLoss=false to go on from what nsqd holds)"
            )
        log.warning("nsq source: %s; going on from what it holds (failOnDataLoss=false)", what)

    def report_latest(self) -> dict | None:
        return make_log_offset({a: i["end"] for a, i in self.info.items()}) if self.info else None

    # -- partitions and commits ------------------------------------------------------------------

    def partitions(self, start: dict, end: dict) -> list[LogPartition]:
        begin = parse_log_offset(start)
        finish = parse_log_offset(end)
        ranges = []
        for address in sorted(finish):
            lo, hi = begin.get(address, finish[address]), finish[address]
            node_info = self.info.get(address)
            if address in self.adopted:
                continue  # its replica delivers what it had not committed
            if node_info is not None:
                lo = self._position(address, lo, node_info)
            if (
                node_info is not None
                and not self.options.fail_on_data_loss
                and not (node_info["start"] <= lo <= node_info["end"])
            ):
                lo = node_info["start"]  # failOnDataLoss=false: what nsqd holds now
            if hi > lo:
                ranges.append((address, lo, hi))
        return [
            LogPartition(address, lo, hi, tuple(a for a in sorted(self.nodes) if a != address))
            for address, lo, hi in split(ranges, self.options.min_partitions)
        ]

    def commit(self, end: dict) -> None:
        """Spark committed the batch ending at ``end``: finish it in nsqd. An nsqd that does not answer
        gets it with a later commit (commits are cumulative; what it keeps meanwhile is only read again
        if the query restarts before that, which the checkpoint prevents)."""
        for address, offset in parse_log_offset(end).items():
            node = self.nodes.get(address)
            if node is None or address in self.adopted:  # taken over: what it holds is its replica's
                continue
            try:
                self.info[address] = node.commit(offset, retry_for=_PLAN_TIMEOUT)
                self.acknowledged[address] = self.info[address]["committed"]
            except (ConnectionClosed, TimeoutError) as exc:
                log.warning(
                    "nsq source: cannot commit offset %d on nsqd %s (%s); the next commit will", offset, address, exc
                )


# -- the executor's side ---------------------------------------------------------------------------


def read_partition(options: SourceOptions, partition: LogPartition) -> Iterator:
    """Arrow record batches of ``partition``, read from its nsqd one ``LREAD`` answer at a time."""
    node = LogNode(partition.nsqd, options)
    position, hi = partition.lo, partition.hi
    retry_for = options.read_retry_ms / 1000
    try:
        while position < hi:
            try:
                data = _read_or_adopted(node, partition, position, options)
                if data is None:
                    return
            except (ConnectionClosed, TimeoutError) as exc:
                if options.fail_on_data_loss:
                    raise NsqSourceError(
                        f"nsq source: nsqd {partition.nsqd} did not answer for {retry_for:.0f} s "
                        f"(option readRetryMs) reading offsets [{position}, {hi}): {exc}"
                    ) from None
                log.warning(
                    "nsq source: nsqd %s did not answer for %.0f s (%s): offsets [%d, %d) given up "
                    "(failOnDataLoss=false; after a takeover the replica delivers them)",
                    partition.nsqd,
                    retry_for,
                    exc,
                    position,
                    hi,
                )
                return
            except NSQError as exc:
                if exc.code == E_LOG_BEFORE_START:
                    node_info = node.offsets(retry_for=retry_for)
                    moved = TakeoverNotes.handed_over(position, node_info)
                    if moved is not None:
                        log.warning(
                            "nsq source: nsqd %s handed offsets [%d, %d) over to %s at a takeover: skipped "
                            "(adopted by %s, not data loss)",
                            partition.nsqd,
                            position,
                            min(moved[0], hi),
                            moved[1],
                            moved[1],
                        )
                        position = min(moved[0], hi)
                        continue
                if exc.code == E_LOG_BEFORE_START and not options.fail_on_data_loss:
                    start = node_info["start"]
                    log.warning(
                        "nsq source: nsqd %s no longer holds offsets [%d, %d) (%s); skipped (failOnDataLoss=false)",
                        partition.nsqd,
                        position,
                        start,
                        exc,
                    )
                    position = max(position + 1, min(start, hi))
                    continue
                raise NsqSourceError(
                    f"nsq source: reading offsets [{position}, {hi}) of nsqd {partition.nsqd}: {exc}"
                ) from None
            first, count, batch = range_batch(data, partition.nsqd, options.topic, options.channel)
            if first != position or count == 0:
                raise NsqSourceError(
                    f"nsq source: nsqd {partition.nsqd} answered LREAD from {position} with "
                    f"{count} messages from {first}"
                )
            count = min(count, hi - position)
            yield batch if count == batch.num_rows else batch.slice(0, count)
            position += count
    finally:
        node.close()


#: a task whose nsqd does not answer asks the query's other nsqd this often whether one took it over
_ADOPTION_CHECK = 2.0


def _read_or_adopted(
    node: LogNode, partition: LogPartition, position: int, options: SourceOptions
) -> bytes | bytearray | None:
    """``LREAD`` from ``position``, dialling again for ``readRetryMs``; between the tries, the
    query's other nsqd are asked (LOG) whether one adopted this nsqd's messages: None then (the
    range is given up to that replica, logged). Raises what the last try raised."""
    deadline = time.monotonic() + options.read_retry_ms / 1000
    while True:
        left = deadline - time.monotonic()
        try:
            return node.read(
                position, partition.hi, options.fetch_max_bytes, retry_for=max(min(left, _ADOPTION_CHECK), 0.0)
            )
        except (ConnectionClosed, TimeoutError):
            replica = _adopter(partition, options) if partition.others else None
            if replica is not None:
                log.warning(
                    "nsq source: nsqd %s was taken over by %s: offsets [%d, %d) given up (adopted by %s, "
                    "not data loss)",
                    partition.nsqd,
                    replica,
                    position,
                    partition.hi,
                    replica,
                )
                return None
            if time.monotonic() >= deadline:
                raise


def _adopter(partition: LogPartition, options: SourceOptions) -> str | None:
    infos = {}
    for address in partition.others:
        other = LogNode(address, options)
        try:
            infos[address] = other.offsets()
        except (ConnectionClosed, TimeoutError, NSQError, NoLogChannels):
            continue
        finally:
            other.close()
    return TakeoverNotes.adopter(partition.nsqd, infos)


def range_batch(data: bytes | bytearray, nsqd: str, topic: str, channel: str) -> tuple[int, int, Any]:
    """An LREAD answer (the range layout of ``protocol.log``) as ``(first, count, RecordBatch)`` in
    the source's schema. numpy reads each column out of the frame in one call: the bodies' data
    buffer is the frame's own, their offsets one cumulative sum; IDs are a string column whose data
    is the frame's 16-byte IDs; timestamps (ns, big-endian) become microseconds in one division.
    Checks what ``protocol.log.decode_range`` checks (magic, sizes, lengths adding up) without
    its per-message list; a frame that fails raises ``NsqSourceError``."""
    import numpy as np
    import pyarrow as pa

    size = len(data)
    if size < RANGE_HEADER_SIZE:
        raise NsqSourceError(f"nsq source: nsqd {nsqd} answered LREAD with {size} bytes")
    magic, n, first, end = _RANGE_HEADER.unpack_from(data)
    fixed = RANGE_HEADER_SIZE + 30 * n
    if magic != RANGE_MAGIC or size < fixed or first + n > end:
        raise NsqSourceError(
            f"nsq source: nsqd {nsqd} answered LREAD with a malformed range ({magic!r}, {n} "
            f"messages from {first}, end {end}, {size} bytes)"
        )
    base = RANGE_HEADER_SIZE
    lengths = np.frombuffer(data, ">u4", n, base + 24 * n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] != size - fixed or offsets[-1] >= 1 << 31:
        raise NsqSourceError(
            f"nsq source: nsqd {nsqd} answered LREAD with body lengths adding up to "
            f"{int(offsets[-1])} and {size - fixed} bytes of bodies"
        )
    frame = pa.py_buffer(data)
    body = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), frame.slice(fixed)])
    id_offsets = np.arange(0, 16 * n + 1, 16, dtype=np.int32)
    ids = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(id_offsets), frame.slice(base + 8 * n, 16 * n)])
    try:
        ids.validate(full=True)  # nsqd's IDs are hex digits: anything else is not text Spark can hold
    except pa.ArrowInvalid:
        raise NsqSourceError(f"nsq source: nsqd {nsqd} answered LREAD with message IDs that are not text") from None
    micros = np.frombuffer(data, ">i8", n, base) // 1000
    timestamps = pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [None, pa.py_buffer(micros.astype(np.int64))])
    attempts = pa.Array.from_buffers(
        pa.int32(), n, [None, pa.py_buffer(np.frombuffer(data, ">u2", n, base + 28 * n).astype(np.int32))]
    )
    constants = [pa.repeat(pa.scalar(value, pa.string()), n) for value in (nsqd, topic, channel)]
    batch = pa.RecordBatch.from_arrays([ids, body, timestamps, attempts, *constants], schema=_arrow_schema())
    return first, n, batch


def _arrow_schema():
    import pyarrow as pa

    return pa.schema(
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
