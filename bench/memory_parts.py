"""Where a queued message's bytes go, measured inside one process (``python -m bench.memory_parts``).

The ``memory`` scenario reads a running nsqd's resident set; this one builds the same objects in-process (a real
``Topic`` with 0, 1 or 4 ``Channel``\\ s, published to with ``Topic.publish`` as PUB and MPUB do, delivered by the
channels' real dispatchers to consumers that never FIN) and says what each part costs:

- the parts, from ``sys.getsizeof`` rounded up to the 16-byte blocks of CPython's small-object allocator (and the
  cyclic collector's 16-byte header where the object has one): the message object, its ID, the body's bytes
  object over the body itself, the deque's slot, each further channel's copy, and, in flight and deferred, the
  heap's and the map's entries; a queue of packed messages (``nsqd/queues/packed.py``) has no message object,
  16 bytes of joined ID and the segment's slot for the body;
- ``traced``: the growth of the Python heap per message seen by ``tracemalloc`` (sizes as asked, before rounding);
- ``rss``: the growth of this process's resident set per message (what the allocator really took from the system),
  read after the C heap's free pages went back to the system, as nsqd's periodic loop gives them back
  (``runtime.allocator``).

All three are per message, over the body (``--body-size``). Run it with ``TRIONSQ_NO_SPEEDUPS=1`` for the Python
twins (messages then stay tracked by the collector; their size does not change).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tracemalloc

import trio

from nsqd.actors import ActorSystem
from nsqd.client import Client, ClientState
from nsqd.message import Message, PythonMessage
from nsqd.queues.deferred import item_of
from nsqd.topic import Topic
from runtime.allocator import release_free_memory

#: CPython's small-object allocator hands out blocks in multiples of this (objects of up to 512 bytes)
BLOCK = 16
SMALL = 512


def allocated(size: int) -> int:
    """What an object of ``size`` bytes takes from the small-object allocator (larger ones go to malloc)."""
    return -(-size // BLOCK) * BLOCK if size <= SMALL else size


def object_cost(obj) -> int:
    return allocated(sys.getsizeof(obj))


def rss_bytes() -> int:
    release_free_memory()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _consumer(channel, client_id: int) -> Client:
    client = Client(
        client_id,
        f"127.0.0.1:{40000 + client_id}",
        msg_timeout=600.0,
        heartbeat_interval=30.0,
        output_buffer_size=16384,
        output_buffer_timeout=0.25,
    )
    client.state = ClientState.SUBSCRIBED
    client.channel = channel
    channel.add_client(client)
    client.rdy = 10**9
    channel.client_credit_changed(client)
    return client


def _topic(channels: int, messages: int) -> Topic:
    topic = Topic(
        "parts", node_id=1, mem_queue_size=messages + 1, max_msg_timeout=900.0, actors=ActorSystem(), spawn=None
    )
    for index in range(channels):
        topic.get_channel(f"c{index}")
    return topic


def _deliver(topic: Topic) -> None:
    """Every channel's dispatcher hands its whole queue to one consumer that never answers, in the daemon's time
    slices (the frames of each slice dropped, as a flush would: a frame holds a bytes object of its message's ID
    until it is written)."""
    for index, channel in enumerate(topic.channels.values()):
        client = _consumer(channel, index + 1)
        slice_seconds = channel.dispatcher._actor_system.slice_seconds
        while channel.queue:
            channel.dispatcher.dispatch(trio.current_time() + slice_seconds)
            client.out.clear()


async def _measure_one(channels: int, state: str, messages: int, body_size: int, traced: bool) -> dict:
    return measure(channels, state, messages, body_size, traced)


def measure(channels: int, state: str, messages: int, body_size: int, traced: bool, batch: int = 200) -> dict:
    """One row: the growth per message over the body for ``messages`` published in MPUBs of ``batch``: of the
    traced heap (``traced``) or of the resident set."""
    topic = _topic(channels, messages)
    defer = 3600.0 if state == "deferred" else 0.0
    gc.collect()
    rss_before = rss_bytes()
    if traced:  # tracemalloc's own records cost memory: the resident set is read in a run without it
        tracemalloc.start()
    for start in range(0, messages, batch):
        count = min(batch, messages - start)
        topic.publish([b"%0*d" % (body_size, n) for n in range(start, start + count)], defer)
    if state == "in flight":
        _deliver(topic)
    grown = rss_bytes() - rss_before
    if traced:
        grown = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    row = {"channels": channels, "state": state, "messages": messages, "grown": grown / messages - body_size}
    row.update(parts(topic, state, body_size))
    topic.channels.clear()
    return row


def parts(topic: Topic, state: str, body_size: int) -> dict:
    """The parts of one message, from a sample of what the topic and its channels hold."""
    holders = [topic.queue] if not topic.channels else [c.queue for c in topic.channels.values()]
    if state != "in flight" and holders[0]._runs and type(holders[0]._runs[0]).__name__ == "_Window":
        # packed (nsqd/queues/packed.py): no message object, the ID in the segment's joined IDs; each queue holds
        # a window on the segment, one object for all its messages
        packed = holders[0]._runs[0].packed
        row = {
            "message": 0,
            "id": len(packed.ids) // len(packed.bodies),
            "body over size": object_cost(packed.bodies[0]),
        }
        row.update({"copies": 0, "copy each": 0, "slots": 8})  # the bodies list's slot
        row["body over size"] -= body_size
        row["sum"] = row["id"] + row["body over size"] + row["slots"]
        return row
    if state == "in flight":
        sample = [next(iter(c.in_flight._entries.values())) for c in topic.channels.values()]
    elif state == "deferred" and topic.channels:
        sample = [item_of(c.deferred._heap[0]) for c in topic.channels.values()]
    else:
        sample = [next(iter(holder)) for holder in holders]
    first = sample[0]
    distinct = {id(m): m for m in sample}
    row = {
        "message": object_cost(first),
        "id": 0 if Message is not PythonMessage else object_cost(first.id),  # the C type holds it inline
        "body over size": object_cost(first.body) - body_size,
        "copies": len(distinct) - 1,
        "copy each": object_cost(sample[-1]) if len(distinct) > 1 else 0,
    }
    if state == "queued":
        row["slots"] = 8 * len(holders)  # one deque slot per holder (a deque block is 64 slots + 16 bytes)
    elif state == "in flight":
        # per channel: the index's entry (C: a pointer in a table kept 3/8 to 3/4 full; a dict's: key, value and
        # hash, the table kept at most 2/3 full, and its index) and the message's slot in its deadline bucket's list
        # (nsqd/queues/inflight.py)
        index = next(iter(topic.channels.values())).in_flight._entries
        entry = round(sys.getsizeof(index) / len(index)) if Message is not PythonMessage else 24 * 3 // 2 + 8
        row["slots"] = len(topic.channels) * (entry + 8)
    else:
        if topic.channels:
            # the heap's (due, seq, message) tuple, its due float and seq int, made once for every channel's heap
            # (nsqd/queues/deferred.py), and a list slot per channel
            # (nsqd/queues/deferred.py; the C Message is its own entry: a list slot per channel only)
            heap = next(iter(topic.channels.values())).deferred._heap
            shared = len({id(c.deferred._heap[-1]) for c in topic.channels.values()}) == 1
            entry = 0
            if type(heap[-1]) is tuple:
                due, seq, _ = heap[-1]
                entry = allocated(sys.getsizeof(heap[-1])) + object_cost(due) + object_cost(seq)
            row["slots"] = (1 if shared else len(topic.channels)) * entry + 8 * len(topic.channels)
        else:
            row["slots"] = 8
    row["sum"] = row["message"] + row["id"] + row["body over size"] + row["copies"] * row["copy each"] + row["slots"]
    return row


def _rows(args) -> list[dict]:
    """Each row in a fresh process, so that no row reuses the memory an earlier one freed."""
    rows = []
    for channels in args.channels:
        for state in args.states:
            if state == "in flight" and not channels:
                continue
            argv = [sys.executable, "-m", "bench.memory_parts", "--one", str(channels), state]
            argv += ["--messages", str(args.messages), "--body-size", str(args.body_size)]
            found = {}
            for how in ("rss", "traced"):
                done = subprocess.run(argv + [f"--{how}"], capture_output=True, text=True, check=True, timeout=600)
                found[how] = json.loads(done.stdout)
            row = found["rss"]
            row["traced/msg"] = found["traced"].pop("grown")
            row["rss/msg"] = row.pop("grown")
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--channels", type=int, nargs="+", default=[0, 1, 4])
    parser.add_argument("--states", nargs="+", default=["queued", "in flight", "deferred"])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--one", nargs=2, metavar=("CHANNELS", "STATE"), help="measure one row, print it as JSON")
    parser.add_argument("--rss", dest="traced", action="store_false", help="with --one: the resident set's growth")
    parser.add_argument("--traced", dest="traced", action="store_true", help="with --one: the traced heap's")
    args = parser.parse_args(argv)
    if args.one:
        row = trio.run(_measure_one, int(args.one[0]), args.one[1], args.messages, args.body_size, args.traced)
        print(json.dumps(row))
        return 0
    rows = _rows(args)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    from bench.common import format_table

    print(format_table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
