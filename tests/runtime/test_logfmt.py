"""NSQ-style log lines, levels, and a logger that never raises."""

from __future__ import annotations

import io
import itertools
import logging
import re
import threading
import time

import pytest
import trio

from runtime.logfmt import (
    DEBUG,
    ERROR,
    FATAL,
    INFO,
    WARN,
    NSQHandler,
    format_line,
    get_log_level,
    log_flusher,
    log_level_word,
    parse_log_level,
    set_log_level,
    setup_logging,
    to_logging_level,
)

LINE = re.compile(r"^\[nsqd\] \d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{6} (DEBUG|INFO|WARNING|ERROR|FATAL): .*$")
_names = itertools.count()


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def logger_and_stream():
    """A logger of its own (the process-wide "nsqd" logger is left alone) writing to a buffer."""
    stream = io.StringIO()
    name = f"test-logfmt-{next(_names)}"
    logger = setup_logging("[nsqd] ", "info", stream, name=name)
    yield logger, stream
    logger.handlers.clear()


def test_format_line_exact(utc):
    created = 1795262400.123456  # 2026-11-21 12:00:00.123456 UTC
    assert (
        format_line("[nsqd] ", "INFO", "TCP: listening on 127.0.0.1:4150", created)
        == "[nsqd] 2026/11/21 12:00:00.123456 INFO: TCP: listening on 127.0.0.1:4150"
    )
    assert format_line("", "FATAL", "x", 0.0000009) == "1970/01/01 00:00:00.000001 FATAL: x"
    assert (
        format_line("[nsqlookupd] ", "WARNING", "y", 86399.9999994)
        == "[nsqlookupd] 1970/01/01 23:59:59.999999 WARNING: y"
    )


def test_lines_and_labels(logger_and_stream):
    logger, stream = logger_and_stream
    logger.debug("hidden at info")
    logger.info("TCP: listening on %s", "127.0.0.1:4150")
    logger.warning("careful")
    logger.error("broken %d", 7)
    logger.critical("fatal thing")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4
    assert all(LINE.match(line) for line in lines), lines
    assert lines[0].endswith(" INFO: TCP: listening on 127.0.0.1:4150")
    assert lines[1].endswith(" WARNING: careful")
    assert lines[2].endswith(" ERROR: broken 7")
    assert lines[3].endswith(" FATAL: fatal thing")


def test_child_loggers_use_the_same_handler(logger_and_stream):
    logger, stream = logger_and_stream
    logging.getLogger(logger.name + ".tcp").info("from a child")
    assert stream.getvalue().endswith(" INFO: from a child\n")


@pytest.mark.parametrize(
    "value, level",
    [
        ("debug", DEBUG),
        ("INFO", INFO),
        ("Warn", WARN),
        ("error", ERROR),
        ("FATAL", FATAL),
        (" info\n", INFO),
        (1, DEBUG),
        (5, FATAL),
        ("3", WARN),
    ],
)
def test_parse_log_level(value, level):
    assert parse_log_level(value) == level


@pytest.mark.parametrize("value", ["warning", "critical", "", "loud", 0, 6, "6", True, None, 2.0])
def test_parse_log_level_rejects(value):
    with pytest.raises(ValueError) as info:
        parse_log_level(value)
    assert str(info.value) == f"invalid log level '{value}' (debug, info, warn, error, fatal)"


def test_level_conversions():
    assert [log_level_word(n) for n in range(1, 6)] == ["debug", "info", "warn", "error", "fatal"]
    assert [to_logging_level(n) for n in range(1, 6)] == [
        logging.DEBUG,
        logging.INFO,
        logging.WARNING,
        logging.ERROR,
        logging.CRITICAL,
    ]


def test_level_changes_at_run_time(logger_and_stream):
    logger, stream = logger_and_stream
    assert get_log_level(logger) == INFO
    assert set_log_level(logger, "debug") == DEBUG
    logger.debug("now visible")
    assert set_log_level(logger, "error") == ERROR
    logger.warning("now hidden")
    with pytest.raises(ValueError):
        set_log_level(logger, "loud")
    assert get_log_level(logger) == ERROR
    assert stream.getvalue().count("\n") == 1 and " DEBUG: now visible" in stream.getvalue()


def test_never_raises():
    class Broken(io.StringIO):
        def write(self, text):
            raise OSError("disk gone")

    for stream in (Broken(), io.StringIO()):
        logger = setup_logging("[nsqd] ", "debug", stream, name=f"test-logfmt-{next(_names)}")
        if not isinstance(stream, Broken):
            stream.close()
        logger.info("no raise %s")  # closed stream
        logger.info("%d", "not a number")  # bad arguments
        logger.info("x", exc_info=True)
    good = io.StringIO()
    logger = setup_logging("[nsqd] ", "info", good, name=f"test-logfmt-{next(_names)}")
    logger.info("%d apples %s", "x")
    assert "%d apples %s ('x',)" in good.getvalue()


def test_exceptions_are_one_line_unless_debug(logger_and_stream):
    logger, stream = logger_and_stream
    try:
        raise ValueError("bad thing")
    except ValueError:
        logger.exception("handler failed")
    assert stream.getvalue().splitlines()[-1].endswith(" ERROR: handler failed: ValueError: bad thing")
    assert stream.getvalue().count("\n") == 1
    set_log_level(logger, "debug")
    try:
        raise ValueError("again")
    except ValueError:
        logger.exception("handler failed")
    tail = stream.getvalue().split("handler failed: ValueError: again\n", 1)[1]
    assert tail.startswith("    Traceback (most recent call last):")


def test_setup_twice_replaces_the_handler():
    name = f"test-logfmt-{next(_names)}"
    first, second = io.StringIO(), io.StringIO()
    setup_logging("[a] ", "info", first, name=name)
    logger = setup_logging("[b] ", "warn", second, name=name)
    logger.warning("once")
    logger.info("filtered")
    assert first.getvalue() == ""
    assert second.getvalue().startswith("[b] ") and second.getvalue().count("\n") == 1
    logger.handlers.clear()


def test_default_stream_is_stderr_at_write_time(capsys):
    logger = setup_logging("[nsqlookupd] ", "info", name=f"test-logfmt-{next(_names)}")
    logger.info("to stderr")
    err = capsys.readouterr().err
    assert err.startswith("[nsqlookupd] ") and err.endswith(" INFO: to stderr\n")
    logger.handlers.clear()


def _messages(stream) -> list[str]:
    return [line.split(": ", 1)[1] for line in stream.getvalue().splitlines()]


def test_held_lines_are_written_together_and_in_order(logger_and_stream):
    logger, stream = logger_and_stream
    handler = next(h for h in logger.handlers if isinstance(h, NSQHandler))
    handler.hold_lines(True)
    logger.info("one")
    logger.debug("not at info level")
    logger.info("two")
    assert stream.getvalue() == ""
    handler.write_pending()
    assert _messages(stream) == ["one", "two"]
    logger.info("three")
    logger.warning("four")  # a warning is written at once, after what was held before it
    assert _messages(stream) == ["one", "two", "three", "four"]
    logger.info("five")
    handler.hold_lines(False)  # no longer holding: what is held is written
    logger.info("six")
    assert _messages(stream)[-2:] == ["five", "six"]
    assert all(LINE.match(line) for line in stream.getvalue().splitlines())


def test_lines_of_other_threads_are_not_held(logger_and_stream):
    logger, stream = logger_and_stream
    handler = next(h for h in logger.handlers if isinstance(h, NSQHandler))
    handler.hold_lines(True)
    worker = threading.Thread(target=logger.info, args=("from a worker",))
    worker.start()
    worker.join(10)
    assert _messages(stream) == ["from a worker"]
    handler.hold_lines(False)


def test_a_daemon_loop_writes_its_lines_once_per_turn(logger_and_stream):
    logger, stream = logger_and_stream
    seen = []

    async def main():
        logger.info("first")
        logger.info("second")
        seen.append(stream.getvalue())  # held while this turn runs
        await trio.sleep(0)  # the loop goes round and looks for I/O: the lines go out before
        seen.append(stream.getvalue())
        logger.info("last")

    trio.run(main, instruments=[log_flusher(logger)])
    assert seen[0] == ""
    assert [line.split(": ", 1)[1] for line in seen[1].splitlines()] == ["first", "second"]
    assert _messages(stream)[-1] == "last"  # written when the run ended
