"""Microbenchmark of the shared HTTP/1.1 server (``runtime.http_server``) alone, without nsqd behind it.

``python -m bench.http_server`` starts a trivial server in one process (``GET /ping`` answers ``OK``,
``POST /pub`` takes a body and answers ``OK`` as nsqd's /pub does, without an access-log line) and drives it
from a separate load-generator process: plain blocking sockets, one ``epoll`` loop, requests encoded once
before the run. Each connection keeps ``depth`` requests outstanding: ``pipelined`` writes a batch and tops it
up as answers arrive; ``one-at-a-time`` (depth 1) waits for each answer before the next request.

Every answer of the trivial server has the same length (the ``Date`` header is fixed-width), so the generator
counts answers by bytes received and never parses them; the first answer on each connection is read and checked
before the run. Both processes start together at one ``time.monotonic`` instant chosen by the parent (the clock
is system-wide), warm up, then count answers over the same window in which the parent reads the server's CPU
time from ``/proc``. ``server µs/req`` is that CPU time divided by the answers counted: the cost of one request
in the server, whatever the machine's core count, and steadier than req/s on a machine shared with other work
(``server_cpu`` well under 1.0 means the server was not the bottleneck). Results go to
``bench/results/http_server.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import select
import socket
import sys
import time
from pathlib import Path

from bench.common import format_table, machine_info

RESULTS_DIR = Path(__file__).resolve().parent / "results"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

PUB_BODY = b"x" * 200
REQUESTS = {
    "GET /ping": b"GET /ping HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench/1.0\r\nAccept: */*\r\n\r\n",
    "POST /pub": (
        b"POST /pub?topic=bench HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench/1.0\r\n"
        b"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % len(PUB_BODY)
    )
    + PUB_BODY,
}


# -- the server process ---------------------------------------------------------------------------------------
def _serve(conn) -> None:
    """Child process: serve the trivial router on 127.0.0.1, send the port, run until terminated."""
    import logging

    import trio

    from protocol.http import Router, text_response
    from runtime.http_server import HTTPServer

    async def ping(request):
        return text_response("OK")

    async def pub(request):
        request.query_value("topic")
        return text_response("OK", nsq_header=True)

    router = Router()
    router.add(["GET"], "/ping", ping)
    router.add(["POST"], "/pub", pub, access_log=False)
    logger = logging.getLogger("bench.http_server")
    logger.setLevel(logging.WARNING)

    async def main() -> None:
        server = HTTPServer(router, logger=logger, address="127.0.0.1:0")
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            conn.send(server.port)

    trio.run(main)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


# -- the load-generator process -------------------------------------------------------------------------------
def _read_first_answer(sock: socket.socket) -> int:
    """Read one whole answer (blocking); return its length after checking it is a 200 with a fixed-size head."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("server closed the connection")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200 "):
        raise RuntimeError(f"unexpected answer {head!r}")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    size = len(head) + 4 + length
    while len(data) < size:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("server closed the connection")
        data += chunk
    if len(data) != size:
        raise RuntimeError("answer longer than announced")
    return size


def _generate(conn, port: int, request: bytes, connections: int, depth: int) -> None:
    """Child process: connect, report ready, run from the parent's start instant, report answers counted."""
    socks = []
    for _ in range(connections):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request)
        socks.append(sock)
    answer_size = {_read_first_answer(sock) for sock in socks}
    if len(answer_size) != 1:
        raise RuntimeError(f"answers of different sizes: {answer_size}")
    answer_size = answer_size.pop()
    conn.send(answer_size)
    begin, start, stop = conn.recv()  # monotonic instants: send from begin, count from start, end at stop

    batches = {n: request * n for n in range(1, depth + 1)}
    poller = select.epoll()
    state = {}  # fd -> [socket, bytes received not yet counted as answers]
    for sock in socks:
        poller.register(sock.fileno(), select.EPOLLIN)
        state[sock.fileno()] = [sock, 0]
    time.sleep(max(0.0, begin - time.monotonic()))
    for sock in socks:
        sock.sendall(batches[depth])
    counted = 0
    counting = False
    cpu_start = 0.0
    now = time.monotonic()
    while now < stop:
        for fd, _ in poller.poll(0.1):
            entry = state[fd]
            data = entry[0].recv(262144)
            if not data:
                raise RuntimeError("server closed a connection during the run")
            received = entry[1] + len(data)
            answers, entry[1] = divmod(received, answer_size)
            if answers:
                if counting:
                    counted += answers
                entry[0].sendall(batches[answers])  # never more than depth: that many are outstanding
        now = time.monotonic()
        if not counting and now >= start:
            counting = True
            counted = 0
            cpu_start = time.process_time()
    conn.send((counted, time.process_time() - cpu_start))
    for sock in socks:
        sock.close()


# -- the parent -----------------------------------------------------------------------------------------------
def run_case(
    port: int, server_pid: int, name: str, mode: str, *, connections: int, depth: int, warmup: float, duration: float
) -> dict:
    context = multiprocessing.get_context("spawn")
    parent_end, child_end = context.Pipe()
    generator = context.Process(
        target=_generate, args=(child_end, port, REQUESTS[name], connections, depth), daemon=True
    )
    generator.start()
    try:
        if not parent_end.poll(30):
            raise RuntimeError("load generator did not connect")
        parent_end.recv()
        begin = time.monotonic() + 0.2
        start = begin + warmup
        stop = start + duration
        parent_end.send((begin, start, stop))
        time.sleep(max(0.0, start - time.monotonic()))
        cpu_before = _cpu_seconds(server_pid)
        time.sleep(max(0.0, stop - time.monotonic()))
        cpu_after = _cpu_seconds(server_pid)
        if not parent_end.poll(duration + 30):
            raise RuntimeError("load generator did not report")
        answers, generator_cpu = parent_end.recv()
    finally:
        generator.join(10)
        if generator.is_alive():
            generator.terminate()
            generator.join(5)
    cpu = cpu_after - cpu_before
    return {
        "request": name,
        "mode": mode,
        "connections": connections,
        "depth": depth,
        "req/s": answers / duration,
        "server µs/req": cpu / answers * 1e6 if answers else None,
        "server_cpu": cpu / duration,
        "generator_cpu": generator_cpu / duration,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--depth", type=int, default=32, help="requests outstanding per connection when pipelined")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per case")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before measuring")
    parser.add_argument("--requests", nargs="+", choices=sorted(REQUESTS), default=sorted(REQUESTS))
    parser.add_argument(
        "--modes", nargs="+", choices=["pipelined", "one-at-a-time"], default=["pipelined", "one-at-a-time"]
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)

    context = multiprocessing.get_context("spawn")
    parent_end, child_end = context.Pipe()
    server = context.Process(target=_serve, args=(child_end,), daemon=True)
    server.start()
    rows = []
    try:
        if not parent_end.poll(30):
            raise RuntimeError("server did not start")
        port = parent_end.recv()
        for name in args.requests:
            for mode in args.modes:
                depth = args.depth if mode == "pipelined" else 1
                row = run_case(
                    port,
                    server.pid,
                    name,
                    mode,
                    connections=args.connections,
                    depth=depth,
                    warmup=args.warmup,
                    duration=args.duration,
                )
                rows.append(row)
                print(f"{name:10} {mode:14} {row['req/s']:10,.0f} req/s", file=sys.stderr)
    finally:
        server.terminate()
        server.join(10)
    print(format_table(rows))
    report = {
        "scenario": "http_server",
        "title": "runtime.http_server alone: trivial routes, raw-socket load from a separate process",
        "machine": machine_info(),
        "params": {
            "connections": args.connections,
            "pipeline_depth": args.depth,
            "duration_s": args.duration,
            "pub_body_bytes": len(PUB_BODY),
        },
        "results": rows,
        "targets": {"nsqd /pub": ">= 20,000 req/s with 32 keep-alive connections"},
        "notes": [
            "server_cpu and generator_cpu are cores used by each process (1.0 = one core busy)",
            "server µs/req is server CPU time per answer counted",
        ],
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / "http_server.json"
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
