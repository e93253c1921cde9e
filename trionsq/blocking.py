"""The blocking driver: the client side of V2 over plain sockets, for scripts and for processes
that must not import trio (Spark's Python workers and its driver-side source).

It runs the same sans-IO core as the trio ``Connection`` (``trionsq._core``: handshake, upgrades,
AUTH, frames to events, the FIFO of replies); this module only moves bytes. It imports the
standard library, ``protocol`` and the client's trio-free modules (``_config``, ``_core``,
``_errors``, ``_lookupd``'s parsers, ``_message``), never trio.

``connect(address, config)`` -> ``BlockingConnection``
    dials within ``config.dial_timeout``, then magic, IDENTIFY, the TLS upgrade (``ssl``, context
    from ``config.ssl_context()``), snappy or deflate, AUTH, all before ``deadline`` (default:
    ``dial_timeout + read_timeout`` from the call). ``tls_v1`` asked of an nsqd that offers no TLS, and
    an nsqd that requires AUTH with no ``auth_secret`` set, raise ``HandshakeError``: retrying the
    same configuration cannot succeed.

    Three ways to read, for three kinds of loop:

    - ``read_event(deadline)``: the next ``Reply`` / ``ErrorReply`` / ``Message`` (heartbeats are
      answered on the way), through the core. Requests that expect a reply are written with
      ``send_command(data, token)`` so that the core matches replies to them in order.
    - ``read_available(timeout)``: the raw (decompressed) stream bytes the socket holds, for a loop
      that parses a whole receive buffer in one pass (the Spark source logs a read's messages as
      one record and FINs them in one write). It takes over the stream from the core:
      ``take_unparsed()`` first hands it the bytes the core already holds. After one read, it keeps
      reading what the socket already has, without waiting, up to ``coalesce`` bytes, into one
      receive buffer allocated once per connection (a fresh 1 MiB ``recv`` object per call cost
      14 us more per read), so one pass, one log record and one fsync cover all of it.
    - ``request(data)`` / ``request_into(data)``: one command and its answer, for a connection used one
      request at a time; ``request_into`` reads a large answer (the log channels' ``LREAD``, megabytes)
      from the socket straight into one buffer of its size instead of through the core's frame buffer
      (0.21 -> 0.09 us of CPU per 200-byte message received).

    ``send(data)`` writes commands (compressed when the connection is); it may be called from
    another thread than the reader (a lock keeps writes and the compressor's stream whole).

``Producer(addresses, config)``
    Pipelined publishing with fail-over. ``send(command)`` writes an encoded PUB, MPUB or DPUB on
    the current nsqd's connection and reads replies only when ``max_in_flight`` commands wait for
    one; ``flush()`` waits for every reply. ``publish``, ``multi_publish`` and
    ``deferred_publish`` are ``send`` then ``flush``. A lost connection, a reply timeout or a
    server-side failure (E_PUB_FAILED, E_MPUB_FAILED, E_DPUB_FAILED) moves to the next address
    and sends the unanswered commands there, each command trying every address at most once
    (at least once: a command whose reply was lost may have been stored); when one has failed
    everywhere, ``NoAvailableNsqd``. A request error (E_BAD_TOPIC, E_BAD_MESSAGE ...) is raised as
    ``NSQError`` at once; nsqd closes the connection after it, and the commands written behind the
    refused one, which it never ran, are sent again by the next ``send`` or ``flush``. With no
    thread to answer heartbeats between calls, its connections ask for none; one that nsqd closed
    meanwhile (a restart) is found without blocking before the next write and replaced.

``lookup(lookupd, topic)``, ``lookup_producers``, ``nodes(lookupd)``, ``topics(lookupd)``
    One GET each (``urllib``), parsed by the trio driver's parsers (``trionsq._lookupd``).

Modules: ``_blocking_connection`` (``connect``, ``BlockingConnection``), ``_blocking_producer``
(``Producer``); this one holds the lookupd helpers and is the public face of all three.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from ._blocking_connection import BlockingConnection, HandshakeError, cause, connect
from ._blocking_producer import Producer, ProducerStats
from ._config import Config
from ._core import AuthResult, ErrorReply, Features, Reply
from ._errors import ConnectError, ConnectionClosed, NoAvailableNsqd, NSQError
from ._lookupd import (
    ACCEPT_V1,
    DEFAULT_TIMEOUT,
    MAX_BODY,
    LookupdError,
    Peer,
    lookup_url,
    parse_lookup,
    parse_nodes,
    parse_topics,
)
from ._message import Message

__all__ = [
    "AuthResult",
    "BlockingConnection",
    "Config",
    "ConnectError",
    "ConnectionClosed",
    "ErrorReply",
    "Features",
    "HandshakeError",
    "LookupdError",
    "Message",
    "NSQError",
    "NoAvailableNsqd",
    "Peer",
    "Producer",
    "ProducerStats",
    "Reply",
    "connect",
    "lookup",
    "lookup_producers",
    "nodes",
    "topics",
]


# -- nsqlookupd --------------------------------------------------------------------------------------


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=dict([ACCEPT_V1]))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read(MAX_BODY)
    except urllib.error.URLError as exc:
        raise LookupdError(
            f"GET {url}: {cause(exc.reason) if isinstance(exc.reason, BaseException) else exc.reason}"
        ) from None
    except (OSError, ValueError) as exc:
        raise LookupdError(f"GET {url}: {cause(exc)}") from None


def lookup_producers(lookupd_http_address: str, topic: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[Peer]:
    """The nsqd a lookupd lists for ``topic``, with their ports and versions.

    Args:
        lookupd_http_address: The lookupd's HTTP address, ``host:port`` or an ``http(s)://`` URL.
        topic: The topic.
        timeout: The bound on the query, in seconds.

    Returns:
        One `Peer` per nsqd, ``[]`` when the lookupd knows no such topic.

    Raises:
        LookupdError: The lookupd gave no usable answer.
    """
    url = lookup_url(lookupd_http_address, "/lookup", topic=topic)
    return parse_lookup(url, *_get(url, timeout))


def lookup(lookupd_http_address: str, topic: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """``broadcast_address:tcp_port`` of each nsqd a lookupd lists for ``topic``, in its order
    (``[]`` for a topic the lookupd does not know).

    Raises:
        LookupdError: The lookupd gave no usable answer.
    """
    return [peer.tcp_address for peer in lookup_producers(lookupd_http_address, topic, timeout=timeout)]


def nodes(lookupd_http_address: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[Peer]:
    """Every nsqd registered with a lookupd (``/nodes``), with its topics and tombstones.

    Raises:
        LookupdError: The lookupd gave no usable answer.
    """
    url = lookup_url(lookupd_http_address, "/nodes")
    return parse_nodes(url, *_get(url, timeout))


def topics(lookupd_http_address: str, *, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Every topic a lookupd knows (``/topics``).

    Raises:
        LookupdError: The lookupd gave no usable answer.
    """
    url = lookup_url(lookupd_http_address, "/topics")
    return parse_topics(url, *_get(url, timeout))
