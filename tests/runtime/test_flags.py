"""Go ``flag`` compatibility, Go value syntax, and config-file resolution."""

from __future__ import annotations

import io
import math

import pytest

from runtime.flags import (
    FlagError,
    FlagSet,
    HelpRequested,
    duration_to_ns,
    format_duration,
    format_duration_ns,
    go_format_float,
    go_quote,
    load_config,
    merge,
    parse_duration,
    parse_duration_ns,
    parse_go_bool,
    parse_go_float,
    parse_go_int,
)


def make_flagset() -> FlagSet:
    fs = FlagSet("demo")
    fs.add("name", "str", "anon", "a name")
    fs.add("count", "int", 3, "how many")
    fs.add("ratio", "float", 0.5, "a ratio")
    fs.add("enabled", "bool", True, "switch")
    fs.add("verbose", "bool", False, "talk more")
    fs.add("timeout", "duration", 60.0, "how long")
    fs.add("address", "str_list", [], "repeatable address", config_key="addresses", attr="addresses")
    fs.add("peer", "str_list", [], "repeatable, comma separated", comma_separated=True, attr="peers")
    fs.add("pct", "float_list", [], "percentiles", attr="pcts")
    fs.add("node-id", "int", 7, "node", config_key="id")
    fs.add("config", "str", "", "config file", in_config=False)
    return fs


# --------------------------------------------------------------------------------------------
# command-line syntax

SYNTAX_CASES = [
    # (argv, expected values subset, positional leftovers)
    (["-name", "x"], {"name": "x"}, []),
    (["-name=x"], {"name": "x"}, []),
    (["--name", "x"], {"name": "x"}, []),
    (["--name=x"], {"name": "x"}, []),
    (["--name="], {"name": ""}, []),
    (["--name=a=b"], {"name": "a=b"}, []),
    (["-name", "-dash-value"], {"name": "-dash-value"}, []),
    (["-count", "10"], {"count": 10}, []),
    (["--count=0x10"], {"count": 16}, []),
    (["-count=010"], {"count": 8}, []),
    (["-count", "-5"], {"count": -5}, []),
    (["-timeout", "1.5h"], {"timeout": 5400.0}, []),
    (["--timeout=300ms"], {"timeout": 0.3}, []),
    (["-timeout=0"], {"timeout": 0.0}, []),
    (["-ratio=.25"], {"ratio": 0.25}, []),
    (["-verbose"], {"verbose": True}, []),
    (["--verbose"], {"verbose": True}, []),
    (["-enabled=false"], {"enabled": False}, []),
    (["--enabled=0"], {"enabled": False}, []),
    (["-enabled=F"], {"enabled": False}, []),
    (["-enabled=FALSE"], {"enabled": False}, []),
    (["-verbose=t"], {"verbose": True}, []),
    (["-verbose=True"], {"verbose": True}, []),
    (["-verbose=1"], {"verbose": True}, []),
    # a boolean flag never takes the next argument: "false" is positional and parsing stops
    (["-enabled", "false", "-count=9"], {"enabled": True, "count": 3}, ["false", "-count=9"]),
    (["-count=1", "--", "-count=2"], {"count": 1}, ["-count=2"]),
    (["-count=1", "file", "-count=2"], {"count": 1}, ["file", "-count=2"]),
    (["-", "-count=2"], {"count": 3}, ["-", "-count=2"]),
    (["-count=1", "-count=2"], {"count": 2}, []),
    ([], {"name": "anon", "count": 3, "enabled": True, "timeout": 60.0, "addresses": []}, []),
]


@pytest.mark.parametrize("argv, expected, rest", SYNTAX_CASES)
def test_syntax(argv, expected, rest):
    fs = make_flagset()
    values = fs.parse(argv)
    for key, value in expected.items():
        assert values[key] == value, key
    assert fs.args == rest


def test_given_tracks_only_explicit_flags():
    fs = make_flagset()
    fs.parse(["-count=3", "--verbose"])
    assert fs.given == {"count": 3, "verbose": True}


def test_repeatable_lists():
    fs = make_flagset()
    values = fs.parse(
        [
            "--address",
            "a:1,b:2",
            "-address=c:3",
            "--peer=x:1, y:2",
            "-peer",
            "z:3",
            "-pct=0.5,0.99",
            "--pct",
            "0.75",
            "-pct=1.0",
        ]
    )
    assert values["addresses"] == ["a:1,b:2", "c:3"]  # Go's StringArray does not split
    assert values["peers"] == ["x:1", "y:2", "z:3"]
    assert values["pcts"] == [1.0, 0.99, 0.75, 0.5]  # FloatArray keeps them sorted descending


def test_repeatable_scalar_kind():
    fs = FlagSet("demo")
    fs.add("wait", "duration", [], "waits", repeatable=True)
    assert fs.parse(["-wait=1s", "-wait", "250ms"])["wait"] == [1.0, 0.25]


def test_defaults_are_not_shared():
    fs = FlagSet("demo")
    fs.add("item", "str_list", ["a"], "items")
    first = fs.parse([])
    first["item"].append("mutated")
    assert fs.parse([])["item"] == ["a"]
    assert fs.parse(["-item=b"])["item"] == ["b"]  # an explicit flag replaces the default list


ERROR_CASES = [
    (["-nope"], "flag provided but not defined: -nope"),
    (["--nope=1"], "flag provided but not defined: -nope"),
    (["---count=1"], "bad flag syntax: ---count=1"),
    (["-=1"], "bad flag syntax: -=1"),
    (["--=1"], "bad flag syntax: --=1"),
    (["-count"], "flag needs an argument: -count"),
    (["-count=abc"], 'invalid value "abc" for flag -count: parse error'),
    (["-count=9223372036854775808"], 'invalid value "9223372036854775808" for flag -count: value out of range'),
    (["-count="], 'invalid value "" for flag -count: parse error'),
    (["-timeout=5"], 'invalid value "5" for flag -timeout: parse error'),
    (["-ratio=x"], 'invalid value "x" for flag -ratio: parse error'),
    (["-verbose=yes"], 'invalid boolean value "yes" for -verbose: parse error'),
    (["-pct=0.5,abc"], 'invalid value "0.5,abc" for flag -pct: parse error'),
]


@pytest.mark.parametrize("argv, message", ERROR_CASES)
def test_errors(argv, message):
    fs = make_flagset()
    with pytest.raises(FlagError) as info:
        fs.parse(argv)
    assert info.value.message == message
    assert info.value.exit_code == 2
    assert info.value.usage == fs.usage()


def test_unknown_flag_exits_2_with_message_and_usage():
    fs = make_flagset()
    stream = io.StringIO()
    with pytest.raises(FlagError) as info:
        fs.parse(["-count=1", "--bogus", "x"])
    with pytest.raises(SystemExit) as exited:
        info.value.exit(stream)
    assert exited.value.code == 2
    text = stream.getvalue()
    assert text.startswith("flag provided but not defined: -bogus\nUsage of demo:\n")
    assert text.endswith(fs.usage())


@pytest.mark.parametrize("arg", ["-h", "-help", "--help", "--h", "-help=1"])
def test_help_exits_0_with_usage_only(arg):
    fs = make_flagset()
    with pytest.raises(HelpRequested) as info:
        fs.parse(["-count=1", arg, "-bogus"])
    stream = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        info.value.exit(stream)
    assert exited.value.code == 0
    assert stream.getvalue() == fs.usage()


def test_help_flag_defined_by_program_wins():
    fs = FlagSet("demo")
    fs.add("h", "bool", False, "custom h")
    assert fs.parse(["-h"])["h"] is True


def test_custom_bool_like_value():
    fs = FlagSet("demo")
    convert = lambda text: {"true": "on", "false": "off", "both": "both"}[text.lower()]  # noqa: E731
    fs.add("mode", "str", "off", "mode", convert=lambda t: _checked(convert, t), bool_like=True)
    assert fs.parse(["-mode"])["mode"] == "on"
    assert fs.parse(["-mode=BOTH"])["mode"] == "both"
    values = fs.parse(["-mode", "both"])
    assert values["mode"] == "on" and fs.args == ["both"]
    with pytest.raises(FlagError) as info:
        fs.parse(["-mode=maybe"])
    assert info.value.message == 'invalid boolean value "maybe" for -mode: bad mode'


def _checked(convert, text):
    try:
        return convert(text)
    except KeyError:
        raise ValueError("bad mode") from None


def test_definition_errors():
    fs = FlagSet("demo")
    fs.add("a", "int", 0, "a")
    with pytest.raises(ValueError):
        fs.add("a", "int", 0, "again")
    with pytest.raises(ValueError):
        fs.add("-b", "int", 0, "dash")
    with pytest.raises(ValueError):
        fs.add("c=d", "int", 0, "equals")
    with pytest.raises(ValueError):
        fs.add("e", "complex", 0, "kind")
    with pytest.raises(ValueError):
        fs.add("f", "bool", False, "repeatable bool", repeatable=True)
    with pytest.raises(ValueError):
        fs.add("g", "int", 0, "same attribute", attr="a")
    fs.add("h", int, 0, "python type as kind")
    assert fs.parse(["-h=0b11"])["h"] == 3


# --------------------------------------------------------------------------------------------
# usage text


def test_usage_matches_go_layout():
    fs = FlagSet("demo")
    fs.add("x", "bool", False, "short bool")
    fs.add("zeta", "int", 0, "zero default is not shown")
    fs.add("alpha", "str", "a b", "quoted default")
    fs.add("beta", "duration", 90.0, "a duration")
    fs.add("gamma", "float", 0.5, "a float")
    fs.add("delta", "bool", True, "true default")
    fs.add("eps", "str_list", [], "a list")
    fs.add("file", "str", "", "read from `path`\nsecond line")
    assert fs.usage() == (
        "Usage of demo:\n"
        '  -alpha string\n    \tquoted default (default "a b")\n'
        "  -beta duration\n    \ta duration (default 1m30s)\n"
        "  -delta\n    \ttrue default (default true)\n"
        "  -eps value\n    \ta list\n"
        "  -file path\n    \tread from path\n    \tsecond line\n"
        "  -gamma float\n    \ta float (default 0.5)\n"
        "  -x\tshort bool\n"
        "  -zeta int\n    \tzero default is not shown\n"
    )


# --------------------------------------------------------------------------------------------
# Go value syntax


@pytest.mark.parametrize(
    "text, value",
    [
        ("0", 0),
        ("-0", 0),
        ("+7", 7),
        ("1_000", 1000),
        ("0x1F", 31),
        ("0X_1f", 31),
        ("0o17", 15),
        ("017", 15),
        ("0b101", 5),
        ("0_7", 7),
        ("-9223372036854775808", -(1 << 63)),
        ("9223372036854775807", (1 << 63) - 1),
    ],
)
def test_go_int(text, value):
    assert parse_go_int(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "+",
        "-",
        "08",
        "0x",
        "0b",
        "1__0",
        "_1",
        "1_",
        "0x_",
        " 1",
        "1 ",
        "1.0",
        "٣",
        "9223372036854775808",
        "-9223372036854775809",
    ],
)
def test_go_int_rejects(text):
    with pytest.raises(ValueError):
        parse_go_int(text)


@pytest.mark.parametrize(
    "text, value",
    [
        ("1", 1.0),
        ("-1.5", -1.5),
        (".5", 0.5),
        ("5.", 5.0),
        ("1e3", 1000.0),
        ("1E-2", 0.01),
        ("1_000.5", 1000.5),
        ("0x1p-2", 0.25),
        ("0x1.8p1", 3.0),
        ("inf", math.inf),
        ("-Infinity", -math.inf),
        ("+INF", math.inf),
    ],
)
def test_go_float(text, value):
    assert parse_go_float(text) == value


@pytest.mark.parametrize(
    "text", ["", ".", "e5", "1e", "abc", " 1", "1 ", "0x1.8", "+nan", "infin", "1__0", "1_.5", "1e400", "٣"]
)
def test_go_float_rejects(text):
    with pytest.raises(ValueError):
        parse_go_float(text)


def test_go_float_nan():
    assert math.isnan(parse_go_float("NaN"))


@pytest.mark.parametrize(
    "text, value",
    [
        ("1", True),
        ("t", True),
        ("T", True),
        ("TRUE", True),
        ("true", True),
        ("True", True),
        ("0", False),
        ("f", False),
        ("F", False),
        ("FALSE", False),
        ("false", False),
        ("False", False),
    ],
)
def test_go_bool(text, value):
    assert parse_go_bool(text) is value


@pytest.mark.parametrize("text", ["", "yes", "tRUE", "2", " true"])
def test_go_bool_rejects(text):
    with pytest.raises(ValueError, match="invalid syntax"):
        parse_go_bool(text)


@pytest.mark.parametrize(
    "value, text",
    [
        (1.0, "1"),
        (0.99, "0.99"),
        (0.0, "0"),
        (1e-05, "1e-05"),
        (0.0001, "0.0001"),
        (123456.0, "123456"),
        (1234567.0, "1.234567e+06"),
        (1e21, "1e+21"),
        (-2.5, "-2.5"),
        (math.inf, "+Inf"),
    ],
)
def test_go_format_float(value, text):
    assert go_format_float(value) == text


def test_go_quote():
    assert go_quote('a"b\\c') == '"a\\"b\\\\c"'
    assert go_quote("tab\there\n") == '"tab\\there\\n"'
    assert go_quote("µs\x01") == '"µs\\x01"'


# --------------------------------------------------------------------------------------------
# durations

DURATION_CASES = [
    ("0", 0),
    ("+0", 0),
    ("-0", 0),
    ("0s", 0),
    ("1ns", 1),
    ("1us", 1_000),
    ("1µs", 1_000),
    ("1μs", 1_000),
    ("300ms", 300_000_000),
    ("1.5h", 5_400_000_000_000),
    ("2h45m", 9_900_000_000_000),
    ("-1.5s", -1_500_000_000),
    ("+5s", 5_000_000_000),
    (".5s", 500_000_000),
    ("5.s", 5_000_000_000),
    ("1h2m3.5s", 3_723_500_000_000),
    ("1.000000001s", 1_000_000_001),
    ("3m0.000000001s", 180_000_000_001),
    ("1.1ms1us", 1_101_000),
    ("9223372036854775807ns", (1 << 63) - 1),
    ("-9223372036854775808ns", -(1 << 63)),
    ("2562047h47m16.854775807s", (1 << 63) - 1),
    ("0.3333333333333333333h", 1_200_000_000_000),
]


@pytest.mark.parametrize("text, ns", DURATION_CASES)
def test_parse_duration(text, ns):
    assert parse_duration_ns(text) == ns
    assert parse_duration(text) == ns / 1e9


@pytest.mark.parametrize(
    "text, message",
    [
        ("", 'time: invalid duration ""'),
        ("-", 'time: invalid duration "-"'),
        ("1", 'time: missing unit in duration "1"'),
        ("1.5", 'time: missing unit in duration "1.5"'),
        ("s", 'time: invalid duration "s"'),
        (".s", 'time: invalid duration ".s"'),
        ("1x", 'time: unknown unit "x" in duration "1x"'),
        ("1 s", 'time: unknown unit " s" in duration "1 s"'),
        ("1S", 'time: unknown unit "S" in duration "1S"'),
        ("1h-5m", 'time: unknown unit "h-" in duration "1h-5m"'),
        ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
        ("3000000h", 'time: invalid duration "3000000h"'),
    ],
)
def test_parse_duration_rejects(text, message):
    with pytest.raises(ValueError) as info:
        parse_duration_ns(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "ns, text",
    [
        (0, "0s"),
        (1, "1ns"),
        (999, "999ns"),
        (1_000, "1µs"),
        (1_500, "1.5µs"),
        (25_000_000, "25ms"),
        (250_000_000, "250ms"),
        (1_000_000_000, "1s"),
        (1_500_000_000, "1.5s"),
        (60_000_000_000, "1m0s"),
        (90_000_000_000, "1m30s"),
        (3_600_000_000_000, "1h0m0s"),
        (9_900_000_000_000, "2h45m0s"),
        (90_061_500_000_000, "25h1m1.5s"),
        (-1_500_000_000, "-1.5s"),
        (1_000_000_001, "1.000000001s"),
        ((1 << 63) - 1, "2562047h47m16.854775807s"),
        (-(1 << 63), "-2562047h47m16.854775808s"),
    ],
)
def test_format_duration_ns(ns, text):
    assert format_duration_ns(ns) == text


@pytest.mark.parametrize(
    "seconds, text",
    [(60.0, "1m0s"), (0.25, "250ms"), (0.025, "25ms"), (900.0, "15m0s"), (0.005, "5ms"), (2.0, "2s"), (0.1, "100ms")],
)
def test_format_duration_seconds(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


def test_duration_round_trip():
    for ns in [1, 7, 1_234, 1_000_001, 59_999_999_999, 3_600_000_000_001, 123_456_789_012_345]:
        assert parse_duration_ns(format_duration_ns(ns)) == ns
        assert parse_duration_ns(format_duration_ns(-ns)) == -ns


def test_duration_to_ns_rounds_float_error():
    assert duration_to_ns(0.025) == 25_000_000
    assert duration_to_ns(0.1) == 100_000_000
    assert duration_to_ns(60.0) == 60_000_000_000


# --------------------------------------------------------------------------------------------
# config files


def test_config_precedence_flag_over_config_over_default():
    fs = make_flagset()
    config = {"name": "from-config", "count": 11, "timeout": "2s", "id": 5, "node_id": 99}
    values = fs.parse(["-count=12"], config)
    assert values["count"] == 12  # flag wins
    assert values["name"] == "from-config"  # config beats default
    assert values["timeout"] == 2.0
    assert values["node_id"] == 5  # the renamed key; the flag-derived key is ignored
    assert values["ratio"] == 0.5  # default


def test_resolve_after_parse_and_merge():
    fs = make_flagset()
    fs.parse(["-name=cli"])
    values = fs.resolve({"name": "cfg", "count": "42", "config": "ignored.toml"})
    assert (values["name"], values["count"], values["config"]) == ("cli", 42, "")
    merged = merge({"a": 1}, {"a": 2, "b": 2}, {"a": 3, "b": 3, "c": 3})
    assert merged == {"a": 1, "b": 2, "c": 3}


COERCION_CASES = [
    ("timeout", "1.5h", "timeout", 5400.0),
    ("timeout", 1500, "timeout", 1.5),  # bare integers are milliseconds
    ("timeout", 0, "timeout", 0.0),
    ("timeout", "0", "timeout", 0.0),
    ("count", 9, "count", 9),
    ("count", "-9", "count", -9),
    ("ratio", 1, "ratio", 1.0),
    ("ratio", "0.25", "ratio", 0.25),
    ("enabled", False, "enabled", False),
    ("enabled", "f", "enabled", False),
    ("addresses", ["a:1", "b:2"], "addresses", ["a:1", "b:2"]),
    ("addresses", "a:1, b:2,", "addresses", ["a:1", "b:2"]),
    ("peer", "x:1", "peers", ["x:1"]),
    ("pct", [0.5, 0.99, 1], "pcts", [0.5, 0.99, 1.0]),  # config order is kept
    ("pct", "0.5, 0.9", "pcts", [0.5, 0.9]),
]


@pytest.mark.parametrize("key, raw, attr, value", COERCION_CASES)
def test_config_coercion(key, raw, attr, value):
    fs = make_flagset()
    assert fs.parse([], {key: raw})[attr] == value


@pytest.mark.parametrize(
    "key, raw",
    [
        ("timeout", "1500"),  # a numeric string is not milliseconds: Go's ParseDuration needs a unit
        ("timeout", 1.5),
        ("timeout", True),
        ("count", "0x10"),
        ("count", 1.0),
        ("count", True),
        ("count", 1 << 64),
        ("enabled", 1),
        ("enabled", "yes"),
        ("name", 5),
        ("addresses", 5),
        ("pct", "abc"),
    ],
)
def test_config_coercion_errors(key, raw):
    fs = make_flagset()
    with pytest.raises(FlagError) as info:
        fs.parse([], {key: raw})
    assert info.value.exit_code == 1
    assert info.value.usage is None
    assert key in info.value.message


def test_load_config(tmp_path):
    path = tmp_path / "demo.toml"
    path.write_text('name = "n"\ncount = 4\ntimeout = "250ms"\naddresses = ["a:1"]\nid = 3\nunknown = 1\n')
    fs = make_flagset()
    values = fs.parse(["--config", str(path), "--count=5"])
    values = fs.resolve(load_config(values["config"]))
    assert (values["name"], values["count"], values["timeout"], values["addresses"], values["node_id"]) == (
        "n",
        5,
        0.25,
        ["a:1"],
        3,
    )


def test_load_config_errors(tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(FlagError) as info:
        load_config(str(missing))
    assert info.value.exit_code == 1
    assert info.value.message == f"failed to load config file {missing} - open {missing}: no such file or directory"
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(FlagError) as info:
        load_config(str(bad))
    assert info.value.message.startswith(f"failed to load config file {bad} - ")
    rendered = info.value.render(log_prefix="[demo] ")
    assert rendered.startswith("[demo] ") and " FATAL: failed to load config file" in rendered
