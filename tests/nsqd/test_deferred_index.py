"""The deferred index side file: its format, damage handling and the stale-entry rule."""

from __future__ import annotations

import logging
import struct
import zlib

from nsqd.queues.deferred_index import MAGIC, DeferredIndex, decode, encode, side_file_name

ID_A = b"18a398c44e669000"
ID_B = b"18a398c44e669001"


def test_file_format_is_exact(tmp_path):
    index = DeferredIndex(str(tmp_path), "orders:archive")
    index.add(ID_A, 1_700_000_000_123_456_789)
    index.save((2, 4096), extra=[(ID_B, 5)])
    path = tmp_path / "orders:archive.deferred.dat"
    assert side_file_name(str(tmp_path), "orders:archive") == str(path)
    body = MAGIC + struct.pack(">qqI", 2, 4096, 2) + ID_A + struct.pack(">q", 1_700_000_000_123_456_789)
    body += ID_B + struct.pack(">q", 5)
    assert path.read_bytes() == body + struct.pack(">I", zlib.crc32(body))
    assert path.stat().st_mode & 0o777 == 0o600


def test_load_restores_entries_until_the_reader_passes_the_saved_end(tmp_path, caplog):
    DeferredIndex(str(tmp_path), "t").save((1, 500), extra=[(ID_A, 10), (ID_B, 20)])
    index = DeferredIndex(str(tmp_path), "t")
    assert index.load((0, 0)) == 2
    assert index.take(ID_A) == 10
    assert index.take(ID_A) is None
    index.reader_moved((1, 499))
    assert len(index) == 1
    caplog.set_level(logging.WARNING)
    index.reader_moved((1, 500))  # ID_B was never read back: it is not in the queue any more
    assert len(index) == 0 and "matched no message" in caplog.text


def test_entries_added_while_running_are_not_subject_to_the_saved_end(tmp_path):
    DeferredIndex(str(tmp_path), "t").save((0, 100), extra=[(ID_A, 10)])
    index = DeferredIndex(str(tmp_path), "t")
    index.load((0, 0))
    index.add(ID_B, 30)
    index.reader_moved((0, 200))
    assert index.due == {ID_B: 30}


def test_a_file_already_read_past_loads_nothing(tmp_path):
    DeferredIndex(str(tmp_path), "t").save((3, 0), extra=[(ID_A, 10)])
    index = DeferredIndex(str(tmp_path), "t")
    assert index.load((3, 0)) == 0 and not index


def test_damaged_files_are_ignored(tmp_path, caplog):
    good = encode((0, 90), [(ID_A, 10)])
    variants = {
        "truncated": good[:-1],
        "bad checksum": good[:-1] + bytes([good[-1] ^ 1]),
        "bad magic": b"X" + good[1:],
        "empty": b"",
        "count too large": good[:24] + struct.pack(">I", 5) + good[28:],
    }
    for label, data in variants.items():
        assert decode(data) is None, label
        path = tmp_path / "t.deferred.dat"
        path.write_bytes(data)
        index = DeferredIndex(str(tmp_path), "t")
        assert index.load((0, 0)) == 0 and not index, label
    assert "damaged file ignored" in caplog.text
    assert decode(good) == ((0, 90), [(ID_A, 10)])


def test_saving_nothing_removes_the_file(tmp_path):
    index = DeferredIndex(str(tmp_path), "t")
    index.save((0, 10), extra=[(ID_A, 1)])
    assert (tmp_path / "t.deferred.dat").exists()
    index.save((0, 10))
    assert not (tmp_path / "t.deferred.dat").exists()
    index.remove_file()  # nothing to remove: no error
    assert list(tmp_path.iterdir()) == []
