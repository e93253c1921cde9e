"""Listen addresses read with Go's rules: ``net.SplitHostPort`` decides TCP or unix socket (nsqd's TypeOfAddr),
ports are read as Go's resolver reads them, and what cannot be listened on is a ``ListenError`` in Go's words."""

from __future__ import annotations

import os
import socket

import pytest

from runtime import startup
from runtime.startup import (
    ListenError,
    address_port,
    bind_address,
    bind_all,
    format_address,
    is_unix_address,
    resolve_port,
    split_host_port,
)

SPLITS = [
    ("127.0.0.1:4150", ("127.0.0.1", "4150")),
    (":4150", ("", "4150")),
    ("[::1]:4150", ("::1", "4150")),
    ("localhost:http", ("localhost", "http")),
    ("127.0.0.1:", ("127.0.0.1", "")),
    ("/tmp/a:b", ("/tmp/a", "b")),  # a path with a colon reads as host:port, as in Go
]
REFUSED_SPLITS = [
    ("/tmp/nsqd.sock", "missing port in address"),
    ("", "missing port in address"),
    ("::1", "too many colons in address"),
    ("a:b:c", "too many colons in address"),
    ("[::1", "missing ']' in address"),
    ("[::1]", "missing port in address"),
    ("[::1]x:1", "missing port in address"),
    ("[::1]:1:2", "too many colons in address"),
    ("a[b:1", "unexpected '[' in address"),
    ("a]b:1", "unexpected ']' in address"),
]


@pytest.mark.parametrize(("address", "parts"), SPLITS)
def test_split_host_port(address, parts):
    assert split_host_port(address) == parts
    assert not is_unix_address(address)


@pytest.mark.parametrize(("address", "reason"), REFUSED_SPLITS)
def test_what_split_host_port_refuses_is_a_unix_socket(address, reason):
    with pytest.raises(ValueError) as info:
        split_host_port(address)
    assert str(info.value) == f"address {address}: {reason}"
    assert is_unix_address(address)


@pytest.mark.parametrize(
    ("service", "port"), [("4150", 4150), ("", 0), ("0", 0), ("+80", 80), ("65535", 65535), ("http", 80), ("00080", 80)]
)
def test_resolve_port(service, port):
    assert resolve_port(service) == port


@pytest.mark.parametrize(
    ("service", "reason"),
    [
        ("65536", "address 65536: invalid port"),
        ("-1", "address -1: invalid port"),
        ("99999999999999999999", "address 99999999999999999999: invalid port"),
        ("abc", "lookup tcp/abc: unknown port"),
        ("4150x", "lookup tcp/4150x: unknown port"),
        ("١٢", "lookup tcp/١٢: unknown port"),  # digits, not ASCII ones
        ("a\0b", "lookup tcp/a\0b: unknown port"),
    ],
)
def test_resolve_port_refusals(service, reason):
    with pytest.raises(ValueError) as info:
        resolve_port(service)
    assert str(info.value) == reason


def test_format_address_and_port():
    assert format_address(("127.0.0.1", 4150)) == "127.0.0.1:4150"
    assert format_address(("::1", 4150, 0, 0)) == "[::1]:4150"
    assert format_address("/tmp/nsqd.sock") == "/tmp/nsqd.sock"
    assert format_address("\0nsqd") == "@nsqd"
    assert format_address("") == "@" and format_address(b"") == "@"  # an unnamed peer, as Go prints it
    assert [address_port(a) for a in ("127.0.0.1:4150", "[::1]:4151", "/tmp/nsqd.sock", None)] == [4150, 4151, -1, -1]
    assert address_port("/tmp/nsqd.sock", 0) == 0


def test_unix_sockets_are_made_and_removed(tmp_path):
    path = str(tmp_path / "nsqd.sock")
    [sock] = bind_address(path)
    try:
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
        with pytest.raises(ListenError) as info:
            bind_address(path)  # a file that exists is never replaced
        assert str(info.value) == f"listen ({path}) failed - listen unix {path}: bind: address already in use"
    finally:
        sock.close()
    startup.remove_unix_sockets()
    assert not os.path.exists(path)


def test_abstract_unix_socket_has_no_file():
    name = f"@trionsq-test-{os.getpid()}"
    [sock] = bind_address(name)
    try:
        assert format_address(sock.getsockname()) == name
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("address", "unix", "text"),
    [
        ("127.0.0.1:99999", True, "listen tcp: address 99999: invalid port"),
        ("/tmp/x.sock", False, "listen tcp: address /tmp/x.sock: missing port in address"),
        ("/nonexistent/x.sock", True, "listen unix /nonexistent/x.sock: bind: no such file or directory"),
        ("/tmp/" + "x" * 120, True, f"listen unix /tmp/{'x' * 120}: bind: invalid argument"),
        ("/tmp/a\0b", True, "listen unix /tmp/a\0b: bind: invalid argument"),
    ],
)
def test_listen_errors_in_gos_words(address, unix, text):
    with pytest.raises(ListenError) as info:
        bind_address(address, unix=unix)
    assert str(info.value) == f"listen ({address}) failed - {text}"


def test_bind_all_closes_what_it_bound_when_one_fails(tmp_path):
    path = str(tmp_path / "first.sock")
    with pytest.raises(ListenError):
        bind_all((path, True), ("127.0.0.1:99999", True))
    with socket.socket(socket.AF_UNIX) as client, pytest.raises(ConnectionRefusedError):
        client.connect(path)  # closed (the file goes when the daemon exits)
    startup.remove_unix_sockets()
    off, any_port = bind_all((None, True), ("127.0.0.1:", False))
    assert off == [] and any_port[0].getsockname()[1] > 0  # None: a listener turned off; no port: any, as Go's
    any_port[0].close()
