"""One V2 TCP connection: the magic, the command loop, the writer, heartbeats and deadlines.

Reading: each receive buffer is fed to the sans-IO ``CommandParser`` and every complete command is
handled synchronously (no await per message); the responses are appended to the client's output buffer
and leave in one write. A connection that consumes and publishes gets the answer to a publish before any
message that this publish delivers back to it (``_publish_answering_first``). A plain-TCP connection
waiting for input sits in the daemon's ``ReadPoller``, which reads it and runs those commands in its own
task (``poll_ready``); the connection's task takes over for a command that must await (IDENTIFY, AUTH,
an auth refresh), an error or EOF. TLS and compressed connections read in their own task. Writing: a
writer task sends the output buffer when something asks for an immediate flush (any non-message frame, a
consumer that became not-ready, an idle channel) or when the flush timer (``output_buffer_timeout``)
expires. Deadlines: the read side must see a command within 2 x heartbeat interval (one cancel scope
whose deadline moves, not a scope per read); each write must finish within one heartbeat interval.

Errors: handlers raise ``ProtocolError``; this loop alone decides to close. A fatal error is
written, flushed, and the connection closed; E_FIN_FAILED / E_REQ_FAILED / E_TOUCH_FAILED are not
fatal. Causes are logged, never sent.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from protocol.commands import CommandParser, encode_sub, ms_to_go_duration, parse_base10
from protocol.compression import DeflateDecoder, DeflateEncoder, SnappyDecoder, SnappyEncoder
from protocol.errors import LineTooLong, ProtocolError
from protocol.frames import CLOSE_WAIT_FRAME, FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, OK_FRAME, encode_frame
from protocol.identify import negotiate
from protocol.log import E_LOG_FAILED, parse_log_request
from protocol.names import go_quote, is_valid_channel_name, is_valid_name_bytes, is_valid_topic_name

from . import log_commands
from .auth import AuthError
from .channel import ChannelError
from .client import Client, ClientState
from .fastpath import fast_line_of, read_pubs
from .streams import CompressedStream, CompressionError, PrefixedStream
from .tls import tls_info
from .topic import TopicExiting, TopicFull

__all__ = ["Connection", "MAGIC_V2"]

log = logging.getLogger("nsqd")

MAGIC_V2 = b"  V2"
RECEIVE_SIZE = 65536
MESSAGE_ID_LENGTH = 16
FINAL_FLUSH_TIMEOUT = 1.0
#: the read deadline (2 x heartbeat interval) is moved only when it would move by more than this share
#: of it: moving a trio deadline costs a heap operation (3-4% of a PUB's CPU when done every few reads),
#: and closing a silent client up to 3 s early of 60 s (0.1 s of 2 s at the shortest interval) changes nothing
READ_DEADLINE_SLACK = 0.05
TLS_HANDSHAKE_TIMEOUT = 5.0

_ASYNC_COMMANDS = frozenset((b"IDENTIFY", b"AUTH"))  # they may wait for the network (upgrade, auth server)
_AUTH_CHECKED = frozenset((b"SUB", b"PUB", b"MPUB", b"DPUB", b"LOG", b"LSEEK", b"LREAD", b"LCOMMIT"))


_INIT_ONLY_WITH_BODY = frozenset((b"IDENTIFY", b"AUTH"))
_FIN_STATES = (ClientState.SUBSCRIBED, ClientState.CLOSING)
#: a handler's answer that is already in the output buffer (``_publish_answering_first``): the loop appends
#: nothing more, and flushes the buffer as it does for any answer
_ANSWER_QUEUED = b""
#: a handler's answer when its command goes to the worker that owns its topic (``Connection._forwarded``)
_FORWARD: Any = object()
_FORWARD_COMMAND = (b"", (), None)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


class _UpgradeFailed(Exception):
    """A TLS or compression upgrade after IDENTIFY failed: the connection is closed without a word."""


def _remote_ip(remote_address: str) -> str:
    return remote_address.rpartition(":")[0].strip("[]")


def _message_id(params: tuple, index: int = 0) -> bytes:
    msg_id = params[index]
    if len(msg_id) != MESSAGE_ID_LENGTH:
        raise ProtocolError("E_INVALID", "invalid message ID")
    return msg_id


class Connection:
    """Drives one client connection until it closes. Owns its tasks through its own nursery."""

    # slots for what ``__init__`` sets: a plain instance past 29 attributes keeps them in a dict of its own, where
    # each read on a PUB's or a FIN's path is a lookup (CPython's inline values stop there); anything else goes to
    # the ``__dict__`` slot
    __slots__ = (
        "nsqd",
        "opts",
        "stream",
        "client",
        "parser",
        "_read_scope",
        "_now",
        "_read_moves_at",
        "_heartbeat_timer",
        "_writer_done",
        "_send_lock",
        "_tls_required",
        "_auth_enabled",
        "_auth_refresh_error",
        "_authed_before_refresh",
        "_ack_wait",
        "_poller",
        "_poll_fd",
        "last_read",
        "poll_actor",
        "_poll_done",
        "_poll_result",
        "_pending_command",
        "_poller_error",
        "_consumes",
        "_reply_deferred",
        "_plain",
        "fast_line",
        "_publish_batch",
        "_mesh",
        "_forward",
        "_forwards_held",
        "_forward_failed",
        "_forwards_done",
        "_hand_to",
        "_handed",
        "__dict__",
        "__weakref__",
    )

    def __init__(self, nsqd, stream: trio.abc.Stream, client: Client) -> None:
        self.nsqd = nsqd
        self.opts = nsqd.opts
        self.stream = stream
        self.client = client
        self.parser = CommandParser(
            max_msg_size=self.opts.max_msg_size,
            max_body_size=self.opts.max_body_size,
            max_req_timeout_ms=int(self.opts.max_req_timeout * 1000),
            line_check=self._line_check,
        )
        self._read_scope: trio.CancelScope | None = None
        self._now = trio.lowlevel.current_clock().current_time  # the run's clock, one call
        self._read_moves_at = math.inf  # when the read deadline is moved next (``_move_read_deadline``)
        self._heartbeat_timer = nsqd.heartbeats  # one task writes every connection's heartbeats
        self._writer_done = trio.Event()
        self._send_lock = trio.Lock()  # the writer's flushes against IDENTIFY's upgrades
        self._tls_required = self.opts.tls_required_on_tcp()
        self._auth_enabled = nsqd.authenticator.enabled
        self._auth_refresh_error: AuthError | None = None
        self._authed_before_refresh: bool | None = None
        client.direct_flush = self._flush_direct
        #: the replication seq an ACK callback waits for on this connection's behalf (``_await_ack_directly``)
        self._ack_wait = 0
        self._poller = nsqd.read_poller
        self._poll_fd = -1
        self.last_read = RECEIVE_SIZE  # bytes of the last read through the poller (``ReadPoller``: small first)
        #: the poller's order before size: a consumer goes by its channel's run time in the actor system (SUB sets
        #: it), so the reads of a channel owed time come first; None (a producer) goes before every consumer
        self.poll_actor = None
        self._poll_done: trio.Event | None = None
        self._poll_result: bytes | OSError | None = None
        self._pending_command: tuple | None = None  # left by the poller for this task (it must await)
        self._poller_error: Exception | None = None  # raised by a command the poller ran
        self._consumes = False  # SUB: what it publishes may come back to it (``_publish``)
        self._reply_deferred = False
        #: whether its PUBs may take the fast path at all (``poll_ready``): what cannot change while it
        #: lives (auth, a TLS requirement, replication: set up before any client comes) and SUB, which clears it
        self._plain = not self._auth_enabled and not self._tls_required and nsqd.replication is None
        #: ``parser.last_pub()`` while the connection is ``_plain``, else None: taken when the poller starts
        #: watching the connection and after each read the parser handled there (only those change it; a fast
        #: read leaves the parser as it was), so a step reads it instead of asking the parser (``fast_pub``)
        self.fast_line: tuple[bytes, bytes] | None = None
        self._publish_batch = nsqd.publish_batch
        #: with ``--workers`` above 1, the workers (nsqd/workers.py): a publish to a topic owned by another
        #: worker is sent there, its OK put in the output at once and the output held until the owner answers
        #: (``_publish_elsewhere``); a SUB waits for the owner's answer (``_forwarded``)
        self._mesh = nsqd.mesh
        self._forward: tuple | None = None
        self._forwards_held = 0  # publishes sent to their owner and not answered yet
        self._forward_failed = False
        self._forwards_done: trio.Event | None = None  # set when the last held publish is answered
        self._hand_to: int | None = None  # the worker this producer's connection goes to at the step's end
        self._handed = False  # given to another worker (``hand_over``): this task ends without a word

    # -- driving ---------------------------------------------------------------------------------
    async def run(self, initial: bytes) -> None:
        """Serve the connection; ``initial`` holds bytes read after the magic."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer)
            self._heartbeat_timer.schedule(self.client, self.client.heartbeat_interval)
            try:
                await self._read_loop(initial)
            finally:
                # whatever ended the loop (EOF, reset, fatal error, deadline), nsqd logs this line
                log.info("PROTOCOL(V2): [%s] exiting ioloop", self.client.remote_address)
                with trio.CancelScope(shield=True):
                    await self._drain()
                self._heartbeat_timer.cancel(self.client)
                nursery.cancel_scope.cancel()

    async def _drain(self) -> None:
        """Let the writer send what is buffered (e.g. a fatal error frame), within a bound."""
        client = self.client
        client.draining = True
        client.flush_now = True
        client.wake_writer()
        with trio.move_on_after(FINAL_FLUSH_TIMEOUT):
            await self._writer_done.wait()

    def _set_read_deadline(self) -> None:
        """Two heartbeat intervals from now (none without heartbeats); ``_move_read_deadline`` moves it again once
        that would move it by more than ``READ_DEADLINE_SLACK`` of them."""
        interval = self.client.heartbeat_interval
        if interval <= 0:
            self._read_scope.deadline = self._read_moves_at = math.inf
            return
        now = self._now()
        self._read_scope.deadline = now + 2 * interval
        self._read_moves_at = now + READ_DEADLINE_SLACK * 2 * interval

    def _move_read_deadline(self) -> None:
        if self._now() > self._read_moves_at:  # one clock call per read: the scope is not looked at
            self._set_read_deadline()

    async def _read_loop(self, initial: bytes) -> None:
        parser = self.parser
        client = self.client
        with trio.CancelScope() as scope:
            self._read_scope = scope
            self._set_read_deadline()
            data: bytes | bytearray | None = initial
            while True:
                if data is None or data:  # None: the read poller stopped on a command or an error
                    try:
                        if data:
                            parser.receive_data(data)
                        error, self._poller_error = self._poller_error, None
                        if error is not None:
                            raise error
                        await self._run_buffered()
                    except ProtocolError as error:
                        log.error("[%s] - %s", client.remote_address, error.payload().decode("utf-8", "replace"))
                        client.write_frame(encode_frame(FRAME_TYPE_ERROR, error.payload()))
                        return
                    except LineTooLong:
                        log.error("[%s] - command line too long, closing", client.remote_address)
                        return
                    except _UpgradeFailed as exc:
                        log.error("[%s] - %s, closing", client.remote_address, exc)
                        client.out.clear()  # nothing more may reach a peer whose layers are unknown
                        return
                    self._move_read_deadline()
                if self._handed:
                    log.info("[%s] - handed over to the worker that owns its topic", client.remote_address)
                    return
                try:
                    stream = self.stream
                    if type(stream) is trio.SocketStream:
                        data = await self._receive_polled()
                    else:
                        data = await stream.receive_some(RECEIVE_SIZE)
                except CompressionError as exc:
                    log.error("[%s] - corrupt compressed stream, closing: %s", client.remote_address, exc)
                    return
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    log.info("[%s] - read failed: %s", client.remote_address, exc)
                    return
                if data is not None and not data:
                    eof_error = parser.pending_eof_error()
                    if eof_error is not None:
                        # a command cut short: nsqd reports what it failed to read before closing
                        log.error("[%s] - %s", client.remote_address, eof_error.payload().decode("utf-8", "replace"))
                        client.write_frame(encode_frame(FRAME_TYPE_ERROR, eof_error.payload()))
                    return
        log.info("[%s] - read deadline exceeded, closing", client.remote_address)

    async def _run_buffered(self) -> None:
        """Run every complete command the parser holds, awaiting where a command must."""
        command, self._pending_command = self._pending_command, None
        if command is None:
            command = self._run_commands()
        while command is not None:
            await self._run_awaiting(command)
            command = self._run_commands()

    def _run_commands(self) -> tuple | None:
        """Run the parser's complete commands that need no await, answering them in one write at the end
        (``_send_replies``). Stops at the first command that may wait for the network (IDENTIFY, AUTH, a
        command whose auth answer may need refreshing) and returns it unrun, after sending the answers so
        far. Non-fatal errors are answered and the loop goes on; a fatal one is raised."""
        parser = self.parser
        client = self.client
        handlers = _HANDLERS
        out = client.out
        replied = False
        while True:
            command = parser.next_command()
            if command is None:
                break
            name = command[0]
            handler = handlers.get(name)
            if handler is None:
                raise ProtocolError("E_INVALID", f"invalid command {_text(name)}")
            if name in _ASYNC_COMMANDS or (self._auth_enabled and name in _AUTH_CHECKED and self._auth_refresh_due()):
                if replied:
                    self._send_replies()
                return command
            try:
                response = handler(self, command)
            except ProtocolError as error:
                if error.fatal:
                    raise
                client.write_frame(encode_frame(FRAME_TYPE_ERROR, error.payload()))
                continue
            if response is not None:
                if response is _FORWARD:
                    if replied:
                        self._send_replies()
                    return _FORWARD_COMMAND
                # sent after the whole buffer is handled, in one write (_send_replies)
                out.append(response)
                client.out_bytes += len(response)
                client.flush_now = replied = True
        if replied:
            self._send_replies()
        return None

    async def _run_awaiting(self, command: tuple) -> None:
        """One command that may wait (see ``_run_commands``); its answer leaves at once."""
        name = command[0]
        try:
            if command is _FORWARD_COMMAND:
                await self._forwarded()
                return
            if name in _ASYNC_COMMANDS:
                response = await _HANDLERS[name](self, command)
            else:
                await self._refresh_expired_auth()
                response = _HANDLERS[name](self, command)
                if response is _FORWARD:
                    await self._forwarded()
                    return
        except ProtocolError as error:
            if error.fatal:
                raise
            self.client.write_frame(encode_frame(FRAME_TYPE_ERROR, error.payload()))
            return
        if response is not None:
            client = self.client
            client.out.append(response)
            client.out_bytes += len(response)
            client.flush_now = True
            self._send_replies()

    async def _forwarded(self) -> None:
        """Send the SUB a handler left in ``_forward`` to the topic's owner (nsqd/workers.py) and answer it as the
        handler would have: OK, or the owner's refusal."""
        request, self._forward = self._forward, None
        assert request is not None and self._mesh is not None
        client = self.client
        if request[0] == "log":
            answer = await self._mesh.log_command(request[1])
            client.out.append(answer)
            client.out_bytes += len(answer)
            client.flush_now = True
            self._send_replies()
            return
        _, topic_name, channel_name = request
        owner = self._mesh.owner(topic_name)
        if self._hand_over_unread(owner, encode_sub(topic_name, channel_name)):
            return  # the owner runs the SUB
        client.channel = await self._mesh.subscribe(client, topic_name, channel_name)
        self._consumes = True
        self._plain = False
        self.fast_line = None
        client.state = ClientState.SUBSCRIBED
        # where a consumer is served: through a stand-in here (each delivery crosses), or by the owner (the line
        # of ``SUB``, once the connection went there)
        log.info("[%s] SUB %s:%s through worker %d", client.remote_address, topic_name, channel_name, owner)
        client.out.append(OK_FRAME)
        client.out_bytes += len(OK_FRAME)
        client.flush_now = True
        self._send_replies()

    def _publish_elsewhere(self, verb: str, topic_name: str, bodies: list[bytes], defer: float) -> bytes:
        """A publish to a topic another worker owns: sent there (batched with the step's other records, see
        nsqd/workers.py) and acknowledged at once (``WorkerMesh.publish_acknowledged`` says why that is safe).
        While the owner's disk refuses that topic, its OK is put in the output instead, and nothing of the output
        is written until every publish sent so is answered (``_forwards_held``), so answers keep their order while
        the connection goes on reading. A refusal replaces that OK with ``E_<VERB>_FAILED`` and closes the
        connection, as a failed publish does (``_forward_answered``)."""
        assert self._mesh is not None
        if self._mesh.publish_acknowledged(topic_name, bodies, defer):
            self.client.published(topic_name, len(bodies))
            if self._reply_deferred or self._poller.defer_reply(self):  # in a poller step: the step's end
                self._reply_deferred = True
                self._hand_to = self._mesh.owner(topic_name)
            return OK_FRAME
        self._mesh.publish_soon(topic_name, bodies, defer, self.hold_oks(1, self._mesh.owner(topic_name), verb))
        self.client.published(topic_name, len(bodies))
        return _ANSWER_QUEUED

    def hold_oks(self, count: int, owner: int, verb: str = "PUB") -> Callable[[str | None], None]:
        """Put ``count`` OKs in the output, held with everything after them until the returned function gets the
        answer of worker ``owner`` (``_publish_elsewhere``; the fast path's batches too, ``fastpath.PublishBatch``).
        Once no publish is held any more and the last was taken, the producer goes to ``owner`` (``hand_over``)
        if its OKs leave in the step that read the answer: in durable mode, where every publish that crosses
        waits so (an OK only after the owner's fsync), its later publishes then cross nothing and share the
        owner's group commit with its other producers', as with one nsqd."""
        client = self.client
        index = len(client.out)
        data = OK_FRAME * count
        client.out.append(data)
        client.out_bytes += len(data)
        self._forwards_held += 1
        return partial(self._forward_answered, index, verb, owner)

    def _forward_answered(self, index: int, verb: str, owner: int, reason: str | None) -> None:
        if self._forward_failed:
            return
        client = self.client
        self._forwards_held -= 1
        if reason is not None:
            error = ProtocolError(f"E_{verb}_FAILED", f"{verb} failed {reason}")
            log.error("[%s] - %s", client.remote_address, error.payload().decode("utf-8", "replace"))
            self._forward_failed = True
            self._forwards_held = 0
            out = client.out
            if index < len(out):  # the output was held since that OK went in: it is still there
                out[index] = encode_frame(FRAME_TYPE_ERROR, error.payload())
                del out[index + 1 :]
                client.out_bytes = sum(len(piece) for piece in out)
            self._stop_reading()
        if self._forwards_held == 0:
            done, self._forwards_done = self._forwards_done, None
            if done is not None:
                done.set()
            client.flush_now = True
            if reason is None and (self._reply_deferred or self._poller.defer_reply(self)):
                self._reply_deferred = True  # written at the step's end (``send_deferred``), then handed over
                self._hand_to = owner
            self._send_replies()

    async def _forwards_answered(self) -> None:
        """Wait until no publish sent to its owner waits for its answer."""
        while self._forwards_held:
            if self._forwards_done is None:
                self._forwards_done = trio.Event()
            await self._forwards_done.wait()

    # -- reading through the poller (plain TCP) ----------------------------------------------------
    async def _receive_polled(self) -> bytes | None:
        """Wait in the daemon's ``ReadPoller`` instead of a task wake-up per read: while this task waits,
        the poller reads the socket and runs the commands itself (``poll_ready``). Returns b"" at EOF, None
        when the poller stopped at a command that must await (``_pending_command``) or at an error
        (``_poller_error``), both for this task to take over; raises a read error as ``OSError``."""
        poller = self._poller
        self._poll_fd = fd = self.stream.socket.fileno()  # type: ignore[attr-defined]  # a SocketStream here
        self._poll_result = None
        self._poll_done = done = trio.Event()
        self.fast_line = self.parser.last_pub() if self._plain else None
        poller.add(fd, self)
        try:
            await done.wait()
        finally:
            poller.discard(fd)
        result = self._poll_result
        if isinstance(result, OSError):
            raise result
        return result

    def poll_ready(self) -> None:
        """Called by the poller when the socket is readable; never raises. Whatever this cannot finish goes
        back to the connection's task, which the poller stops watching for at once.
        A read of nothing but PUBs of the connection's last PUB line goes to the step's ``PublishBatch``
        (``nsqd/fastpath.py``) when nothing else is to be checked for them (``fast_pub``). In durable mode an OK
        that a sync must precede is left to the writer (``PublishBatch``), as ``_flush_direct`` leaves it.
        The producers ready at the start of a step are read together instead (``PublishBatch.read_producers``),
        which calls ``fast_read`` or ``poll_data`` with what it read."""
        last = self.fast_pub()
        try:
            if last is not None:
                data = read_pubs(self._poll_fd, last[0], self.parser.max_msg_size)
                if data is None:
                    return
                if type(data) is tuple:
                    self._publish_batch.add(self, last[1], data[1])
                    self.fast_read(data[0])
                    return
            else:
                data = os.read(self._poll_fd, RECEIVE_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._poll_return(exc)
            return
        self.poll_data(data)

    def fast_pub(self) -> tuple[bytes, bytes] | None:
        """The line and topic of the PUBs a read may hand to the step's ``PublishBatch`` without the parser
        (``fast_line``, the parser's ``last_pub``), when nothing else is to be checked for them: no auth, no TLS
        requirement, never subscribed, no replication (its OKs wait for the peers; all four in ``_plain``),
        nothing unsent before them and no write of the writer's under way (the batch writes its OKs at the step's
        end). None when the read goes to the parser. The checks are ``fastpath.fast_line_of``'s, which the reads
        of a step's producers make too."""
        return fast_line_of(self)

    def fast_read(self, size: int) -> None:
        """A read of ``size`` bytes went to the step's ``PublishBatch``."""
        self.last_read = size
        if self._poller.step_time > self._read_moves_at:  # the step's clock: one call per step
            self._set_read_deadline()

    def poll_data(self, data) -> None:
        """What a read in the poller gave that is not for the ``PublishBatch``: bytes for the parser, b"" at end of
        input, None when there was nothing to read, the ``OSError`` of a failed read. Never raises."""
        if data is None:
            return
        if type(data) is not bytes:
            self._poll_return(data)
            return
        if not data:
            self._poll_return(b"")
            return
        self.last_read = len(data)
        try:
            self.parser.receive_data(data)
            command = self._run_commands()
        except Exception as exc:  # the task raises it again where its own loop handles errors
            self._poller_error = exc
            self._poll_return(None)
            return
        if command is not None:
            self._pending_command = command
            self._poll_return(None)
            return
        self.fast_line = self.parser.last_pub() if self._plain else None
        if self._poller.step_time > self._read_moves_at:
            self._set_read_deadline()

    @property
    def poll_fd(self) -> int:
        return self._poll_fd

    def answer_later(self, data: bytes) -> None:
        """OKs of a ``PublishBatch`` that could not be written at once: through the output buffer, as any answer."""
        client = self.client
        client.out.append(data)
        client.out_bytes += len(data)
        client.flush_now = True
        self._send_replies()

    def fast_publish_failed(self, error: ProtocolError) -> None:
        """A ``PublishBatch`` publish failed: the connection's task reports the fatal error and closes, as when a
        PUB run by ``_run_commands`` raises it."""
        self._poller_error = error
        self._poll_return(None)

    def _poll_return(self, result) -> None:
        self._poller.discard(self._poll_fd)
        self._poll_result = result
        self._poll_done.set()

    def _send_replies(self) -> None:
        """Send what the commands of one receive buffer answered, from the reading task, in one
        non-blocking write, when that cannot reorder anything: a plain socket (no TLS/compression
        layer) and the writer not holding data (``_send_lock`` free). What the socket does not take,
        or any error, is left to the writer task, which keeps the write deadline and the error
        handling. Saves a task switch and a ``send_all`` per round trip of a PUB producer.
        While a disk sync is owed (durable mode), the writer sends instead: it commits the sync
        barrier first, once for all the connections whose readers ran in the meantime (group commit)."""
        if self._reply_deferred:
            return
        if self._poller.defer_reply(self):
            self._reply_deferred = True
            return
        if not self._flush_direct() and not self._await_ack_directly():
            self.client.wake_writer()

    def send_deferred(self) -> None:
        self._reply_deferred = False
        if not self._flush_direct() and not self._await_ack_directly():
            self._hand_to = None
            self.client.wake_writer()
            return
        if self._hand_to is not None:
            owner, self._hand_to = self._hand_to, None
            self.hand_over(owner)

    def hand_over(self, owner: int) -> bool:
        """Give this producer's connection to worker ``owner``, the owner of the topic it just published to,
        if it is a plain producer waiting in the read poller with nothing unsent, unanswered or to be run, and
        never handed over before (see "Connections go to their topic's owner" in bench/MULTICORE.md). The
        task here then ends without a word to the client; the other worker goes on reading the socket, so the
        client sees one connection. True if it was handed over."""
        return self._give_producer(owner, spread=False)

    def spread_to(self, peer: int) -> bool:
        """In the owner of a topic it published to, give this producer to worker ``peer``, so that its reads and
        parsing run on another core and only its messages cross (``WorkerMesh.spread``: the owner is busy, the
        peer and the machine are not). As ``hand_over``: a plain producer waiting in the read poller with nothing
        unsent, unanswered or to be run; once (it stays in ``peer``, ``Client.spread``). True if it went."""
        client = self.client
        mesh = self._mesh
        if (
            mesh is None
            or client.spread
            or self._reply_deferred
            or not any(mesh.owns(topic) for topic in client.pub_counts)
        ):
            return False
        return self._give_producer(peer, spread=True)

    def _give_producer(self, worker: int, *, spread: bool) -> bool:
        """``hand_over`` and ``spread_to``: a producer waiting in the read poller with nothing to be run goes to
        ``worker`` (``_hand_over_unread``), and the task here ends. True if it went."""
        done = self._poll_done
        if done is None or done.is_set() or self._pending_command is not None or self._poller_error is not None:
            return False
        if not self._hand_over_unread(worker, b"", spread=spread):
            return False
        self._poll_return(None)
        return True

    def _hand_over_unread(self, owner: int, first: bytes, *, spread: bool = False) -> bool:
        """``hand_over``'s checks of the connection and the hand-over itself, with ``first`` (a command that the
        owner is to run first; a consumer's SUB was, see "Connections go to their topic's owner" in
        bench/MULTICORE.md) before the bytes the parser holds. True if it was handed over; the task ends at its
        next read. A producer goes only while the owner is not busy (``may_hand_over``); a consumer (``first``,
        its SUB) goes whatever the owner's load: the owner does its channel's work either way, and serving it
        through a stand-in costs the owner more than serving its socket (bench/MULTICORE.md, "Latency and a hot
        channel's consumers")."""
        client = self.client
        if (
            self._mesh is None
            or (client.handed_over and not spread)
            or not self._plain
            or self._consumes
            or client.state != ClientState.INIT
            or type(self.stream) is not trio.SocketStream
            or client.out
            or self._forwards_held
            or self._send_lock.locked()
            or not self.parser.between_commands()
            or not (first or spread or self._mesh.may_hand_over(owner))
        ):
            return False
        fd = self.stream.socket.fileno()
        self._mesh.hand_over(owner, fd, client, first + self.parser.take_unparsed(), spread=spread)
        self._handed = True
        return True

    def _await_ack_directly(self) -> bool:
        """Replication: when the OKs in the output wait only for the peers (``replicated_seq`` above ``acked``),
        have the ACK that covers them write them (``Replicator.call_when_acked``), with no task switch: the
        writer task stays asleep (waking it, and waking it again once it waited for the ACK, cost two task
        switches per publish). True if so (or if such a call is already registered); False when the writer must
        handle it (not a plain socket, a write or a sync in progress, degraded)."""
        replication = self.nsqd.replication
        if replication is None or replication.degraded or not self._may_write_directly():
            return False
        seq = self.client.replicated_seq
        if seq <= replication.acked:
            return False  # not held for the peers: a write the socket did not take all of, for the writer
        if self._ack_wait < seq:
            if self._ack_wait:
                return True  # the registered call comes first and waits again for the rest (``_acked``)
            self._ack_wait = seq
            replication.call_when_acked(seq, self._acked)
        return True

    def _acked(self) -> None:
        """An ACK covered ``_ack_wait`` (or the replicator's state changed): write what waited, wait again for a
        later publish's seq, or leave it to the writer."""
        self._ack_wait = 0
        self._send_replies()

    def _may_write_directly(self) -> bool:
        """Whether a write from outside the writer task cannot reorder anything: a plain socket (no TLS or
        compression layer), no write of the writer's under way (``_send_lock``), no disk sync owed (durable mode:
        the writer commits it first)."""
        return (
            type(self.stream) is trio.SocketStream
            and not self._send_lock.locked()
            and not self.nsqd.sync_barrier
            and not self._forwards_held
        )

    def _flush_direct(self) -> bool:
        """Write the whole output buffer now, without awaiting, if that cannot reorder anything (the
        conditions of ``_send_replies``); True if all of it left. Otherwise what is left stays first in
        the buffer, marked for an immediate flush, and the caller wakes the writer. The channel's
        dispatcher calls it too (``Client.direct_flush``) for consumers it asks to flush, which saves
        a wake-up of the writer task per delivered batch."""
        if not self._may_write_directly():
            return False
        client = self.client
        replication = self.nsqd.replication
        if replication is not None and client.replicated_seq > replication.acked:
            return False  # the writer sends once the peers hold what an OK here acknowledges
        data = client.take_output()
        if not data:
            return True
        try:
            sent = os.write(self.stream.socket.fileno(), data)  # type: ignore[attr-defined]  # a SocketStream here
        except OSError:
            sent = 0
        if sent == len(data):
            return True
        rest = data[sent:]
        client.out.insert(0, rest)
        client.out_bytes += len(rest)
        client.flush_now = True
        return False

    async def _writer(self) -> None:
        client = self.client
        lock = self._send_lock
        try:
            while True:
                if not client.out:
                    if client.draining:
                        return
                    await client.writer_wait_event().wait()
                    continue
                if not client.flush_now and not client.draining:
                    # message frames only: batch them until the flush timer expires or a flush is asked for
                    timeout = client.output_buffer_timeout
                    deadline = trio.current_time() + timeout if timeout > 0 else math.inf
                    while not client.flush_now and not client.draining:
                        with trio.move_on_at(deadline):
                            await client.writer_wait_event().wait()
                        if trio.current_time() >= deadline:
                            break
                replication = self.nsqd.replication
                while replication is not None and client.replicated_seq > replication.acked:
                    # nothing leaves before the peers hold what an OK in it acknowledges (nsqd/replication/);
                    # a publish read while this waited raised replicated_seq: its OK waits too
                    if not await replication.wait_acked(client.replicated_seq, self._flush_direct):
                        log.error(
                            "[%s] - replication degraded before a publish was acknowledged, closing",
                            client.remote_address,
                        )
                        client.out.clear()
                        self._stop_reading()
                        return
                    if replication.degraded:
                        break  # ``accept``: taken unreplicated, answered now
                if self._forwards_held:
                    await self._forwards_answered()  # publishes sent to their topic's worker (_publish_elsewhere)
                    continue
                try:
                    lock.acquire_nowait()
                except trio.WouldBlock:
                    await lock.acquire()  # an upgrade is under way; what follows goes through its layers
                if self._forwards_held:  # a publish read meanwhile
                    lock.release()
                    continue
                try:
                    data = client.take_output()
                    barrier = self.nsqd.sync_barrier
                    if barrier and not barrier.commit() and client.commit_verbs:
                        # group commit: what an OK here acknowledges is on disk, or the OK does not leave: the
                        # publishes it covered fail as nsqd fails a publish it could not store (fatal: closed)
                        log.error(
                            "[%s] - a disk sync failed before %d publish(es) were acknowledged: E_*_FAILED, closing",
                            client.remote_address,
                            len(client.commit_verbs),
                        )
                        data = fail_publish_oks(data, client.commit_verbs)
                        client.commit_verbs = []
                        with trio.move_on_after(1):
                            await self.stream.send_all(data)
                        self._stop_reading()
                        return
                    if client.commit_verbs:
                        client.commit_verbs = []
                    if not data:
                        continue
                    sent = self._write_now(data)
                    if sent < len(data):
                        interval = client.heartbeat_interval
                        with trio.move_on_after(interval if interval > 0 else math.inf) as scope:
                            await self.stream.send_all(memoryview(data)[sent:] if sent else data)
                        timed_out = scope.cancelled_caught
                    else:
                        timed_out = False
                finally:
                    lock.release()
                if timed_out:
                    log.error("[%s] - write deadline exceeded, closing", client.remote_address)
                    self._stop_reading()
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("[%s] - write failed: %s", client.remote_address, exc)
            self._stop_reading()
        finally:
            self._writer_done.set()

    def _write_now(self, data: bytes) -> int:
        """Write what the socket takes right now, without awaiting (plain TCP only); returns the
        bytes written. Most flushes fit the socket buffer, so this skips trio's send machinery."""
        stream = self.stream
        if type(stream) is not trio.SocketStream:
            return 0
        try:
            return os.write(stream.socket.fileno(), data)
        except (BlockingIOError, InterruptedError):
            return 0

    def _stop_reading(self) -> None:
        if self._read_scope is not None:
            self._read_scope.cancel()
        if self._poll_fd >= 0:  # the poller runs no more of its commands before the task ends the loop
            self._poller.discard(self._poll_fd)

    # -- checks ----------------------------------------------------------------------------------
    def _line_check(self, name: bytes, params: tuple) -> None:
        """Checks nsqd makes before reading a command's body: the TLS policy (every command but
        IDENTIFY), IDENTIFY and AUTH only in init, and MPUB's permission (nsqd checks it before the body)."""
        if self._tls_required and not self.client.tls and name != b"IDENTIFY":
            raise ProtocolError("E_INVALID", f"cannot {_text(name)} in current state (TLS required)")
        if name == b"MPUB" and self._auth_enabled and params and is_valid_name_bytes(params[0]):
            self._authorize_before_body("MPUB", _text(params[0]))
        if name in _INIT_ONLY_WITH_BODY and self.client.state != ClientState.INIT:
            raise ProtocolError("E_INVALID", f"cannot {name.decode()} in current state")

    def _require_state(self, name: str, *states: ClientState) -> None:
        if self.client.state not in states:
            raise ProtocolError("E_INVALID", f"cannot {name} in current state")

    # -- commands --------------------------------------------------------------------------------
    async def IDENTIFY(self, command) -> bytes | None:
        client = self.client
        self._require_state("IDENTIFY", ClientState.INIT)
        limits = self.nsqd.identify_limits
        result = negotiate(command.body, limits)
        first = not client.identified
        if result.client_id is not None:
            client.client_id = result.client_id
        if result.hostname is not None:
            client.hostname = result.hostname
        if result.user_agent is not None:
            client.user_agent = result.user_agent
        if first:
            client.identified = True
            client.heartbeat_interval = result.heartbeat_interval_ms / 1000 if result.heartbeat_interval_ms > 0 else 0.0
            client.output_buffer_size = result.output_buffer_size
            client.output_buffer_timeout = result.output_buffer_timeout_ms / 1000
            client.sample_rate = result.sample_rate
            client.msg_timeout = result.msg_timeout_ms / 1000
            self._heartbeat_timer.schedule(client, client.heartbeat_interval)
            if self._read_scope is not None:
                self._set_read_deadline()
        log.info(
            "[%s] IDENTIFY: client_id=%r hostname=%r user_agent=%r",
            client.remote_address,
            client.client_id,
            client.hostname,
            client.user_agent,
        )
        if not first:
            # a repeated IDENTIFY is accepted with a plain OK: no negotiation, no upgrade (nsqd does so)
            return OK_FRAME
        response = encode_frame(FRAME_TYPE_RESPONSE, result.response(limits))
        if result.tls or result.snappy or result.deflate:
            await self._upgrade(response, result)
            return None
        return response

    async def _upgrade(self, response: bytes, result) -> None:
        """nsqd's order: the IDENTIFY response in clear, then TLS, then snappy or deflate, each layer
        confirmed by an ``OK`` sent through it. Bytes the client sent after IDENTIFY already belong to
        the new layers (``take_unparsed``). The writer is held off meanwhile (``_send_lock``)."""
        client = self.client
        leftover = self.parser.take_unparsed()
        await self._forwards_answered()  # (the poller reads nothing meanwhile: this task runs the commands)
        client.write_frame(response)
        async with self._send_lock:
            try:
                data = client.take_output()
                if self.nsqd.sync_barrier:
                    self.nsqd.sync_barrier.commit()
                await self._send_now(self.stream, data)
                stream = self.stream
                if result.tls:
                    log.info("PROTOCOL(V2): [%s] upgrading connection to TLS", client.remote_address)
                    ssl_stream = trio.SSLStream(
                        PrefixedStream(stream, leftover), self.nsqd.tls_context, server_side=True, https_compatible=True
                    )
                    leftover = b""
                    with trio.move_on_after(TLS_HANDSHAKE_TIMEOUT) as scope:
                        try:
                            await ssl_stream.do_handshake()
                        except trio.BrokenResourceError as exc:
                            raise _UpgradeFailed(f"TLS handshake failed: {exc.__cause__ or exc}") from None
                    if scope.cancelled_caught:
                        raise _UpgradeFailed("TLS handshake timed out")
                    info = tls_info(ssl_stream)
                    client.tls = True
                    client.tls_version = info.version
                    client.tls_cipher_suite = info.cipher_suite
                    client.tls_negotiated_protocol = info.negotiated_protocol
                    client.tls_negotiated_protocol_is_mutual = True
                    client.tls_common_name = info.common_name
                    self.stream = stream = ssl_stream
                    await self._send_now(stream, OK_FRAME)
                if result.snappy or result.deflate:
                    if result.snappy:
                        log.info("PROTOCOL(V2): [%s] upgrading connection to snappy", client.remote_address)
                        codec: tuple[SnappyEncoder | DeflateEncoder, SnappyDecoder | DeflateDecoder]
                        codec = SnappyEncoder(), SnappyDecoder()
                        client.snappy = True
                    else:
                        log.info(
                            "PROTOCOL(V2): [%s] upgrading connection to deflate (level %d)",
                            client.remote_address,
                            result.deflate_level,
                        )
                        codec = DeflateEncoder(result.deflate_level), DeflateDecoder()
                        client.deflate = True
                        client.deflate_level = result.deflate_level
                    self.stream = stream = CompressedStream(stream, codec[0], codec[1], initial=leftover)
                    await self._send_now(stream, OK_FRAME)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise _UpgradeFailed(f"upgrade failed: {exc}") from None

    async def _send_now(self, stream, data: bytes) -> None:
        interval = self.client.heartbeat_interval
        with trio.move_on_after(interval if interval > 0 else math.inf) as scope:
            await stream.send_all(data)
        if scope.cancelled_caught:
            raise _UpgradeFailed("write deadline exceeded during the upgrade")

    async def AUTH(self, command) -> bytes:
        client = self.client
        self._require_state("AUTH", ClientState.INIT)
        if client.authed:
            raise ProtocolError("E_INVALID", "AUTH already set")
        if not self._auth_enabled:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        client.auth_secret = command.body
        try:
            client.auth_state = await self._query_auth()
        except AuthError as exc:
            # the cause stays in the log: an untrusted client learns nothing about the auth servers
            log.warning("PROTOCOL(V2): [%s] AUTH failed %s", client.remote_address, exc)
            raise ProtocolError("E_AUTH_FAILED", "AUTH failed") from None
        if not client.authed:
            raise ProtocolError("E_UNAUTHORIZED", "AUTH no authorizations found")
        log.info(
            "PROTOCOL(V2): [%s] AUTH identity=%r permissions=%d",
            client.remote_address,
            client.auth_identity,
            len(client.auth_state.authorizations),
        )
        return encode_frame(FRAME_TYPE_RESPONSE, client.auth_state.response())

    async def _query_auth(self):
        client = self.client
        return await self.nsqd.authenticator.query(
            remote_ip=_remote_ip(client.remote_address),
            tls=client.tls,
            common_name=client.tls_common_name,
            secret=client.auth_secret,
        )

    def _auth_refresh_due(self) -> bool:
        """Before SUB/PUB/MPUB/DPUB (auth enabled): forget the last refresh's outcome; True when the cached
        answer's TTL has passed, so the auth server must be asked again (``_refresh_expired_auth``)."""
        self._auth_refresh_error = None
        self._authed_before_refresh = None
        state = self.client.auth_state
        return state is not None and state.expired(trio.current_time())

    async def _refresh_expired_auth(self) -> None:
        """Ask the auth server again (``_auth_refresh_due`` said so). A failure is kept for ``_authorize``,
        which reports it after the command's own checks."""
        client = self.client
        self._authed_before_refresh = client.authed
        try:
            client.auth_state = await self._query_auth()
        except AuthError as exc:
            self._auth_refresh_error = exc

    def _authorize(self, verb: str, topic: str, channel: str) -> None:
        """nsqd's permission check (auth enabled): AUTH first, a failed re-query, then the rules."""
        client = self.client
        authed = self._authed_before_refresh
        self._authed_before_refresh = None
        if not (client.authed if authed is None else authed):
            raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {verb}")
        error = self._auth_refresh_error
        if error is not None:
            self._auth_refresh_error = None
            log.warning("PROTOCOL(V2): [%s] auth failed - %s", client.remote_address, error)
            raise ProtocolError("E_AUTH_FAILED", "AUTH failed")
        if not client.auth_state.allows(topic, channel):
            raise ProtocolError("E_UNAUTHORIZED", f"AUTH failed for {verb} on {go_quote(topic)} {go_quote(channel)}")

    def _authorize_before_body(self, verb: str, topic: str) -> None:
        """MPUB's check before its body, as far as the cached answer decides it (an expired answer is
        re-queried after the body, when the connection may wait)."""
        client = self.client
        if not client.authed:
            raise ProtocolError("E_AUTH_FIRST", f"AUTH required before {verb}")
        if not client.auth_state.expired(trio.current_time()) and not client.auth_state.allows(topic, ""):
            raise ProtocolError("E_UNAUTHORIZED", f"AUTH failed for {verb} on {go_quote(topic)} {go_quote('')}")

    def SUB(self, command) -> bytes:
        client = self.client
        self._require_state("SUB", ClientState.INIT)
        if client.heartbeat_interval <= 0:
            raise ProtocolError("E_INVALID", "cannot SUB with heartbeats disabled")
        params = command.params
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = _text(params[0])
        channel_name = _text(params[1])
        if not is_valid_topic_name(topic_name):
            raise ProtocolError("E_BAD_TOPIC", f"SUB topic name {go_quote(topic_name)} is not valid")
        if not is_valid_channel_name(channel_name):
            raise ProtocolError("E_BAD_CHANNEL", f"SUB channel name {go_quote(channel_name)} is not valid")
        if self._auth_enabled:
            self._authorize("SUB", topic_name, channel_name)
        if self.nsqd.exiting:
            raise ProtocolError("E_SUB_FAILED", "SUB failed to deleted topic/channel")
        if self._mesh is not None and not self._mesh.owns(topic_name):
            self._forward = ("sub", topic_name, channel_name)
            return _FORWARD
        topic = self.nsqd.get_topic(topic_name)
        channel = topic.get_channel(channel_name)
        if channel.log is not None:
            raise ProtocolError("E_INVALID", f"SUB channel {topic_name}:{channel_name} is a log, read it with LREAD")
        limit = self.opts.max_channel_consumers
        if limit and len(channel.clients) >= limit:
            raise ProtocolError(
                "E_SUB_FAILED", f"SUB failed consumers for {topic_name}:{channel_name} exceeds limit of {limit}"
            )
        channel.add_client(client)
        client.channel = channel
        self.poll_actor = channel.dispatcher
        self._consumes = True  # what it publishes may come back here now
        self._plain = False
        self.fast_line = None
        client.state = ClientState.SUBSCRIBED
        log.info("[%s] SUB %s:%s", client.remote_address, topic_name, channel_name)
        return OK_FRAME

    def RDY(self, command) -> None:
        client = self.client
        if client.state == ClientState.CLOSING:
            return None
        self._require_state("RDY", ClientState.SUBSCRIBED)
        count = 1
        if command.params:
            raw = command.params[0]
            try:
                count = parse_base10(raw)
            except ValueError:
                raise ProtocolError("E_INVALID", f"RDY could not parse count {_text(raw)}") from None
        limit = self.opts.max_rdy_count
        if count > limit:
            raise ProtocolError("E_INVALID", f"RDY count {count} out of range 0-{limit}")
        client.rdy = count
        client.channel.client_credit_changed(client)
        return None

    def FIN(self, command) -> None:
        # the hottest command of a consumer: the checks of _require_state and _message_id, inlined
        client = self.client
        if client.state not in _FIN_STATES:
            raise ProtocolError("E_INVALID", "cannot FIN in current state")
        msg_ids = command[2]
        if msg_ids is not None:
            # a run of FIN lines read at once (see protocol.commands.Command): finished in one call, each
            # refused one answered as the read loop answers a non-fatal error
            for msg_id, reason in client.channel.finish_many(client, msg_ids):
                error = ProtocolError("E_FIN_FAILED", f"FIN {_text(msg_id)} failed {reason}")
                client.write_frame(encode_frame(FRAME_TYPE_ERROR, error.payload()))
            return None
        params = command[1]
        if not params:
            raise ProtocolError("E_INVALID", "FIN insufficient number of params")
        msg_id = params[0]
        if len(msg_id) != MESSAGE_ID_LENGTH:
            raise ProtocolError("E_INVALID", "invalid message ID")
        try:
            client.channel.finish(client, msg_id)
        except ChannelError as error:
            raise ProtocolError("E_FIN_FAILED", f"FIN {_text(msg_id)} failed {error}") from None
        return None

    def REQ(self, command) -> None:
        client = self.client
        self._require_state("REQ", ClientState.SUBSCRIBED, ClientState.CLOSING)
        params = command.params
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "REQ insufficient number of params")
        msg_id = _message_id(params)
        try:
            delay_ns = ms_to_go_duration(parse_base10(params[1]))
        except ValueError:
            raise ProtocolError("E_INVALID", f"REQ could not parse timeout {_text(params[1])}") from None
        # clamped to [0, max-req-timeout], no error (nsqd >= 1.1)
        delay = min(max(delay_ns, 0) / 1e9, self.opts.max_req_timeout)
        try:
            client.channel.requeue(client, msg_id, delay)
        except ChannelError as error:
            raise ProtocolError("E_REQ_FAILED", f"REQ {_text(msg_id)} failed {error}") from None
        return None

    def TOUCH(self, command) -> None:
        client = self.client
        self._require_state("TOUCH", ClientState.SUBSCRIBED, ClientState.CLOSING)
        if not command.params:
            raise ProtocolError("E_INVALID", "TOUCH insufficient number of params")
        msg_id = _message_id(command.params)
        try:
            client.channel.touch(client, msg_id, client.msg_timeout)
        except ChannelError as error:
            raise ProtocolError("E_TOUCH_FAILED", f"TOUCH {_text(msg_id)} failed {error}") from None
        return None

    def CLS(self, command) -> bytes:
        client = self.client
        self._require_state("CLS", ClientState.SUBSCRIBED)
        client.rdy = 0
        client.state = ClientState.CLOSING
        if self._mesh is not None:
            client.channel.client_credit_changed(client)  # a channel in another worker learns of it
        log.info("[%s] CLS: closing", client.remote_address)
        return CLOSE_WAIT_FRAME

    def NOP(self, command) -> None:
        return None

    # -- log channels (LOG-PROTOCOL.md) ----------------------------------------------------------------
    def _log_request(self, command):
        """The checks every log command makes, in this order: state, parameters, permission, shutdown."""
        verb = command[0].decode()
        if self.client.state != ClientState.INIT:
            raise ProtocolError("E_INVALID", f"cannot {verb} in current state")
        request = parse_log_request(command[0], command[1])
        if self._auth_enabled:
            self._authorize(verb, request.topic, request.channel)
        if self.nsqd.exiting:
            raise ProtocolError(E_LOG_FAILED, f"{verb} failed exiting")
        return request

    def _log_command(self, command) -> Any:
        """LOG, LSEEK, LREAD, LCOMMIT: answered here, or with ``--workers`` by the worker that owns the topic
        (nsqd/workers.py), which runs the same ``log_commands.answer`` on the request checked here."""
        request = self._log_request(command)
        if self._mesh is not None:
            self._forward = ("log", request)  # ``WorkerMesh.log_command``
            return _FORWARD
        return log_commands.answer(self.nsqd, request)

    LOG = LSEEK = LREAD = LCOMMIT = _log_command

    def _publish(self, verb: str, topic_name: str, bodies: list[bytes], defer: float = 0.0) -> bytes:
        """PUB, MPUB, DPUB: ``_publish_stored`` of a connection that never subscribed, ``_publish_answering_first``
        of one that did (a flag, not a bound method kept per connection: one object fewer for the collector)."""
        if self._mesh is not None and not self._mesh.owns(topic_name):
            return self._publish_elsewhere(verb, topic_name, bodies, defer)
        if self._consumes:
            return self._publish_answering_first(verb, topic_name, bodies, defer)
        return self._publish_stored(verb, topic_name, bodies, defer)

    def _publish_stored(self, verb: str, topic_name: str, bodies: list[bytes], defer: float = 0.0) -> bytes:
        """The publish of a connection that never subscribed: what it publishes cannot come back to it, so its OK
        is appended by the command loop after the publish, as any answer."""
        topic = self.nsqd.get_topic(topic_name)
        replication = self.nsqd.replication
        if replication is not None and replication.refusing():
            raise ProtocolError(f"E_{verb}_FAILED", f"{verb} failed replication degraded")
        try:
            topic.publish(bodies, defer, defer_sync=True)  # synced before the OK leaves (_writer)
            if self.nsqd.sync_barrier:
                self.client.commit_verbs.append(verb)
        except TopicExiting:
            raise ProtocolError(f"E_{verb}_FAILED", f"{verb} failed exiting") from None
        except TopicFull as exc:
            raise ProtocolError(f"E_{verb}_FAILED", f"{verb} failed {exc}") from None
        if replication is not None:
            self.client.replicated_seq = replication.seq  # the writer holds the OK until peers have it
        self.client.published(topic_name, len(bodies))
        return OK_FRAME

    def _publish_answering_first(self, verb: str, topic_name: str, bodies: list[bytes], defer: float = 0.0) -> bytes:
        """``_publish`` of a connection that consumes: the hand-off to the channels may deliver to this very
        connection inside the publish (a quiet channel's slice runs at once, appends message frames to the output
        buffer and may write them), so the OK goes into the buffer first. A publish that fails raises before it
        stores or hands over anything, so that OK is then still the buffer's last piece and is taken back."""
        client = self.client
        out = client.out
        out.append(OK_FRAME)
        client.out_bytes += len(OK_FRAME)
        try:
            self._publish_stored(verb, topic_name, bodies, defer)
        except ProtocolError:
            out.pop()
            client.out_bytes -= len(OK_FRAME)
            raise
        return _ANSWER_QUEUED

    def PUB(self, command) -> bytes:
        if self._auth_enabled:
            self._authorize("PUB", _text(command.params[0]), "")
        if self.nsqd.exiting:
            raise ProtocolError("E_PUB_FAILED", "PUB failed exiting")
        return self._publish("PUB", _text(command.params[0]), [command.body])

    def MPUB(self, command) -> bytes:
        if self._auth_enabled:
            self._authorize("MPUB", _text(command.params[0]), "")
        if self.nsqd.exiting:
            raise ProtocolError("E_MPUB_FAILED", "MPUB failed exiting")
        return self._publish("MPUB", _text(command.params[0]), command.body)

    def DPUB(self, command) -> bytes:
        if self._auth_enabled:
            self._authorize("DPUB", _text(command.params[0]), "")
        if self.nsqd.exiting:
            raise ProtocolError("E_DPUB_FAILED", "DPUB failed exiting")
        delay = max(ms_to_go_duration(parse_base10(command.params[1])), 0) / 1e9
        return self._publish("DPUB", _text(command.params[0]), [command.body], delay)


def fail_publish_oks(data: bytes, verbs: list[str]) -> bytes:
    """``data`` (frames for the client) with the OKs of the publishes ``verbs`` (the last ``len(verbs)`` OK
    responses in it, in order) turned into their ``E_<VERB>_FAILED`` errors: the sync that was to cover them
    failed. Other frames (messages, other answers) are left as they are."""
    oks = []
    pos = 0
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        if data[pos : pos + 4 + size] == OK_FRAME:
            oks.append(pos)
        pos += 4 + size
    failed = oks[len(oks) - len(verbs) :] if len(verbs) <= len(oks) else oks
    verbs = verbs[len(verbs) - len(failed) :]
    parts, last = [], 0
    for at, verb in zip(failed, verbs, strict=True):
        parts.append(data[last:at])
        parts.append(encode_frame(FRAME_TYPE_ERROR, f"E_{verb}_FAILED {verb} failed sync".encode()))
        last = at + len(OK_FRAME)
    parts.append(data[last:])
    return b"".join(parts)


#: each command's method, called with the connection (one table for every connection: a table of bound methods
#: made per connection was a dozen more objects each for the cyclic collector to visit)
_HANDLERS: dict[bytes, Callable[[Connection, Any], Any]] = {
    b"FIN": Connection.FIN,
    b"RDY": Connection.RDY,
    b"REQ": Connection.REQ,
    b"PUB": Connection.PUB,
    b"MPUB": Connection.MPUB,
    b"DPUB": Connection.DPUB,
    b"NOP": Connection.NOP,
    b"TOUCH": Connection.TOUCH,
    b"SUB": Connection.SUB,
    b"CLS": Connection.CLS,
    b"IDENTIFY": Connection.IDENTIFY,
    b"AUTH": Connection.AUTH,
    b"LOG": Connection.LOG,
    b"LSEEK": Connection.LSEEK,
    b"LREAD": Connection.LREAD,
    b"LCOMMIT": Connection.LCOMMIT,
}
