"""The origin's side of a heal: which copies a replica sends back go into the channels again.

A queue of this node that finds records damaged or lost (``queues/checksums.py``) asks its replicas for their
copies (PROTOCOL.md, "Damage"). A replica cannot tell which of the messages a damaged channel did not name in the
backfill were lost and which were finished here without their FIN reaching it (a replica that was away while the
channel went on misses every FIN of that time), so it sends back all of them: put back as they came, a single lost
record could bring back a channel's whole finished history (1,476 messages for one lost record, in a ring under
kills). The origin can tell: each lost record left its side file entry, ``(length, CRC-32C)`` of the record as the
queue wrote it, and a copy whose record would have that entry is the one lost (``LostRecords.claim``).

So ``LostCopies`` keeps, per ``(topic, channel)`` (channel ``""``: the topic's own queue), the entries of the records
found lost (``note``: from the queue's own reader, ``NSQD._queue_damaged``, and from a backfill's reading,
``snapshot.py``), and for each copy a replica sends back (``sort``):

- one put back already (two replicas send the same copies), or held by the channel now (in memory, in flight or
  deferred): left out;
- one that matches a lost record of its channel, or of its topic's queue (then it goes into every channel that
  asks for it): put back;
- any other is set aside until that replica's RESTORED (``settle``), which puts them back only when the damage is
  not fully known: some record was lost without an entry (a file missing with its side file, a file nsqd wrote,
  a depth found short), or some entry was matched by no copy (an entry damaged itself, or attempts the copy did
  not know). Then, as before, every copy goes back: a message comes twice rather than not at all.

A queue of which nothing was noted (its damage was found before a restart) takes every copy, as before. Nothing
changes on the wire: a replica of any version sends what it sends, and a node of an earlier release puts back all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from protocol.replication import ReplicatedMessage

from ..queues.checksums import LostRecords

__all__ = ["LostCopies"]

log = logging.getLogger("nsqd")

Key = tuple[str, str]


class LostCopies:
    """What this node's queues lost, and the copies replicas sent back for them; see the module notes."""

    def __init__(self) -> None:
        #: (topic, channel or "") -> the records its queue found lost
        self.lost: dict[Key, LostRecords] = {}
        #: (topic, channel) -> ids of the copies put back (once, whichever replica sends them)
        self.restored: dict[Key, set[bytes]] = {}
        #: topic -> ids of the copies that matched a lost record of the topic's queue (every channel takes them)
        self._topic_claims: dict[str, set[bytes]] = {}
        #: replica -> (topic, channel) -> id -> a copy it sent that matched nothing (``settle``)
        self._aside: dict[str, dict[Key, dict[bytes, ReplicatedMessage]]] = {}

    def note(self, topic: str, channel: str, lost: LostRecords) -> None:
        """Records of ``topic``'s queue (``channel`` ""), or of one of its channels, found damaged or lost."""
        if lost:
            known = self.lost.get((topic, channel))
            if known is None:
                known = self.lost[(topic, channel)] = LostRecords()
            known.merge(lost)

    def note_queue(self, name: str, lost: LostRecords) -> None:
        """``note`` by the queue's name, ``topic`` or ``topic:channel``."""
        topic, _, channel = name.partition(":")
        self.note(topic, channel, lost)

    def sort(
        self, peer: str, topic: str, channel: str, messages: Iterable[ReplicatedMessage], held: Callable[[], set[bytes]]
    ) -> list[ReplicatedMessage]:
        """The copies of ``messages`` (``ReplicatedMessage``) that ``peer`` sent back for ``channel`` to put back
        now; ``held()``: the ids the channel holds in memory, in flight or deferred."""
        done = self.restored.setdefault((topic, channel), set())
        mine = self.lost.get((topic, channel))
        topics = self.lost.get((topic, ""))
        holding = held()
        fresh = []
        for m in messages:
            if m.id in done or m.id in holding:
                continue
            if (mine is None and topics is None) or self._claim(mine, topics, topic, m):
                fresh.append(m)
                done.add(m.id)
            else:
                self._aside.setdefault(peer, {}).setdefault((topic, channel), {})[m.id] = m
        return fresh

    def _claim(self, mine: LostRecords | None, topics: LostRecords | None, topic: str, m: ReplicatedMessage) -> bool:
        if mine is not None and mine.claim(m.id, m.timestamp, m.attempts, m.body):
            return True
        if topics is None:
            return False
        claims = self._topic_claims.setdefault(topic, set())
        if m.id in claims:
            return True
        if topics.claim(m.id, m.timestamp, m.attempts, m.body):
            claims.add(m.id)
            return True
        return False

    def settle(
        self, peer: str, held: Callable[[str, str], set[bytes]]
    ) -> list[tuple[str, str, list[ReplicatedMessage]]]:
        """``peer`` sent back everything (RESTORED): the copies it sent that matched no lost record, to put back
        for the queues whose damage is not fully known (see the module notes) as ``(topic, channel, copies)``;
        the others are dropped. ``held(topic, channel)``: as for ``sort``."""
        out = []
        for (topic, channel), copies in self._aside.pop(peer, {}).items():
            if not self._unsure(topic, channel):
                log.info(
                    "REPLICATION: %d cop(ies) of %s:%s sent back by %s matched no record lost here: not put back",
                    len(copies),
                    topic,
                    channel,
                    peer,
                )
                continue
            done = self.restored.setdefault((topic, channel), set())
            holding = held(topic, channel)
            fresh = [m for msg_id, m in copies.items() if msg_id not in done and msg_id not in holding]
            done.update(m.id for m in fresh)
            if fresh:
                out.append((topic, channel, fresh))
        return out

    def _unsure(self, topic: str, channel: str) -> bool:
        """Whether records of the channel's or its topic's queue were lost that no copy has been matched to."""
        return any(self.lost.get(key) for key in ((topic, channel), (topic, "")))
