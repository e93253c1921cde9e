"""``/stats`` and ``/metrics`` of the whole node, re-rendering only what changed since the last request.

The admin polls every node's ``/stats`` every few seconds and Prometheus scrapes ``/metrics``; at 10,000 topics,
20,000 channels and 5,000 clients, building a snapshot of every object (``stats.collect``) and formatting it cost
about 5 us per object, 150-250 ms per request. Most objects are idle between two requests, so each topic keeps its
rendered pieces here, and each topic, channel and client the *key* they were rendered from: a tuple of the plain
values the rendering shows, read at request time (the counters topics, channels and clients already keep; the
publish, dispatch and FIN paths only mark a topic or channel changed, once per batch: see "Which keys are read"
below). A request reads the keys of what was marked and of every client, compares each with the stored one (one
tuple comparison for an idle object) and renders again only the topics whose key, or whose channels' or clients'
keys, differ; then it joins the topics' pieces. The output is byte for
byte what the snapshot's renderings write (``stats.json_body``, ``stats.format_text``, ``metrics.series_text``):
the same functions write each piece, from snapshot objects (``ChannelStats``...) built again from the stored
figures when a topic is rendered, and dropped once it is.

What is kept is shaped for CPython's cyclic collector, which walks every container object that lives long (a
full collection of a node at 10,000 topics, 20,000 channels and 5,000 connections takes 0.5-0.7 s) and makes one
each time the long-lived ones have grown by a quarter. Topics and channels have no object of their own here:
``_Columns`` keeps one list per field (topics in name order, each topic's channels after the previous topic's),
whose entries are the daemon's objects, bytes, None, or flat tuples of plain values (keys, latency figures, a
topic's /metrics rows, its text cut around the clients' connection times), which the collector stops tracking at
their first collection (a tuple holding a tuple is let go one level per collection, so none is nested). A client
has one object (``_ClientPiece``: key, values as a tuple, renderings) and a channel with clients one list of them.
So the collector walks a few dozen lists however many topics there are, and a request whose topics changed leaves
no new long-lived object behind, where a piece and a snapshot object per channel, topic and client made every
full collection longer and, renewed at each request, brought the next one sooner (on an idle node too, in the
seconds after an admin's poll).

What makes a piece stale, and is therefore in its key:
- channel: memory and disk depth, in flight, deferred, message, requeue and timeout counts, client count, paused,
  and its latency window's state (``E2ELatency.state``: bucket edge and counts; a new FIN or a rotation changes it);
- topic: memory and disk depth, message count and bytes, paused, and its channels' window states (its latency
  merges all of them); a channel created or deleted renews its topic too;
- client: state, RDY, in flight, message, finish and requeue counts, the auth answer (a new object per query);
  while it is in its first state (IDENTIFY is allowed only there) or once it has published, also the IDENTIFY
  fields, TLS and compression, and its publish counts. Clients are matched to their pieces by their place in the
  channel's list. The text's "connected" age is written per request between cached pieces (``_fold``).
Topics and channels are listed sorted by name; the columns are laid out again when ``nsqd.topology_version``
(bumped at every topic and channel create and delete) moves, each topic keeping its entries if its channels are
the same objects as before.

Which keys are read: a topic or channel whose figures change adds itself to ``NSQD.stats_changed`` (a set the
node's topics and channels share: ``Topic.changed``), where its publish, delivery, FIN, REQ, timeout, deferral,
disk read, pause, emptying and client arrival or departure happen (once per batch or slice, one set insertion), and
a request reads the keys of those topics and of the topics of those channels only, then empties the set. Reading a
key costs about 1 us per channel (memory reads of the channel and its queues, scattered over the heap: 20-30 ms
at 20,000 channels), which an idle channel no longer costs. All keys are read after the topics or channels were
laid out again, and always on a node with latency percentiles (a window's state moves with the clock). The clients
of every channel that has some are read at each request that lists them (their counters change on every RDY,
delivery and FIN). Requests with ``topic=`` go through ``stats.collect`` (one topic costs well under a
millisecond); statsd too; ``channel=`` without ``topic=`` renders every topic that has the channel again (no admin
asks for it).
"""

from __future__ import annotations

import time
from itertools import zip_longest
from operator import attrgetter
from typing import Any

from .client import ClientState
from .e2e import EMPTY as EMPTY_E2E
from .e2e import merge_results
from .metrics import TOPIC_SERIES, channel_rows, rows_pieces, topic_rows
from .stats import (
    PRODUCERS_TEXT,
    TOPICS_TEXT,
    ChannelStats,
    ClientStats,
    E2EResult,
    TopicStats,
    channel_json_parts,
    channel_text_line,
    client_body,
    client_stats,
    client_text_parts,
    connected_text,
    json_end,
    json_head,
    json_middle,
    node_stats,
    text_end,
    text_head,
    topic_json_head,
    topic_json_tail,
    topic_text_line,
)

__all__ = ["StatsCache"]

_NO_CLIENTS: tuple = ()
#: topics per run of /metrics rows joined together (see ``StatsCache.metrics_pieces``)
METRICS_BLOCK = 128
#: the rows of ``metrics.topic_rows``: one per family of ``TOPIC_SERIES``, its latency quantiles' and sample count's
_TOPIC_ROWS = len(TOPIC_SERIES) + 2
#: a ``ClientStats``'s values in field order, as a tuple (``ClientStats(*values)`` builds it again)
_client_values = attrgetter(*ClientStats.__slots__)


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "replace")


def _fold(parts: list) -> tuple:
    """Text pieces with the connection times of clients among them (ints) as ``(text up to the first time, time,
    text up to the next time, time, ...)``, so that a rendering joins few pieces and the ages."""
    folded: list = []
    pending: list[bytes] = []
    for part in parts:
        if isinstance(part, int):
            folded += (b"".join(pending), part)
            pending = []
        else:
            pending.append(part)
    folded.append(b"".join(pending))
    return tuple(folded)


# What the cache keeps is flat tuples of plain values (no tuple in a tuple): the collector stops tracking such a
# tuple at its first collection, where a tuple holding tuples is let go one level per collection, so that a
# nested one may live on in the oldest generation (see the module notes).


def _e2e_values(result: E2EResult) -> tuple | None:
    """A latency result's figures as one flat tuple (None: ``EMPTY``)."""
    if result is EMPTY_E2E:
        return None
    if result.percentiles is None:
        return (result.count, None)
    return (result.count, *[figure for pair in result.percentiles for figure in pair])


def _e2e_result(values: tuple | None) -> E2EResult:
    if values is None:
        return EMPTY_E2E
    if len(values) == 2 and values[1] is None:
        return E2EResult(values[0])
    return E2EResult(values[0], tuple(zip(values[1::2], values[2::2], strict=True)))


#: the fields of a channel's key before its latency window's state (see ``StatsCache._refresh``)
_CHANNEL_FIGURES = 11


def _channel_stats(channel, key: tuple, e2e: tuple | None) -> ChannelStats:
    """A channel's snapshot (without clients) from its key (see ``StatsCache._refresh``) and latency figures."""
    (depth, backend_depth, in_flight, deferred, messages, requeues, timeouts, clients, paused, damaged, offsets) = key[
        :_CHANNEL_FIGURES
    ]
    if offsets is not None:  # a log channel: its depth is what is not committed
        backend_depth = offsets[2] - offsets[1]
    return ChannelStats(
        channel.name,
        depth + backend_depth,
        backend_depth,
        in_flight,
        deferred,
        messages,
        requeues,
        timeouts,
        clients,
        None,
        paused,
        _e2e_result(e2e),
        damaged,
        offsets,
    )


class _ClientPiece:
    """A client's key, the values its renderings show (``ClientStats``'s, as a tuple) and its renderings (None
    until asked for)."""

    __slots__ = ("client", "key", "values", "json", "text")

    def __init__(self, client) -> None:
        self.client = client
        self.key: Any = None
        self.values: tuple[Any, ...] | None = None
        self.json: bytes | None = None
        self.text: tuple[Any, ...] | None = None  # (text before its age, its connection time, text after)

    def renew(self, key) -> None:
        self.key, self.json, self.text = key, None, None
        self.values = _client_values(client_stats(self.client, None))


class _Columns:
    """Every topic's and channel's key, figures and renderings, in columns: one list per field, topics in name
    order, each topic's channels in name order after the previous topic's (``bounds``). A topic or a channel is
    therefore no object of the cache's: its entries are plain values or bytes, and the lists the only containers
    (the cyclic collector walks those few lists, not tens of thousands of pieces: see the module notes)."""

    __slots__ = (
        "topics",
        "topic_keys",
        "topic_e2e",
        "bounds",
        "has_clients",
        "json",
        "json_clients",
        "text",
        "text_clients",
        "metrics",
        "channels",
        "keys",
        "e2e",
        "clients",
        "with_clients",
        "where",
    )

    def __init__(self) -> None:
        self.topics: list = []
        self.topic_keys: list = []
        self.topic_e2e: list = []  # its merged latency figures (``_e2e_values``)
        self.bounds: list[int] = [0]  # topic i's channels are channels[bounds[i]:bounds[i + 1]]
        self.has_clients: list[bool] = []  # as the last request that listed clients saw
        # its renderings, None until asked for and dropped when the topic, a channel or a client changed
        self.json: list = []  # with "clients":null
        self.json_clients: list = []
        self.text: list = []  # its line and its channels' lines, without clients (see ``_fold``)
        self.text_clients: list = []  # with clients
        self.metrics: list = []  # its rows, then its channels' rows joined family by family (see ``_TOPIC_ROWS``)
        self.channels: list = []
        self.keys: list = []
        self.e2e: list = []  # a channel's latency figures (``_e2e_values``)
        self.clients: list = []  # a channel's clients' pieces, in the channel's order
        self.with_clients: dict[int, None] = {}  # the channels whose key counts clients
        self.where: dict = {}  # each topic and channel -> its topic's index (``StatsCache._marked``)

    def add(self, topic, channels: list, kept: _Columns | None = None, index: int = 0) -> None:
        """Append a topic: with what ``kept`` holds for it at ``index``, or nothing yet."""
        self.topics.append(topic)
        count = len(channels)
        at = len(self.topics) - 1
        self.where[topic] = at
        for channel in channels:
            self.where[channel] = at
        self.channels += channels
        self.bounds.append(len(self.channels))
        columns = ("topic_keys", "topic_e2e", "has_clients", "json", "json_clients", "text", "text_clients", "metrics")
        if kept is None:
            for name in columns:
                getattr(self, name).append(None)
            self.keys += [None] * count
            self.e2e += [None] * count
            self.clients += [_NO_CLIENTS] * count
            return
        for name in columns:
            getattr(self, name).append(getattr(kept, name)[index])
        start, end = kept.bounds[index], kept.bounds[index + 1]
        first = len(self.keys)
        for position in range(start, end):
            if position in kept.with_clients:
                self.with_clients[first + position - start] = None
        self.keys += kept.keys[start:end]
        self.e2e += kept.e2e[start:end]
        self.clients += kept.clients[start:end]

    def drop(self, index: int) -> None:
        self.json[index] = self.json_clients[index] = self.text[index] = self.text_clients[index] = None
        self.metrics[index] = None

    def topic_stats(self, index: int, channels: tuple = ()) -> TopicStats:
        """Topic ``index``'s snapshot, with the given channels' (its renderings show their number only in
        /metrics)."""
        depth, backend_depth, messages, message_bytes, paused, damaged = self.topic_keys[index][:6]
        return TopicStats(
            self.topics[index].name,
            channels,
            depth + backend_depth,
            backend_depth,
            messages,
            message_bytes,
            paused,
            _e2e_result(self.topic_e2e[index]),
            damaged,
        )

    def channel_stats(self, index: int, channel: str | None = None) -> list:
        """``(ChannelStats, its clients' pieces)`` of topic ``index``'s channels (only ``channel`` if given)."""
        listed = []
        for at in range(self.bounds[index], self.bounds[index + 1]):
            member = self.channels[at]
            if channel is None or member.name == channel:
                listed.append((_channel_stats(member, self.keys[at], self.e2e[at]), self.clients[at]))
        return listed


#: the values of a client that its renderings show and that change after IDENTIFY: its counters, its state and
#: the auth answer (a new object per query; a refresh can come at any PUB or SUB)
_client_counters = attrgetter(
    "state", "rdy", "in_flight", "message_count", "finish_count", "requeue_count", "auth_state"
)
#: the values that IDENTIFY (allowed only in the first state, INIT) sets: fixed once the client leaves INIT
_client_identity = attrgetter(
    "client_id",
    "hostname",
    "user_agent",
    "sample_rate",
    "deflate",
    "snappy",
    "tls",
    "tls_version",
    "tls_cipher_suite",
    "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual",
)


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
        nsqd.stats_readers += 1
        self._version: tuple[Any, int] | None = None
        self._columns = _Columns()
        self._producers: list[_ClientPiece] = []
        self._metrics_blocks: dict[int, tuple[Any, ...]] = {}  # by the index of the run's first topic

    # -- keeping the pieces current -----------------------------------------------------------------------------
    def _sorted(self) -> tuple[_Columns, bool]:
        """The topics and channels in name order (kept across topology changes; a topic whose channels changed
        starts afresh), and whether they were laid out again."""
        nsqd = self.nsqd
        version = (nsqd.topology_version, len(nsqd.topics))
        kept = self._columns
        if version == self._version:
            return kept, False
        where = {id(topic): index for index, topic in enumerate(kept.topics)}
        columns = _Columns()
        for _, topic in sorted(nsqd.topics.items()):
            channels = [channel for _, channel in sorted(topic.channels.items())]
            index = where.get(id(topic))
            if (
                index is not None
                and kept.topics[index] is topic
                and kept.channels[kept.bounds[index] : kept.bounds[index + 1]] == channels
            ):
                columns.add(topic, channels, kept, index)
            else:
                columns.add(topic, channels)
        self._columns, self._version = columns, version
        return columns, True

    def _refresh(self, include_clients: bool) -> _Columns:
        """Bring every key up to date: renew the figures of what changed and drop the renderings of the topics
        it belongs to. Clients are looked at only for a request that lists them (their pieces' keys are those of
        the last such request, so a change in between is still seen by the next one). Returns the columns.

        The keys read are those of the topics that changed since the last request, or one of whose channels did
        (``_marked``); all of them after the topics or channels were laid out again, always with latency
        percentiles (a window's state moves with the clock), and when the node has another cache. Reading a key
        is about 1 us per channel (memory reads of the channel and its queues, scattered over the heap: 20-30 ms
        at 20,000 channels), so an idle channel costs nothing. The clients of every channel that has some are
        looked at."""
        now_ns = time.time_ns()
        columns, laid_out = self._sorted()
        tracked = bool(self.nsqd.opts.e2e_processing_latency_percentiles)
        marked = self.nsqd.stats_changed
        if laid_out or tracked or self.nsqd.stats_readers > 1:
            indexes: range | list[int] = range(len(columns.topics))
        else:
            indexes = self._marked(columns, marked)
        marked.clear()
        changed = {index for index in indexes if self._refresh_topic(columns, index, tracked, now_ns)}
        if include_clients:
            has_clients = [False] * len(columns.topics)
            channels, clients, where = columns.channels, columns.clients, columns.where
            for at in columns.with_clients:
                owner = where[channels[at]]
                has_clients[owner] = True
                if self._refresh_clients(clients, at, channels[at].clients):
                    changed.add(owner)
            columns.has_clients = has_clients
            previous = {piece.client.id: piece for piece in self._producers}
            self._producers = [
                self._producer_piece(c, previous) for c in list(self.nsqd.clients.values()) if c.pub_counts
            ]
        for index in changed:
            columns.drop(index)
        return columns

    @staticmethod
    def _marked(columns: _Columns, marked: set) -> list[int]:
        """The indexes of the topics that are in ``marked`` (``NSQD.stats_changed``: the topics and channels that
        changed since the last request add themselves), or one of whose channels is."""
        where = columns.where
        return sorted({where[member] for member in marked if member in where})

    def _refresh_topic(self, columns: _Columns, index: int, tracked: bool, now_ns: int) -> bool:
        """Topic ``index``'s key and its channels': True if one changed (their figures renewed)."""
        channels, keys, e2e, clients, bounds, with_clients = (
            columns.channels,
            columns.keys,
            columns.e2e,
            columns.clients,
            columns.bounds,
            columns.with_clients,
        )
        changed = False
        state = None
        states: tuple[int, ...] = ()  # its channels' window states one after the other (each is 3 ints)
        for at in range(bounds[index], bounds[index + 1]):
            channel = channels[at]
            if tracked:
                window = channel.e2e
                state = window.state(now_ns) if window is not None else None
                if state is not None:
                    states += state
            # the sizes come from the queues' own fields, not their ``len()`` and ``depth()`` (methods written
            # in Python, a third of a request at 20,000 channels); the tests compare the result with the snapshot
            backend = channel.backend
            members = channel.clients
            key: tuple[Any, ...] = (
                len(channel.queue),
                backend._depth if backend is not None else 0,
                len(channel.in_flight._entries),
                len(channel.deferred._heap),
                channel.message_count,
                channel.requeue_count,
                channel.timeout_count,
                len(members),
                channel.paused,
                backend.damaged if backend is not None else 0,
                channel.log.offsets() if channel.log is not None else None,
            )
            if state is not None:
                key += state
            if key != keys[at]:
                keys[at] = key
                # the figures, not the window's samples
                e2e[at] = _e2e_values(window.result(now_ns)) if state is not None else None
                if members:
                    with_clients[at] = None
                else:  # (a channel whose key counts no client lists none: not looked at for clients)
                    with_clients.pop(at, None)
                    clients[at] = _NO_CLIENTS
                changed = True
        topic = columns.topics[index]
        backend = topic.backend
        key = (
            len(topic.queue),
            backend._depth if backend is not None else 0,
            topic.message_count,
            topic.message_bytes,
            topic.paused,
            backend.damaged if backend is not None else 0,
        )
        if states:
            key += states
        if key != columns.topic_keys[index]:
            columns.topic_keys[index] = key
            results = (
                [c.e2e.result(now_ns) for c in channels[bounds[index] : bounds[index + 1]] if c.e2e is not None]
                if states
                else ()
            )
            columns.topic_e2e[index] = _e2e_values(
                merge_results(results, tuple(self.nsqd.opts.e2e_processing_latency_percentiles))
            )
            changed = True
        return changed

    @staticmethod
    def _refresh_clients(clients: list, at: int, members: dict) -> bool:
        """Channel ``at``'s clients' pieces, renewed where a client's key changed; True if one did, or if the
        channel's clients are not those of the last look."""
        client_counters, client_identity, INIT = _client_counters, _client_identity, ClientState.INIT
        previous = clients[at]
        if len(previous) != len(members):
            previous = ()
        changed = False
        listed = []
        for client, client_piece in zip_longest(members.values(), previous):
            if client_piece is None or client_piece.client is not client:
                client_piece = _ClientPiece(client)
            counters = client_counters(client)
            counts = client.pub_counts
            key = (
                counters
                if not counts and counters[0] != INIT
                else (counters, tuple(counts.items()), client_identity(client))
            )
            if key != client_piece.key:
                client_piece.renew(key)
                changed = True
            listed.append(client_piece)
        if listed != previous:
            clients[at] = listed
            changed = True
        return changed

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
        columns = self._refresh(include_clients)
        topics = []
        if channel is None:
            kept = columns.json_clients if include_clients else columns.json
            for index, rendered in enumerate(kept):
                if rendered is None:
                    rendered = kept[index] = self._topic_json(
                        columns, index, columns.channel_stats(index), include_clients
                    )
                topics.append(rendered)
        else:
            for index in range(len(columns.topics)):
                listed = columns.channel_stats(index, channel)
                if listed:
                    topics.append(self._topic_json(columns, index, listed, include_clients))
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

    def _topic_json(self, columns: _Columns, index: int, channels: list, include_clients: bool) -> bytes:
        rendered = []
        for stats, clients in channels:
            head, tail = map(_encode, channel_json_parts(stats))
            rendered.append(head + (self._json_clients(clients) if include_clients else b"null") + tail)
        return (
            _encode(topic_json_head(columns.topics[index].name))
            + b",".join(rendered)
            + _encode(topic_json_tail(columns.topic_stats(index)))
        )

    @staticmethod
    def _json_clients(pieces) -> bytes:
        for piece in pieces:
            if piece.json is None:
                piece.json = _encode(client_body(ClientStats(*piece.values)))
        return b"[" + b",".join([piece.json for piece in pieces]) + b"]"

    # -- text ---------------------------------------------------------------------------------------------------
    def text(self, *, channel: str | None = None, include_clients: bool = True, include_mem: bool = True) -> bytes:
        """``/stats`` without ``format=json``: ``stats.format_text(stats.collect(...))``, encoded."""
        columns = self._refresh(include_clients)
        now = int(time.time())
        ages: dict[int, bytes] = {}
        out = [b""]
        append = out.append
        listed_any = False
        for index in range(len(columns.topics)):
            if channel is None:
                with_clients = include_clients and columns.has_clients[index]
                kept = columns.text_clients if with_clients else columns.text
                rendered = kept[index]
                if rendered is None:
                    rendered = kept[index] = self._topic_text(
                        columns, index, columns.channel_stats(index), with_clients
                    )
            else:
                listed = columns.channel_stats(index, channel)
                if not listed:
                    continue
                rendered = self._topic_text(columns, index, listed, include_clients)
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

    def _topic_text(self, columns: _Columns, index: int, channels: list, include_clients: bool) -> tuple:
        parts: list = [_encode(topic_text_line(columns.topic_stats(index)) + "\n")]
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
        out.append(rendered[0])
        for connect_ts, text in zip(rendered[1::2], rendered[2::2], strict=True):
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
        columns = self._refresh(False)
        rows = columns.metrics
        for index, rendered in enumerate(rows):
            if rendered is None:
                name = columns.topics[index].name
                channels = tuple(stats for stats, _ in columns.channel_stats(index))
                channel_rows_ = [channel_rows(stats, name) for stats in channels]
                joined = tuple(map(b"".join, zip(*channel_rows_, strict=True)))
                rows[index] = topic_rows(columns.topic_stats(index, channels)) + joined
        blocks = []
        for start in range(0, len(rows), METRICS_BLOCK):
            run = rows[start : start + METRICS_BLOCK]
            kept = self._metrics_blocks.get(start)
            if kept is None or kept[0] != run:  # the same row objects: no change (compared by identity first)
                topic_columns = tuple(map(b"".join, zip(*[rendered[:_TOPIC_ROWS] for rendered in run], strict=True)))
                channel_parts = [rendered[_TOPIC_ROWS:] for rendered in run if len(rendered) > _TOPIC_ROWS]
                channel_columns = tuple(map(b"".join, zip(*channel_parts, strict=True))) if channel_parts else None
                kept = self._metrics_blocks[start] = (run, topic_columns, channel_columns)
            blocks.append(kept)
        for start in [start for start in self._metrics_blocks if start >= len(rows)]:
            del self._metrics_blocks[start]
        return rows_pieces(
            [topic_columns for _, topic_columns, _ in blocks],
            [channel_columns for _, _, channel_columns in blocks if channel_columns is not None],
            openmetrics=openmetrics,
        )
