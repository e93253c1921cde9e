"""nsqlookupd's flags, defaults, config file and startup checks."""

import socket
from pathlib import Path

import pytest

import lookupd
from lookupd.options import Options, build_flagset, parse_options, validate
from runtime.flags import FlagError, HelpRequested


def parse(*argv: str) -> Options:
    return parse_options(list(argv), exit_on_error=False)


def test_defaults_are_nsqs():
    opts = parse()
    assert (opts.tcp_address, opts.http_address) == ("0.0.0.0:4160", "0.0.0.0:4161")
    assert opts.broadcast_address == socket.gethostname()
    assert (opts.inactive_producer_timeout, opts.tombstone_lifetime) == (300.0, 45.0)
    assert (opts.log_level, opts.log_prefix) == ("info", "[nsqlookupd] ")


def test_every_flag_of_nsqlookupd():
    names = {flag.name for flag in build_flagset().flags}
    assert names == {
        "config",
        "version",
        "log-level",
        "log-prefix",
        "verbose",
        "tcp-address",
        "http-address",
        "broadcast-address",
        "inactive-producer-timeout",
        "tombstone-lifetime",
    }


def test_go_flag_syntax_and_durations():
    opts = parse(
        "-tcp-address=127.0.0.1:0",
        "--http-address",
        "127.0.0.1:1",
        "--inactive-producer-timeout=1m30s",
        "-tombstone-lifetime",
        "250ms",
        "--log-level=WARN",
        "-verbose",
    )
    assert (opts.tcp_address, opts.http_address) == ("127.0.0.1:0", "127.0.0.1:1")
    assert (opts.inactive_producer_timeout, opts.tombstone_lifetime) == (90.0, 0.25)
    assert opts.log_level == "warn"


def test_usage_errors():
    with pytest.raises(FlagError, match="flag provided but not defined: -lookupd-tcp-address") as info:
        parse("--lookupd-tcp-address=x")
    assert info.value.exit_code == 2 and "Usage of nsqlookupd:" in info.value.usage
    with pytest.raises(FlagError, match='invalid value "soon" for flag -tombstone-lifetime'):
        parse("--tombstone-lifetime=soon")
    with pytest.raises(HelpRequested):
        parse("-h")


def test_usage_text_shows_nsqs_defaults():
    usage = build_flagset().usage()
    assert '  -tcp-address string\n    \t<addr>:<port> to listen on for TCP clients (default "0.0.0.0:4160")' in usage
    assert "(default 5m0s)" in usage and "(default 45s)" in usage and "(default INFO)" in usage


def test_config_file_and_precedence(tmp_path):
    config = tmp_path / "lookupd.cfg"
    config.write_text(
        'tcp_address = "127.0.0.1:5000"\nhttp_address = "127.0.0.1:5001"\n'
        'tombstone_lifetime = "10s"\ninactive_producer_timeout = 2000\nlog_prefix = "[x] "\n'
    )
    opts = parse(f"--config={config}", "--http-address=127.0.0.1:6001")
    assert (opts.tcp_address, opts.http_address) == ("127.0.0.1:5000", "127.0.0.1:6001")
    assert (opts.tombstone_lifetime, opts.inactive_producer_timeout, opts.log_prefix) == (10.0, 2.0, "[x] ")
    with pytest.raises(FlagError, match="failed to load config file"):
        parse(f"--config={tmp_path / 'missing.cfg'}")


def test_version_flag():
    assert parse("--version").version


def test_validate():
    validate(parse())
    validate(parse("--tcp-address=127.0.0.1", "--http-address=127.0.0.1:http"))  # checked when bound


def test_imported_from_this_checkout():
    assert Path(lookupd.__file__).resolve().parent == Path(__file__).resolve().parents[2] / "lookupd"
