"""NSQD.health(): a disk queue write error makes nsqd unhealthy until a write succeeds again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_health_follows_disk_write_errors(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk (in a child process, so the limit cannot touch the test run)."""
    script = textwrap.dedent(f"""
        import resource, sys, time
        sys.path.insert(0, {str(REPO)!r})
        from nsqd.options import parse_options
        from nsqd.server import NSQD
        from nsqd.message import Message
        from nsqd.topic import TopicFull

        opts = parse_options(["--data-path={tmp_path}", "--mem-queue-size=0"])
        nsqd = NSQD(opts)
        nsqd.lock_data_path()
        topic = nsqd.get_topic("full")
        assert nsqd.health() == "OK"
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
        body = b"x" * 500
        stored = 0
        try:
            for n in range(100):
                topic.put_many([Message(topic.new_ids(1)[0], body, time.time_ns())])
                stored += 1
        except TopicFull as exc:
            assert "File too large" in str(exc), exc
        else:
            raise AssertionError("the limit never bit")
        assert stored == 4096 // (4 + 26 + 500), stored
        health = nsqd.health()
        assert health.startswith("NOK - ") and "File too large" in health, health
        assert topic.message_count == stored  # the refused message is not counted
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        topic.put_many([Message(topic.new_ids(1)[0], body, time.time_ns())])
        assert nsqd.health() == "OK"
        assert topic.depth() == stored + 1
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
