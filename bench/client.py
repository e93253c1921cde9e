"""Scenario: the client package (``trionsq``, trio and blocking) against the raw generators, in one run on one nsqd.

What an application pays for using the client instead of hand-written frames. Each workload runs three times on
the same nsqd, one after the other, for the same window: by the raw generator of ``bench.load`` (one epoll loop,
pre-encoded frames, replies counted with ``bytes.count``: the cheapest client there can be), by the trio
``Producer``/``Consumer``, and by the blocking driver (``trionsq.blocking``). Every client runs in a process of its
own, pinned to a CPU nsqd is not on, as the generators are, so the CPU it uses is its own and nsqd's is nsqd's.

Workloads (``--body-size`` 200-byte bodies):

- ``MPUB x100, 4 in flight``: the raw generator keeps 4 MPUBs unanswered on one connection; the trio ``Producer``
  runs 4 tasks that each ``await multi_publish`` in a loop (pipelined on its one connection); the blocking
  ``Producer`` ``send``s MPUBs with ``max_in_flight=4``.
- ``PUB, 16 in flight``: one connection with 16 PUBs unanswered: 16 trio tasks each awaiting ``publish`` in a loop;
  blocking ``send`` with ``max_in_flight=16``.
- ``PUB, one at a time``: each PUB waits for its OK before the next (1 trio task; blocking ``publish``).
- ``consume, RDY 200``: a backlog of ``--messages`` in a channel of its own per client, drained by one connection
  with RDY 200 (``max_in_flight=200``), every message FIN'd: the raw generator's consumer (FINs of a read in one
  write), the trio ``Consumer`` with a handler that returns at once, and the blocking connection's ``read_event``
  loop with ``message.finish()`` (one write per FIN). Rate between the first and the last delivery.

Columns: ``msg/s``; ``client us/msg``, the client process's CPU (user + system) per message over the window, the
figure the issue asks for; ``nsqd us/msg``; ``vs raw``, the rate as a share of the raw generator's.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
import urllib.request

from bench.common import Report, Target, generator_cpus, main, run_spread, unique_topic
from bench.consume import create_channel, drain, prefill
from protocol.commands import encode_mpub, encode_pub

NAME = "client"
TITLE = "the trionsq client (trio and blocking) against the raw generators: msg/s and client CPU per message"


def add_arguments(parser) -> None:
    parser.add_argument("--body-size", type=int, default=200)
    parser.add_argument("--batch", type=int, default=100, help="messages per MPUB")
    parser.add_argument("--mpub-in-flight", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=16, help="PUBs in flight (trio tasks) in the pipelined PUB rows")
    parser.add_argument("--messages", type=int, default=200_000, help="backlog of each consume row")
    parser.add_argument("--rdy", type=int, default=200)


# -- the client processes --------------------------------------------------------------------------------------------


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


class _Window:
    """Counter and CPU snapshots at the window's start and end (``time.monotonic``, every process's clock)."""

    def __init__(self, warm_at: float, end_at: float) -> None:
        self.warm_at, self.end_at = warm_at, end_at
        self.start: tuple[int, float] | None = None
        self.end: tuple[int, float] | None = None

    def tick(self, count: int, now: float) -> bool:
        """Record what is due at ``now``; True once the window is over."""
        if self.start is None and now >= self.warm_at:
            self.start = (count, _cpu())
        if now >= self.end_at:
            if self.end is None:
                self.end = (count, _cpu())
            return True
        return False

    def result(self) -> dict:
        assert self.start is not None and self.end is not None
        return {
            "messages": self.end[0] - self.start[0],
            "cpu": self.end[1] - self.start[1],
            "seconds": self.end_at - self.warm_at,
        }


def _trio_publish(address: str, topic: str, body: bytes, batch: int, tasks: int, window: _Window) -> dict:
    import trio

    from trionsq import Producer

    bodies = [body] * batch
    acked = 0

    async def publisher(producer) -> None:
        nonlocal acked
        while not stop:
            if batch > 1:
                await producer.multi_publish(topic, bodies)
            else:
                await producer.publish(topic, body)
            acked += batch

    async def run() -> None:
        nonlocal stop
        async with Producer([address]) as producer:
            await producer.publish(topic, body)  # connected before the window
            async with trio.open_nursery() as nursery:
                for _ in range(tasks):
                    nursery.start_soon(publisher, producer)
                while not window.tick(acked, time.monotonic()):
                    now = time.monotonic()
                    await trio.sleep(max(0.0, (window.warm_at if window.start is None else window.end_at) - now))
                stop = True

    stop = False
    trio.run(run)
    return window.result()


def _blocking_publish(address: str, topic: str, body: bytes, batch: int, tasks: int, window: _Window) -> dict:
    from trionsq.blocking import Producer

    frame = encode_mpub(topic, [body] * batch) if batch > 1 else encode_pub(topic, body)
    monotonic = time.monotonic
    with Producer([address], max_in_flight=max(tasks, 1)) as producer:
        producer.publish(topic, body)  # connected before the window
        if tasks == 0:  # one at a time, through the plain call
            while not window.tick(producer.stats().messages, monotonic()):
                for _ in range(50):
                    producer.publish(topic, body)
        else:
            send = producer.send
            while not window.tick(producer.stats().messages, monotonic()):
                for _ in range(50):
                    send(frame, batch)
        producer.flush()
    return window.result()


def _trio_consume(address: str, topic: str, channel: str, rdy: int, expected: int, window: _Window) -> dict:
    import trio

    from trionsq import Config, Consumer

    state = {"count": 0, "first": 0.0, "last": 0.0, "cpu_first": 0.0}
    done = trio.Event()

    async def handler(message) -> None:
        count = state["count"] = state["count"] + 1
        if count == 1:
            state["first"], state["cpu_first"] = time.monotonic(), _cpu()
        if count >= expected:
            state["last"] = time.monotonic()
            done.set()

    async def run() -> None:
        async with Consumer(topic, channel, handler, Config(max_in_flight=rdy), nsqd_tcp_addresses=[address]):
            with trio.move_on_after(window.end_at - time.monotonic()):
                await done.wait()

    trio.run(run)
    return _drained(state, _cpu())


def _blocking_consume(address: str, topic: str, channel: str, rdy: int, expected: int, window: _Window) -> dict:
    from trionsq.blocking import Message, connect

    state = {"count": 0, "first": 0.0, "last": 0.0, "cpu_first": 0.0}
    with connect(address) as conn:
        conn.subscribe(topic, channel)
        conn.ready(rdy)
        read_event = conn.read_event
        count = 0
        while count < expected:
            try:
                event = read_event(window.end_at)
            except TimeoutError:
                break
            if type(event) is Message:
                event.finish()
                count += 1
                if count == 1:
                    state["first"], state["cpu_first"] = time.monotonic(), _cpu()
        state["count"], state["last"] = count, time.monotonic()
    return _drained(state, _cpu())


def _drained(state: dict, cpu_end: float) -> dict:
    return {
        "messages": state["count"],
        "cpu": cpu_end - state["cpu_first"],
        "seconds": max(state["last"] - state["first"], 1e-9),
    }


_CLIENTS = {
    "trio publish": _trio_publish,
    "blocking publish": _blocking_publish,
    "trio consume": _trio_consume,
    "blocking consume": _blocking_consume,
}


def _child(pipe, kind: str, params: dict, cpu: int | None) -> None:
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        import trionsq  # which code is measured: a worktree run puts its own first on PYTHONPATH

        print(f"  ({kind}: trionsq from {os.path.dirname(trionsq.__file__)})", flush=True)
        pipe.send(("ready",))
        _, warm_at, end_at = pipe.recv()
        pipe.send(("result", _CLIENTS[kind](**params, window=_Window(warm_at, end_at))))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
    finally:
        pipe.close()


def run_client(args, target: Target, kind: str, params: dict, *, limit: float | None = None) -> dict:
    """Run one client in a process of its own (pinned as the generators are) over the window, or until it drained
    (``limit`` seconds at most); its counts, its CPU and nsqd's CPU over the same time."""
    context = multiprocessing.get_context("spawn")
    pipe, child_end = context.Pipe()
    process = context.Process(
        target=_child, args=(child_end, kind, params, generator_cpus()[0] if args.pin else None), daemon=True
    )
    process.start()
    child_end.close()
    try:
        if not pipe.poll(60) or pipe.recv()[0] != "ready":
            raise RuntimeError(f"the {kind} client did not start")
        sampler = target.sampler()
        start = time.monotonic() + 0.2
        warm_at = start + (args.warmup if limit is None else 0.0)
        end_at = warm_at + (args.duration if limit is None else limit)
        pipe.send(("go", warm_at, end_at))
        time.sleep(max(0.0, warm_at - time.monotonic()))
        nsqd_before = sampler.cpu_seconds()
        if not pipe.poll(end_at - time.monotonic() + 60):
            raise RuntimeError(f"the {kind} client did not report")
        nsqd_cpu = sampler.cpu_seconds() - nsqd_before
        message = pipe.recv()
        if message[0] != "result":
            raise RuntimeError(f"the {kind} client failed:\n{message[1]}")
        return {**message[1], "nsqd_cpu": nsqd_cpu}
    finally:
        pipe.close()
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join(5)


# -- the scenario -----------------------------------------------------------------------------------------------------


def _row(
    client: str, workload: str, messages: int, seconds: float, client_cpu: float, nsqd_cpu: float, target: Target
) -> dict:
    return {
        "client": client,
        "workload": workload,
        "msg/s": messages / seconds if seconds else 0.0,
        "client us/msg": client_cpu * 1e6 / messages if messages else None,
        "nsqd us/msg": nsqd_cpu * 1e6 / messages if messages and target.pid else None,
    }


def _delete_topic(target: Target, topic: str) -> None:
    """Free what a publish row left in nsqd's memory (millions of messages) before the next row."""
    if target.http is None:
        return
    request = urllib.request.Request("http://{}:{}/topic/delete?topic={}".format(*target.http, topic), method="POST")
    with urllib.request.urlopen(request, timeout=60):
        pass


def _relative(rows: list[dict]) -> None:
    raw = {row["workload"]: row["msg/s"] for row in rows if row["client"] == "raw generator"}
    for row in rows:
        base = raw.get(row["workload"])
        row["vs raw"] = f"{row['msg/s'] / base:.0%}" if base else None


def publish_rows(args, target: Target) -> list[dict]:
    body = b"c" * args.body_size
    rows = []
    workloads = [
        (f"MPUB x{args.batch}, {args.mpub_in_flight} in flight", args.batch, args.mpub_in_flight),
        (f"PUB, {args.tasks} in flight", 1, args.tasks),
        ("PUB, one at a time", 1, 1),
    ]
    for workload, batch, in_flight in workloads:
        topic = unique_topic(NAME)
        frame = encode_mpub(topic, [body] * batch) if batch > 1 else encode_pub(topic, body)
        raw = run_spread(
            args,
            target,
            "pub",
            1,
            1,
            dict(address=target.tcp, frame=frame, messages_per_frame=batch, outstanding=in_flight),
        )
        rows.append(_row("raw generator", workload, raw.messages, raw.window, raw.generator_cpu, raw.nsqd_cpu, target))
        print(f"  {workload}: raw {rows[-1]['msg/s']:,.0f} msg/s", flush=True)
        params = dict(address="{}:{}".format(*target.tcp), topic=topic, body=body, batch=batch, tasks=in_flight)
        _delete_topic(target, topic)
        for client, kind, extra in (
            ("trio Producer", "trio publish", {}),
            ("blocking Producer", "blocking publish", {"tasks": 0} if workload == "PUB, one at a time" else {}),
        ):
            result = run_client(args, target, kind, {**params, **extra})
            rows.append(
                _row(client, workload, result["messages"], result["seconds"], result["cpu"], result["nsqd_cpu"], target)
            )
            print(f"  {workload}: {client} {rows[-1]['msg/s']:,.0f} msg/s", flush=True)
            _delete_topic(target, topic)
    return rows


def consume_rows(args, target: Target) -> tuple[list[dict], list[str]]:
    topic = unique_topic(NAME)
    channels = ["raw", "trio", "blocking"]
    for channel in channels:
        create_channel(target, topic, channel)
    published = prefill(target, topic, args.messages, args.body_size)
    workload = f"consume, RDY {args.rdy}"
    rows, notes = [], []
    sampler = target.sampler()
    before = sampler.cpu_seconds()
    raw = drain(target, topic, "raw", 1, args.rdy, 1)
    nsqd_cpu = sampler.cpu_seconds() - before
    rows.append(
        _row(
            "raw generator", workload, raw["delivered"], raw["seconds"], raw["generator_cpu_seconds"], nsqd_cpu, target
        )
    )
    print(f"  {workload}: raw {rows[-1]['msg/s']:,.0f} msg/s", flush=True)
    for client, kind, channel in (
        ("trio Consumer", "trio consume", "trio"),
        ("blocking read_event", "blocking consume", "blocking"),
    ):
        result = run_client(
            args,
            target,
            kind,
            dict(address="{}:{}".format(*target.tcp), topic=topic, channel=channel, rdy=args.rdy, expected=published),
            limit=300.0,
        )
        rows.append(
            _row(client, workload, result["messages"], result["seconds"], result["cpu"], result["nsqd_cpu"], target)
        )
        print(f"  {workload}: {client} {rows[-1]['msg/s']:,.0f} msg/s", flush=True)
        if result["messages"] < published:
            notes.append(f"{client} received {result['messages']} of {published} messages")
    if raw["delivered"] < published:
        notes.append(f"the raw consumer received {raw['delivered']} of {published} messages")
    notes.append(
        "consume rows: the raw generator's CPU is over the whole drain (its idle second at the end "
        "included); nsqd us/msg of the client rows covers the drain and the client's start"
    )
    return rows, notes


def run(args) -> Report:
    report = Report(
        NAME,
        TITLE,
        params={
            "body_size": args.body_size,
            "batch": args.batch,
            "mpub_in_flight": args.mpub_in_flight,
            "tasks": args.tasks,
            "messages": args.messages,
            "rdy": args.rdy,
            "duration_s": args.duration,
        },
    )
    with Target(args, [f"--mem-queue-size={max(3 * args.messages + 100_000, 20_000_000)}"], want_http=True) as target:
        report.target = target.describe()
        rows = publish_rows(args, target)
        consume, notes = consume_rows(args, target)
        rows += consume
    _relative(rows)
    report.rows = rows
    report.notes += notes
    report.notes.append(
        "client us/msg: CPU (user + system) of the client's process per message; every client runs "
        "in its own process on a CPU other than nsqd's (unless --no-pin)"
    )
    report.targets = {"client us/msg": "a few microseconds per message pipelined: small beside nsqd's own cost"}
    return report


if __name__ == "__main__":
    raise SystemExit(main(__import__(__name__)))
