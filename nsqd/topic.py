"""Topic: the stream producers publish to, copied to every channel.

A topic keeps a bounded memory deque (``--mem-queue-size``). Its pump copies messages to every
channel that exists at that moment: the first channel gets the topic's own objects, the others a
per-channel copy that shares the body. Without channels, or while paused, messages accumulate in
the topic, as in nsqd. The pump is synchronous and runs right after a publish, when a channel is
added, on unpause, and when a channel's dispatcher made room; it moves only as many messages as
the fullest non-ephemeral channel can take, so nothing is ever dropped for lack of room: the
publish is refused with E_PUB_FAILED instead (until the disk queue takes the overflow).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable

from protocol.names import is_ephemeral

from .channel import Channel
from .guid import GUIDFactory, GUIDUnavailable
from .message import Message

__all__ = ["Topic", "TopicFull", "TopicExiting"]

log = logging.getLogger("nsqd")


class TopicFull(Exception):
    """The memory queue has no room and there is no backend to take the overflow."""


class TopicExiting(Exception):
    """The topic is being deleted or nsqd is exiting."""


class Topic:
    def __init__(self, name: str, *, node_id: int, mem_queue_size: int, max_msg_timeout: float, actors,
                 on_channel_created: Callable[[Channel], None] | None = None,
                 on_channel_deleted: Callable[[Channel], None] | None = None,
                 on_last_channel_gone: Callable[["Topic"], None] | None = None) -> None:
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.mem_queue_size = mem_queue_size
        self.max_msg_timeout = max_msg_timeout
        self.paused = False
        self.exiting = False
        self.channels: dict[str, Channel] = {}
        self.queue: deque[Message] = deque()
        self.message_count = 0
        self.message_bytes = 0
        self.guid = GUIDFactory(node_id)
        self._actors = actors
        self._on_channel_created = on_channel_created
        self._on_channel_deleted = on_channel_deleted
        self._on_last_channel_gone = on_last_channel_gone

    # -- publishing ------------------------------------------------------------------------------
    def put(self, message: Message) -> None:
        self.put_many((message,))

    def put_many(self, messages) -> None:
        """Accept a batch (PUB, MPUB, DPUB) all or nothing."""
        if self.exiting:
            raise TopicExiting()
        self.pump()
        queue = self.queue
        if not self.ephemeral and len(queue) + len(messages) > self.mem_queue_size:
            raise TopicFull()
        queue.extend(messages)
        self.message_count += len(messages)
        self.message_bytes += sum(len(m.body) for m in messages)
        if self.ephemeral and len(queue) > self.mem_queue_size:
            # an ephemeral topic has no backend: overflow is dropped, like nsqd
            for _ in range(len(queue) - max(self.mem_queue_size, 0)):
                queue.pop()
        self.pump()

    def backlog(self) -> int:
        return len(self.queue)

    def pump(self) -> None:
        """Copy queued messages to every channel, as many as all channels can take."""
        queue = self.queue
        if not queue or self.paused or not self.channels or self.exiting:
            return
        channels = list(self.channels.values())
        count = len(queue)
        for channel in channels:
            if not channel.ephemeral:
                room = channel.room()
                if room < count:
                    count = room
        if count <= 0:
            return
        if count == len(queue):
            batch = list(queue)
            queue.clear()
        else:
            batch = [queue.popleft() for _ in range(count)]
        for channel in channels[1:]:
            channel.put_many([m.copy_for_channel() for m in batch])
        channels[0].put_many(batch)

    def new_ids(self, count: int) -> list[bytes]:
        """IDs for a batch. A used-up tick or a clock that stepped back waits a moment and retries
        (nsqd sleeps 1 ms too); the wait blocks, but it is rare and bounded."""
        for _ in range(1000):
            try:
                return self.guid.next_ids(count)
            except GUIDUnavailable:
                time.sleep(0.0005)
        return self.guid.next_ids(count)

    # -- channels --------------------------------------------------------------------------------
    def get_channel(self, name: str) -> Channel:
        channel = self.channels.get(name)
        if channel is None:
            channel = Channel(self, name, mem_queue_size=self.mem_queue_size, max_msg_timeout=self.max_msg_timeout,
                              actors=self._actors, on_last_client_gone=self._ephemeral_channel_idle)
            self.channels[name] = channel
            log.info("TOPIC(%s): new channel(%s)", self.name, name)
            if self._on_channel_created is not None:
                self._on_channel_created(channel)
            self.pump()
        return channel

    def delete_channel(self, name: str) -> bool:
        channel = self.channels.pop(name, None)
        if channel is None:
            return False
        channel.close()
        log.info("TOPIC(%s): deleting channel %s", self.name, name)
        if self._on_channel_deleted is not None:
            self._on_channel_deleted(channel)
        if self.ephemeral and not self.channels and self._on_last_channel_gone is not None:
            self._on_last_channel_gone(self)
        return True

    def _ephemeral_channel_idle(self, channel: Channel) -> None:
        self.delete_channel(channel.name)

    # -- administration --------------------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self.pump()

    def empty(self) -> None:
        self.queue.clear()

    def close(self) -> None:
        self.exiting = True
        for channel in self.channels.values():
            channel.close()

    def __repr__(self) -> str:
        return f"Topic({self.name})"
