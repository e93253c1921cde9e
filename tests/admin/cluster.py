"""A live cluster for the admin's end-to-end tests: one nsqlookupd, two nsqd and one nsqadmin, as subprocesses
on 127.0.0.1 with ports picked at run time.

Each daemon is a ``DaemonProcess`` of tests/integration/harness.py: its merged stdout/stderr is drained by a
thread (so it never blocks on a full pipe); startup waits, bounded, for the ``HTTP: listening on <addr>`` line
and takes the real address from it. ``stop`` sends SIGTERM and insists on exit code 0 (kill -9 and fail
otherwise).

The admin runs in lookupd mode (``--lookupd-http-address``) when both nsqd nodes show up in lookupd's
``/nodes``; an nsqd that does not register with lookupd leaves it in nsqd mode (``--nsqd-http-address`` for
both nodes), and tests that need lookupd's view skip with that reason.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.integration.harness import REPO_ROOT, DaemonProcess

__all__ = ["REPO_ROOT", "Cluster", "Daemon", "Reply", "http", "wait_until"]


class Daemon(DaemonProcess):
    """One daemon subprocess (``python -m <module> <args>``), started once its ``<ready>: listening on`` line is
    logged; ``stop`` insists on exit code 0."""

    def __init__(self, module: str, args: list[str], *, ready: str = "HTTP", timeout: float = 20.0) -> None:
        super().__init__(args, timeout)
        self.module = module
        self.ready = ready

    @property
    def http(self) -> str:
        return self.addresses["HTTP"]

    @property
    def tcp_address(self) -> str:
        return self.addresses["TCP"]

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc is None:
            return 0
        code = super().stop(timeout)
        assert code == 0, f"{self.module} exited with {code}:\n{self.log_text()}"
        return code


# -- plain HTTP for the tests -------------------------------------------------------------------------------------
class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<Reply {self.status} {self.body[:300]!r}>"


def http(
    method: str, url: str, body: bytes | str | dict | None = None, headers: dict | None = None, timeout: float = 10.0
) -> Reply:
    if isinstance(body, dict):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    request = urllib.request.Request(url, data=body if body is not None else None, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())


def wait_until(condition, timeout: float = 15.0, interval: float = 0.1, message: str = "condition"):
    """Poll ``condition`` (bounded) until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except (AssertionError, OSError, KeyError, ValueError) as exc:
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"{message} not reached within {timeout}s (last error: {last_error!r})")


class Cluster:
    """lookupd + ``nodes`` nsqd (two by default) + nsqadmin. ``admin_args`` are extra nsqadmin flags;
    ``topics(index)``, when given, names the topics nsqd ``index`` starts with (written to its ``nsqd.dat``)."""

    def __init__(
        self,
        data_root: Path,
        admin_args: list[str] = (),
        *,
        nodes: int = 2,
        topics=None,
        history_interval: str = "1s",
        stop_timeout: float = 15.0,
    ) -> None:
        self.data_root = Path(data_root)
        self.admin_args = list(admin_args)
        self.nodes = nodes
        self.topics = topics
        self.history_interval = history_interval
        self.stop_timeout = stop_timeout
        self.lookupd: Daemon | None = None
        self.nsqds: list[Daemon] = []
        self.admin: Daemon | None = None
        self.mode = ""

    def start(self) -> Cluster:
        try:
            self.lookupd = Daemon(
                "lookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1"]
            ).start()
            for number in range(self.nodes):
                data = self.data_root / f"nsqd{number}"
                data.mkdir(parents=True, exist_ok=True)
                if self.topics is not None:
                    entries = [{"name": name, "paused": False, "channels": None} for name in self.topics(number)]
                    (data / "nsqd.dat").write_text(json.dumps({"topics": entries, "version": "1.3.0"}))
                self.nsqds.append(
                    Daemon(
                        "nsqd",
                        [
                            "--tcp-address=127.0.0.1:0",
                            "--http-address=127.0.0.1:0",
                            "--broadcast-address=127.0.0.1",
                            f"--lookupd-tcp-address={self.lookupd.tcp_address}",
                            f"--data-path={data}",
                            "--e2e-processing-latency-percentile=0.99,0.5",
                        ],
                    ).start()
                )
            if self._registered():
                self.mode = "lookupd"
                upstream = [f"--lookupd-http-address={self.lookupd.http}"]
            else:
                self.mode = "nsqd"
                upstream = [f"--nsqd-http-address={n.http}" for n in self.nsqds]
            self.admin = Daemon(
                "admin",
                [
                    "--http-address=127.0.0.1:0",
                    f"--history-interval={self.history_interval}",
                    *upstream,
                    *self.admin_args,
                ],
            ).start()
        except BaseException:
            self.stop(check=False)
            raise
        return self

    def _registered(self, timeout: float = 8.0) -> bool:
        wanted = {f"127.0.0.1:{n.http.rpartition(':')[2]}" for n in self.nsqds}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = http("GET", f"http://{self.lookupd.http}/nodes")
            names = {f"{p['broadcast_address']}:{p['http_port']}" for p in reply.json().get("producers") or ()}
            if wanted <= names:
                return True
            time.sleep(0.2)
        return False

    @property
    def url(self) -> str:
        return f"http://{self.admin.http}"

    def nsqd_url(self, index: int) -> str:
        return f"http://{self.nsqds[index].http}"

    def node_name(self, index: int) -> str:
        return f"127.0.0.1:{self.nsqds[index].http.rpartition(':')[2]}"

    def stats(self, index: int, topic: str | None = None) -> dict:
        query = "/stats?format=json" + (f"&topic={topic}" if topic else "")
        reply = http("GET", self.nsqd_url(index) + query)
        assert reply.status == 200, reply
        return reply.json()

    def topic_stats(self, index: int, topic: str) -> dict | None:
        for t in self.stats(index, topic).get("topics") or ():
            if t["topic_name"] == topic:
                return t
        return None

    def channel_stats(self, index: int, topic: str, channel: str) -> dict | None:
        t = self.topic_stats(index, topic)
        for c in (t or {}).get("channels") or ():
            if c["channel_name"] == channel:
                return c
        return None

    def publish(self, index: int, topic: str, body: str = "hello") -> None:
        reply = http("POST", self.nsqd_url(index) + f"/pub?topic={topic}", body)
        assert reply.status == 200, reply

    def create_channel(self, index: int, topic: str, channel: str) -> None:
        reply = http("POST", self.nsqd_url(index) + f"/channel/create?topic={topic}&channel={channel}")
        assert reply.status == 200, reply

    def stop(self, check: bool = True) -> None:
        """Stop the admin, then every nsqd at once (each persists its topics), then lookupd."""
        errors: list[str] = []

        def stop(daemon) -> None:
            try:
                daemon.stop(self.stop_timeout)
            except AssertionError as exc:
                errors.append(str(exc))

        for group in ([self.admin], self.nsqds, [self.lookupd]):
            threads = [threading.Thread(target=stop, args=(daemon,)) for daemon in group if daemon is not None]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        if check and errors:
            raise AssertionError("\n\n".join(errors))
