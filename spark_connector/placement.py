"""Where the write-ahead log may live: which ``ackMode``/``walPath`` combinations survive a driver
that restarts on another machine.

- ``ackMode=commit``: nsqd keeps every message until Spark's commit covers it, so the log only
  serves the running driver; a restart with a lost, different or empty ``walPath`` loses nothing
  (the messages of uncommitted batches come again from nsqd). Safe everywhere.
- ``ackMode=durable``: a message is FIN'd as soon as it is in the log, so until Spark commits it
  the log holds its only copy. The ``walPath`` must be where the next driver will find it: a
  local disk is enough when the driver always restarts on the same machine (client deploy mode
  on a fixed host); when the driver may restart elsewhere (cluster deploy mode: standalone
  ``--deploy-mode cluster --supervise``, YARN, Kubernetes) it must be shared storage mounted at
  the same path on every machine that may run the driver (NFS, CephFS, GlusterFS, Lustre...), or
  a volume that follows the driver (say so with ``walPathShared=true``).

``check_placement`` refuses, when the source starts, what it can tell is unsafe (durable mode, a
driver in cluster deploy mode, a ``walPath`` on a filesystem of this machine), and logs a warning
where it cannot tell (durable mode on a local filesystem, deploy mode unknown; a ``walPath`` in
memory, tmpfs, which a reboot empties).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .options import ACK_DURABLE, SourceOptions

__all__ = ["SHARED_FILESYSTEMS", "UnsafePlacementError", "check_placement", "cluster_driver", "filesystem_of"]

log = logging.getLogger("spark_connector.placement")

SHARED_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "fuse.cephfs",
        "fuse.juicefs",
        "fuse.mfs",
        "ocfs2",
        "gfs2",
        "9p",
        "virtiofs",
        "afs",
        "fuse.sshfs",
    }
)
_MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})

# The main classes of a driver JVM that Spark starts in cluster deploy mode.
_CLUSTER_DRIVER_CLASSES = {
    b"org.apache.spark.deploy.worker.DriverWrapper": "standalone cluster deploy mode",
    b"org.apache.spark.deploy.yarn.ApplicationMaster": "YARN cluster deploy mode",
}


class UnsafePlacementError(ValueError):
    """The walPath cannot keep durable mode's promise where this driver runs."""


def filesystem_of(path: str | Path) -> str | None:
    """The type of the filesystem ``path`` is on (from /proc/mounts), or None if unknown."""
    target = os.path.realpath(path)
    while not os.path.exists(target):
        parent = os.path.dirname(target)
        if parent == target:
            break
        target = parent
    best, kind = "", None
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[2]
    except OSError:
        return None
    return kind


def cluster_driver() -> str | None:
    """How this driver was started, when that is cluster deploy mode (its driver may restart on
    another machine); None when it cannot tell. Looks at the JVM this Python process descends
    from and at the environment Kubernetes gives a pod."""
    pid = os.getppid()
    for _ in range(8):
        if pid <= 1:
            break
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        for main_class, how in _CLUSTER_DRIVER_CLASSES.items():
            if main_class in cmdline:
                return how
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    if os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("SPARK_DRIVER_BIND_ADDRESS"):
        return "a Kubernetes driver pod"
    return None


def check_placement(options: SourceOptions) -> None:
    """Refuse (``UnsafePlacementError``) or warn about a walPath that durable mode cannot rely on."""
    if options.ack_mode != ACK_DURABLE or options.wal_path_shared:
        return
    kind = filesystem_of(options.wal_path)
    if kind in SHARED_FILESYSTEMS:
        return
    where = f"walPath {options.wal_path} is on a {kind or 'local'} filesystem of this machine"
    driver = cluster_driver()
    if driver is not None:
        raise UnsafePlacementError(
            f"nsq source: ackMode=durable with {where}, but the driver runs in {driver} and may "
            f"restart on another machine, without this log: the messages it holds (FIN'd, not yet "
            f"committed by Spark) would be lost. Use ackMode=commit (safe with any walPath), or a walPath "
            f"on shared storage mounted on every machine that may run the driver; set walPathShared=true "
            f"if this path is such storage (a volume that follows the driver)"
        )
    if kind in _MEMORY_FILESYSTEMS:
        log.warning(
            "nsq source: ackMode=durable with %s in memory (%s): a reboot empties it and loses the "
            "messages Spark has not committed; use ackMode=commit or a walPath on disk",
            where,
            kind,
        )
        return
    log.warning(
        "nsq source: ackMode=durable with %s: safe only if the driver always restarts on this "
        "machine; if it may restart elsewhere (cluster deploy mode), use ackMode=commit or a walPath on "
        "shared storage (walPathShared=true)",
        where,
    )
