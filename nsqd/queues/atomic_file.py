"""Replacing a small file atomically: nsqd.dat, disk queue meta files, deferred indexes.

The data goes to ``<path>.<random>.tmp`` (created 0600, never over an existing file), is fsynced,
and is renamed over ``path``. A reader therefore sees the old file or the new one, never a mix,
and a crash leaves at worst a stray ``.tmp`` file, which ``remove_stray_temporaries`` deletes at the
next start. On failure the temporary file is removed and the error propagates.
"""

from __future__ import annotations

import os
import random
import re

__all__ = ["remove_stray_temporaries", "replace_file"]

#: the names ``replace_file`` gives its temporary files for the files nsqd replaces this way
_STRAY = re.compile(r"(?:nsqd\.dat|.+\.diskqueue\.meta\.dat|.+\.deferred\.dat)\.\d+\.tmp\Z")


def replace_file(path: str, data: bytes, *, sync: bool = True) -> None:
    """``sync=False`` skips the fsync: for content whose loss in a power cut loses nothing (see the callers)."""
    tmp = f"{path}.{random.getrandbits(63)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def remove_stray_temporaries(directory: str) -> list[str]:
    """Delete the temporary files that ``replace_file`` left in ``directory`` when the process was killed
    between creating one and renaming it (only names it makes, for nsqd's own files); returns the names
    removed. Call it only while holding the directory's lock, when nothing else can be writing one."""
    removed = []
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
