"""A disk sync that fails before a durable publish's OK: the OK never leaves, E_PUB_FAILED does
(queues/group_commit.py).

The failure is real: the queue's write file descriptor is pointed at ``/dev/null`` with ``dup2``, which takes writes
and seeks but fails ``fsync`` (EINVAL) as a failing disk would; pointing it back at the file heals it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from nsqd.queues.diskqueue import DiskQueue
from nsqd.queues.group_commit import SyncBarrier

REPO = Path(__file__).resolve().parents[2]
RECORD = b"\x00" * 26 + b"body"


def test_a_failed_sync_leaves_its_queue_owing_and_the_commit_says_so(tmp_path):
    barrier = SyncBarrier()
    queue = DiskQueue("a", str(tmp_path), sync_every=1, barrier=barrier)
    queue.put_many([RECORD], defer_sync=True)
    saved = os.dup(queue._write_fd)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, queue._write_fd)
    assert barrier.commit() is False
    assert barrier and barrier.failures == 1 and queue.last_error is not None
    assert barrier.commit() is False  # tried again, still failing
    os.dup2(saved, queue._write_fd)
    assert barrier.commit() is True and not barrier and barrier.failures == 2
    assert (tmp_path / "a.diskqueue.meta.dat").read_bytes() == b"1\n0,0\n0,%d\n" % (4 + len(RECORD))
    queue.close()
    for fd in (saved, null):
        os.close(fd)


def test_a_publish_whose_sync_failed_gets_no_ok(tmp_path):
    script = textwrap.dedent(f"""
        import os, struct, sys
        sys.path.insert(0, {str(REPO)!r})
        import trio
        from nsqd.options import parse_options
        from nsqd.server import NSQD

        def pub(topic, body):
            return b"PUB " + topic + b"\\n" + struct.pack(">I", len(body)) + body

        async def answer(stream):
            data = b""
            with trio.fail_after(20):
                while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        return None  # closed without an answer
                    data += chunk
            return data[8:]

        async def main():
            opts = parse_options(["--data-path={tmp_path}", "--mem-queue-size=0", "--sync-every=1",
                                  "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"])
            nsqd = NSQD(opts)
            async with trio.open_nursery() as nursery:
                await nursery.start(nsqd.run)
                host, port = nsqd.tcp_address.rsplit(":", 1)
                first = await trio.open_tcp_stream(host, int(port))
                await first.send_all(b"  V2" + pub(b"t", b"one"))
                assert await answer(first) == b"OK"
                queue = nsqd.topics["t"].backend
                saved = os.dup(queue._write_fd)
                os.dup2(os.open(os.devnull, os.O_WRONLY), queue._write_fd)  # fsync now fails
                await first.send_all(pub(b"t", b"two"))
                failed = await answer(first)
                assert failed is not None and failed.startswith(b"E_PUB_FAILED"), "an OK left although its sync failed"
                second = await trio.open_tcp_stream(host, int(port))
                await second.send_all(b"  V2" + pub(b"t", b"three"))
                assert (await answer(second)).startswith(b"E_PUB_FAILED")
                assert nsqd.sync_barrier.failures >= 2
                os.dup2(saved, queue._write_fd)  # the disk syncs again
                third = await trio.open_tcp_stream(host, int(port))
                await third.send_all(b"  V2" + pub(b"t", b"four"))
                assert await answer(third) == b"OK"
                nsqd.exit()
            print("ok")

        trio.run(main)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"
    assert "a disk sync failed before 1 publish(es) were acknowledged: E_*_FAILED, closing" in result.stderr
