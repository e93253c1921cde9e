"""nsq_to_file: the file rules alone (names, revisions, rotation, gzip, work dir, when a message may be FIN'd) with
clocks the test moves, then the tool end to end as a subprocess against real nsqd and nsqlookupd, with messages
published over nsqd's HTTP /pub (nothing of the client under test)."""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from nsq_tools._file_logger import (
    FileLogger,
    FileOptions,
    TopicWriter,
    compute_filename_format,
    strftime,
)
from tests.tools.conftest import (
    ToolProcess,
    assert_unknown_flag,
    assert_usage,
    channel_depth,
    run_tool,
    wait_for,
)

# --- the file rules, with a controllable clock ------------------------------------------------------------------------

HOUR = 3600.0
# 2026-11-27 12:30:00 in the local zone, whatever it is
T0 = time.mktime((2026, 11, 27, 12, 30, 0, 0, 0, -1))


class Clock:
    def __init__(self) -> None:
        self.wall = T0
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@dataclass
class Msg:
    body: bytes
    nsqd_address: str = "127.0.0.1:4150"
    finished: int = 0

    def finish(self) -> None:
        self.finished += 1


def make_writer(tmp_path: Path, clock: Clock, topic: str = "tt", **fields) -> tuple[TopicWriter, list[str]]:
    fields.setdefault("output_dir", str(tmp_path / "out"))
    fields.setdefault("work_dir", fields["output_dir"])
    opts = FileOptions(**fields)
    lines: list[str] = []
    name = compute_filename_format(opts, topic, hostname="vm.example.com", pid=4242)
    logger = FileLogger(
        opts,
        topic,
        name,
        lambda level, text: lines.append(text),
        wall_clock=lambda: clock.wall,
        monotonic=lambda: clock.mono,
    )
    return TopicWriter(logger), lines


def bodies(*texts: str) -> list[Msg]:
    return [Msg(text.encode()) for text in texts]


def test_strftime_codes_and_literals():
    t = time.struct_time((2026, 3, 7, 15, 4, 5, 5, 66, 0))  # a Saturday
    assert strftime("%Y-%m-%d_%H", t) == "2026-03-07_15"
    assert strftime("%y%m%d %I:%M:%S %p", t) == "260307 03:04:05 PM"
    assert strftime("%A %a %B %b", t) == "Saturday Sat March Mar"
    assert strftime("100%% %Q %", t) == "100% %Q %"
    assert strftime("no codes", t) == "no codes"


def test_filename_format_replacements():
    opts = FileOptions()
    assert compute_filename_format(opts, "tt", hostname="vm.example.com", pid=7) == "tt.vm.<DATETIME>.log"
    opts = FileOptions(host_identifier="<SHORT_HOST>-<HOSTNAME>", filename_format="<TOPIC>/<HOST>.<PID><REV>.log")
    assert compute_filename_format(opts, "tt", hostname="vm.example.com", pid=7) == "tt/vm-vm.example.com.7.log"
    gz = FileOptions(gzip=True)
    assert compute_filename_format(gz, "tt", hostname="vm", pid=7) == "tt.vm<REV>.<DATETIME>.log.gz"
    assert (
        compute_filename_format(FileOptions(gzip=True, filename_format="<TOPIC><REV>.gz"), "tt", hostname="vm")
        == "tt<REV>.gz"
    )
    for needs_rev in (
        dict(gzip=True),
        dict(rotate_size=10),
        dict(rotate_interval=1.0),
        dict(work_dir="/w", output_dir="/o"),
    ):
        with pytest.raises(ValueError, match=r"missing <REV> in --filename-format when gzip, rotation, or work dir"):
            compute_filename_format(FileOptions(filename_format="<TOPIC>.log", **needs_rev), "tt", hostname="vm")


def test_default_file_is_synced_before_finish_and_appended_across_runs(tmp_path):
    clock = Clock()
    writer, lines = make_writer(tmp_path, clock)
    messages = bodies("one", "two", "ends in newline\n")
    assert writer.write(messages[:1]) == messages[:1]  # opening a file syncs, as a rotation does
    assert writer.write(messages[1:]) == []  # written, not yet durable: nothing to FIN
    path = tmp_path / "out" / "tt.vm.2026-11-27_12.log"
    done = writer.tick()
    assert done == messages[1:]
    assert path.read_bytes() == b"one\ntwo\nends in newline\n\n"
    assert any("syncing 2 records to disk" in line for line in lines)
    writer.close()
    # a second run in the same hour appends to the same file (no <REV> without gzip, rotation or work dir)
    writer2, _ = make_writer(tmp_path, clock)
    writer2.write(bodies("three"))
    writer2.close()
    assert path.read_bytes() == b"one\ntwo\nends in newline\n\nthree\n"
    assert sorted(os.listdir(tmp_path / "out")) == [path.name]


def test_gzip_members_and_revisions(tmp_path):
    clock = Clock()
    writer, _ = make_writer(tmp_path, clock, gzip=True, gzip_level=9)
    first = bodies("a", "b")
    assert writer.write(first) == first
    path = tmp_path / "out" / "tt.vm-000000.2026-11-27_12.log.gz"
    # after a sync the file holds complete gzip members only
    assert gzip.decompress(path.read_bytes()) == b"a\nb\n"
    second = bodies("c")
    assert writer.write(second) == [] and writer.tick() == second
    writer.close()
    assert gzip.decompress(path.read_bytes()) == b"a\nb\nc\n"
    # a gzip file is never appended to: the next run takes the next revision
    writer2, lines = make_writer(tmp_path, clock, gzip=True)
    writer2.write(bodies("d"))
    writer2.close()
    next_file = tmp_path / "out" / "tt.vm-000001.2026-11-27_12.log.gz"
    assert gzip.decompress(next_file.read_bytes()) == b"d\n"
    assert any("working file already exists" in line for line in lines)


def test_rotate_size_after_the_message_that_crosses_it(tmp_path):
    clock = Clock()
    writer, _ = make_writer(tmp_path, clock, rotate_size=10)
    messages = bodies("aaa", "bbb", "ccc", "ddd", "eee", "fff", "ggg")
    done = writer.write(messages)
    done += writer.close()
    assert done == messages  # every rotation synced what it closed
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == [
        "tt.vm-000000.2026-11-27_12.log",
        "tt.vm-000001.2026-11-27_12.log",
        "tt.vm-000002.2026-11-27_12.log",
    ]
    assert (out / "tt.vm-000000.2026-11-27_12.log").read_bytes() == b"aaa\nbbb\nccc\n"  # 12 bytes > 10
    assert (out / "tt.vm-000001.2026-11-27_12.log").read_bytes() == b"ddd\neee\nfff\n"
    assert (out / "tt.vm-000002.2026-11-27_12.log").read_bytes() == b"ggg\n"
    # a restart appends to the first revision not past the size
    writer2, _ = make_writer(tmp_path, clock, rotate_size=10)
    writer2.write(bodies("hhh"))
    writer2.close()
    assert (out / "tt.vm-000002.2026-11-27_12.log").read_bytes() == b"ggg\nhhh\n"


def test_rotate_interval_and_datetime_change(tmp_path):
    clock = Clock()
    writer, _ = make_writer(tmp_path, clock, rotate_interval=60.0)
    writer.write(bodies("one"))
    clock.advance(30)
    writer.write(bodies("two"))
    clock.advance(31)  # 61 s since the file was opened
    writer.write(bodies("three"))
    clock.advance(HOUR)  # a new <DATETIME>: the revision starts again
    writer.write(bodies("four"))
    writer.close()
    out = tmp_path / "out"
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == {
        "tt.vm-000000.2026-11-27_12.log": b"one\ntwo\n",
        "tt.vm-000001.2026-11-27_12.log": b"three\n",
        "tt.vm-000000.2026-11-27_13.log": b"four\n",
    }


def test_tick_rotation_makes_empty_files_unless_skipped(tmp_path):
    clock = Clock()
    writer, _ = make_writer(tmp_path / "a", clock, rotate_interval=10.0)
    writer.tick()  # the first tick opens a file even with no message
    clock.advance(11)
    writer.tick()
    writer.close()
    assert sorted(os.listdir(tmp_path / "a" / "out")) == [
        "tt.vm-000000.2026-11-27_12.log",
        "tt.vm-000001.2026-11-27_12.log",
    ]
    clock = Clock()
    writer, _ = make_writer(tmp_path / "b", clock, rotate_interval=10.0, skip_empty_files=True)
    writer.tick()
    assert not writer.logger.is_open and not (tmp_path / "b" / "out").exists()
    writer.write(bodies("x"))
    late = bodies("x2")
    assert writer.write(late) == []
    clock.advance(11)
    assert writer.tick() == late  # due: synced and closed, nothing new opened
    assert not writer.logger.is_open
    clock.advance(11)
    writer.tick()
    writer.write(bodies("y"))
    writer.close()
    out = tmp_path / "b" / "out"
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == {
        "tt.vm-000000.2026-11-27_12.log": b"x\nx2\n",
        "tt.vm-000001.2026-11-27_12.log": b"y\n",
    }


def test_pending_limit_syncs_at_max_in_flight(tmp_path):
    writer, _ = make_writer(tmp_path, Clock(), max_in_flight=3)
    opening = bodies("0")
    assert writer.write(opening) == opening
    messages = bodies("1", "2", "3", "4")
    done = writer.write(messages)
    assert done == messages[:3] and writer.pending == messages[3:]
    assert writer.write([], sync=True) == messages[3:]


def test_work_dir_move_and_revision_clashes(tmp_path):
    clock = Clock()
    work, out = tmp_path / "work", tmp_path / "out"
    out.mkdir()
    (out / "tt.vm-000000.2026-11-27_12.log").write_bytes(b"older\n")  # a revision taken before we start
    writer, lines = make_writer(tmp_path, clock, work_dir=str(work), output_dir=str(out))
    writer.write(bodies("a"))
    assert writer.logger.path == str(work / "tt.vm-000001.2026-11-27_12.log")
    assert any("output file already exists" in line for line in lines)
    assert not (out / "tt.vm-000001.2026-11-27_12.log").exists()  # still in the work dir while open
    (out / "tt.vm-000001.2026-11-27_12.log").write_bytes(b"raced\n")  # someone takes our name meanwhile
    writer.close()
    assert os.listdir(work) == []
    assert (out / "tt.vm-000001.2026-11-27_12.log").read_bytes() == b"raced\n"  # never replaced
    assert (out / "tt.vm-000002.2026-11-27_12.log").read_bytes() == b"a\n"
    assert any("renamed finished file" in line for line in lines)


# --- end to end -------------------------------------------------------------------------------------------------------


SHORT_HOST = socket.gethostname().split(".")[0]
HOUR_STAMP = r"\d{4}-\d\d-\d\d_\d\d"  # the default --datetime-format (its exact text: the unit tests above)

FACTS = {
    "channel": ("string", '"nsq_to_file"'),
    "consumer-opt": ("value", None),
    "datetime-format": ("string", '"%Y-%m-%d_%H"'),
    "filename-format": ("string", '"<TOPIC>.<HOST><REV>.<DATETIME>.log"'),
    "gzip": ("bool", None),
    "gzip-level": ("int", "6"),
    "host-identifier": ("string", None),
    "http-client-connect-timeout": ("duration", "2s"),
    "http-client-request-timeout": ("duration", "5s"),
    "log-level": ("string", '"info"'),
    "log-prefix": ("string", '"[nsq_to_file] "'),
    "lookupd-http-address": ("value", None),
    "max-in-flight": ("int", "200"),
    "nsqd-tcp-address": ("value", None),
    "output-dir": ("string", '"/tmp"'),
    "rotate-interval": ("duration", None),
    "rotate-size": ("rotate-size", None),
    "skip-empty-files": ("bool", None),
    "sync-interval": ("duration", "30s"),
    "topic": ("value", None),
    "topic-pattern": ("string", None),
    "topic-refresh": ("duration", "1m0s"),
    "version": ("bool", None),
    "work-dir": ("string", None),
}


def test_usage_lists_nsq_flags():
    assert_usage("nsq_to_file", FACTS)


def test_bad_flag_exits_2_and_version():
    assert_unknown_flag("nsq_to_file")
    result = run_tool("nsq_to_file", "--gzip-level=x")
    assert result.returncode == 2 and b'invalid value "x" for flag -gzip-level' in result.stderr
    result = run_tool("nsq_to_file", "-version")
    assert result.returncode == 0 and re.match(rb"nsq_to_file v1\.3\.0", result.stdout)


@pytest.mark.parametrize(
    "args, text",
    [
        (["--topic=t"], "--nsqd-tcp-address or --lookupd-http-address required."),
        (
            ["--topic=t", "--nsqd-tcp-address=a:1", "--lookupd-http-address=b:2"],
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (["--nsqd-tcp-address=a:1"], "--topic or --topic-pattern required"),
        (
            ["--nsqd-tcp-address=a:1", "--topic-pattern=x"],
            "--lookupd-http-address must be specified when no --topic specified",
        ),
        (["--topic=t", "--nsqd-tcp-address=a:1", "--gzip-level=10"], "invalid --gzip-level value (10), should be 1-9"),
        (["--topic=t", "--nsqd-tcp-address=a:1", "--channel="], "--channel is required"),
        (
            ["--topic=t", "--nsqd-tcp-address=a:1", "--http-client-connect-timeout=0"],
            "--http-client-connect-timeout should be positive",
        ),
        (
            ["--topic=t", "--nsqd-tcp-address=a:1", "--http-client-request-timeout=-1s"],
            "--http-client-request-timeout should be positive",
        ),
        (["--topic=t", "--nsqd-tcp-address=a:1", "--log-level=loud"], "--log-level is invalid"),
        (["--topic=t", "--nsqd-tcp-address=a:1", "extra"], "unknown arguments: [extra]"),
    ],
)
def test_validation_is_fatal(args, text):
    result = run_tool("nsq_to_file", *args)
    assert result.returncode == 1, result.stderr
    line = result.stderr.decode().strip().splitlines()[-1]
    assert re.fullmatch(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d " + re.escape(text), line), line


def publish(nsqd, topic: str, body: bytes) -> None:
    host, port = nsqd.http()
    request = urllib.request.Request(f"http://{host}:{port}/pub?topic={topic}", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200


def publish_many(nsqd, topic: str, messages: list[bytes]) -> None:
    host, port = nsqd.http()
    request = urllib.request.Request(
        f"http://{host}:{port}/mpub?topic={topic}", data=b"\n".join(messages), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200


def read_lines(directory: Path) -> dict[str, list[bytes]]:
    found = {}
    for path in sorted(directory.iterdir()):
        data = path.read_bytes()
        if path.name.endswith(".gz"):
            data = gzip.decompress(data)
        found[path.name] = data.splitlines()
    return found


def all_lines(directory: Path) -> list[bytes]:
    return [line for lines in read_lines(directory).values() for line in lines]


def channel_left(nsqd, topic: str) -> int:
    """What nsqd still holds on the channel: waiting, in flight (until its timeout) or deferred."""
    host, port = nsqd.http()
    with urllib.request.urlopen(f"http://{host}:{port}/stats?format=json&topic={topic}", timeout=10) as reply:
        doc = json.loads(reply.read())
    chan = next(
        c
        for t in doc["topics"]
        if t["topic_name"] == topic
        for c in t["channels"]
        if c["channel_name"] == "nsq_to_file"
    )
    return chan["depth"] + chan["in_flight_count"] + chan["deferred_count"]


def stop_ok(tool: ToolProcess) -> None:
    code = tool.stop(signal.SIGTERM)
    assert code == 0, tool.stderr.decode(errors="replace")


def test_default_name_and_content(nsqd, topic, tmp_path):
    publish_many(nsqd, topic, [b"first", b"second message", b"third"])
    with ToolProcess(
        "nsq_to_file",
        f"--topic={topic}",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--output-dir={tmp_path}",
        "--sync-interval=200ms",
    ) as tool:
        wait_for(lambda: channel_depth(nsqd, topic, "nsq_to_file") == 0 and len(all_lines(tmp_path)) == 3, timeout=20)
        stop_ok(tool)
    [(name, lines)] = read_lines(tmp_path).items()
    assert lines == [b"first", b"second message", b"third"]
    assert re.fullmatch(rf"{topic}\.{SHORT_HOST}\.{HOUR_STAMP}\.log", name), name
    assert re.search(
        rb"\[nsq_to_file\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} INFO: \["
        + topic.encode()
        + rb"/nsq_to_file\] opening ",
        tool.stderr,
    )


def test_gzip_output_reads_with_gzip_command(nsqd, topic, tmp_path):
    messages = [f"gz {i}".encode() for i in range(500)]
    with ToolProcess(
        "nsq_to_file",
        f"--topic={topic}",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--output-dir={tmp_path}",
        "--gzip",
        "--gzip-level=1",
        "--sync-interval=100ms",
        "--max-in-flight=50",
    ) as tool:
        for start in range(0, 500, 100):
            publish_many(nsqd, topic, messages[start : start + 100])
        wait_for(lambda: channel_depth(nsqd, topic, "nsq_to_file") == 0, timeout=30)
        tool.wait_for_stderr(rb"syncing \d+ records", timeout=10)
        stop_ok(tool)
    files = sorted(tmp_path.iterdir())
    assert len(files) == 1
    assert re.fullmatch(rf"{topic}\.{SHORT_HOST}-000000\.{HOUR_STAMP}\.log\.gz", files[0].name), files[0].name
    assert gzip.decompress(files[0].read_bytes()).splitlines() == messages
    unpacked = subprocess.run(["gzip", "-dc", str(files[0])], capture_output=True, timeout=30)
    assert unpacked.returncode == 0 and unpacked.stdout.splitlines() == messages


def test_rotate_size_keeps_every_message_once_in_order(nsqd, topic, tmp_path):
    messages = [f"message number {i:04d}".encode() for i in range(300)]  # 20 bytes a line
    publish_many(nsqd, topic, messages)
    with ToolProcess(
        "nsq_to_file",
        f"--topic={topic}",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--output-dir={tmp_path}",
        "--rotate-size=1000",
        "--sync-interval=100ms",
        "--max-in-flight=1",
    ) as tool:
        wait_for(lambda: channel_depth(nsqd, topic, "nsq_to_file") == 0 and len(all_lines(tmp_path)) == 300, timeout=60)
        stop_ok(tool)
    files = read_lines(tmp_path)
    assert len(files) == 6  # 51 lines (1020 bytes) a file: the line that passes 1000 bytes stays in the file
    assert all(re.fullmatch(rf"{topic}\.{SHORT_HOST}-00000\d\..*\.log", name) for name in files)
    assert [len(lines) for lines in files.values()] == [51] * 5 + [45]
    assert all_lines(tmp_path) == messages


def test_rotate_interval_and_work_dir(nsqd, topic, tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    with ToolProcess(
        "nsq_to_file",
        f"--topic={topic}",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--output-dir={out}",
        f"--work-dir={work}",
        "--rotate-interval=500ms",
        "--sync-interval=100ms",
        "--skip-empty-files",
    ) as tool:
        publish(nsqd, topic, b"early")
        wait_for(lambda: out.exists() and all_lines(out) == [b"early"], timeout=20)  # moved once rotated
        publish(nsqd, topic, b"late")
        wait_for(lambda: all_lines(out) == [b"early", b"late"], timeout=20)
        stop_ok(tool)
    names = sorted(os.listdir(out))
    assert len(names) == 2 and all(re.fullmatch(rf"{topic}\.{SHORT_HOST}-00000[01]\..*\.log", n) for n in names)
    assert os.listdir(work) == []


def test_sighup_closes_the_file_and_the_next_message_opens_another(nsqd, topic, tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    with ToolProcess(
        "nsq_to_file",
        f"--topic={topic}",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--output-dir={out}",
        f"--work-dir={work}",
        "--sync-interval=100ms",
    ) as tool:
        publish(nsqd, topic, b"before")
        wait_for(lambda: work.exists() and all_lines(work) == [b"before"], timeout=20)
        assert not out.exists() or not os.listdir(out)
        tool.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: out.exists() and all_lines(out) == [b"before"] and not os.listdir(work), timeout=20)
        publish(nsqd, topic, b"after")
        wait_for(lambda: all_lines(work) == [b"after"], timeout=20)
        stop_ok(tool)
    files = read_lines(out)
    assert list(files.values()) == [[b"before"], [b"after"]]
    assert [
        re.fullmatch(rf"{topic}\.{SHORT_HOST}-00000([01])\.{HOUR_STAMP}\.log", name).group(1) for name in files
    ] == ["0", "1"]


def test_topic_pattern_picks_up_new_topics(lookupd, lookupd_nsqd, tmp_path):
    nsqd = lookupd_nsqd
    lookupd_address = "{}:{}".format(*lookupd.http_address)
    publish(nsqd, "match_one", b"first topic")
    publish(nsqd, "other", b"not for us")
    with ToolProcess(
        "nsq_to_file",
        "--topic-pattern=^match_",
        f"--lookupd-http-address={lookupd_address}",
        f"--output-dir={tmp_path}",
        "--topic-refresh=200ms",
        "--sync-interval=100ms",
        "--consumer-opt=lookupd_poll_interval,200ms",
    ) as tool:
        wait_for(lambda: all_lines(tmp_path) == [b"first topic"], timeout=20)
        publish(nsqd, "match_two", b"second topic")  # created after the start
        wait_for(lambda: sorted(all_lines(tmp_path)) == [b"first topic", b"second topic"], timeout=20)
        tool.wait_for_stderr(rb"skipping topic other \(doesn't match pattern \^match_\)")
        stop_ok(tool)
    assert sorted(name.split(".")[0] for name in os.listdir(tmp_path)) == ["match_one", "match_two"]


def test_sigterm_mid_stream_loses_nothing(nsqd, topic, tmp_path):
    total = 6000
    messages = [f"stream {i:05d}".encode() for i in range(total)]
    publish_many(nsqd, topic, messages[:1000])
    args = (
        f"--topic={topic}",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        f"--output-dir={tmp_path}",
        "--sync-interval=50ms",
        "--max-in-flight=20",
    )
    with ToolProcess("nsq_to_file", *args) as tool:
        tool.wait_for_stderr(rb"syncing \d+ records")
        for start in range(1000, total, 2500):
            publish_many(nsqd, topic, messages[start : start + 2500])
        stop_ok(tool)  # in the middle of the stream
    written = all_lines(tmp_path)
    assert len(written) == len(set(written)) and set(written) <= set(messages)
    assert written == sorted(written)
    # everything else is still in nsqd, on the channel (depth, deferred, or in flight until it times out), and
    # nothing written is there too: a message is in a file and FIN'd, or back in nsqd, never both
    assert len(written) + channel_left(nsqd, topic) == total
    assert len(written) < total, "the stop came too late to test anything"
    # a second run writes the rest, and nothing twice
    with ToolProcess("nsq_to_file", *args) as tool:
        wait_for(lambda: set(all_lines(tmp_path)) == set(messages), timeout=60)
        stop_ok(tool)
    assert sorted(all_lines(tmp_path)) == messages


def test_unwritable_output_dir_is_fatal(nsqd, topic, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    publish(nsqd, topic, b"x")
    result = run_tool(
        "nsq_to_file", f"--topic={topic}", f"--nsqd-tcp-address={nsqd.tcp_address}", f"--output-dir={blocker}/out"
    )
    assert result.returncode == 1
    assert re.search(rb"FATAL: \[" + topic.encode() + rb"/nsq_to_file\] unable to create dir: ", result.stderr)
    assert b"Traceback" not in result.stderr
    assert channel_left(nsqd, topic) == 1  # never FIN'd: nsqd still has it


def test_unreachable_nsqd_skips_the_topic_as_nsq_does(tmp_path):
    from tests.integration.harness import free_port

    with ToolProcess(
        "nsq_to_file", "--topic=tt", f"--nsqd-tcp-address=127.0.0.1:{free_port()}", f"--output-dir={tmp_path}"
    ) as tool:
        tool.wait_for_stderr(rb"ERROR: couldn't create logger for new topic tt: ")
        stop_ok(tool)
    assert b"Traceback" not in tool.stderr
