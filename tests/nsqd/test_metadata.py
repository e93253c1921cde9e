"""nsqd.dat kept by the metadata writer on an in-process NSQD: after any storm of changes the file equals the
daemon's state, changes are coalesced into few writes, a pause is answered only once it is on disk, and a change
re-encodes only its own topic."""

from __future__ import annotations

import json
import random

import trio

from nsqd.http_api import build_router
from nsqd.metadata import FILE_NAME, snapshot
from nsqd.metadata_writer import document_parts
from nsqd.options import parse_options
from nsqd.server import NSQD
from protocol.http import Request


def raw(nsqd: NSQD) -> bytes:
    with open(f"{nsqd.data_path}/{FILE_NAME}", "rb") as handle:
        return handle.read()


def on_disk(nsqd: NSQD) -> dict:
    return json.loads(raw(nsqd))


def by_name(document: dict) -> dict:
    """The document with its topics keyed by name (nsqd writes them in map order: the order is not kept)."""
    return {t["name"]: (t["paused"], t["channels"]) for t in document["topics"] or []}


def state(nsqd: NSQD) -> dict:
    return by_name(snapshot(nsqd.topics.values()))


async def running_nsqd(nursery, tmp_path) -> NSQD:
    opts = parse_options(
        ["--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={tmp_path}"], exit_on_error=False
    )
    nsqd = NSQD(opts)
    await nursery.start(nsqd.run)
    return nsqd


async def post(router, path: str, query: str) -> int:
    response = await router.handle(Request("POST", path, query.encode(), remote_address="127.0.0.1:1"))
    return response.status


async def test_the_file_equals_the_state_after_a_storm_of_creates_deletes_and_pauses(tmp_path):
    rng = random.Random(7)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nsqd = await running_nsqd(nursery, tmp_path)
            router = build_router(nsqd)
            names = [f"t{i}" for i in range(12)] + ["e0#ephemeral", "e1#ephemeral"]
            for step in range(600):
                name = rng.choice(names)
                action = rng.random()
                topic = nsqd.topics.get(name)
                if action < 0.35 or topic is None:
                    nsqd.get_topic(name).get_channel(rng.choice(["a", "b", "c", "x#ephemeral"]))
                elif action < 0.5:
                    nsqd.delete_topic(name)
                elif action < 0.65 and topic.channels:
                    topic.delete_channel(rng.choice(list(topic.channels)))
                elif action < 0.8:
                    verb = rng.choice(["pause", "unpause"])
                    assert await post(router, f"/topic/{verb}", f"topic={name}") == 200
                    assert by_name(on_disk(nsqd)) == state(nsqd)  # answered only once written
                elif topic.channels:
                    verb = rng.choice(["pause", "unpause"])
                    channel = rng.choice(list(topic.channels))
                    assert await post(router, f"/channel/{verb}", f"topic={name}&channel={channel}") == 200
                    assert by_name(on_disk(nsqd)) == state(nsqd)
                if step % 50 == 0:
                    await trio.sleep(0)  # let the writer run now and then, mid-storm
            # creates and deletes are not waited for, but the file follows without any further request
            while by_name(on_disk(nsqd)) != state(nsqd):
                await nsqd.metadata.wait_written()
            assert not any(name.endswith("#ephemeral") for name in by_name(on_disk(nsqd)))
            nsqd.exit()
        final = state(nsqd)
    assert by_name(on_disk(nsqd)) == final


async def test_changes_in_one_turn_make_one_write(tmp_path):
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nsqd = await running_nsqd(nursery, tmp_path)
            await nsqd.persist_metadata()
            assert raw(nsqd) == b'{"topics":null,"version":"1.3.0"}'
            writes = nsqd.metadata.writes
            for index in range(300):
                nsqd.get_topic(f"t{index}").get_channel("c")
            await nsqd.persist_metadata()
            assert nsqd.metadata.writes == writes + 1
            assert len(by_name(on_disk(nsqd))) == 300
            # byte for byte the document nsqd writes (the topics in the daemon's order, compact JSON)
            assert raw(nsqd) == json.dumps(snapshot(nsqd.topics.values()), separators=(",", ":")).encode()
            await nsqd.persist_metadata()  # nothing changed: no write
            assert nsqd.metadata.writes == writes + 1
            nsqd.exit()


async def test_a_change_encodes_only_its_own_topic(tmp_path):
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nsqd = await running_nsqd(nursery, tmp_path)
            for index in range(100):
                nsqd.get_topic(f"t{index}").get_channel("c")
            await nsqd.persist_metadata()
            entries = dict(nsqd.metadata.entries)
            nsqd.topics["t5"].get_channel("d")
            nsqd.delete_topic("t7")
            await nsqd.persist_metadata()
            after = nsqd.metadata.entries
            assert "t7" not in after
            assert json.loads(after["t5"])["channels"] == [
                {"name": "c", "paused": False},
                {"name": "d", "paused": False},
            ]
            unchanged = [name for name in after if name != "t5"]
            assert len(unchanged) == 98
            assert all(after[name] is entries[name] for name in unchanged)  # the same bytes, not re-encoded
            nsqd.exit()


async def test_a_large_file_written_in_pieces_with_pauses_is_the_whole_document(tmp_path):
    """Thousands of topics: the background write goes in many ``writev`` with pauses between them (``pause``), and
    the file is byte for byte the document all the same."""
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nsqd = await running_nsqd(nursery, tmp_path)
            for index in range(3000):
                nsqd.get_topic(f"topic-{index}").get_channel("c")
            await nsqd.persist_metadata()
            assert len(document_parts(list(nsqd.metadata.entries.values()))) > 2 * 1024  # three writev at least
            assert raw(nsqd) == json.dumps(snapshot(nsqd.topics.values()), separators=(",", ":")).encode()
            nsqd.exit()


async def test_a_storm_waits_out_the_cpu_bound_but_a_pause_does_not(tmp_path):
    """The writer spaces its writes by ``CPU_FACTOR`` times the CPU the last one took (its thread's, measured);
    a pause's answer waits for a write of its own, which does not wait out that spacing."""
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nsqd = await running_nsqd(nursery, tmp_path)
            router = build_router(nsqd)
            writer = nsqd.metadata
            writer.CPU_FACTOR = 1e9  # whatever CPU a write takes, the next one is out of this test's reach
            nsqd.get_topic("first")
            await nsqd.persist_metadata()
            assert writer._last_cpu > 0
            writes = writer.writes
            for index in range(50):
                nsqd.get_topic(f"t{index}").get_channel("c")
            with trio.move_on_after(0.5):  # the coalescing interval (10 ms) passes many times over: no write
                await writer.wait_written()
            assert writer.writes == writes and writer.written < writer.changes
            assert await post(router, "/topic/pause", "topic=t3") == 200
            assert writer.writes == writes + 1
            assert by_name(on_disk(nsqd)) == state(nsqd)
            nsqd.exit()
