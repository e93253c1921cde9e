"""The channel's dispatcher: the actor that moves ready messages to consumers with credit.

One dispatcher per channel runs on the ActorSystem (``actors.py``), so channels share the CPU by
time slices ordered by consumed run time rather than by how many consumers each one has. A slice:

1. takes a consumer from the channel's mailbox (consumers with credit, each at most once),
2. hands it up to ``min(credit, BATCH)`` messages: records them in flight with one deadline,
   ``now + client.msg_timeout`` rounded up to ``DEADLINE_GRAIN`` (one call; the batches of the same
   millisecond with the same timeout share one bucket of the queue, ``queues/inflight.py``: a bucket
   per batch of 64 cost 4-5 bytes a message, its object, heap entry, number and map entry),
   then per message attempts + 1 and its frame appended to the client's output buffer
   (``deliver_frames``, in C when the accelerator is built),
3. puts the consumer back at the tail of the mailbox while it still has credit (round robin),
4. stops at the end of the slice or when messages or consumers run out.

Between consumers and after each disk read, once ``interlude_seconds`` have passed since the last one,
the slice lets the system run an interlude (``ActorSystem.interlude``; in nsqd: reading the
connections that send little, which may publish to a quiet channel and deliver there at once). Those
are safe points: no consumer is half served and no local state outlives a change the interlude makes.

Nothing in a slice awaits, so a publish may run it at once (``run_slice_now``, the system's wake-up
preemption). At its end each consumer that got frames is told to flush now when it
became not-ready (NSQ flushes then too), when its buffer is over its size, or when the channel has
nothing more to send right now (so a quiet channel never waits for the flush timer: frames are
batched only while there is a backlog). Otherwise the flush timer of ``output_buffer_timeout`` runs.
The time of those flushes is not charged to the channel (``ActorSystem.uncharge``): their number follows
how many consumers it has and the windows they ask for, and the share of delivery should not.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Callable

import trio

from protocol.frames import FRAME_TYPE_MESSAGE
from protocol.message import MESSAGE_HEADER_SIZE

from .actors import Actor
from .message import claim_shared, track_all
from .speedups import load as load_speedups

__all__ = ["ChannelDispatcher", "BATCH", "DEADLINE_GRAIN", "REFILL"]

#: messages handed to one consumer per turn before moving on to the next one in the mailbox
BATCH = 64
#: in-flight deadlines are rounded up to this many seconds: never earlier than ``msg_timeout`` after the delivery,
#: at most this much later (the queue scanner finds expired messages every 100 ms)
DEADLINE_GRAIN = 0.001
_PER_SECOND = round(1 / DEADLINE_GRAIN)
#: messages read from the channel's disk queue per read when its memory deque runs dry; reads go on, with a
#: chance of an interlude after each, until a consumer's batch (BATCH) is there
REFILL = 32

# A message frame's header: size, frame type, then the message's timestamp, attempts and ID (the layout of
# ``protocol.message``); the prefix before the ID is packed in one call. nsqd's IDs are always 16 bytes
# (``MESSAGE_ID_LENGTH``: made by the topic's GUID factory or read back from a record's fixed header).
_pack_frame_prefix = struct.Struct(">iiqH").pack
_FRAME_HEADER_SIZE = 8 + MESSAGE_HEADER_SIZE
_FRAME_OVERHEAD = 4 + MESSAGE_HEADER_SIZE  # what the size field counts besides the body


def _no_interlude() -> None:
    pass


def _deliver_frames(batch: list, client, now: float, out: list) -> int:
    """Mark each message of ``batch`` delivered to ``client`` at ``now`` (attempts + 1) and append its frame to
    ``out``; returns the bodies' bytes. The frames go in pieces that the flush joins: the header up to the
    attempts, the ID, the body (so a body is copied once). The messages of one publish share their timestamp and
    usually their size and attempts, so a header prefix is packed only when one of those differs from the previous
    message's. The C twin (``nsqd/_speedups.c``) does the same with no Python frame per message."""
    append = out.append
    pack_prefix = _pack_frame_prefix
    nbytes = 0
    last_size = last_timestamp = last_attempts = -1
    prefix = b""
    for message in batch:
        attempts = message.attempts + 1
        message.attempts = attempts
        message.client = client
        message.delivered_at = now
        body = message.body
        size = len(body)
        timestamp = message.timestamp
        if size != last_size or timestamp != last_timestamp or attempts != last_attempts:
            prefix = pack_prefix(size + _FRAME_OVERHEAD, FRAME_TYPE_MESSAGE, timestamp, attempts)
            last_size = size
            last_timestamp = timestamp
            last_attempts = attempts
        append(prefix)
        append(message.id)
        append(body)
        nbytes += size
    return nbytes


#: the C twin when the accelerator is built (an accelerator built before it had the function, not rebuilt since,
#: leaves the Python one)
deliver_frames = getattr(load_speedups(), "deliver_frames", _deliver_frames)


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

    def _sample(self, batch: list, sample_rate: int) -> list:
        """The messages a consumer with ``sample_rate`` gets; the others are consumed from the channel and
        discarded, as nsqd does."""
        kept = []
        random = self._random
        for message in batch:
            if random() * 100 > sample_rate:
                self.channel.discard(message)
            else:
                kept.append(message)
        return kept

    def _drop_refused(self, batch: list, refused: list) -> list:
        """A second copy of a message in flight (a crash in durable mode can repeat a copy to the channel):
        one copy out is enough, the others are dropped."""
        for message in refused:
            self.channel.discard(message)
        refused_ids = set(map(id, refused))
        return [message for message in batch if id(message) not in refused_ids]

    async def run_slice(self, slice_end: float) -> bool:
        return self.dispatch(slice_end)

    def run_slice_now(self, slice_end: float) -> bool:
        return self.dispatch(slice_end)

    def dispatch(self, slice_end: float) -> bool:
        channel = self.channel
        if channel.paused or channel.exiting:
            return False
        channel.changed.add(channel)  # its queue and in-flight counts may move (stats_cache.py)
        queue = channel.queue
        take = queue.take
        mailbox = channel.mailbox
        push_in_flight = None  # the channel's in-flight queue is made at its first delivery (``open_in_flight``)
        clock = trio.current_time
        now = clock()
        touched: dict = {}
        delivered = 0
        # the system's interludes (reads of connections with little input) at safe points: between
        # consumers, and after a disk read
        system = self._actor_system
        interlude: Callable[[], None] = _no_interlude  # called only once interlude_at is finite
        every = 0.0
        if system is not None and system.interlude_hook is not None:
            interlude = system.interlude
            every = system.interlude_seconds
        interlude_at = now + every if every else math.inf
        # the topic's channels (a live view): while it has more than one, they may hold the same message
        # objects until each delivers its own (nsqd/message.py: ``claim_shared``; the packed ones a queue
        # hands out are its own already)
        siblings = getattr(channel.topic, "channels", ())
        while mailbox:
            if not queue:
                if not channel.refill(REFILL):
                    break
                while True:
                    if clock() >= interlude_at:
                        interlude()
                        interlude_at = clock() + every
                    if len(queue) >= BATCH or not channel.refill(REFILL):
                        break
                continue  # what an interlude ran may have changed the mailbox
            client = mailbox.popleft()
            credit = client.credit()
            if credit <= 0 or client.channel is not channel:
                client.in_mailbox = False
                continue
            batch = take(min(credit, BATCH))  # packed ones made now, fresh for this channel (queues/packed.py)
            if client.sample_rate:
                batch = self._sample(batch, client.sample_rate)
            if len(siblings) > 1:
                claim_shared(batch)  # before anything records or changes them
            if push_in_flight is None:
                push_in_flight = channel.open_in_flight().push_many
            refused = push_in_flight(batch, math.ceil((now + client.msg_timeout) * _PER_SECOND) / _PER_SECOND)
            if refused:
                batch = self._drop_refused(batch, refused)
            track_all(batch)  # before the client is stored in them (nsqd/message.py: the cyclic collector)
            nbytes = deliver_frames(batch, client, now, client.out)
            sent = len(batch)
            if sent:
                client.in_flight += sent
                client.message_count += sent
                client.out_bytes += nbytes + _FRAME_HEADER_SIZE * sent
                touched[client] = None
                delivered += sent
            if client.credit() > 0:
                mailbox.append(client)
            else:
                client.in_mailbox = False
            now = clock()
            if now >= slice_end:
                break
            if now >= interlude_at:
                interlude()
                now = clock()
                interlude_at = now + every
        self.delivered += delivered
        unflushed = self._unflushed
        if touched or unflushed:
            flushing = clock()
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
            if system is not None:
                system.uncharge(clock() - flushing)  # the consumers' writes (see ``ActorSystem.uncharge``)
        return bool(mailbox) and channel.has_ready() and not channel.paused
