"""Options of ``spark.readStream.format("nsq")``, named in the style of Spark's Kafka source.

Spark hands options over as strings with case-insensitive keys; ``SourceOptions.parse`` checks
them all at once and reports every problem in one ``ValueError``.

======================== ========== ===============================================================
option                   default    meaning
======================== ========== ===============================================================
nsqd.tcp.addresses       --         comma-separated ``host:port`` of nsqd TCP listeners
lookupd.http.addresses   --         comma-separated ``host:port`` (or URLs) of nsqlookupd HTTP APIs;
                                    one of the two address options is required
topic, channel           required   what to consume
readMode                 auto       ``auto``: the log path when every nsqd read offers log channels
                                    (``LOG``), else the driver path; ``log``: the log path or fail;
                                    ``driver``: the driver path (consumer and write-ahead log)

-- the log path (executors read offset ranges from nsqd; see ``spark_connector.log_source``)
startingOffsets          committed  where a new query starts on each nsqd: ``committed`` (the
                                    channel's unfinished messages), ``earliest`` (the oldest one
                                    nsqd retains), ``latest`` (only what comes next), or a JSON
                                    object ``{"host:port": offset}`` (-2 earliest, -1 latest;
                                    nsqd not named start at ``committed``)
startingTimestamp        none       ms since the epoch: start at the first message published at or
                                    after it (LSEEK); takes precedence over startingOffsets
maxOffsetsPerTrigger     none       upper bound of messages per micro-batch (maxMessagesPerTrigger
                                    is the same option under the driver path's name)
failOnDataLoss           true       fail when a planned offset is no longer in nsqd (committed by
                                    another reader, gone from retention); false: skip ahead
fetchMaxBytes            8 MiB      bytes per LREAD answer (one Arrow batch each); nsqd caps at 64 MiB
readRetryMs              60000      how long a task or the planner dials again an nsqd that stopped
                                    answering (a restart) before it fails

-- the driver path (a consumer in the driver, a write-ahead log)
walPath                  required   directory of the write-ahead log, one per query (accepted and
                                    unused on the log path)
walPathShared            false      the walPath is storage every machine that may run the driver
                                    mounts (see ``spark_connector.placement``)
ackMode                  durable    ``durable``: FIN once the message is fsynced in the log;
                                    ``commit``: FIN once the batch holding it is in Spark's commit log
maxMessagesPerTrigger    none       upper bound of messages per micro-batch (Spark ReadMaxRows)
maxBytesPerTrigger       32 MiB     upper bound of the log's bytes a micro-batch carries through the
                                    driver (its messages are pickled into the partitions there); the
                                    default applies only without maxOffsetsPerTrigger
minPartitions            none       split a micro-batch into at least about this many partitions
                                    (Spark tasks) of consecutive messages; default one per nsqd
                                    (both paths)
maxInFlight              2500       RDY budget shared by the nsqd connections
maxBacklogMessages       1000000    logged messages Spark is not done with above which RDY drops to 0
msgTimeoutMs             nsqd's     IDENTIFY msg_timeout: how long nsqd waits for FIN or TOUCH
walSegmentBytes          16 MiB     segment size of the log (deletion granularity)
dedupWindow              200000     ids remembered per nsqd to drop redelivered copies
lookupd.pollIntervalMs   15000      how often lookupd is asked for the topic's producers
connectTimeoutMs         10000      first connection to a listed nsqd; failure stops the query
clientId / hostname      --         IDENTIFY fields shown in nsqd's stats
tls                      false      upgrade the connections to TLS (IDENTIFY tls_v1)
tls.caFile               system     CA bundle to verify nsqd's certificate
tls.certFile/tls.keyFile --         client certificate for nsqd's --tls-client-auth-policy
tls.insecure             false      skip certificate and host name verification
tls.serverName           host       name to verify the certificate against
snappy / deflate         false      compression (needs protocol/compression.py; see docs/spark.md)
deflate.level            6          requested deflate level
auth.secret              --         sent with AUTH when nsqd requires it
======================== ========== ===============================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import overload

from protocol.names import is_valid_channel_name, is_valid_topic_name

__all__ = [
    "ACK_COMMIT",
    "ACK_DURABLE",
    "DEFAULT_MAX_BYTES_PER_TRIGGER",
    "READ_AUTO",
    "READ_DRIVER",
    "READ_LOG",
    "SinkOptions",
    "SourceOptions",
]

ACK_DURABLE = "durable"
ACK_COMMIT = "commit"
READ_AUTO = "auto"
READ_LOG = "log"
READ_DRIVER = "driver"
#: startingOffsets' words, and the numbers that stand for them in its JSON form (Kafka's -2 and -1)
START_COMMITTED = "committed"
START_EARLIEST = "earliest"
START_LATEST = "latest"
_START_NUMBERS = {-2: START_EARLIEST, -1: START_LATEST}
#: what a driver-path micro-batch carries through the driver without maxOffsetsPerTrigger. Its
#: messages are pickled into the partitions by the source runner and held by the driver's JVM,
#: which serializes each task with its partition and then the task's RPC message, each into a
#: buffer that grows by doubling: at its peak the JVM holds a batch's bytes five to seven times
#: over. 32 MiB holds for the smallest driver Spark starts (512 MiB) and the default 1 GiB one;
#: 64 MiB took a 512 MiB driver out (OutOfMemoryError in the scheduler's launchTasks).
DEFAULT_MAX_BYTES_PER_TRIGGER = 32 << 20

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


class _Parser:
    """Reads typed values out of Spark's string options, collecting every problem."""

    def __init__(self, raw: Mapping[str, str]) -> None:
        self.opts = {str(k).lower(): v for k, v in raw.items()}
        self.errors: list[str] = []

    def text(self, name: str) -> str | None:
        value = self.opts.get(name.lower())
        return None if value is None else str(value).strip()

    @overload
    def integer(self, name: str, default: int, minimum: int) -> int: ...
    @overload
    def integer(self, name: str, default: None, minimum: int) -> int | None: ...
    def integer(self, name: str, default: int | None, minimum: int) -> int | None:
        value = self.text(name)
        if value is None or value == "":
            return default
        try:
            number = int(value)
        except ValueError:
            self.errors.append(f"option {name}={value!r} is not an integer")
            return default
        if number < minimum:
            self.errors.append(f"option {name}={number} must be at least {minimum}")
            return default
        return number

    def boolean(self, name: str, default: bool = False) -> bool:
        value = self.text(name)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        self.errors.append(f"option {name}={value!r} is not a boolean (true/false)")
        return default

    def addresses(self, name: str) -> tuple[str, ...]:
        value = self.text(name) or ""
        return tuple(a.strip() for a in value.split(",") if a.strip())

    def destinations(self) -> dict:
        """``nsqd.tcp.addresses`` and ``lookupd.http.addresses``: one of them is required."""
        nsqd = self.addresses("nsqd.tcp.addresses")
        for address in nsqd:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                self.errors.append(f"nsqd address {address!r} is not host:port")
        lookupd = self.addresses("lookupd.http.addresses")
        if not nsqd and not lookupd:
            self.errors.append("set nsqd.tcp.addresses or lookupd.http.addresses")
        return {"nsqd_addresses": nsqd, "lookupd_addresses": lookupd}

    def connection(self) -> dict:
        """The options of every nsqd connection, source and sink alike."""
        snappy = self.boolean("snappy")
        deflate = self.boolean("deflate")
        if snappy and deflate:
            self.errors.append("options snappy and deflate are exclusive")
        return {
            "connect_timeout_ms": self.integer("connectTimeoutMs", 10_000, 1),
            "client_id": self.text("clientId"),
            "hostname": self.text("hostname"),
            "tls": self.boolean("tls"),
            "tls_ca_file": self.text("tls.caFile"),
            "tls_cert_file": self.text("tls.certFile"),
            "tls_key_file": self.text("tls.keyFile"),
            "tls_insecure": self.boolean("tls.insecure"),
            "tls_server_name": self.text("tls.serverName"),
            "snappy": snappy,
            "deflate": deflate,
            "deflate_level": self.integer("deflate.level", 6, 1) or 6,
            "auth_secret": self.text("auth.secret"),
        }

    def check(self, what: str) -> None:
        if self.errors:
            raise ValueError(f"nsq {what}: " + "; ".join(self.errors))


@dataclass(frozen=True)
class _Connection:
    connect_timeout_ms: int = 10_000
    client_id: str | None = None
    hostname: str | None = None
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_insecure: bool = False
    tls_server_name: str | None = None
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 6
    auth_secret: str | None = None


@dataclass(frozen=True)
class SourceOptions(_Connection):
    nsqd_addresses: tuple[str, ...] = ()
    lookupd_addresses: tuple[str, ...] = ()
    topic: str = ""
    channel: str = ""
    wal_path: str = ""
    ack_mode: str = ACK_DURABLE
    max_messages_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    min_partitions: int | None = None
    max_in_flight: int = 2500
    max_backlog_messages: int = 1_000_000
    msg_timeout_ms: int | None = None
    wal_segment_bytes: int = 16 << 20
    dedup_window: int = 200_000
    lookupd_poll_interval_ms: int = 15_000
    wal_path_shared: bool = False
    read_mode: str = READ_AUTO
    starting_offsets: str = START_COMMITTED
    starting_offsets_by_nsqd: tuple[tuple[str, int | str], ...] = ()  # JSON form: (address, offset or word)
    starting_timestamp_ms: int | None = None
    fail_on_data_loss: bool = True
    fetch_max_bytes: int = 8 << 20
    read_retry_ms: int = 60_000

    @property
    def batch_byte_cap(self) -> int | None:
        """The bytes of the log a driver-path micro-batch may carry: ``maxBytesPerTrigger`` when
        set, none with an explicit ``maxOffsetsPerTrigger`` alone, else the default."""
        if self.max_bytes_per_trigger is not None:
            return self.max_bytes_per_trigger
        return None if self.max_messages_per_trigger is not None else DEFAULT_MAX_BYTES_PER_TRIGGER

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SourceOptions:
        p = _Parser(raw)
        destinations = p.destinations()
        topic = p.text("topic") or ""
        channel = p.text("channel") or ""
        if not topic:
            p.errors.append("option topic is required")
        elif not is_valid_topic_name(topic):
            p.errors.append(f"topic {topic!r} is not a valid NSQ topic name")
        if not channel:
            p.errors.append("option channel is required")
        elif not is_valid_channel_name(channel):
            p.errors.append(f"channel {channel!r} is not a valid NSQ channel name")
        read_mode = (p.text("readMode") or READ_AUTO).lower()
        if read_mode not in (READ_AUTO, READ_LOG, READ_DRIVER):
            p.errors.append(f"option readMode={read_mode!r} must be {READ_AUTO!r}, {READ_LOG!r} or {READ_DRIVER!r}")
        wal_path = p.text("walPath") or ""
        if not wal_path and read_mode == READ_DRIVER:
            p.errors.append("option walPath is required with readMode=driver (a directory of its own for each query)")
        starting, by_nsqd = _starting_offsets(p)
        limit = p.integer("maxOffsetsPerTrigger", None, 1)
        if limit is None:
            limit = p.integer("maxMessagesPerTrigger", None, 1)
        ack_mode = (p.text("ackMode") or ACK_DURABLE).lower()
        if ack_mode not in (ACK_DURABLE, ACK_COMMIT):
            p.errors.append(f"option ackMode={ack_mode!r} must be {ACK_DURABLE!r} or {ACK_COMMIT!r}")
        parsed = cls(
            **destinations,
            topic=topic,
            channel=channel,
            wal_path=wal_path,
            ack_mode=ack_mode,
            max_messages_per_trigger=limit,
            max_bytes_per_trigger=p.integer("maxBytesPerTrigger", None, 1),
            min_partitions=p.integer("minPartitions", None, 1),
            max_in_flight=p.integer("maxInFlight", 2500, 1),
            max_backlog_messages=p.integer("maxBacklogMessages", 1_000_000, 1),
            msg_timeout_ms=p.integer("msgTimeoutMs", None, 1000),
            wal_segment_bytes=p.integer("walSegmentBytes", 16 << 20, 1),
            dedup_window=p.integer("dedupWindow", 200_000, 0),
            lookupd_poll_interval_ms=p.integer("lookupd.pollIntervalMs", 15_000, 10),
            wal_path_shared=p.boolean("walPathShared"),
            read_mode=read_mode,
            starting_offsets=starting,
            starting_offsets_by_nsqd=by_nsqd,
            starting_timestamp_ms=p.integer("startingTimestamp", None, 0),
            fail_on_data_loss=p.boolean("failOnDataLoss", True),
            fetch_max_bytes=p.integer("fetchMaxBytes", 8 << 20, 1024),
            read_retry_ms=p.integer("readRetryMs", 60_000, 0),
            **p.connection(),
        )
        p.check("source")
        return parsed


def _starting_offsets(p: _Parser) -> tuple[str, tuple[tuple[str, int | str], ...]]:
    """``startingOffsets``: a word, or a JSON object of nsqd ``host:port`` to an offset (or -2, -1)."""
    value = p.text("startingOffsets") or START_COMMITTED
    if value.lower() in (START_COMMITTED, START_EARLIEST, START_LATEST):
        return value.lower(), ()
    try:
        obj = json.loads(value)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or not obj:
        p.errors.append(
            f"option startingOffsets={value!r} must be committed, earliest, latest or a JSON object "
            f'{{"host:port": offset}}'
        )
        return START_COMMITTED, ()
    by_nsqd = []
    for address, offset in sorted(obj.items()):
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < -2:
            p.errors.append(
                f"startingOffsets: the offset of {address!r} must be an integer >= 0, or -2 (earliest) "
                f"or -1 (latest); got {offset!r}"
            )
            continue
        by_nsqd.append((address, _START_NUMBERS.get(offset, offset)))
    return START_COMMITTED, tuple(by_nsqd)


@dataclass(frozen=True)
class SinkOptions(_Connection):
    """Options of ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")`` (the table is in
    ``spark_connector.sink``)."""

    nsqd_addresses: tuple[str, ...] = ()
    lookupd_addresses: tuple[str, ...] = ()
    topic: str | None = None
    batch_messages: int = 500
    batch_bytes: int = 5 << 20
    max_message_bytes: int = 1 << 20
    max_in_flight: int = 8
    response_timeout_ms: int = 30_000
    metrics_path: str | None = None
    msg_timeout_ms: int | None = None  # IDENTIFY's field; a publisher never sets it

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SinkOptions:
        p = _Parser(raw)
        destinations = p.destinations()
        topic = p.text("topic") or None
        if topic is not None and not is_valid_topic_name(topic):
            p.errors.append(f"topic {topic!r} is not a valid NSQ topic name")
        parsed = cls(
            **destinations,
            topic=topic,
            batch_messages=p.integer("batchMessages", 500, 1),
            batch_bytes=p.integer("batchBytes", 5 << 20, 64),
            max_message_bytes=p.integer("maxMessageBytes", 1 << 20, 1),
            max_in_flight=p.integer("maxInFlight", 8, 1),
            response_timeout_ms=p.integer("responseTimeoutMs", 30_000, 1),
            metrics_path=p.text("metricsPath") or None,
            **p.connection(),
        )
        p.check("sink")
        return parsed
