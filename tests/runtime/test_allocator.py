"""runtime.allocator: the C heap's free pages go back to the system."""

from __future__ import annotations

import ctypes
import os

import pytest

from runtime.allocator import release_free_memory


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _glibc() -> bool:
    try:
        ctypes.CDLL(None).malloc_trim  # noqa: B018 (the lookup is the check)
    except AttributeError:
        return False
    return True


def test_release_answers_on_every_call() -> None:
    assert release_free_memory() in (True, False)
    assert release_free_memory() in (True, False)


@pytest.mark.skipif(not _glibc(), reason="a C library without malloc_trim: the release is a no-op")
def test_freed_blocks_inside_the_heap_leave_the_resident_set() -> None:
    # 32 KiB blocks come from malloc's heap (under its 128 KiB mapping threshold); a small one after each keeps
    # them from merging into the heap's top, which free() would give back by itself
    blocks = []
    for _ in range(2000):
        blocks.append(bytearray(32 * 1024))
        blocks.append(bytearray(700))
    for block in blocks[::2]:
        block[::4096] = b"x" * len(block[::4096])  # touch every page: resident
    release_free_memory()
    grown = _resident()
    del blocks[::2]  # 62 MiB freed inside the heap, the small blocks still between them
    freed_before = grown - _resident()
    assert release_free_memory()
    freed = grown - _resident()
    assert freed - freed_before > 32 * 1024 * 1024, (freed_before, freed)
