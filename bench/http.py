"""Scenario: publishing over nsqd's HTTP API, ``/pub`` requests per second and ``/mpub`` messages per second.

Load generator processes (``--processes``, default 2) hold keep-alive connections, each keeping
``--depth`` copies of one pre-encoded request in flight (pipelined: a new copy is written as each
response arrives), and count the 200 responses. Rows:

- ``/pub``: 32 connections, pipelined, ``--body-size`` bytes per message;
- ``/pub`` with one request in flight per connection (the classic keep-alive client);
- ``/mpub`` text (newline-separated) and ``/mpub?binary=true``, ``--batch`` messages per request.

The topics have no channel, so the figures are the HTTP publish path alone; nsqd gets a
``--mem-queue-size`` large enough that nothing goes to disk during a run, and a fresh nsqd per row so
the backlog of one row does not weigh on the next.
"""

from __future__ import annotations

import struct

from bench.common import Report, Target, main, run_spread, unique_topic

NAME = "http"
TITLE = "HTTP /pub requests/s and /mpub messages/s (keep-alive, pipelined)"
MEM_QUEUE_SIZE = 50_000_000


def add_arguments(parser) -> None:
    parser.add_argument("--connections", type=int, default=32, help="connections for the /pub rows")
    parser.add_argument("--depth", type=int, default=8, help="pipelined requests in flight per connection")
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--mpub-connections", type=int, default=8)
    parser.add_argument("--mpub-depth", type=int, default=2)
    parser.add_argument("--batch", type=int, default=200, help="messages per /mpub request")
    parser.add_argument("--processes", type=int, default=2, help="generator processes")


def encode_request(path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: nsqd\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def _rate(args, target: Target, request: bytes, messages_per_request: int, connections: int, depth: int) -> dict:
    run = run_spread(
        args,
        target,
        "http",
        connections,
        args.processes,
        dict(address=target.http, request=request, messages_per_request=messages_per_request, outstanding=depth),
    )
    return {
        "requests/s": run.messages / messages_per_request / run.window,
        "msg/s": run.messages / run.window,
        "nsqd_cpu": run.nsqd_cpu / run.window if target.pid else None,
        "generator_cpu": run.generator_cpu / run.window,
    }


def _row(args, report: Report, label: str, path_of, body: bytes, messages: int, connections: int, depth: int) -> None:
    with Target(args, [f"--mem-queue-size={MEM_QUEUE_SIZE}"], want_http=True) as target:
        if target.http is None:
            # nsqd logged no "HTTP: listening on" line (or no --nsqd-http-address was given)
            report.skipped = "the server has no HTTP listener"
            return
        report.target = target.describe()
        request = encode_request(path_of(unique_topic(NAME)), body)
        figures = _rate(args, target, request, messages, connections, depth)
    report.rows.append(
        {"endpoint": label, "connections": connections, "in_flight": depth, "msgs/request": messages, **figures}
    )


def run(args) -> Report:
    report = Report(
        NAME,
        TITLE,
        params={
            "connections": args.connections,
            "depth": args.depth,
            "body_size": args.body_size,
            "mpub_connections": args.mpub_connections,
            "mpub_depth": args.mpub_depth,
            "batch": args.batch,
            "processes": args.processes,
            "duration_s": args.duration,
        },
    )
    body = b"h" * args.body_size
    _row(args, report, "/pub", lambda t: f"/pub?topic={t}", body, 1, args.connections, args.depth)
    if report.skipped:
        return report
    _row(args, report, "/pub", lambda t: f"/pub?topic={t}", body, 1, args.connections, 1)
    text = b"\n".join([body] * args.batch)
    _row(args, report, "/mpub", lambda t: f"/mpub?topic={t}", text, args.batch, args.mpub_connections, args.mpub_depth)
    binary = struct.pack(">i", args.batch) + (struct.pack(">i", len(body)) + body) * args.batch
    _row(
        args,
        report,
        "/mpub binary",
        lambda t: f"/mpub?topic={t}&binary=true",
        binary,
        args.batch,
        args.mpub_connections,
        args.mpub_depth,
    )
    report.targets = {"/pub requests/s": "real nsqd 1.3.0 serves tens of thousands per core (Go net/http)"}
    report.notes.append("cpu columns are cores used (1.0 = one core busy); load and nsqd share the machine")
    report.notes.append("/pub and /mpub write no access-log line, as in nsqd")
    return report


__all__ = ["encode_request", "run"]

if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
