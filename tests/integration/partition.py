"""A network partition between two nodes, built from TCP proxies the test controls (only 127.0.0.1).

Replication traffic between an origin A and its replica B takes two paths: A's stream to B (A dials the address
in its ``--replicate-to``) and B's connections to A's node address (the CONFIRM of each HELLO, the probe of a
silent origin before a takeover). A ``Link`` puts a proxy on each: A's ``--replicate-to`` names ``link.to_b``
and A's ``--broadcast-tcp-port`` is ``link.to_a``'s port (its node address), so every byte between the two
nodes crosses the link, while clients still reach both nodes directly.

``cut(a_to_b, b_to_a)`` holds the bytes of the directions it names: the proxy stops reading them, so they wait in
the sockets' buffers as in a network that drops packets (TCP retransmits them once the network heals), and a
node's writes block once those buffers fill. The connections stay open; their ends time out on their own.
During any cut new connections between the two are refused (the proxies stop listening): a node's address looks
down to the other, as an unreachable host does after its connect timeout. A proxy whose node refuses a
connection (it is down) refuses them too until its node takes one again. ``heal()`` forwards everything held, in
order, and listens again.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

from tests.integration.harness import free_port

__all__ = ["Link", "Proxy"]


class Proxy:
    """``127.0.0.1:port`` forwarding each connection to ``target``; ``outbound``/``inbound`` say whether the
    bytes from the dialling side (``outbound``) and those back to it (``inbound``) are held."""

    def __init__(self, target: tuple[str, int], port: int | None = None) -> None:
        self.target = target
        self.port = port or free_port()
        self.lock = threading.Condition()
        self.outbound_held = False
        self.inbound_held = False
        self.refusing = False  # a cut: no new connection
        self.target_down = False  # the target refused the last connection: so does the proxy, until it is back
        self.connections = 0  # accepted so far
        self.closed = False
        self._listener: socket.socket | None = None
        with self.lock:
            self._update_listener()
        self._thread = threading.Thread(target=self._accept_loop, name=f"proxy-{self.port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _update_listener(self) -> None:
        """Listen exactly while no cut refuses connections and the target takes them (the lock held): a node that
        is down looks down through its proxy too (a replica probes a silent origin's address before a takeover)."""
        listen = not (self.refusing or self.target_down or self.closed)
        if listen and self._listener is None:
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self._listener = listener
        elif not listen and self._listener is not None:
            self._listener.close()  # the accept loop sees it and waits
            self._listener = None
        self.lock.notify_all()

    def set(self, *, outbound: bool, inbound: bool) -> None:
        """Hold (True) or forward (False) each direction; while either is held, refuse new connections."""
        with self.lock:
            self.outbound_held, self.inbound_held = outbound, inbound
            self.refusing = outbound or inbound
            self._update_listener()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.outbound_held = self.inbound_held = False
            self._update_listener()

    def _watch_target(self) -> None:
        """The target refused a connection: look every 0.1 s until it takes one, then listen again."""
        while not self.closed:
            time.sleep(0.1)
            try:
                socket.create_connection(self.target, timeout=1).close()
            except OSError:
                continue
            with self.lock:
                self.target_down = False
                self._update_listener()
            return

    def _accept_loop(self) -> None:
        while True:
            with self.lock:
                while self._listener is None and not self.closed:
                    self.lock.wait()
                if self.closed:
                    return
                listener = self._listener
            try:
                ready, _, _ = select.select([listener], [], [], 0.1)
                if not ready:
                    continue
                client, _ = listener.accept()
            except (OSError, ValueError):  # closed by ``set`` meanwhile
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                with self.lock:
                    self.target_down = True
                    self._update_listener()
                threading.Thread(target=self._watch_target, daemon=True).start()
                continue
            self.connections += 1
            pair = _Pair(client, server)
            for source, sink, outbound in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(pair, source, sink, outbound), daemon=True).start()

    def _held(self, outbound: bool) -> bool:
        return self.outbound_held if outbound else self.inbound_held

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket, outbound: bool) -> None:
        try:
            while True:
                with self.lock:
                    while self._held(outbound) and not self.closed:
                        self.lock.wait()
                    if self.closed:
                        break
                ready, _, _ = select.select([source], [], [], 0.1)
                if not ready:
                    continue
                with self.lock:
                    if self._held(outbound):  # cut meanwhile: leave the bytes where they are
                        continue
                data = source.recv(65536)
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    break
                sink.sendall(data)
        except OSError:
            pass
        pair.done()


class _Pair:
    """Both sockets of a proxied connection, closed once both directions ended."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.sockets = (client, server)
        self.left = 2
        self.lock = threading.Lock()

    def done(self) -> None:
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            for sock in self.sockets:
                sock.close()
        else:  # one direction broke (an error): the other cannot go on either
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RD)


class Link:
    """The network between node A and node B (see the module notes): ``to_b`` carries A's connections to B (its
    stream), ``to_a`` B's connections to A's node address (CONFIRM, probes)."""

    def __init__(self, a_port: int, b_port: int) -> None:
        self.to_b = Proxy(("127.0.0.1", b_port))
        self.to_a = Proxy(("127.0.0.1", a_port))

    def cut(self, *, a_to_b: bool = True, b_to_a: bool = True) -> None:
        self.to_b.set(outbound=a_to_b, inbound=b_to_a)
        self.to_a.set(outbound=b_to_a, inbound=a_to_b)

    def heal(self) -> None:
        self.cut(a_to_b=False, b_to_a=False)

    def close(self) -> None:
        self.to_b.close()
        self.to_a.close()
