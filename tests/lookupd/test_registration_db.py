"""The registration database: keys, producers, wildcards, activity and tombstones."""

from lookupd.registration_db import (
    CLIENT,
    GO_ZERO_TIME_NS,
    PeerInfo,
    Producer,
    Registration,
    RegistrationDB,
    filter_active,
)

S = 1_000_000_000


def peer(peer_id: str, last_update: int = 0) -> PeerInfo:
    return PeerInfo(
        id=peer_id,
        remote_address=peer_id,
        hostname="h",
        broadcast_address="b",
        tcp_port=4150,
        http_port=4151,
        version="1.3.0",
        last_update=last_update,
    )


def topic(name: str) -> Registration:
    return Registration("topic", name, "")


def channel(topic_name: str, name: str) -> Registration:
    return Registration("channel", topic_name, name)


def test_add_producer_once_per_peer_and_keep_the_first():
    db = RegistrationDB()
    a = peer("a")
    first = Producer(a)
    assert db.add_producer(topic("t"), first)
    assert not db.add_producer(topic("t"), Producer(a))
    assert db.find_producers("topic", "t", "") == [first]
    assert db.add_producer(topic("t"), Producer(peer("b")))
    assert len(db.find_producers("topic", "t", "")) == 2


def test_keys_remain_without_producers():
    db = RegistrationDB()
    db.add_producer(topic("t"), Producer(peer("a")))
    assert db.remove_producer(topic("t"), "a") == (True, 0)
    assert db.remove_producer(topic("t"), "a") == (False, 0)
    assert db.find_registrations("topic", "t", "") == [topic("t")]
    assert db.remove_producer(topic("missing"), "a") == (False, 0)
    db.add_registration(topic("t"))  # existing key: nothing changes
    db.remove_registration(topic("t"))
    assert db.find_registrations("topic", "*", "") == []
    db.remove_registration(topic("t"))  # absent: no error


def test_wildcards():
    db = RegistrationDB()
    for t, c in (("t1", "c1"), ("t1", "c2"), ("t2", "c1")):
        db.add_producer(channel(t, c), Producer(peer("a")))
        db.add_producer(topic(t), Producer(peer("a")))
    db.add_producer(channel("t2", "c1"), Producer(peer("b")))
    assert sorted(r.subkey for r in db.find_registrations("channel", "t1", "*")) == ["c1", "c2"]
    assert sorted(r.key for r in db.find_registrations("channel", "*", "c1")) == ["t1", "t2"]
    assert len(db.find_registrations("channel", "*", "*")) == 3
    assert sorted(r.key for r in db.find_registrations("topic", "*", "")) == ["t1", "t2"]
    assert db.find_registrations("channel", "t1", "c9") == []
    # one producer per peer across the matching keys
    assert sorted(p.peer.id for p in db.find_producers("channel", "*", "*")) == ["a", "b"]
    assert db.find_producers("topic", "nope", "") == []


def test_peer_index_follows_every_change():
    db = RegistrationDB()
    db.add_producer(CLIENT, Producer(peer("a")))
    db.add_producer(topic("t"), Producer(peer("a")))
    db.add_producer(channel("t", "c"), Producer(peer("a")))
    assert set(db.lookup_registrations("a")) == {CLIENT, topic("t"), channel("t", "c")}
    db.remove_registration(channel("t", "c"))
    assert set(db.lookup_registrations("a")) == {CLIENT, topic("t")}
    assert set(db.remove_peer("a")) == {CLIENT, topic("t")}
    assert db.lookup_registrations("a") == []
    assert db.find_registrations("topic", "t", "") == [topic("t")]


def test_peer_producers_are_the_peers_own_keys_of_a_category():
    db = RegistrationDB()
    a, b = peer("a"), peer("b")
    for name in ("t1", "t2"):
        db.add_producer(topic(name), Producer(a))
        db.add_producer(channel(name, "c"), Producer(a))
    db.add_producer(topic("t1"), Producer(b))
    found = db.peer_producers("a", "topic")
    assert [key for key, _ in found] == [topic("t1"), topic("t2")]
    assert all(producer.peer is a for _, producer in found)
    assert db.peer_producers("b", "topic") == [(topic("t1"), db.producer(topic("t1"), "b"))]
    assert db.peer_producers("nobody", "topic") == []


def test_activity_and_tombstones():
    now = 1000 * S
    fresh, stale = peer("fresh", now - 5 * S), peer("stale", now - 301 * S)
    producers = [Producer(fresh), Producer(stale)]
    assert filter_active(producers, 300 * S, 45 * S, now) == [producers[0]]
    assert filter_active(producers, 301 * S, 45 * S, now) == producers  # the limit itself is still active
    assert producers[0].tombstoned_at == GO_ZERO_TIME_NS
    producers[0].tombstone(now - 10 * S)
    assert producers[0].is_tombstoned(45 * S, now)
    assert filter_active(producers, 400 * S, 45 * S, now) == [producers[1]]
    assert not producers[0].is_tombstoned(10 * S, now)  # the lifetime has passed
    assert filter_active(producers, 400 * S, 10 * S, now) == producers
    assert filter_active(producers, 400 * S, 0, now) == producers  # /nodes does not filter tombstones


def test_tombstone_is_per_topic_and_peer_info_is_shared():
    db = RegistrationDB()
    a = peer("a")
    db.add_producer(topic("t1"), Producer(a))
    db.add_producer(topic("t2"), Producer(a))
    db.producer(topic("t1"), "a").tombstone(5)
    assert db.producer(topic("t1"), "a").tombstoned
    assert not db.producer(topic("t2"), "a").tombstoned
    a.last_update = 42  # a PING refreshes the peer under every key
    assert {p.peer.last_update for p in db.find_producers("topic", "*", "")} == {42}
