"""The parts of replacing a peer gone for good that need no daemon: the order in which an origin tries the
candidates nsqlookupd knows, and the peers a restart takes from ``replication.peers.json`` (the ring test is
``tests/integration/test_replication_replace.py``)."""

from __future__ import annotations

import json

from nsqd.replication.replace import STATE_FILE, current_peers, load_replacements, spread


def test_each_origin_orders_the_candidates_its_own_way():
    candidates = [f"10.0.0.{n}:4150" for n in range(1, 9)]
    orders = {tuple(spread(f"10.0.1.{n}:4150", candidates)) for n in range(1, 9)}
    for order in orders:
        assert sorted(order) == candidates  # every candidate, once
    assert spread("10.0.1.1:4150", candidates) == spread("10.0.1.1:4150", list(reversed(candidates)))
    assert len({order[0] for order in orders}) > 1  # not every origin puts the same node first


def test_a_restart_keeps_the_peers_that_replaced_lost_ones(tmp_path):
    assert current_peers(str(tmp_path), ["b:1", "c:1"]) == ["b:1", "c:1"]  # no file: the flags
    (tmp_path / STATE_FILE).write_text(json.dumps({"replaced": {"c:1": "d:1", "d:1": "e:1"}, "release": ["c:1"]}))
    assert current_peers(str(tmp_path), ["b:1", "c:1"]) == ["b:1", "e:1"]  # a chain followed to its end
    assert current_peers(str(tmp_path), ["b:1", "x:1"]) == ["b:1", "x:1"]  # flags edited since: theirs
    assert load_replacements(str(tmp_path))[1] == ["c:1"]
    (tmp_path / STATE_FILE).write_text(json.dumps({"replaced": {"c:1": "d:1", "d:1": "c:1"}}))
    assert current_peers(str(tmp_path), ["c:1"]) == ["d:1"]  # a loop ends
    (tmp_path / STATE_FILE).write_text("not json")
    assert current_peers(str(tmp_path), ["c:1"]) == ["c:1"]
