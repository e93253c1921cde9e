"""What the six utilities share: Go-style flags, NSQ's option pass-through, fatal errors, signals, trio.

Each tool is one module with a ``main(argv=None) -> int`` (its console script) that declares its flags on a
``ToolFlags`` (NSQ 1.3.0's names, kinds and defaults, see NSQ-TOOLS-FACTS), parses them with Go's rules
(``runtime.flags.FlagSet``: ``-h`` prints the usage to stderr and exits 0, an unknown or malformed flag prints
the error and the usage and exits 2, ``-version`` prints ``<tool> v1.3.0 (built w/python...)`` and exits 0),
checks them, and runs its trio main with ``run``.

Fatal start-up problems (a missing ``--topic``) end the tool the way Go's ``log.Fatal`` does: one line
``YYYY/MM/DD HH:MM:SS <text>`` on stderr and exit code 1, never a traceback.

``-consumer-opt``/``-producer-opt``: NSQ's tools declare them as go-nsq's ``ConfigFlag`` (a ``flag.Value`` whose
``Set`` applies the option to the tool's Config), so a bad option is a flag error: ``invalid value "x" for flag
-consumer-opt: <go-nsq's reason>``, the usage, exit code 2. Here each value is tried on a scratch ``Config`` while
the flags are parsed (the flag's ``convert``), and applied to the real one by ``consumer_config``/``producer_config``.

Signals: ``run`` hands the tool's main a ``trio.Event`` that is set by the first SIGINT, SIGTERM or SIGHUP
(the tools' graceful stop: close files, finish or requeue in-flight messages); a second one while stopping is
ignored, like NSQ's tools, which stop once and wait.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from protocol.version import version_string
from runtime.flags import FlagError, FlagSet

__all__ = [
    "ToolFlags",
    "consumer_config",
    "fatal",
    "fatal_if",
    "log_line",
    "producer_config",
    "run",
    "setup_logging",
    "write_stdout",
]


def log_line(text: str) -> str:
    """Go's standard logger line (``log.LstdFlags``): local date and time, then the text."""
    return time.strftime("%Y/%m/%d %H:%M:%S ") + text


def fatal(text: str) -> NoReturn:
    """Go's ``log.Fatal``: the line on stderr, exit code 1. Go exits there and then; here the exit unwinds
    the tool's tasks, whose log lines (a connection closing...) would follow the fatal one, so logging ends."""
    logging.disable(logging.CRITICAL)
    try:
        sys.stderr.write(log_line(text) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    raise SystemExit(1)


def write_stdout(data: bytes | str) -> None:
    """Write and flush at once (a tool's output is news, like Go's unbuffered ``os.Stdout``). A reader that
    went away (``tool | head``) ends the tool quietly, as the SIGPIPE that ends a Go tool does; any other
    failure is fatal with upstream's words."""
    try:
        if isinstance(data, str):
            data = data.encode()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush has nowhere to fail
        raise SystemExit(0) from None
    except OSError as exc:
        fatal(f"ERROR: failed to write to os.Stdout - {exc}")


class _GoLogFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info and record.levelno >= logging.ERROR:
            text += f" - {record.exc_info[1]}"
        stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(record.created))
        return f"{self._prefix}{stamp} {text}"

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix


def setup_logging(prefix: str = "", level: int = logging.INFO) -> None:
    """Log lines on stderr in Go's standard form, as NSQ's tools print their own and the client's events."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_GoLogFormatter(prefix))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class ToolFlags(FlagSet):
    """A tool's flag set, with the flags most tools share declared by one call each."""

    def add_version(self) -> None:
        self.add("version", "bool", False, "print the version and exit", in_config=False)

    def add_consumer(self, *, channel: str = "", max_in_flight: int | None = 200, topics: bool = True) -> None:
        """``-channel``, ``-consumer-opt``, ``-lookupd-http-address``, ``-nsqd-tcp-address``, ``-max-in-flight``
        and (``topics``) a repeatable ``-topic``: the flags of every consuming tool."""
        self.add("channel", "str", channel, "the channel to consume", in_config=False)
        self.add(
            "consumer-opt",
            "str_list",
            [],
            "an option for the consumer, as name,value (repeatable; go-nsq's option names)",
            in_config=False,
            convert=_option_checker(),
        )
        self.add(
            "lookupd-http-address",
            "str_list",
            [],
            "an nsqlookupd HTTP address to discover nsqd from (repeatable)",
            in_config=False,
        )
        self.add(
            "nsqd-tcp-address", "str_list", [], "an nsqd TCP address to consume from (repeatable)", in_config=False
        )
        if max_in_flight is not None:
            self.add(
                "max-in-flight", "int", max_in_flight, "how many messages may be in flight at once", in_config=False
            )
        if topics:
            self.add("topic", "str_list", [], "a topic to consume (repeatable)", in_config=False)

    def add_producer_opt(self) -> None:
        self.add(
            "producer-opt",
            "str_list",
            [],
            "an option for the producer, as name,value (repeatable; go-nsq's option names)",
            in_config=False,
            convert=_option_checker(),
        )

    def add_http_client_timeouts(self, request_timeout: float = 5.0) -> None:
        self.add(
            "http-client-connect-timeout",
            "duration",
            2.0,
            "timeout for connecting to an HTTP endpoint",
            in_config=False,
        )
        self.add(
            "http-client-request-timeout", "duration", request_timeout, "timeout for an HTTP request", in_config=False
        )

    def parse_or_exit(self, argv: list[str] | None) -> dict[str, Any]:
        """The flags' values by attribute, or the process ends as Go's ``flag.Parse`` and ``-version`` end it."""
        try:
            values = self.parse(sys.argv[1:] if argv is None else argv)
        except FlagError as exc:
            exc.exit()
        if values.get("version"):
            sys.stdout.write(version_string(self.program) + "\n")
            sys.stdout.flush()
            raise SystemExit(0)
        return values


def _option_checker() -> Callable[[str], str]:
    """A ``convert`` for an option flag: ``name,value`` set on a scratch ``Config`` of that flag (several
    occurrences accumulate, as on go-nsq's ConfigFlag), ``ValueError`` with go-nsq's reason when refused."""
    scratch: list[Any] = []

    def check(text: str) -> str:
        if not scratch:
            from trionsq import Config  # only when the flag is given: -h stays light

            scratch.append(Config())
        scratch[0].set_option_text(text)
        return text

    return check


def _apply_options(config, options: list[str]) -> None:
    for text in options:
        try:
            config.set_option_text(text)
        except ValueError as exc:
            fatal(str(exc))


def consumer_config(values: dict[str, Any], **fields: Any):
    """A ``trionsq.Config`` from a consuming tool's flags: ``-max-in-flight``, then each ``-consumer-opt``
    (which may override it, as in NSQ's tools); ``fields`` are set first (a tool's own defaults)."""
    from trionsq import Config  # keeps -h and -version free of the client's imports

    config = Config(**fields)
    if "max_in_flight" in values:
        config.max_in_flight = values["max_in_flight"]
    _apply_options(config, values.get("consumer_opt", []))
    return config


def producer_config(values: dict[str, Any], **fields: Any):
    """A ``trionsq.Config`` for a producing tool, with its ``-producer-opt`` values applied."""
    from trionsq import Config

    config = Config(**fields)
    _apply_options(config, values.get("producer_opt", []))
    return config


def run(main: Callable[..., Awaitable[int | None]], *args: Any, on_hup: Callable[[], None] | None = None) -> int:
    """Run ``await main(stop, *args)`` under trio, where ``stop`` is a ``trio.Event`` set by the first SIGINT,
    SIGTERM or SIGHUP; return its exit code (None means 0). With ``on_hup`` (called in the event loop), SIGHUP
    calls it instead of stopping (nsq_to_file reopens its files on SIGHUP)."""
    import trio

    async def with_signals() -> int | None:
        stop = trio.Event()
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    async for signum in signals:
                        if signum == signal.SIGHUP and on_hup is not None:
                            on_hup()
                        else:
                            stop.set()

                nursery.start_soon(watch)
                code = await main(stop, *args)
                nursery.cancel_scope.cancel()
        return code

    try:
        code = trio.run(with_signals)
    except KeyboardInterrupt:
        return 130
    except BaseExceptionGroup as group:
        # fatal() called inside a task reaches here wrapped by the nurseries it crossed; it is still only an exit
        exits, rest = group.split(SystemExit)
        if exits is None or rest is not None:
            raise
        raise _first_leaf(exits) from None
    return 0 if code is None else code


def fatal_if(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> None:
    """End the tool with ``exc``'s text as a fatal line when it is one of ``kinds`` (or a group from trio's
    nurseries holding only such errors, the first one named); otherwise return, for the caller to re-raise."""
    if isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(kinds)
        if matched is None or rest is not None:
            return
        exc = _first_leaf(matched)
    if isinstance(exc, kinds):
        fatal(str(exc))


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
