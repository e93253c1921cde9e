"""Adopted messages: where they go, and the list of their ids a replica keeps for their origin.

``place`` puts messages into a topic's channels as they were elsewhere (each into the channels that had not
finished it) and replicates them from here: a takeover adopts an origin's copies with it, and an origin whose
messages a replica adopted puts back with it the ones the replica did not adopt.

``AdoptedIds`` is ``replica.<node>.adopted`` in the data directory: the ids of the messages of origin ``node``
this replica adopted (16 bytes each, appended at each takeover). They go to that origin in ADOPTED frames the next
time it connects (PROTOCOL.md): it drops the ones it still holds (the replica delivers them) and counts the ones
it had finished (delivered twice: its FINs had not reached the replica). The file goes once the origin heard them.
"""

from __future__ import annotations

import os
import time

from ..message import Message

__all__ = ["AdoptedIds", "place"]

ID_SIZE = 16
#: ids per ADOPTED frame (1 MiB)
FRAME_IDS = 65536


def place(nsqd, topic_name: str, batch: list) -> int:
    """Put ``batch``, ``[(message, channels that finished it), ...]`` of ``ReplicatedMessage``-like messages, into
    topic ``topic_name``: each into every channel not in its set (into the topic when it has no channel), deferred
    ones with the rest of their delay; replicated to this node's peers with FINs for the channels that finished
    it. Returns how many."""
    topic = nsqd.get_topic(topic_name)
    now_ns = time.time_ns()
    messages = [Message(m.id, m.body, m.timestamp, m.attempts, max(m.due_ns - now_ns, 0) / 1e9 if m.due_ns else 0.0)
                for m, _finished in batch]
    channels = list(topic.channels.values())
    if not channels:
        topic.put_many(messages)
    else:
        for channel in channels:
            pending = [Message(m.id, m.body, m.timestamp, m.attempts, m.defer)
                       for m, (_, finished) in zip(messages, batch) if channel.name not in finished]
            if pending:
                channel.put_many(pending)
    replication = nsqd.replication
    if replication is not None and not topic.ephemeral and messages:
        replication.offer(topic_name, messages)
        for channel in channels:
            done = [m for m, (_, finished) in zip(messages, batch) if channel.name in finished]
            if done and not channel.ephemeral:
                replication.finished(topic_name, channel.name, done)
    return len(messages)


class AdoptedIds:
    """The ids of origin ``node``'s messages adopted here that the origin has not heard of yet."""

    def __init__(self, data_path: str, node: str) -> None:
        self.path = os.path.join(data_path, f"replica.{node}.adopted")

    def add(self, ids: list[bytes]) -> None:
        """Append (synced: the origin must hear of every message adopted here, even after this node's crash)."""
        if not ids:
            return
        with open(self.path, "ab") as f:
            f.write(b"".join(ids))
            f.flush()
            os.fsync(f.fileno())

    def load(self) -> list[bytes]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return []
        size = len(raw) - len(raw) % ID_SIZE  # a write cut short by a crash leaves a partial id: ignored
        return [raw[i:i + ID_SIZE] for i in range(0, size, ID_SIZE)]

    def clear(self) -> None:
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
