"""Per-connection state of a V2 client: identity, RDY window, counters and the output buffer.

The connection (``tcp.py``) owns the socket and the tasks; this object is what the channel's
dispatcher and the stats see. Dispatch appends encoded message frames to ``out`` without awaiting
and then tells the writer whether to flush now or to let the flush timer batch more frames.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol, Self

import trio

if TYPE_CHECKING:  # for annotations only
    from .auth import AuthState

__all__ = ["Client", "ClientState", "SubscribedChannel"]


class ClientState(IntEnum):
    """Values as reported in /stats ``state``."""

    INIT = 0
    DISCONNECTED = 1
    CONNECTED = 2
    SUBSCRIBED = 3
    CLOSING = 4


class SubscribedChannel(Protocol):
    """What a connection asks of the channel its client subscribed to: ``channel.Channel``, which imports this
    module (so this one names only the part it uses)."""

    name: str
    topic_name: str

    def client_credit_changed(self, client: Client) -> None: ...

    def remove_client(self, client: Client) -> None: ...

    def finish(self, client: Client, msg_id: bytes) -> object: ...

    def finish_many(self, client: Client, msg_ids: list[bytes]) -> list[tuple[bytes, str]]: ...

    def requeue(self, client: Client, msg_id: bytes, delay: float) -> None: ...

    def touch(self, client: Client, msg_id: bytes, msg_timeout: float) -> None: ...


class Client:
    """One V2 connection as the broker sees it.

    ``credit()`` is NSQ's readiness rule: a consumer may receive a message while it is subscribed,
    ``in_flight < rdy``, and its channel is not paused (the channel checks that last part).
    """

    def __init__(
        self,
        client_id: int,
        remote_address: str,
        *,
        msg_timeout: float,
        heartbeat_interval: float,
        output_buffer_size: int,
        output_buffer_timeout: float,
    ) -> None:
        host = remote_address.rsplit(":", 1)[0].strip("[]")
        self.id = client_id
        self.remote_address = remote_address
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        self.state = ClientState.INIT
        self.connect_ts = int(time.time())
        self.identified = False
        self.replicated_seq = 0  # replication seq of this connection's last publish (nsqd/replication/)
        #: with ``--workers``: another worker gave this connection to this one (``WorkerMesh.hand_over``); it stays
        self.handed_over = False
        #: a busy owner gave this producer to an idle worker to spread its topic's reads (``WorkerMesh.spread``):
        #: it stays there
        self.spread = False
        #: the verbs of the publishes whose OKs wait for the group commit (queues/group_commit.py), in order
        self.commit_verbs: list[str] = []

        # negotiated settings (the first IDENTIFY wins, as in nsqd)
        self.msg_timeout = msg_timeout
        self.heartbeat_interval = heartbeat_interval
        self.output_buffer_size = output_buffer_size
        self.output_buffer_timeout = output_buffer_timeout
        self.sample_rate = 0
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.tls_version = ""
        self.tls_cipher_suite = ""
        self.tls_negotiated_protocol = ""
        self.tls_negotiated_protocol_is_mutual = False
        self.tls_common_name = ""  # the client certificate's CN, sent to the auth server

        # auth: the secret of AUTH and the auth server's answer (nsqd.auth.AuthState)
        self.auth_secret: bytes | None = None
        self.auth_state: AuthState | None = None

        # delivery
        self.channel: SubscribedChannel | None = None
        self.rdy = 0
        self.in_flight = 0
        self.in_mailbox = False

        # counters
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}

        # output buffer, drained by the connection's writer task
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.flush_now = False
        self.draining = False
        self._writer_wakeup: trio.Event | None = None
        #: set by the connection: writes the whole buffer now if it safely can, True if it did
        self.direct_flush: Callable[[], bool] | None = None

    @classmethod
    def from_fields(cls, client_id: int, fields: dict[str, Any]) -> Self:
        """A client with the settings and names of another one (``fields``: attribute -> value, with at least the
        constructor's), for a connection served in another worker process (nsqd/workers.py)."""
        client = cls(
            client_id,
            fields["remote_address"],
            msg_timeout=fields["msg_timeout"],
            heartbeat_interval=fields["heartbeat_interval"],
            output_buffer_size=fields["output_buffer_size"],
            output_buffer_timeout=fields["output_buffer_timeout"],
        )
        for name, value in fields.items():
            setattr(client, name, value)
        return client

    # -- auth (as /stats reports it) -------------------------------------------------------------
    @property
    def authed(self) -> bool:
        """True once an AUTH answer granted at least one authorization."""
        state = self.auth_state
        return state is not None and len(state.authorizations) > 0

    @property
    def auth_identity(self) -> str:
        return self.auth_state.identity if self.auth_state is not None else ""

    @property
    def auth_identity_url(self) -> str:
        return self.auth_state.identity_url if self.auth_state is not None else ""

    # -- readiness -------------------------------------------------------------------------------
    def credit(self) -> int:
        if self.state != ClientState.SUBSCRIBED:
            return 0
        return self.rdy - self.in_flight

    # -- output ----------------------------------------------------------------------------------
    def write_frame(self, frame: bytes) -> None:
        """Queue a non-message frame (response, error, heartbeat): these are flushed at once."""
        self.out.append(frame)
        self.out_bytes += len(frame)
        self.flush_now = True
        self.wake_writer()

    def write_frame_now(self, frame: bytes) -> None:
        """``write_frame`` from outside the connection's tasks (the heartbeat timer): the buffer is written at once
        if the connection can (``direct_flush``), which saves a wake-up of its writer task."""
        self.out.append(frame)
        self.out_bytes += len(frame)
        self.flush()

    def messages_queued(self, flush: bool) -> None:
        """Dispatch appended message frames to ``out``: flush now, or let the writer's timer run."""
        if flush or self.out_bytes >= self.output_buffer_size:
            self.flush()
        else:
            self.wake_writer()

    def flush(self) -> None:
        """Write the buffer now: directly if the connection can, else by its writer."""
        self.flush_now = True
        direct_flush = self.direct_flush
        if direct_flush is None or not direct_flush():
            self.wake_writer()

    def wake_writer(self) -> None:
        event = self._writer_wakeup
        if event is not None:
            self._writer_wakeup = None
            event.set()

    def writer_wait_event(self) -> trio.Event:
        event = trio.Event()
        self._writer_wakeup = event
        return event

    def take_output(self) -> bytes:
        data = b"".join(self.out) if len(self.out) != 1 else self.out[0]
        self.out.clear()
        self.out_bytes = 0
        self.flush_now = False
        return data

    def published(self, topic: str, count: int) -> None:
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + count

    def __repr__(self) -> str:
        return f"Client({self.id} {self.remote_address})"
