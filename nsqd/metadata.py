"""``nsqd.dat``: the list of topics and channels (with their paused flags) that survives restarts.

Same JSON as nsqd 1.3.0 writes, so a data directory moves between the two:
``{"topics":[{"name":T,"paused":false,"channels":[{"name":C,"paused":false}]}],"version":"1.3.0"}``
with ``null`` for an empty list. Ephemeral topics and channels are never written. The file is
replaced atomically: written to ``nsqd.dat.<random>.tmp``, fsynced, renamed over the old one.
The data directory is held with an exclusive ``flock`` so that two daemons cannot share it.

It is written by ``metadata_writer.py`` (off the event loop, coalesced).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from typing import Any

from protocol.names import is_ephemeral, is_valid_channel_name, is_valid_topic_name
from protocol.version import NSQ_VERSION

__all__ = [
    "FILE_NAME",
    "DataDirLocked",
    "Prebound",
    "bind_addresses",
    "lock_data_path",
    "prebind",
    "load_metadata",
    "snapshot",
]

FILE_NAME = "nsqd.dat"
log = logging.getLogger("nsqd")


class DataDirLocked(Exception):
    """Another process holds the data directory."""


class Prebound:
    """What nsqd takes before it imports its serving code: the data directory's lock and its listening sockets
    (``--tcp-address``, ``--http-address``, and ``--https-address`` when a certificate is configured), in nsqd's
    order, so a second nsqd on the same directory or ports is refused as nsqd refuses it."""

    __slots__ = ("data_lock", "tcp", "http", "https", "mesh")

    def __init__(self, data_lock: int, tcp: list, http: list, https: list) -> None:
        self.data_lock = data_lock
        self.tcp = tcp
        self.http = http
        self.https = https
        #: with ``--workers`` above 1, this worker's place among them (``supervisor.MeshSockets``)
        self.mesh: Any = None


def bind_addresses(opts) -> list[list]:
    """The listening sockets of ``--tcp-address``, ``--http-address`` and, when a certificate is configured,
    ``--https-address``, in that order (an unused one gets none); raises ``ListenError``."""
    from runtime.startup import bind_all  # light, but only start-up needs it

    # "" turns HTTP and HTTPS off, and HTTPS needs a certificate; nsqd listens on a unix socket where the TCP or
    # HTTP address is a path (Go's TypeOfAddr), HTTPS only on TCP
    https_address = opts.https_address if (opts.tls_cert or opts.tls_key) and opts.https_address else None
    return bind_all((opts.tcp_address, True), (opts.http_address or None, True), (https_address, False))


def prebind(opts) -> Prebound:
    """Lock ``--data-path`` and bind nsqd's addresses (``Prebound``); raises ``DataDirLocked`` or ``ListenError``."""
    data_lock = lock_data_path(opts.data_path or os.getcwd())
    try:
        tcp, http, https = bind_addresses(opts)
    except BaseException:
        os.close(data_lock)
        raise
    return Prebound(data_lock, tcp, http, https)


def lock_data_path(path: str) -> int:
    """Take the exclusive lock on the directory; returns the fd to keep open for the lifetime."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)  # Go's wording of EWOULDBLOCK
        raise DataDirLocked(
            f"failed to lock data-path: cannot flock directory {path} - {reason} "
            "(possibly in use by another instance of nsqd)"
        ) from exc
    return fd


def snapshot(topics) -> dict:
    """The metadata document for the live topics (``Topic`` objects), as a whole (``MetadataWriter`` writes the
    same by parts)."""
    entries = []
    for topic in topics:
        if topic.ephemeral:
            continue
        channels = [{"name": c.name, "paused": c.paused} for c in topic.channels.values() if not c.ephemeral]
        entries.append({"name": topic.name, "paused": topic.paused, "channels": channels or None})
    return {"topics": entries or None, "version": NSQ_VERSION}


def load_metadata(data_path: str) -> list[dict]:
    """Topics to restore: ``[{"name", "paused", "channels": [{"name", "paused"}]}]``.

    A missing file is a fresh start; an unreadable one raises (nsqd refuses to start); invalid
    names are skipped with a warning.
    """
    path = os.path.join(data_path, FILE_NAME)
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return []
    try:
        document = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"failed to parse metadata in {path} - {exc}") from exc
    topics = []
    for topic in document.get("topics") or []:
        name = topic.get("name", "")
        if not is_valid_topic_name(name) or is_ephemeral(name):
            log.warning("skipping creation of invalid topic %s", name)
            continue
        channels = []
        for channel in topic.get("channels") or []:
            channel_name = channel.get("name", "")
            if not is_valid_channel_name(channel_name) or is_ephemeral(channel_name):
                log.warning("skipping creation of invalid channel %s", channel_name)
                continue
            channels.append({"name": channel_name, "paused": bool(channel.get("paused"))})
        topics.append({"name": name, "paused": bool(topic.get("paused")), "channels": channels})
    return topics
