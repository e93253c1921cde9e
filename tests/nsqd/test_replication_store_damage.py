"""ReplicaStore with a damaged file: the damage is counted, never indexed, and the origin's session forgotten (so
its next connection brings a new backfill)."""

from __future__ import annotations

from pathlib import Path

from .test_replication_store import _id, _messages, _open


def test_a_damaged_record_is_not_held_and_the_session_is_forgotten(tmp_path, caplog):
    store = _open(tmp_path)
    store.store([_messages(1, "t", 1, 2), _messages(2, "t", 3, 4), _messages(3, "t", 5)])
    store.session, store.seq = "abc", 3
    store.save_json()
    store.close()
    (segment,) = Path(tmp_path).glob("replica.*.diskqueue.000000.dat")
    assert Path(str(segment) + ".crc").exists()
    data = bytearray(segment.read_bytes())
    at = data.index(b"body3")
    data[at + 4] ^= 0x01  # one byte of a body of the second record
    segment.write_bytes(bytes(data))

    store = _open(tmp_path)
    assert set(store.held) == {_id(1), _id(2), _id(5)}
    assert store.damaged == 1 and store.session == "" and store.seq == 0
    assert "damaged record" in caplog.text and "new backfill" in caplog.text
    store.close()
    assert _open(tmp_path).session == ""  # forgotten on disk too
