"""Replacing a small file atomically: nsqd.dat, disk queue meta files, deferred indexes.

The data goes to ``<path>.<random>.tmp`` (created 0600, never over an existing file), is fsynced,
and is renamed over ``path``. A reader therefore sees the old file or the new one, never a mix,
and a crash leaves at worst a stray ``.tmp`` file. On failure the temporary file is removed and
the error propagates.
"""

from __future__ import annotations

import os
import random

__all__ = ["replace_file"]


def replace_file(path: str, data: bytes) -> None:
    tmp = f"{path}.{random.getrandbits(63)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
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
