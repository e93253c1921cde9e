"""A real HTTP server in the test process for nsq_to_http to talk to: it records every request and answers
as told.

``HttpSink(fail_first=k)`` answers 500 to the first ``k`` requests carrying a given body (or a given GET query)
and 200 afterwards, so a test sees requeued messages come back. It runs ``http.server``'s threading server on
127.0.0.1 with a port chosen by the OS; ``wait_for(predicate, timeout)`` blocks (bounded) until the requests
recorded so far satisfy ``predicate``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    status: int  # what the sink answered


class _Server(ThreadingHTTPServer):
    # the tool opens up to -n (100) connections at once; http.server's backlog of 5 would drop SYNs under load
    request_queue_size = 256


class HttpSink:
    def __init__(self, *, fail_first: int = 0, status: int = 200) -> None:
        self.fail_first = fail_first
        self.status = status
        self.requests: list[Request] = []
        self._seen: dict[bytes, int] = {}
        self._cond = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                key = body if self.command == "POST" else self.path.encode()
                with sink._cond:
                    count = sink._seen.get(key, 0) + 1
                    sink._seen[key] = count
                    status = 500 if count <= sink.fail_first else sink.status
                    sink.requests.append(
                        Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body, status)
                    )
                    sink._cond.notify_all()
                reply = b"OK" if status < 400 else b"FAIL"
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST = _handle

            def log_message(self, format: str, *args) -> None:  # keep the test output quiet
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HttpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def snapshot(self) -> list[Request]:
        with self._cond:
            return list(self.requests)

    def wait_for(self, predicate: Callable[[list[Request]], bool], timeout: float = 20.0) -> list[Request]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.requests):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"the HTTP sink's {len(self.requests)} requests did not meet the condition within {timeout}s"
                    )
                self._cond.wait(min(remaining, 0.5))
            return list(self.requests)
