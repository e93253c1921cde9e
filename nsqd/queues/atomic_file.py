"""Replacing a small file atomically: nsqd.dat, disk queue meta files, deferred indexes.

The data goes to ``<path>.<random>.tmp`` (created 0600, never over an existing file), is fsynced,
and is renamed over ``path``. A reader therefore sees the old file or the new one, never a mix,
and a crash leaves at worst a stray ``.tmp`` file, which ``remove_stray_temporaries`` deletes at the
next start. On failure the temporary file is removed and the error propagates.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import time

__all__ = ["remove_stray_temporaries", "replace_file"]

#: the names ``replace_file`` gives its temporary files for the files nsqd replaces this way
_STRAY = re.compile(r"(?:nsqd\.dat|.+\.diskqueue\.meta\.dat|.+\.deferred\.dat|.+\.log\.meta)\.\d+\.tmp\Z")


def replace_file(path: str, data: bytes | list[bytes], *, sync: bool = True, pause: float = 0.0) -> None:
    """``data``: the bytes, or pieces of them written one after the other (``writev``, no joined copy).
    ``sync=False`` skips the fsync: for content whose loss in a power cut loses nothing (see the callers).
    ``pause``: seconds slept between two ``writev`` of many pieces (``_IOV_MAX`` each), for a large file written by a
    worker thread that may share the event loop's core: the kernel's copy of each comes as a short piece of work
    the loop can run between, where a single stretch of a megabyte held the core from the loop for a millisecond
    (as ``file_worker.remove_in_steps`` does for removals)."""
    tmp = f"{path}.{random.getrandbits(63)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            if isinstance(data, list):
                _write_pieces(fd, data, pause)
            else:
                _write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


#: pieces per ``writev`` (the system's limit)
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024, 1024)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_pieces(fd: int, pieces: list[bytes], pause: float = 0.0) -> None:
    for start in range(0, len(pieces), _IOV_MAX):
        if start and pause:
            time.sleep(pause)
        chunk = pieces[start : start + _IOV_MAX]
        done = os.writev(fd, chunk)
        if done < sum(map(len, chunk)):  # a short write (a full disk): the rest, plainly, raises the real error
            _write_all(fd, b"".join(chunk)[done:])


def remove_stray_temporaries(directory: str) -> list[str]:
    """Delete the temporary files that ``replace_file`` left in ``directory`` when the process was killed
    between creating one and renaming it (only names it makes, for nsqd's own files); returns the names
    removed. Call it only while holding the directory's lock, when nothing else can be writing one."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.endswith(".tmp") and _STRAY.match(name):
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            removed.append(name)
    return removed
