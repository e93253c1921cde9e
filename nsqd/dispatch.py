"""The channel's dispatcher: the actor that moves ready messages to consumers with credit.

One dispatcher per channel runs on the ActorSystem (``actors.py``), so channels share the CPU by
time slices ordered by consumed run time rather than by how many consumers each one has. A slice:

1. takes a consumer from the channel's mailbox (consumers with credit, each at most once),
2. hands it up to ``min(credit, BATCH)`` messages: attempts + 1, record in flight with the
   deadline ``now + client.msg_timeout``, append the encoded frame to the client's output buffer,
3. puts the consumer back at the tail of the mailbox while it still has credit (round robin),
4. stops at the end of the slice or when messages or consumers run out.

Nothing in a slice awaits. At its end each consumer that got frames is told to flush now when it
became not-ready (NSQ flushes then too), when its buffer is over its size, or when the channel has
nothing more to send right now (so a quiet channel never waits for the flush timer: frames are
batched only while there is a backlog). Otherwise the flush timer of ``output_buffer_timeout`` runs.
"""

from __future__ import annotations

import random

import trio

from protocol.message import encode_message_frame

from .actors import Actor

__all__ = ["ChannelDispatcher", "BATCH", "REFILL"]

#: messages handed to one consumer per turn before moving on to the next one in the mailbox
BATCH = 64
#: messages read from the channel's disk queue at a time when its memory deque runs dry
REFILL = 256


class ChannelDispatcher(Actor):
    def __init__(self, channel) -> None:
        super().__init__()
        self.channel = channel
        self.delivered = 0
        self._random = random.random
        #: consumers given frames without a flush (the slice ended with work left): flushed once idle
        self._unflushed: dict = {}

    def __repr__(self) -> str:
        return f"ChannelDispatcher({self.channel.topic_name}:{self.channel.name})"

    async def run_slice(self, slice_end: float) -> bool:
        return self.dispatch(slice_end)

    def dispatch(self, slice_end: float) -> bool:
        channel = self.channel
        if channel.paused or channel.exiting:
            return False
        queue = channel.queue
        mailbox = channel.mailbox
        push_in_flight = channel.in_flight.push
        clock = trio.current_time
        now = clock()
        touched: dict = {}
        delivered = 0
        while mailbox:
            if not queue and not channel.refill(REFILL):
                break
            client = mailbox.popleft()
            credit = client.credit()
            if credit <= 0 or client.channel is not channel:
                client.in_mailbox = False
                continue
            count = min(credit, BATCH, len(queue))
            deadline = now + client.msg_timeout
            frames = client.out
            nbytes = 0
            sent = 0
            sample_rate = client.sample_rate
            for _ in range(count):
                message = queue.popleft()
                if sample_rate and self._random() * 100 > sample_rate:
                    # sampled out: consumed from the channel and discarded, as nsqd does
                    channel.discard(message)
                    continue
                try:
                    push_in_flight(message.id, message, deadline)
                except KeyError:
                    # a second copy of a message in flight (a crash in durable mode can repeat a copy to the
                    # channel): one copy out is enough, this one is dropped
                    channel.discard(message)
                    continue
                message.attempts += 1
                message.client = client
                message.delivered_at = now
                frame = encode_message_frame(message)
                frames.append(frame)
                nbytes += len(frame)
                sent += 1
            if sent:
                client.in_flight += sent
                client.message_count += sent
                client.out_bytes += nbytes
                touched[client] = None
                delivered += sent
            if client.credit() > 0:
                mailbox.append(client)
            else:
                client.in_mailbox = False
            now = clock()
            if now >= slice_end:
                break
        self.delivered += delivered
        unflushed = self._unflushed
        if touched or unflushed:
            idle = not (mailbox and channel.has_ready())
            if idle and unflushed:
                # frames left to the flush timer by an earlier slice that ended with work left: nothing
                # more is coming to them now, so they leave now too
                for client in unflushed:
                    if client.out and client not in touched:
                        client.messages_queued(True)
                unflushed.clear()
            for client in touched:
                flush = idle or client.credit() <= 0
                client.messages_queued(flush)
                if not flush:
                    unflushed[client] = None
        return bool(mailbox) and channel.has_ready() and not channel.paused
