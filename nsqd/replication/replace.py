"""A peer gone for good, around ``Replicator._replace_gone`` (``--replication-replace-after``): where the candidates
come from without ``--replication-candidates``, what a restart keeps, and what the replaced peer is told (PROTOCOL.md
"A peer gone for good").

- Without ``--replication-candidates`` the candidates are the nodes nsqlookupd knows (``GET /nodes`` of every lookupd
  this node identified with) that answer ASK (trionsq nodes, up), never a peer, this node, or a node replaced and
  not released yet, in an order of their own for each origin (the highest hash of origin and candidate first): the
  origins that lose one peer spread over the others instead of all choosing the same.
- Once the new peer holds the backlog, the other peers reconnect (their streams resume) to learn the new order of
  the peers, which says who takes this node over first.
- The replaced peer may come back (a long partition, a machine repaired): the origin connects to it every few
  seconds with a HELLO saying ``release``. It drops what it holds of this node (after a takeover first, when this
  node restarted without all of its messages, as at any HELLO), and the ids it adopted meanwhile come back in the
  WELCOME, as from any peer: one owner per message.
- ``replication.peers.json`` in the data directory keeps the replacements (flag peer -> the node in its place) and
  the peers still to release, so that a restart keeps the new peer with the same flags.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

import trio

from protocol.errors import ProtocolError
from protocol.replication import Error, Heartbeat, ReplicationDecoder, Welcome, encode

from ..auth import AuthError, http_get
from ..lookup import ACCEPT_V1
from .sender import CONNECT_TIMEOUT, RETRY_MAX, Replicator, receive_adopted, receive_event, side_connection

log = logging.getLogger("nsqd")

STATE_FILE = "replication.peers.json"
CHECK_INTERVAL = 1.0  # how often the peers' state is looked at (s)
RELEASE_INTERVAL = RETRY_MAX  # how often a replaced peer is tried, to tell it (s)


def load_replacements(data_path: str) -> tuple[dict[str, str], list[str]]:
    """What ``replication.peers.json`` says: flag peer -> the node in its place, and the replaced peers still to be
    released. Empty when there is none."""
    try:
        with open(os.path.join(data_path, STATE_FILE), encoding="utf-8") as file:
            state = json.load(file)
        return dict(state.get("replaced", {})), list(state.get("release", []))
    except FileNotFoundError:
        return {}, []
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        log.error("REPLICATION: could not read %s, using the flags' peers - %s", STATE_FILE, exc)
        return {}, []


def current_peers(data_path: str, flags: list[str]) -> list[str]:
    """``--replicate-to`` with the replacements of earlier runs applied (a chain followed to its end)."""
    replaced, _release = load_replacements(data_path)
    peers: list[str] = []
    for peer in flags:
        seen = {peer}
        while peer in replaced and replaced[peer] not in seen:
            peer = replaced[peer]
            seen.add(peer)
        peers.append(peer)
    if peers != flags:
        log.info("REPLICATION: peers replaced in an earlier run: %s (flags: %s)", ", ".join(peers), ", ".join(flags))
    return peers


def spread(node: str, candidates: list[str]) -> list[str]:
    """``candidates`` in ``node``'s order: by a hash of both, so that two origins seldom put first the same one."""
    return sorted(candidates, key=lambda c: hashlib.sha1(f"{node}|{c}".encode()).digest(), reverse=True)


class PeerReplacer:
    """The origin's side of replacing peers (``NSQD.replacer``, with ``--replicate-to``)."""

    def __init__(self, nsqd, replicator: Replicator) -> None:
        self.nsqd = nsqd
        self.replicator = replicator
        self.replaced, release = load_replacements(nsqd.data_path)
        #: replaced peers, told to drop their copies of this node when they answer
        self.release = set(release)
        self.announce: set[str] = set()  # replacements whose backfill is not acknowledged yet (``_announce``)
        replicator.on_replaced = self.replaced_peer
        if not nsqd.opts.replication_candidates:
            replicator.find_candidates = self.candidates

    def replaced_peer(self, lost: str, new: str) -> None:
        """``Replicator._replace`` put ``new`` in ``lost``'s place."""
        flag = next((old for old, now in self.replaced.items() if now == lost), lost)
        self.replaced[flag] = new
        self.release.add(lost)
        self.release.discard(new)  # a node replaced earlier and chosen again is a peer again
        self.announce.add(new)
        self._save()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        next_release = 0.0
        while True:
            await trio.sleep(CHECK_INTERVAL)
            for peer in list(self.replicator.peers):
                if peer.state == "connected" and peer.address in self.announce:
                    self.announce.discard(peer.address)
                    self._announce(peer.address)
            now = trio.current_time()
            if self.release and now >= next_release:
                next_release = now + RELEASE_INTERVAL
                async with trio.open_nursery() as nursery:
                    for old in list(self.release):
                        nursery.start_soon(self._release, old)

    def _announce(self, new: str) -> None:
        """``new`` holds the backlog: the other peers learn the new order of the peers (HELLO's ``peers``: which
        replica takes this node over first) by reconnecting, one stream that resumes, when enough peers are left
        to acknowledge meanwhile; otherwise at their next reconnection."""
        replicator = self.replicator
        connected = [p for p in replicator.peers if p.state == "connected" and not p.lagging]
        for peer in connected:
            if peer.address == new or peer.scope is None or len(connected) - 1 < replicator.acks_required:
                continue
            log.info("REPLICATION: reconnecting peer %s: it learns that %s is a peer now", peer.address, new)
            peer.scope.cancel()
            connected.remove(peer)

    # -- choosing ---------------------------------------------------------------------------------------------------
    async def candidates(self) -> list[str]:
        """The nodes nsqlookupd knows that may take a lost peer's place, in this node's order (``spread``): not this
        node, a peer, or a node still to release, and answering ASK as a trionsq node."""
        lookup = getattr(self.nsqd, "lookup", None)
        addresses = lookup.http_addresses() if lookup is not None else []
        found: set[str] = set()
        for address in addresses:
            try:
                status, body = await http_get(
                    f"http://{address}/nodes",
                    headers=[ACCEPT_V1],
                    ssl_context=None,
                    connect_timeout=self.nsqd.opts.http_client_connect_timeout,
                    request_timeout=self.nsqd.opts.http_client_request_timeout,
                )
                if status != 200:
                    raise AuthError(f"got response {status}")
                for producer in json.loads(body).get("producers") or []:
                    host, port = producer.get("broadcast_address"), producer.get("tcp_port")
                    if isinstance(host, str) and host and isinstance(port, int):
                        found.add(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
            except (AuthError, ValueError, AttributeError, OSError) as exc:
                log.warning("REPLICATION: could not list the nodes of nsqlookupd %s - %s", address, exc)
        replicator = self.replicator
        found -= {replicator.node, *(p.address for p in replicator.peers), *self.release}
        answering = []
        for candidate in spread(replicator.node, sorted(found)):
            if await self.nsqd.replica_host._ask(candidate, replicator.node) is not None:
                answering.append(candidate)
        if not answering:
            log.warning("REPLICATION: no node that nsqlookupd knows can take a lost peer's place")
        return answering

    def _save(self) -> None:
        path = os.path.join(self.nsqd.data_path, STATE_FILE)
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as file:
                json.dump({"replaced": self.replaced, "release": sorted(self.release)}, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(path + ".tmp", path)
        except OSError as exc:
            log.error("REPLICATION: could not write %s - %s", STATE_FILE, exc)

    # -- telling the replaced peer ----------------------------------------------------------------------------------
    async def _release(self, old: str) -> None:
        """Tell ``old`` that it is no longer a replica of this node: it drops what it holds (HELLO ``release``), and
        what it adopted meanwhile comes back in its WELCOME, as from any peer. Quiet while it is unreachable."""
        replicator = self.replicator
        try:
            async with side_connection(old, replicator.ssl_context, CONNECT_TIMEOUT) as stream:
                decoder = ReplicationDecoder(version=replicator.version)
                await stream.send_all(encode(replicator.hello(old, release=True)))
                with trio.fail_after(CONNECT_TIMEOUT):
                    welcome = await receive_event(stream, decoder)
                    if type(welcome) is Error:
                        log.warning("REPLICATION: replaced peer %s refused its release - %s", old, welcome.text)
                        return
                    if type(welcome) is not Welcome:
                        return
                    ids = await receive_adopted(stream, decoder, welcome.adopted) if welcome.adopted else []
                if (welcome.epoch > replicator.epoch or ids) and replicator.on_adopted is not None:
                    replicator.epoch = max(welcome.epoch, replicator.epoch)
                    replicator.on_adopted(old, replicator.epoch, ids)
                try:  # read: the replica may forget the list; then it closes
                    await stream.send_all(encode(Heartbeat()))
                    with trio.move_on_after(CONNECT_TIMEOUT):
                        while await stream.receive_some(65536):
                            pass
                except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # it closed first: released all the same
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, ValueError):
            return  # still away
        except ProtocolError as exc:
            log.warning("REPLICATION: replaced peer %s answered its release with an error - %s", old, exc)
            return
        self.release.discard(old)
        self._save()
        log.info("REPLICATION: replaced peer %s is back and released its copies of this node", old)
