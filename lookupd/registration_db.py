"""The registration database: which nsqd produces which topic and channel.

A registration is a key ``(category, key, subkey)``: ``("topic", T, "")``, ``("channel", T, C)``
or the special ``("client", "", "")`` that every identified nsqd joins (``/nodes`` reads it). Each
key maps peer ids (the TCP remote ``ip:port`` of the nsqd's connection) to a ``Producer``. A key
may exist with no producers: ``/topic/create`` adds one, and keys stay when their producers leave.

A ``Producer`` is one peer under one key, so a tombstone (``/topic/tombstone``) hides a peer for
one topic only. The peer's ``PeerInfo`` is shared by all its producers: a PING refreshes
``last_update`` everywhere at once. A producer is active while ``now - last_update`` is at most
``--inactive-producer-timeout`` (nsqd PINGs every 15 s) and it is not tombstoned, i.e. was not
tombstoned within ``--tombstone-lifetime``.

Lookups with ``"*"`` as key or subkey match every value, as lookupd's do (so ``/channels?topic=*``
lists the channels of every topic). Two indexes keep the common queries off a full scan: keys by
``(category, key)`` and keys by peer id. Times are wall-clock nanoseconds (``time.time_ns()``),
passed in by the caller so that the database itself never reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["CLIENT", "GO_ZERO_TIME_NS", "PeerInfo", "Producer", "Registration", "RegistrationDB", "filter_active"]

#: ``time.Time{}.UnixNano()`` in Go: what lookupd reports as ``tombstoned_at`` for a producer never tombstoned.
GO_ZERO_TIME_NS = -6795364578871345152


class Registration(NamedTuple):
    category: str
    key: str
    subkey: str


CLIENT = Registration("client", "", "")


@dataclass(eq=False, slots=True)
class PeerInfo:
    id: str
    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    last_update: int  # ns

    def as_json(self) -> dict:
        """The peer object of ``/lookup``, in lookupd's key order."""
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }

    def __str__(self) -> str:
        return f"{self.broadcast_address} [{self.tcp_port}, {self.http_port}]"


@dataclass(eq=False, slots=True)
class Producer:
    peer: PeerInfo
    tombstoned: bool = False
    tombstoned_at: int = GO_ZERO_TIME_NS  # ns

    def tombstone(self, now_ns: int) -> None:
        self.tombstoned = True
        self.tombstoned_at = now_ns

    def is_tombstoned(self, lifetime_ns: int, now_ns: int) -> bool:
        return self.tombstoned and now_ns - self.tombstoned_at < lifetime_ns


def filter_active(
    producers: Iterable[Producer], inactive_timeout_ns: int, tombstone_lifetime_ns: int, now_ns: int
) -> list[Producer]:
    """Producers seen within ``inactive_timeout_ns`` and not tombstoned within ``tombstone_lifetime_ns``."""
    return [
        p
        for p in producers
        if now_ns - p.peer.last_update <= inactive_timeout_ns and not p.is_tombstoned(tombstone_lifetime_ns, now_ns)
    ]


def _matches(registration: Registration, category: str, key: str, subkey: str) -> bool:
    return (
        registration.category == category
        and (key == "*" or registration.key == key)
        and (subkey == "*" or registration.subkey == subkey)
    )


class RegistrationDB:
    def __init__(self) -> None:
        self._producers: dict[Registration, dict[str, Producer]] = {}
        self._by_key: dict[tuple[str, str], dict[Registration, None]] = {}  # ordered sets
        self._by_peer: dict[str, dict[Registration, None]] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def items(self):
        """Every key with its producers (``/debug``)."""
        return self._producers.items()

    def add_registration(self, registration: Registration) -> None:
        """Add a key with no producers (no-op when it exists)."""
        if registration not in self._producers:
            self._producers[registration] = {}
            self._by_key.setdefault((registration.category, registration.key), {})[registration] = None

    def add_producer(self, registration: Registration, producer: Producer) -> bool:
        """Add ``producer`` under the key (created if needed); False if its peer was already there,
        in which case the existing producer, tombstone included, is kept."""
        self.add_registration(registration)
        producers = self._producers[registration]
        peer_id = producer.peer.id
        if peer_id in producers:
            return False
        producers[peer_id] = producer
        self._by_peer.setdefault(peer_id, {})[registration] = None
        return True

    def remove_producer(self, registration: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove a peer from a key; returns (whether it was there, producers left). The key stays."""
        producers = self._producers.get(registration)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        if removed:
            self._unindex_peer(peer_id, registration)
        return removed, len(producers)

    def remove_registration(self, registration: Registration) -> None:
        """Remove a key and all its producers."""
        producers = self._producers.pop(registration, None)
        if producers is None:
            return
        for peer_id in producers:
            self._unindex_peer(peer_id, registration)
        group = self._by_key.get((registration.category, registration.key))
        if group is not None:
            group.pop(registration, None)
            if not group:
                del self._by_key[(registration.category, registration.key)]

    def _unindex_peer(self, peer_id: str, registration: Registration) -> None:
        keys = self._by_peer.get(peer_id)
        if keys is not None:
            keys.pop(registration, None)
            if not keys:
                del self._by_peer[peer_id]

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        """Keys matching the pattern (``"*"`` as key or subkey matches anything)."""
        if key != "*" and subkey != "*":
            registration = Registration(category, key, subkey)
            return [registration] if registration in self._producers else []
        if key != "*":
            return [r for r in self._by_key.get((category, key), ()) if subkey == "*" or r.subkey == subkey]
        return [r for r in self._producers if _matches(r, category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """Producers under the matching keys, one per peer."""
        if key != "*" and subkey != "*":
            return list(self._producers.get(Registration(category, key, subkey), {}).values())
        seen: dict[str, Producer] = {}
        for registration in self.find_registrations(category, key, subkey):
            for peer_id, producer in self._producers[registration].items():
                seen.setdefault(peer_id, producer)
        return list(seen.values())

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every key the peer is registered under."""
        return list(self._by_peer.get(peer_id, ()))

    def peer_producers(self, peer_id: str, category: str) -> list[tuple[Registration, Producer]]:
        """The peer's keys of ``category``, each with the peer's producer under it (``/nodes``: one pass over
        the peer's own keys, however many other peers and keys there are)."""
        producers = self._producers
        return [(r, producers[r][peer_id]) for r in self._by_peer.get(peer_id, ()) if r.category == category]

    def producer(self, registration: Registration, peer_id: str) -> Producer | None:
        return self._producers.get(registration, {}).get(peer_id)

    def remove_peer(self, peer_id: str) -> list[Registration]:
        """Remove the peer from every key (its connection closed); returns the keys it left."""
        left = self.lookup_registrations(peer_id)
        for registration in left:
            self.remove_producer(registration, peer_id)
        return left
