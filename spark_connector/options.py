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
walPath                  required   directory of the write-ahead log, one per query
ackMode                  durable    ``durable``: FIN once the message is fsynced in the log;
                                    ``commit``: FIN when Spark commits the batch holding it
maxMessagesPerTrigger    none       upper bound of messages per micro-batch (Spark ReadMaxRows)
minPartitions            none       split a micro-batch into at least about this many partitions
                                    (Spark tasks) of consecutive messages; default one per nsqd
maxInFlight              2500       RDY budget shared by the nsqd connections
maxBacklogMessages       1000000    logged but uncommitted messages above which RDY drops to 0
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
snappy / deflate         false      compression (needs protocol/compression.py; see README)
deflate.level            6          requested deflate level
auth.secret              --         sent with AUTH when nsqd requires it
======================== ========== ===============================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from protocol.names import is_valid_channel_name, is_valid_topic_name

__all__ = ["ACK_COMMIT", "ACK_DURABLE", "SourceOptions"]

ACK_DURABLE = "durable"
ACK_COMMIT = "commit"

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


@dataclass(frozen=True)
class SourceOptions:
    nsqd_addresses: tuple[str, ...]
    lookupd_addresses: tuple[str, ...]
    topic: str
    channel: str
    wal_path: str
    ack_mode: str = ACK_DURABLE
    max_messages_per_trigger: int | None = None
    min_partitions: int | None = None
    max_in_flight: int = 2500
    max_backlog_messages: int = 1_000_000
    msg_timeout_ms: int | None = None
    wal_segment_bytes: int = 16 << 20
    dedup_window: int = 200_000
    lookupd_poll_interval_ms: int = 15_000
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

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> "SourceOptions":
        opts = {str(k).lower(): v for k, v in raw.items()}
        errors: list[str] = []

        def text(name: str) -> str | None:
            value = opts.get(name.lower())
            return None if value is None else str(value).strip()

        def integer(name: str, default: int | None, minimum: int) -> int | None:
            value = text(name)
            if value is None or value == "":
                return default
            try:
                number = int(value)
            except ValueError:
                errors.append(f"option {name}={value!r} is not an integer")
                return default
            if number < minimum:
                errors.append(f"option {name}={number} must be at least {minimum}")
                return default
            return number

        def boolean(name: str, default: bool = False) -> bool:
            value = text(name)
            if value is None:
                return default
            if value.lower() in _TRUE:
                return True
            if value.lower() in _FALSE:
                return False
            errors.append(f"option {name}={value!r} is not a boolean (true/false)")
            return default

        def addresses(name: str) -> tuple[str, ...]:
            value = text(name) or ""
            return tuple(a.strip() for a in value.split(",") if a.strip())

        nsqd = addresses("nsqd.tcp.addresses")
        for address in nsqd:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                errors.append(f"nsqd address {address!r} is not host:port")
        lookupd = addresses("lookupd.http.addresses")
        if not nsqd and not lookupd:
            errors.append("set nsqd.tcp.addresses or lookupd.http.addresses")
        topic = text("topic") or ""
        channel = text("channel") or ""
        if not topic:
            errors.append("option topic is required")
        elif not is_valid_topic_name(topic):
            errors.append(f"topic {topic!r} is not a valid NSQ topic name")
        if not channel:
            errors.append("option channel is required")
        elif not is_valid_channel_name(channel):
            errors.append(f"channel {channel!r} is not a valid NSQ channel name")
        wal_path = text("walPath") or ""
        if not wal_path:
            errors.append("option walPath is required (a directory of its own for each query)")
        ack_mode = (text("ackMode") or ACK_DURABLE).lower()
        if ack_mode not in (ACK_DURABLE, ACK_COMMIT):
            errors.append(f"option ackMode={ack_mode!r} must be {ACK_DURABLE!r} or {ACK_COMMIT!r}")
        msg_timeout = integer("msgTimeoutMs", None, 1000)
        deflate_level = integer("deflate.level", 6, 1)
        snappy = boolean("snappy")
        deflate = boolean("deflate")
        if snappy and deflate:
            errors.append("options snappy and deflate are exclusive")
        parsed = cls(
            nsqd_addresses=nsqd,
            lookupd_addresses=lookupd,
            topic=topic,
            channel=channel,
            wal_path=wal_path,
            ack_mode=ack_mode,
            max_messages_per_trigger=integer("maxMessagesPerTrigger", None, 1),
            min_partitions=integer("minPartitions", None, 1),
            max_in_flight=integer("maxInFlight", 2500, 1),
            max_backlog_messages=integer("maxBacklogMessages", 1_000_000, 1),
            msg_timeout_ms=msg_timeout,
            wal_segment_bytes=integer("walSegmentBytes", 16 << 20, 1),
            dedup_window=integer("dedupWindow", 200_000, 0),
            lookupd_poll_interval_ms=integer("lookupd.pollIntervalMs", 15_000, 10),
            connect_timeout_ms=integer("connectTimeoutMs", 10_000, 1),
            client_id=text("clientId"),
            hostname=text("hostname"),
            tls=boolean("tls"),
            tls_ca_file=text("tls.caFile"),
            tls_cert_file=text("tls.certFile"),
            tls_key_file=text("tls.keyFile"),
            tls_insecure=boolean("tls.insecure"),
            tls_server_name=text("tls.serverName"),
            snappy=snappy,
            deflate=deflate,
            deflate_level=deflate_level or 6,
            auth_secret=text("auth.secret"),
        )
        if errors:
            raise ValueError("nsq source: " + "; ".join(errors))
        return parsed
