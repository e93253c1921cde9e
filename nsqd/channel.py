"""Channel: one consumer group's copy of a topic's stream.

State kept per channel:
- a bounded memory deque of ready messages (``--mem-queue-size``), overflow refused until the disk
  queue takes it (ephemeral channels drop overflow, as nsqd does);
- the in-flight queue (messages delivered and not yet FIN/REQ'd, with their timeout deadline);
- the deferred queue (REQ with a delay, DPUB) ordered by due time;
- its consumers, and a mailbox of those that have credit, served by the channel's dispatcher actor.

Expired in-flight messages and due deferred ones are moved back by the queue scanner calling
``process_queues``. Nothing here awaits: every method is a synchronous fast path.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable

import trio

from protocol.names import is_ephemeral

from .client import Client
from .dispatch import ChannelDispatcher
from .message import Message
from .queues.deferred import DeferredQueue
from .queues.inflight import InFlightQueue

__all__ = ["Channel", "ChannelError"]

log = logging.getLogger("nsqd")


class ChannelError(Exception):
    """A FIN/REQ/TOUCH that the channel refuses; the text is NSQ's reason (``ID not in flight``)."""


class Channel:
    def __init__(self, topic, name: str, *, mem_queue_size: int, max_msg_timeout: float, actors,
                 on_last_client_gone: Callable[["Channel"], None]) -> None:
        self.topic = topic
        self.topic_name = topic.name
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.mem_queue_size = mem_queue_size
        self.max_msg_timeout = max_msg_timeout
        self.paused = False
        self.exiting = False

        self.queue: deque[Message] = deque()
        self.in_flight = InFlightQueue()
        self.deferred = DeferredQueue()
        self.clients: dict[int, Client] = {}
        self.mailbox: deque[Client] = deque()

        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.dropped_count = 0

        self._actors = actors
        self._on_last_client_gone = on_last_client_gone
        self.dispatcher = ChannelDispatcher(self)
        actors.add(self.dispatcher)

    # -- queue -----------------------------------------------------------------------------------
    def room(self) -> int:
        """How many more ready messages the memory queue takes before the publish must be refused."""
        return self.mem_queue_size - len(self.queue)

    def put_many(self, messages: list[Message]) -> None:
        """Accept messages from the topic pump (deferred ones go to the deferred heap)."""
        self.message_count += len(messages)
        queue = self.queue
        if messages[0].defer or messages[-1].defer or any(m.defer for m in messages):
            now = trio.current_time()
            for m in messages:
                if m.defer:
                    self.deferred.push(m, now + m.defer)
                else:
                    queue.append(m)
        else:
            queue.extend(messages)
        if self.ephemeral:
            self._drop_overflow()
        self.wake()

    def _requeue(self, message: Message) -> None:
        """Put a message that was in flight or deferred back in line (it was already counted)."""
        self.queue.append(message)
        if self.ephemeral:
            self._drop_overflow()

    def _drop_overflow(self) -> None:
        extra = len(self.queue) - max(self.mem_queue_size, 0)
        if extra > 0:
            # ephemeral channels have no backend: what does not fit is gone, newest first, like nsqd
            for _ in range(extra):
                self.queue.pop()
            self.dropped_count += extra

    def wake(self) -> None:
        """Resume the dispatcher when there is something to send and someone to send it to."""
        if self.queue and self.mailbox and not self.paused:
            self._actors.resume(self.dispatcher)

    def depth(self) -> int:
        return len(self.queue)

    # -- consumers -------------------------------------------------------------------------------
    def add_client(self, client: Client) -> None:
        self.clients[client.id] = client

    def remove_client(self, client: Client) -> None:
        """A consumer left. Its in-flight messages come back when their timeout expires, as in nsqd."""
        if self.clients.pop(client.id, None) is None:
            return
        if self.ephemeral and not self.clients and not self.exiting:
            self._on_last_client_gone(self)

    def client_credit_changed(self, client: Client) -> None:
        """RDY, FIN, REQ or a timeout gave ``client`` room: put it in the mailbox and wake up."""
        if not client.in_mailbox and client.credit() > 0:
            client.in_mailbox = True
            self.mailbox.append(client)
            self.wake()

    # -- FIN / REQ / TOUCH -----------------------------------------------------------------------
    def _owned(self, client: Client, msg_id: bytes) -> Message:
        message = self.in_flight.get(msg_id)
        if message is None:
            raise ChannelError("ID not in flight")
        if message.client is not client:
            raise ChannelError("client does not own message")
        return message

    def finish(self, client: Client, msg_id: bytes) -> Message:
        message = self._owned(client, msg_id)
        self.in_flight.pop(msg_id)
        client.in_flight -= 1
        client.finish_count += 1
        self.client_credit_changed(client)
        return message

    def requeue(self, client: Client, msg_id: bytes, delay: float) -> None:
        if self.exiting:
            raise ChannelError("exiting")
        message = self._owned(client, msg_id)
        self.in_flight.pop(msg_id)
        message.client = None
        client.in_flight -= 1
        client.requeue_count += 1
        self.requeue_count += 1
        if delay > 0:
            self.deferred.push(message, trio.current_time() + delay)
        else:
            self._requeue(message)
            self.wake()
        self.client_credit_changed(client)

    def touch(self, client: Client, msg_id: bytes, msg_timeout: float) -> None:
        message = self._owned(client, msg_id)
        deadline = trio.current_time() + msg_timeout
        cap = message.delivered_at + self.max_msg_timeout
        if deadline >= cap:
            deadline = cap
        self.in_flight.touch(msg_id, deadline)

    # -- timers, driven by the queue scanner -------------------------------------------------------
    def process_queues(self, now: float) -> bool:
        """Move expired in-flight and due deferred messages back to the queue; True if any moved."""
        expired = self.in_flight.pop_expired(now)
        for message in expired:
            self.timeout_count += 1
            owner = message.client
            message.client = None
            self._requeue(message)
            if owner is not None:
                owner.in_flight -= 1
                if owner.channel is self:
                    self.client_credit_changed(owner)
        due = self.deferred.pop_due(now)
        for message in due:
            self._requeue(message)
        if expired or due:
            self.wake()
            return True
        return False

    # -- administration --------------------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        self.wake()

    def empty(self) -> None:
        """Drop every ready and deferred message, and forget in-flight ones (nsqd's /channel/empty)."""
        self.queue.clear()
        self.deferred.drain()
        for message in self.in_flight.drain():
            owner = message.client
            if owner is not None:
                owner.in_flight -= 1
                if owner.channel is self:
                    self.client_credit_changed(owner)

    def close(self) -> None:
        """Stop dispatching; called when the channel is deleted or nsqd exits."""
        self.exiting = True
        self._actors.remove(self.dispatcher)

    def __repr__(self) -> str:
        return f"Channel({self.topic_name}:{self.name})"
