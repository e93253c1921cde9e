"""Replication between trionsq nodes: a message acknowledged by one nsqd survives that machine's death.

The wire protocol (magic ``  R1`` on the ordinary TCP port) is in ``PROTOCOL.md`` next to this file and its
codec in ``protocol/replication.py``. This package holds the daemon's parts.

Why no consensus: NSQ promises at-least-once delivery and no ordering. A replica only has to *hold* a copy
until the origin's channels finished the message; after a takeover a message may come twice, never not at all.

Design
------
Origin (``sender.py``, ``Replicator``), on with ``--replicate-to`` (repeatable) and ``--replication-acks=N``
(default: all peers):

- ``NSQD.replication`` is the ``Replicator`` or None. With None nothing below runs: ``Topic.publish``,
  ``Channel._finished`` and the connection's writer look at one attribute per batch, never per message.
- A publish (``Topic.publish``) appends one MESSAGES frame per batch (built from the batch's IDs and bodies
  without a step per message) to the replicator's *outbox*, an ordered in-memory log of frames numbered by
  ``seq``, and the connection notes the outbox's last seq
  (``Client.replicated_seq``). FINs (``Channel._finished``) collect per (topic, channel) and become FINISHED
  frames when the sender next writes (FINs alone wait up to 5 ms for more); messages a channel puts back (REQ,
  in-flight timeouts) go the same way as REQUEUED frames, with their attempts and due time; channel and topic creation,
  deletion, pause and emptying become CHANNEL frames. Frames of ephemeral topics and channels are never made.
  A log channel's commit becomes the FINs of the messages it finishes (``log_committed``, the channel's
  ``on_log_commit``), and a channel made a log a CHANNEL frame of op LOG (protocol version 2); a peer on a
  version 1 stream gets op CREATED in its place, with the same seq (``_fallbacks``).
- One sender task per peer writes everything in the outbox past what it sent, in one write, and a reader task
  takes the peer's cumulative ACKs; on a plain TCP stream the node's read poller reads them too, between the
  connections it serves and in channel slices' interludes, and an ACK taken there sends the OKs it covers at
  once (``sender.py``: "Taking ACKs while the loop is busy"). A large batch's frame (or any frame while the peer
  acknowledged everything) is written by the publish itself when nothing is ahead of it on a plain TCP stream, so that
  the replica stores it while the origin handles the rest of what it read; what the socket does not take goes first in
  the sender task's next write. Frames go out without waiting for earlier ACKs. The quorum seq (``acked``) is the N-th
  highest ACK among the connected peers. Group commit: every publish of every connection handled meanwhile rides the
  same write and the same ACK, so replication costs one round trip per batch, as durable mode's fsync does
  (``queues/group_commit.py``).
- A connection's output waits while its ``replicated_seq`` is above ``acked``: no OK leaves before N peers hold
  what it acknowledges. On a plain TCP connection the ACK that covers it writes it (``call_when_acked``: a heap of
  calls and waiters by seq, so an ACK runs only those it covers); no task wakes for it (its writer woke twice per
  publish before: once to find the OK held, once at the ACK; MPUB x200 with replication went from 330-380k to
  426-466k msg/s, alternated runs). The writer waits itself (``wait_acked``) over TLS or compression, in durable
  mode, and when degraded. HTTP ``/pub`` and ``/mpub`` await the same.
- Frames leave the outbox once every peer acknowledged them. A peer that comes back within the same session
  resumes after its last ACK (the WELCOME says where). Any other peer (it restarted empty, or this node
  restarted) first gets a backfill (``snapshot.py``: everything this node holds unfinished, captured at once and
  streamed in bounded steps while publishes go on, seq 0, then SYNCED) and counts toward the acks once it
  acknowledged it.
- Epoch: ``replication.dat`` keeps how often this node's messages were adopted. A WELCOME with a higher epoch
  comes with the ids that peer adopted (ADOPTED frames, ``adopted.py``); at start-up (V2 clients wait until
  every peer answered or refused the connection; a slow one is tried again and waited for, 30 s at most) the
  node drops those it holds (the peer delivers them) and keeps the rest, those accepted unreplicated included.
  Later (a partition longer than the peer's takeover wait) it does the same when the stream returns: one owner
  per message. Adopted ids it no longer held were finished here: ``duplicates_after_takeover``.
- ``replication.dat`` also says whether the node is running: a start that finds ``running`` still true (a
  kill, without durable mode) or no file at all (an empty directory) sends ``clean: false`` in HELLO, and a
  replica holding copies of it takes them over instead of trusting the backfill, which may miss acknowledged
  messages the kill took from memory.
- Degraded (fewer than N peers connected): ``--replication-degraded=refuse`` answers publishes
  ``E_PUB_FAILED``/HTTP 503 and ``/ping`` NOK; a connection waiting for an ACK when the peers go is closed
  without its OK (its producer retries elsewhere: at-least-once). ``accept`` answers OK unreplicated, counts
  it, and sends it when the peers return.

- A peer gone for good (``--replication-replace-after``, ``--replication-candidates``): one that streamed since the
  start and then not for that long is replaced by the first candidate that takes a connection, which gets a backfill
  like any new peer (``Replicator._replace_gone``). ``replace.py`` (``PeerReplacer``): without candidates, the nodes
  nsqlookupd knows (spread by a hash of both names); the replacement kept in ``replication.peers.json``; the other
  peers reconnected to learn the new order; the old peer told, when it answers again, to drop its copies (HELLO
  ``release``), so nothing is delivered twice.
- Silence (``sender.py``: ``HEARTBEAT_INTERVAL``, ``PEER_TIMEOUT``): a stream without a write for 1 s gets a
  heartbeat, which the replica answers at once; a peer heard from neither by ACK nor by answer for 5 s is taken
  for gone and its connection closed. That bounds how long a publish waits on a peer that stopped answering (a
  partition either way, SIGSTOP, a vanished host): 5 s, then it is refused or taken unreplicated as degraded
  mode says (it was 15 s, the peer timeout before). A live peer stalled that long costs a reconnection, which
  resumes after its last ACK.
- Versions (``protocol/replication.py``: ``PROTOCOL_VERSION``, ``PROTOCOL_VERSION_MIN``, ``FRAME_VERSIONS``):
  HELLO carries the range the origin speaks, the replica answers in WELCOME the newest both speak, and each
  stream then sends only that version's frames (its decoders refuse later types, as an older node would), so a
  ring upgrades one node at a time. Version 2 adds PING/PONG (an idle stream's heartbeat, whose round trip
  ``/stats`` shows per peer), damaged queues named in SYNCED, RESTORE and RESTORED. A new frame type raises
  the version and is sent only where ``peer.version`` (origin) or the stream's version (replica) has it.
- Damage (queue files checked against their checksums, ``queues/checksums.py``): a backfill reads the disk
  backlogs as the queues read them (``queues/span.py``), so a damaged record is never sent, and on a version 2
  stream its SYNCED names each queue it found damaged, cut short or missing. Such a queue cannot say what it
  lost, so the replica sends back its copies of what those channels had not finished (RESTORE frames, then
  RESTORED), finished ones whose FINs it missed among them; the origin puts back, once, only those that match
  the side file entry of a record it lost (``restore.py``: all of them when the loss is not fully known), and
  does not replicate them again (the replica still holds them). A queue stays owed to a peer, named in every
  backfill to it, until its RESTORED came; damage found later, past what a peer's last backfill read, closes
  that peer's stream for a new backfill. A version 1 peer cannot send copies back: those records are lost, and
  logged.

Replica (``store.py``, ``ReplicaStore``; ``host.py``, ``ReplicaHost``), in every node:

- One store per origin node, in the data directory: a disk queue (``replica.<node>``, the ordinary
  ``DiskQueue`` in hold mode) of the received frames as they came, one record per frame, and
  ``replica.<node>.json`` with the origin's topics and channels (paused state) and epochs.
- In memory (``held.py``, ``HeldIndex``): message id -> the record of its MESSAGES frame (topic, arrival
  order, how many of its messages are still held, per channel the IDs that channel finished while others have
  not), with one *span* per frame whose IDs are sorted and overlap no other span (bisection over the spans,
  a set of the released IDs), and one dict entry per message for the other frames (adopted messages sent
  again, backfills, frames sent twice). A message is released once every channel that existed when it arrived has
  finished it (every channel of the topic if it had none then), or its channel/topic is deleted; a record is
  acknowledged in the disk queue once it holds none. FINs are applied per run of IDs of one record with C-level slice
  and set operations, and MESSAGES frames are indexed without decoding their messages: the replica takes no Python step
  per message. The disk queue's committed position is the oldest record still needed, so a restart replays from there:
  messages, then the FINs that followed them (a FIN record after the committed position is still on disk, one
  before it refers to a released message). Durable mode syncs each received batch before the ACK; otherwise the
  queue syncs by its own rules. A batch is written with its tokens known (``DiskQueue.put_many_held``: the
  reader is at the writer, so the records are held as written, never read back) and indexed after its ACK;
  what the socket already holds by then is stored and acknowledged first (``APPLY_LAG`` batches at most).
- A SYNCED naming damaged queues of the origin: the messages held from earlier streams that the backfill left out
  stay held for each damaged channel that had not finished them (for every unfinished channel when the topic's
  own queue is named) instead of being released, and are sent back as above.
- Its own damage: the store's disk queue keeps checksums too. A record found damaged (replayed at start-up,
  read back while a stream runs, replayed for a takeover) is logged, counted (``damaged_records`` per origin),
  never indexed nor delivered; the store forgets the origin's session, so the origin's next connection (a
  running stream is closed for it, ``E_STORE_FAILED``) sends a new backfill, and this replica counts toward
  ``--replication-acks`` again only once it acknowledged that backfill's SYNCED. Found at a takeover, the
  damaged copies are lost: the origin, the other copy, is gone.
- An origin's stream without a frame for 5 s (15 s on version 1, whose origins heartbeat every 5 s) is taken
  for broken; the takeover wait starts then.
- Takeover (``ReplicaHost.takeover``): by ``POST /replica/takeover?node=`` or when the origin's stream stayed
  closed for ``--replica-takeover-timeout`` and its address refuses connections (one that accepts them lives: a
  restarted replica finds its origins silent while their reconnections back off; it waits for them, 60 s at
  most). The store is replayed from disk, the origin's topics and channels
  are created here as they were (paused included), each unfinished message goes to each channel that had not
  finished it (into the topic if it had no channel), deferred ones with the rest of their delay, and the topics
  register with lookupd as any topic does. A channel the origin made a log is made a log here first: the adopted
  messages take this node's next offsets of it. The epoch of that origin goes up and is persisted, the adopted ids
  are kept for the origin (``replica.<node>.adopted``); the store's files are removed. Adopted messages are this node's
  own from then on (replicated to its own peers).
- Two replicas of one origin (``ReplicaHost._agree``): HELLO names the origin's peers in order; before a takeover a
  replica asks the others (ASK, HOLDING and the ids they adopted) and adopts only what none adopted, waits for a
  replica ahead of it that still holds copies, and holds back while another has the origin's stream: one owner per
  message.

Not here: ordering, exactly-once; a partition that makes both sides deliver gives duplicates (NSQ allows it).
"""

from .host import ReplicaHost as ReplicaHost
from .sender import Replicator as Replicator
from .sender import attach_channel as attach_channel
from .sender import attach_replication as attach_replication
from .store import ReplicaStore as ReplicaStore
