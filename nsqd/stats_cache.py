"""``/stats`` and ``/metrics`` of the whole node, re-rendering only what changed since the last request.

The admin polls every node's ``/stats`` every few seconds and Prometheus scrapes ``/metrics``; at 10,000 topics,
20,000 channels and 5,000 clients, building a snapshot of every object (``stats.collect``) and formatting it cost
about 5 us per object, 150-250 ms per request. Most objects are idle between two requests, so each topic keeps its
rendered pieces here, and each topic, channel and client the *key* they were rendered from: a tuple of the plain
values the rendering shows, read at request time (the counters topics, channels and clients already keep: nothing
is counted for this cache, nothing is added to the publish, dispatch or FIN paths). A request reads every object's
key, compares it with the stored one (one tuple comparison for an idle object) and renders again only the topics
whose key, or whose channels' or clients' keys, differ; then it joins the topics' pieces. The output is byte for
byte what the snapshot's renderings write (``stats.json_body``, ``stats.format_text``, ``metrics.series_text``):
the same functions write each piece, from the same snapshot objects (kept per channel and client while their key
holds).

What makes a piece stale, and is therefore in its key:
- channel: memory and disk depth, in flight, deferred, message, requeue and timeout counts, client count, paused,
  and its latency window's state (``E2ELatency.state``: bucket edge and counts; a new FIN or a rotation changes it);
- topic: memory and disk depth, message count and bytes, paused, and its channels' window states (its latency
  merges all of them); a channel created or deleted renews its topic too;
- client: state, RDY, in flight, message, finish and requeue counts, the auth answer (a new object per query);
  while it is in its first state (IDENTIFY is allowed only there) or once it has published, also the IDENTIFY
  fields, TLS and compression, and its publish counts. Clients are matched to their pieces by their place in the
  channel's list. The text's "connected" age is written per request between cached pieces (``_fold``).
Topics and channels are listed sorted by name; the sorted lists are kept until ``nsqd.topology_version`` (bumped
at every topic and channel create and delete) moves.

What a request still costs is reading the keys: about 1.5 us per channel (mostly memory reads of the channel and
its queues, scattered over the heap), 40-50 ms at 20,000 channels. Requests with ``topic=`` go through
``stats.collect`` (one topic costs well under a millisecond); statsd too; ``channel=`` without ``topic=`` renders
every topic that has the channel again (no admin asks for it).
"""

from __future__ import annotations

import time
from itertools import zip_longest
from operator import attrgetter

from .client import ClientState
from .e2e import EMPTY as EMPTY_E2E
from .e2e import merge_results
from .metrics import channel_rows, rows_pieces, topic_rows
from .stats import (PRODUCERS_TEXT, TOPICS_TEXT, ChannelStats, ClientStats, E2EResult, TopicStats,
                    channel_json_parts, channel_text_line, client_body, client_stats, client_text_parts,
                    connected_text, json_end, json_head, json_middle, node_stats, text_end, text_head,
                    topic_json_head, topic_json_tail, topic_text_line)

__all__ = ["StatsCache"]

_NO_CLIENTS: tuple = ()
#: topics per run of /metrics rows joined together (see ``StatsCache.metrics_pieces``)
METRICS_BLOCK = 128
#: a ``ClientStats``'s values in field order, as a tuple (``ClientStats(*values)`` builds it again)
_client_values = attrgetter(*ClientStats.__slots__)


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "replace")


def _fold(parts: list) -> tuple[bytes, tuple[tuple[int, bytes], ...]]:
    """Text pieces with the connection times of clients among them (ints) as ``(text up to the first time,
    ((time, text up to the next time), ...))``, so that a rendering joins few pieces and the ages."""
    first = None
    rest = []
    pending: list[bytes] = []
    connect_ts = 0
    for part in parts:
        if isinstance(part, int):
            if first is None:
                first = b"".join(pending)
            else:
                rest.append((connect_ts, b"".join(pending)))
            pending, connect_ts = [], part
        else:
            pending.append(part)
    if first is None:
        return b"".join(pending), ()
    rest.append((connect_ts, b"".join(pending)))
    return first, tuple(rest)


def _e2e_values(result: E2EResult) -> tuple | None:
    """A latency result's figures as plain values (None: ``EMPTY``)."""
    return None if result is EMPTY_E2E else (result.count, result.percentiles)


def _e2e_result(values: tuple | None) -> E2EResult:
    return EMPTY_E2E if values is None else E2EResult(*values)


def _channel_stats(channel, key: tuple, e2e: tuple | None) -> ChannelStats:
    """A channel's snapshot (without clients) from its key (see ``StatsCache._refresh``) and latency figures."""
    depth, backend_depth, in_flight, deferred, messages, requeues, timeouts, clients, paused, _ = key
    return ChannelStats(channel.name, depth + backend_depth, backend_depth, in_flight, deferred, messages, requeues,
                        timeouts, clients, None, paused, _e2e_result(e2e))


class _ClientPiece:
    """A client's key, the values its renderings show (``ClientStats``'s, as a tuple) and its renderings (None
    until asked for)."""

    __slots__ = ("client", "key", "values", "json", "text")

    def __init__(self, client) -> None:
        self.client = client
        self.key = None
        self.values = None
        self.json = None
        self.text = None  # (text before its age, its connection time, text after)

    def renew(self, key) -> None:
        self.key, self.json, self.text = key, None, None
        self.values = _client_values(client_stats(self.client, None))


class _TopicPiece:
    """One topic's key and figures, its channels' in name order (in lists side by side: the refresh loop reads
    them without touching any other object), and the renderings of the whole topic (None until asked for,
    dropped when the topic, a channel or one of their clients changed)."""

    __slots__ = ("topic", "key", "values", "members", "keys", "e2e", "clients", "has_clients", "json",
                 "json_clients", "text", "text_clients", "metrics")

    def __init__(self, topic, channels: list) -> None:
        self.topic = topic
        self.key = None
        self.values = None  # the topic's merged latency figures (``_e2e_values``)
        self.members = channels
        self.keys = [None] * len(channels)  # each channel's key
        self.e2e = [None] * len(channels)  # each channel's latency figures (``_e2e_values``)
        self.clients = [_NO_CLIENTS] * len(channels)  # each channel's clients' pieces, in the channel's order
        self.has_clients = False  # as the last request that listed clients saw
        self.json = None  # with "clients":null
        self.json_clients = None
        self.text = None  # its line and its channels' lines, without clients (see ``_fold``)
        self.text_clients = None  # with clients
        self.metrics = None  # (its rows, its channels' rows joined family by family)

    def drop(self) -> None:
        self.json = self.json_clients = self.text = self.text_clients = self.metrics = None

    def stats(self, channels: tuple = ()) -> TopicStats:
        """Its snapshot, with the given channels' (its renderings show their number only in /metrics)."""
        depth, backend_depth, messages, message_bytes, paused, _ = self.key
        return TopicStats(self.topic.name, channels, depth + backend_depth, backend_depth, messages, message_bytes,
                          paused, _e2e_result(self.values))

    def channel_stats(self, channel: str | None = None) -> list:
        """``(ChannelStats, its clients' pieces)`` of its channels (only ``channel`` if given), in name order."""
        return [(_channel_stats(member, key, e2e), clients)
                for member, key, e2e, clients in zip(self.members, self.keys, self.e2e, self.clients)
                if channel is None or member.name == channel]


#: the values of a client that its renderings show and that change after IDENTIFY: its counters, its state and
#: the auth answer (a new object per query; a refresh can come at any PUB or SUB)
_client_counters = attrgetter("state", "rdy", "in_flight", "message_count", "finish_count", "requeue_count",
                              "auth_state")
#: the values that IDENTIFY (allowed only in the first state, INIT) sets: fixed once the client leaves INIT
_client_identity = attrgetter("client_id", "hostname", "user_agent", "sample_rate", "deflate", "snappy", "tls",
                              "tls_version", "tls_cipher_suite", "tls_negotiated_protocol",
                              "tls_negotiated_protocol_is_mutual")


def _client_key(client) -> tuple:
    """What the client's renderings depend on (the refresh loop writes the same inline)."""
    counters = _client_counters(client)
    counts = client.pub_counts
    if not counts and counters[0] != ClientState.INIT:
        return counters
    return counters, tuple(counts.items()), _client_identity(client)


class StatsCache:
    """The rendered pieces of one daemon's topics, channels and clients (see the module notes)."""

    def __init__(self, nsqd) -> None:
        self.nsqd = nsqd
        self._version = None
        self._order: list[_TopicPiece] = []  # sorted by topic name
        self._producers: list[_ClientPiece] = []
        self._metrics_blocks: dict[int, tuple] = {}  # by the index of the run's first topic

    # -- keeping the pieces current -----------------------------------------------------------------------------
    def _sorted(self) -> list:
        """The topics' pieces in name order (kept across topology changes; a topic whose channels changed starts
        its channels' afresh)."""
        nsqd = self.nsqd
        version = (nsqd.topology_version, len(nsqd.topics))
        if version == self._version:
            return self._order
        kept = {id(piece.topic): piece for piece in self._order}
        order = []
        for _, topic in sorted(nsqd.topics.items()):
            channels = [channel for _, channel in sorted(topic.channels.items())]
            piece = kept.get(id(topic))
            if piece is None or piece.topic is not topic or piece.members != channels:
                piece = _TopicPiece(topic, channels)
            order.append(piece)
        self._order, self._version = order, version
        return order

    def _refresh(self, include_clients: bool) -> list:
        """Bring every key up to date: renew the figures of what changed and drop the renderings of the topics
        it belongs to. Clients are looked at only for a request that lists them (their pieces' keys are those of
        the last such request, so a change in between is still seen by the next one). Returns the sorted topics.

        This loop is most of a request (about 1.5 us per channel at 20,000 channels, mostly memory reads): an
        idle channel is read once and costs one tuple comparison."""
        now_ns = time.time_ns()
        order = self._sorted()
        client_counters, client_identity, INIT = _client_counters, _client_identity, ClientState.INIT
        tracked = bool(self.nsqd.opts.e2e_processing_latency_percentiles)
        state = None
        for topic_piece in order:
            changed = has_clients = False
            states = None
            keys = topic_piece.keys
            for index, channel in enumerate(topic_piece.members):
                if tracked:
                    window = channel.e2e
                    state = window.state(now_ns) if window is not None else None
                    if state is not None:
                        states = (*states, state) if states else (state,)
                # the sizes come from the queues' own fields, not their ``len()`` and ``depth()`` (methods written
                # in Python, a third of a request at 20,000 channels); the tests compare the result with the snapshot
                backend = channel.backend
                members = channel.clients
                key = (len(channel.queue), backend._depth if backend is not None else 0,
                       len(channel.in_flight._entries), len(channel.deferred._heap), channel.message_count,
                       channel.requeue_count, channel.timeout_count, len(members), channel.paused, state)
                if key != keys[index]:
                    keys[index] = key
                    if state is not None:  # the figures, not the window's samples
                        result = window.result(now_ns)
                        topic_piece.e2e[index] = (result.count, result.percentiles)
                    else:
                        topic_piece.e2e[index] = None
                    if not members:  # (a channel whose key counts no client lists none: not looked at below)
                        topic_piece.clients[index] = _NO_CLIENTS
                    changed = True
                if include_clients and members:
                    has_clients = True
                    previous = topic_piece.clients[index]
                    if len(previous) != len(members):
                        previous = ()
                    listed = []
                    for client, client_piece in zip_longest(members.values(), previous):
                        if client_piece is None or client_piece.client is not client:
                            client_piece = _ClientPiece(client)
                        counters = client_counters(client)
                        counts = client.pub_counts
                        key = (counters if not counts and counters[0] != INIT else
                               (counters, tuple(counts.items()), client_identity(client)))
                        if key != client_piece.key:
                            client_piece.renew(key)
                            changed = True
                        listed.append(client_piece)
                    if listed != previous:
                        topic_piece.clients[index] = listed
                        changed = True
            topic = topic_piece.topic
            backend = topic.backend
            key = (len(topic.queue), backend._depth if backend is not None else 0, topic.message_count,
                   topic.message_bytes, topic.paused, states)
            if key != topic_piece.key:
                topic_piece.key = key
                results = [c.e2e.result(now_ns) for c in topic_piece.members if c.e2e is not None] if states else ()
                topic_piece.values = _e2e_values(
                    merge_results(results, tuple(self.nsqd.opts.e2e_processing_latency_percentiles)))
                changed = True
            if changed:
                topic_piece.drop()
            if include_clients:
                topic_piece.has_clients = has_clients
        if include_clients:
            previous = {piece.client.id: piece for piece in self._producers}
            self._producers = [self._producer_piece(c, previous) for c in list(self.nsqd.clients.values())
                               if c.pub_counts]
        return order

    @staticmethod
    def _producer_piece(client, previous: dict) -> _ClientPiece:
        """A producer's piece (the last request's, by client), renewed if the client changed."""
        piece = previous.get(client.id)
        if piece is None or piece.client is not client:
            piece = _ClientPiece(client)
        key = _client_key(client)
        if piece.key != key:
            piece.renew(key)
        return piece

    def _header(self, include_mem: bool):
        return node_stats(self.nsqd, None, None, include_mem=include_mem, now_ns=time.time_ns())

    # -- JSON ---------------------------------------------------------------------------------------------------
    def json(self, *, channel: str | None = None, include_clients: bool = True, include_mem: bool = True) -> bytes:
        """``/stats?format=json`` without ``topic=``: ``stats.json_body(stats.collect(...))``."""
        order = self._refresh(include_clients)
        topics = []
        if channel is None:
            for piece in order:
                rendered = piece.json_clients if include_clients else piece.json
                if rendered is None:
                    rendered = self._topic_json(piece, piece.channel_stats(), include_clients)
                    if include_clients:
                        piece.json_clients = rendered
                    else:
                        piece.json = rendered
                topics.append(rendered)
        else:
            for piece in order:
                listed = piece.channel_stats(channel)
                if listed:
                    topics.append(self._topic_json(piece, listed, include_clients))
        header = self._header(include_mem)
        out = [_encode(json_head(header)), b"["]
        for rendered in topics:
            out.append(rendered)
            out.append(b",")
        if topics:
            out.pop()
        out += (b"]", _encode(json_middle(header)))
        if include_clients and self._producers:
            out.append(self._json_clients(self._producers))
        else:
            out.append(b"null")
        out.append(_encode(json_end(header)))
        return b"".join(out)

    def _topic_json(self, piece: _TopicPiece, channels: list, include_clients: bool) -> bytes:
        rendered = []
        for stats, clients in channels:
            head, tail = map(_encode, channel_json_parts(stats))
            rendered.append(head + (self._json_clients(clients) if include_clients else b"null") + tail)
        return (_encode(topic_json_head(piece.topic.name)) + b",".join(rendered)
                + _encode(topic_json_tail(piece.stats())))

    @staticmethod
    def _json_clients(pieces) -> bytes:
        for piece in pieces:
            if piece.json is None:
                piece.json = _encode(client_body(ClientStats(*piece.values)))
        return b"[" + b",".join([piece.json for piece in pieces]) + b"]"

    # -- text ---------------------------------------------------------------------------------------------------
    def text(self, *, channel: str | None = None, include_clients: bool = True, include_mem: bool = True) -> bytes:
        """``/stats`` without ``format=json``: ``stats.format_text(stats.collect(...))``, encoded."""
        order = self._refresh(include_clients)
        now = int(time.time())
        ages: dict[int, bytes] = {}
        out = [b""]
        append = out.append
        listed_any = False
        for piece in order:
            if channel is None:
                if include_clients and piece.has_clients:
                    rendered = piece.text_clients
                    if rendered is None:
                        rendered = piece.text_clients = self._topic_text(piece, piece.channel_stats(), True)
                else:
                    rendered = piece.text
                    if rendered is None:
                        rendered = piece.text = self._topic_text(piece, piece.channel_stats(), False)
            else:
                listed = piece.channel_stats(channel)
                if not listed:
                    continue
                rendered = self._topic_text(piece, listed, include_clients)
            listed_any = True
            self._text_with_ages(out, rendered, now, ages)
        header = self._header(include_mem)
        out[0] = _encode("\n".join(text_head(header) + TOPICS_TEXT[listed_any]) + "\n")
        producers = self._producers if include_clients else ()
        append(_encode("\n".join(PRODUCERS_TEXT[bool(producers)]) + "\n"))
        parts: list = []
        self._text_clients(parts, producers, b"   ")
        self._text_with_ages(out, _fold(parts), now, ages)
        append(_encode("".join(line + "\n" for line in text_end(header))))
        return b"".join(out)

    def _topic_text(self, piece: _TopicPiece, channels: list, include_clients: bool) -> tuple:
        parts: list = [_encode(topic_text_line(piece.stats()) + "\n")]
        for stats, clients in channels:
            parts.append(_encode(channel_text_line(stats) + "\n"))
            if include_clients:
                self._text_clients(parts, clients, b"        ")
        return _fold(parts)

    @staticmethod
    def _text_clients(parts: list, pieces, indent: bytes) -> None:
        """Each client's line, its connection time standing for its age (written per request)."""
        for piece in pieces:
            text = piece.text
            if text is None:
                stats = ClientStats(*piece.values)
                before, after = client_text_parts(stats)
                text = piece.text = (_encode(before), stats.connect_ts, _encode(after + "\n"))
            parts += (indent, *text)

    @staticmethod
    def _text_with_ages(out: list, rendered: tuple, now: int, ages: dict) -> None:
        first, rest = rendered
        out.append(first)
        for connect_ts, text in rest:
            age = ages.get(connect_ts)
            if age is None:
                age = ages[connect_ts] = _encode(connected_text(connect_ts, now))
            out.append(age)
            out.append(text)

    # -- metrics ------------------------------------------------------------------------------------------------
    def metrics_pieces(self, *, openmetrics: bool = False) -> list[bytes]:
        """The per-topic and per-channel families of ``/metrics``, in pieces:
        ``metrics.series_text(stats.collect(...))`` once joined.

        The families run across all topics, so a topic's rows are spread over 15 places of the exposition. Runs of
        ``METRICS_BLOCK`` topics keep their rows joined family by family, and a run none of whose topics changed
        since the last scrape is not joined again."""
        order = self._refresh(False)
        rows = []
        for piece in order:
            rendered = piece.metrics
            if rendered is None:
                name = piece.topic.name
                channels = tuple(stats for stats, _ in piece.channel_stats())
                channel_rows_ = [channel_rows(stats, name) for stats in channels]
                columns = tuple(map(b"".join, zip(*channel_rows_))) if channel_rows_ else None
                rendered = piece.metrics = (topic_rows(piece.stats(channels)), columns)
            rows.append(rendered)
        blocks = []
        for start in range(0, len(rows), METRICS_BLOCK):
            run = rows[start:start + METRICS_BLOCK]
            kept = self._metrics_blocks.get(start)
            if kept is None or kept[0] != run:  # the same row objects: no change (compared by identity first)
                topic_columns = tuple(map(b"".join, zip(*[topic for topic, _ in run])))
                channels = [columns for _, columns in run if columns is not None]
                channel_columns = tuple(map(b"".join, zip(*channels))) if channels else None
                kept = self._metrics_blocks[start] = (run, topic_columns, channel_columns)
            blocks.append(kept)
        for start in [start for start in self._metrics_blocks if start >= len(rows)]:
            del self._metrics_blocks[start]
        return rows_pieces([topic_columns for _, topic_columns, _ in blocks],
                           [channel_columns for _, _, channel_columns in blocks if channel_columns is not None],
                           openmetrics=openmetrics)
