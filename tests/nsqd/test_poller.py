"""ReadPoller alone, on socket pairs: who is called, when, and what leaving in the middle of a step means."""

from __future__ import annotations

import math
import socket
import types

import pytest
import trio

from nsqd.poller import ReadPoller, scheduler_idle


class Member:
    """Reads what is there on each call and records it; ``on_call`` lets a test act from inside a step.
    ``poll_actor`` (here an actor of vruntime ``poll_rank``, or None for -inf) and ``last_read`` are what the
    poller orders by (the default: a big read, served after the small ones)."""

    def __init__(
        self,
        sock: socket.socket,
        read_size: int = 65536,
        on_call=None,
        last_read: int = 65536,
        calls: list | None = None,
        poll_rank: float = 0.0,
    ) -> None:
        self.sock = sock
        self.read_size = read_size
        self.on_call = on_call
        self.last_read = last_read
        self.poll_rank = poll_rank
        self.poll_actor = None if poll_rank == -math.inf else types.SimpleNamespace(vruntime=poll_rank)
        self.calls = calls  # shared by the members of a test: the order they were called in
        self.reads: list[bytes] = []

    def poll_ready(self) -> None:
        self.reads.append(self.sock.recv(self.read_size))
        if self.calls is not None:
            self.calls.append(self)
        if self.on_call is not None:
            self.on_call(self)


@pytest.fixture
def pairs():
    made: list[socket.socket] = []

    def make(count: int) -> list[tuple[socket.socket, socket.socket]]:
        result = []
        for _ in range(count):
            ours, theirs = socket.socketpair()
            ours.setblocking(False)
            made.extend((ours, theirs))
            result.append((ours, theirs))
        return result

    yield make
    for sock in made:
        sock.close()


def test_only_readable_members_are_called(pairs):
    poller = ReadPoller()
    (a, peer_a), (b, _peer_b) = pairs(2)
    member_a, member_b = Member(a), Member(b)
    poller.add(a.fileno(), member_a)
    poller.add(b.fileno(), member_b)
    assert poller.poll_once() == 0
    peer_a.sendall(b"hello")
    assert poller.poll_once() == 1
    assert member_a.reads == [b"hello"] and member_b.reads == []
    assert len(poller) == 2


def test_input_left_unread_is_reported_again(pairs):
    """Level-triggered: a member that reads part of its input is called again at the next step."""
    poller = ReadPoller()
    [(a, peer)] = pairs(1)
    member = Member(a, read_size=4)
    poller.add(a.fileno(), member)
    peer.sendall(b"0123456789")
    steps = 0
    while poller.poll_once():
        steps += 1
    assert steps == 3 and b"".join(member.reads) == b"0123456789"


def test_a_member_discarded_earlier_in_the_step_is_not_called(pairs):
    poller = ReadPoller()
    (a, peer_a), (b, peer_b) = pairs(2)
    member_b = Member(b)

    def leave_both(member: Member) -> None:
        poller.discard(a.fileno())
        poller.discard(b.fileno())

    member_a = Member(a, on_call=leave_both)
    member_b.on_call = leave_both
    poller.add(a.fileno(), member_a)
    poller.add(b.fileno(), member_b)
    peer_a.sendall(b"x")
    peer_b.sendall(b"y")
    assert poller.poll_once() == 2
    assert len(member_a.reads) + len(member_b.reads) == 1  # whoever came first; the other had left
    assert len(poller) == 0
    peer_a.sendall(b"more")
    assert poller.poll_once() == 0


def test_discard_is_idempotent_and_survives_a_closed_descriptor(pairs):
    poller = ReadPoller()
    [(a, _peer)] = pairs(1)
    fd = a.fileno()
    poller.add(fd, Member(a))
    with pytest.raises(AssertionError):
        poller.add(fd, Member(a))
    poller.discard(fd)
    poller.discard(fd)
    poller.add(fd, Member(a))
    a.close()  # the kernel drops a closed descriptor from the epoll set by itself
    poller.discard(fd)
    assert len(poller) == 0


async def test_run_serves_members_until_cancelled(pairs):
    poller = ReadPoller()
    (a, peer_a), (b, peer_b) = pairs(2)
    got = trio.Event()

    def stop_after_both(_member: Member) -> None:
        if member_a.reads and member_b.reads:
            got.set()

    member_a, member_b = Member(a, on_call=stop_after_both), Member(b, on_call=stop_after_both)
    async with trio.open_nursery() as nursery:
        await nursery.start(poller.run)
        poller.add(a.fileno(), member_a)
        poller.add(b.fileno(), member_b)
        peer_a.sendall(b"one")
        await trio.sleep(0)
        peer_b.sendall(b"two")
        with trio.fail_after(10):
            await got.wait()
        nursery.cancel_scope.cancel()
    assert (member_a.reads, member_b.reads) == ([b"one"], [b"two"])
    assert len(poller) == 0
    with pytest.raises(ValueError):  # the epoll set is closed with the task
        poller.poll_once()
    poller.poll_light()  # but an interlude of a slice that runs during a shutdown finds nothing to do


def test_small_reads_are_served_first_smallest_first(pairs):
    poller = ReadPoller(light_read=2048)
    calls: list[Member] = []
    sizes = [70_000, 300, 2048, 5000, 40, 2049, 41]
    members = []
    for size, (ours, peer) in zip(sizes, pairs(len(sizes)), strict=True):
        member = Member(ours, last_read=size, calls=calls)
        members.append(member)
        poller.add(ours.fileno(), member)
        peer.sendall(b"x")
    assert poller.poll_once() == len(sizes)
    served = [member.last_read for member in calls]
    assert served[:4] == [40, 41, 300, 2048]  # the small ones by size
    assert sorted(served[4:]) == [2049, 5000, 70_000]  # then the others, each once
    assert sorted(map(id, calls)) == sorted(map(id, members))


def test_light_members_go_by_rank_then_size(pairs):
    """The rank (a producer's -inf, a consumer's channel run time) orders the light members before their size;
    heavy members are not ranked."""
    poller = ReadPoller(light_read=2048)
    calls: list[Member] = []
    made = [(2.0, 10), (-math.inf, 300), (1.0, 5), (-math.inf, 40), (-5.0, 70_000), (1.0, 2)]
    for (rank, size), (ours, peer) in zip(made, pairs(len(made)), strict=True):
        poller.add(ours.fileno(), Member(ours, last_read=size, calls=calls, poll_rank=rank))
        peer.sendall(b"x")
    assert poller.poll_once() == len(made)
    assert [(member.poll_rank, member.last_read) for member in calls] == [
        (-math.inf, 40),
        (-math.inf, 300),
        (1.0, 2),
        (1.0, 5),
        (2.0, 10),
        (-5.0, 70_000),
    ]


@pytest.mark.parametrize("repoll_after", [0.0, 60.0], ids=["fresh-look", "one-look"])
def test_an_interlude_serves_only_light_members_ranked_below_the_paused_actor(pairs, repoll_after):
    """``poll_light(below)``: what ranks at or behind the paused channel waits for the poller's step, in the
    first look as in a fresh one."""
    poller = ReadPoller(light_read=2048, repoll_after=repoll_after)
    calls: list[Member] = []
    made = [(-math.inf, 100), (1.0, 10), (2.0, 10), (3.0, 10)]
    members = []
    for (rank, size), (ours, peer) in zip(made, pairs(len(made)), strict=True):
        member = Member(ours, last_read=size, calls=calls, poll_rank=rank)
        members.append((member, peer))
        poller.add(ours.fileno(), member)
    (producer, peer_producer), (owed, _), (paused, peer_paused), (behind, peer_behind) = members
    peer_producer.sendall(b"pub")
    peer_paused.sendall(b"fin")

    def more_arrive(member: Member) -> None:  # during the first call: seen only by a fresh look
        for _, peer in members[1:]:
            peer.sendall(b"late")

    producer.on_call = more_arrive
    poller.poll_light(below=2.0)
    assert calls == ([producer, owed] if repoll_after == 0.0 else [producer])
    assert paused.reads == [] and behind.reads == []
    poller.poll_once()  # the step serves the rest, still in rank order
    assert calls == [producer, owed, paused, behind]
    assert paused.reads == [b"finlate"] and behind.reads == [b"late"]


def test_poll_light_leaves_big_readers_for_the_next_step(pairs):
    poller = ReadPoller(light_read=2048)
    (a, peer_a), (b, peer_b) = pairs(2)
    heavy, light = Member(a, last_read=2049), Member(b, last_read=2048)
    poller.add(a.fileno(), heavy)
    poller.add(b.fileno(), light)
    peer_a.sendall(b"batch")
    peer_b.sendall(b"one")
    poller.poll_light()
    assert (heavy.reads, light.reads) == ([], [b"one"])
    assert poller.poll_once() == 1  # the heavy one's input waited, level-triggered
    assert heavy.reads == [b"batch"]


def test_a_member_whose_read_grew_waits_for_the_step(pairs):
    """``last_read`` is looked at in each step: what the member read last time counts."""
    poller = ReadPoller()
    [(a, peer)] = pairs(1)

    def record_size(member: Member) -> None:
        member.last_read = len(member.reads[-1]) * 1000

    member = Member(a, last_read=10, on_call=record_size)
    poller.add(a.fileno(), member)
    peer.sendall(b"first")
    poller.poll_light()
    peer.sendall(b"second")
    poller.poll_light()
    assert member.reads == [b"first"]  # 5,000 bytes "read": not light any more
    poller.poll_once()
    assert member.reads == [b"first", b"second"]


def test_poll_light_from_inside_a_step_does_nothing(pairs):
    """A member's commands may run a channel's slice, whose interlude calls ``poll_light``: the step in
    progress is not entered again (each ready member is called once per step, in order)."""
    poller = ReadPoller()
    calls: list[Member] = []
    (a, peer_a), (b, peer_b) = pairs(2)
    first = Member(a, last_read=1, calls=calls, on_call=lambda member: poller.poll_light())
    second = Member(b, last_read=2, calls=calls, on_call=lambda member: poller.poll_light())
    poller.add(a.fileno(), first)
    poller.add(b.fileno(), second)
    peer_a.sendall(b"a")
    peer_b.sendall(b"b")
    assert poller.poll_once() == 2
    assert calls == [first, second]
    assert (first.reads, second.reads) == ([b"a"], [b"b"])
    # and the same from inside poll_light itself
    calls.clear()
    peer_a.sendall(b"c")
    peer_b.sendall(b"d")
    poller.poll_light()
    assert calls == [first, second] and (first.reads[-1], second.reads[-1]) == (b"c", b"d")


def _ordered_members(pairs, poller, sizes, calls):
    made = []
    for size, (ours, peer) in zip(sizes, pairs(len(sizes)), strict=True):
        member = Member(ours, last_read=size, calls=calls)
        poller.add(ours.fileno(), member)
        made.append((member, peer))
    return made


@pytest.mark.parametrize(("repoll_after", "long_call"), [(0.0, True), (60.0, False)], ids=["long", "cheap"])
def test_a_small_read_that_came_during_a_long_call_goes_next(pairs, repoll_after, long_call):
    """After a call longer than ``repoll_after`` the set is polled again: a light member that became ready
    meanwhile is served before the rest of the list (with 0, every call counts as long). After a cheap call,
    the step serves what its one poll found and the late one waits for the next step."""
    poller = ReadPoller(light_read=2048, repoll_after=repoll_after)
    calls: list[Member] = []
    (first, peer_first), (heavy, peer_heavy), (late, peer_late) = _ordered_members(pairs, poller, [10, 5000, 20], calls)
    first.on_call = lambda member: peer_late.sendall(b"late")
    peer_first.sendall(b"a")
    peer_heavy.sendall(b"b")
    assert poller.poll_once() == 2
    assert calls == ([first, late, heavy] if long_call else [first, heavy])
    poller.poll_once()
    assert calls == ([first, late, heavy] if long_call else [first, heavy, late])
    assert (first.reads, late.reads, heavy.reads) == ([b"a"], [b"late"], [b"b"])


def test_a_fresh_look_serves_each_member_once_per_step(pairs):
    """A member still readable after its call (more input came, or it read only part) is not called again in
    the same step by a later poll; nor is one that left."""
    poller = ReadPoller(light_read=2048, repoll_after=0.0)
    calls: list[Member] = []
    (chatty, peer_chatty), (gone, peer_gone), (other, peer_other) = _ordered_members(pairs, poller, [1, 2, 3], calls)
    chatty.on_call = lambda member: peer_chatty.sendall(b"more")
    gone.on_call = lambda member: poller.discard(member.sock.fileno())
    for peer in (peer_chatty, peer_gone, peer_other):
        peer.sendall(b"x")
    assert poller.poll_once() == 3
    assert calls == [chatty, gone, other]
    poller.poll_light()
    assert calls == [chatty, gone, other, chatty]
    assert chatty.reads[-1] == b"more"


def test_a_fresh_look_among_heavy_members_skips_light_ones_served_in_the_step(pairs):
    """A light member served first in a step and readable again when a heavy member's call runs long is not
    called a second time in that step: the fresh look covers the whole step, not only the heavy part of it."""
    poller = ReadPoller(light_read=2048, repoll_after=0.0)
    calls: list[Member] = []
    (light, peer_light), (heavy, peer_heavy) = _ordered_members(pairs, poller, [10, 5000], calls)
    heavy.on_call = lambda member: peer_light.sendall(b"again")
    peer_light.sendall(b"x")
    peer_heavy.sendall(b"y")
    assert poller.poll_once() == 2
    assert calls == [light, heavy]
    poller.poll_once()
    assert calls == [light, heavy, light] and light.reads == [b"x", b"again"]


def test_a_step_poll_reads_its_members_and_the_step_serves_the_rest(pairs):
    """With ``step_poll`` set, the step's poll is that call: what it read is counted and never served again in
    the step (a fresh look skips it even when it is readable again), the events it returns are served in the
    poller's order, and the light producers among them go to their own ``poll_ready``, not to ``bulk_read``,
    which would only check them again."""
    poller = ReadPoller(light_read=2048, repoll_after=0.0)
    calls: list[Member] = []
    (taken, peer_taken), (small, peer_small), (big, peer_big) = pairs(3)
    taken_member = Member(taken, last_read=1, calls=calls, poll_rank=-math.inf)
    small_member = Member(small, last_read=2, calls=calls, poll_rank=-math.inf)
    big_member = Member(big, last_read=5000, calls=calls)
    for sock, member in ((taken, taken_member), (small, small_member), (big, big_member)):
        poller.add(sock.fileno(), member)
    seen: list[list] = []

    def step_poll(epoll, members, light_read):
        assert members is poller._members and light_read == 2048
        events = epoll.poll(0)
        seen.append(sorted(fd for fd, _ in events))
        read = [fd for fd, _ in events if fd == taken.fileno()]
        for fd in read:
            members[fd].reads.append(taken.recv(100))
        return [event for event in events if event[0] not in read], read

    poller.step_poll = step_poll
    offered: list[list[int]] = []  # what bulk_read is handed: the producers step_poll left are not offered again

    def bulk_read(fds, members):
        offered.append(list(fds))
        return fds

    poller.bulk_read = bulk_read
    big_member.on_call = lambda member: peer_taken.sendall(b"again")  # readable again in the same step
    for peer in (peer_taken, peer_small, peer_big):
        peer.sendall(b"x")
    assert poller.poll_once() == 3
    assert calls == [small_member, big_member]  # the light one first, and the one step_poll read not at all
    assert taken_member.reads == [b"x"] and seen == [sorted(sock.fileno() for sock in (taken, small, big))]
    assert offered == []
    assert poller.poll_once() == 1 and taken_member.reads == [b"x", b"again"] and len(calls) == 2
    assert poller.poll_once() == 0


def test_a_member_added_with_again_is_served_again_in_the_same_step(pairs):
    """A replication peer's ACKs: readable again after a heavy member's long call, it is served again in that
    step, before the heavy members that follow."""
    poller = ReadPoller(light_read=2048, repoll_after=0.0)
    calls: list[Member] = []
    (acks, peer_acks), (heavy, peer_heavy), (later, peer_later) = pairs(3)
    acks_member = Member(acks, last_read=0, calls=calls, poll_rank=-math.inf)
    heavy_member = Member(heavy, calls=calls, on_call=lambda member: peer_acks.sendall(b"ack2"))
    later_member = Member(later, calls=calls)
    poller.add(acks.fileno(), acks_member, again=True)
    poller.add(heavy.fileno(), heavy_member)
    poller.add(later.fileno(), later_member)
    for peer in (peer_acks, peer_heavy, peer_later):
        peer.sendall(b"x")
    assert poller.poll_once() == 3
    assert calls == [acks_member, heavy_member, acks_member, later_member]
    assert acks_member.reads == [b"x", b"ack2"]
    poller.discard(acks.fileno())
    assert not poller._again


def test_an_interlude_takes_a_fresh_look_for_light_members_only(pairs):
    poller = ReadPoller(light_read=2048, repoll_after=0.0)
    calls: list[Member] = []
    (first, peer_first), (heavy, peer_heavy), (late, peer_late) = _ordered_members(pairs, poller, [10, 5000, 20], calls)

    def both_arrive(member: Member) -> None:
        peer_heavy.sendall(b"batch")
        peer_late.sendall(b"late")

    first.on_call = both_arrive
    peer_first.sendall(b"a")
    poller.poll_light()
    assert calls == [first, late]
    assert heavy.reads == []
    poller.poll_once()
    assert calls == [first, late, heavy]


class CountingEpoll:
    """The poller's epoll set, counting its polls."""

    def __init__(self, epoll) -> None:
        self.epoll = epoll
        self.polls = 0

    def poll(self, timeout):
        self.polls += 1
        return self.epoll.poll(timeout)

    def __getattr__(self, name):
        return getattr(self.epoll, name)


def test_a_run_of_producers_takes_one_fresh_look_at_its_end(pairs):
    """Long calls of light producers (single PUBs on a slow core) do not make a look each: whatever arrives
    cannot rank before the producers still in the list. The look comes once the list reaches a member that is
    not a light producer, and what it found (here a producer with a smaller read) goes before that member."""
    poller = ReadPoller(light_read=2048, repoll_after=0.0)
    calls: list[Member] = []
    made = [(-math.inf, 10), (-math.inf, 300), (-math.inf, 400), (0.0, 5000), (-math.inf, 5)]
    members = []
    for (rank, size), (ours, peer) in zip(made, pairs(len(made)), strict=True):
        member = Member(ours, last_read=size, calls=calls, poll_rank=rank)
        members.append((member, peer))
        poller.add(ours.fileno(), member)
    (first, _), (second, _), (third, _), (heavy, _), (late, peer_late) = members
    first.on_call = lambda member: peer_late.sendall(b"late")
    for _, peer in members[:4]:
        peer.sendall(b"x")
    poller._epoll = counting = CountingEpoll(poller._epoll)
    assert poller.poll_once() == 4
    assert calls == [first, second, third, late, heavy]
    # the step's poll, one look after the three producers (not one each), one after each call that follows
    assert counting.polls == 4


class TaskSteps(trio.abc.Instrument):
    """Counts the times trio resumed ``task`` (each resumption is one wake-up of the poller's ``run``)."""

    def __init__(self) -> None:
        self.task = None
        self.steps = 0

    def before_task_step(self, task) -> None:
        if task is self.task:
            self.steps += 1


async def relay_through_poller(
    pairs, poller: ReadPoller, hops: int, busy: bool = False, last_read: int = 1
) -> tuple[int, list]:
    """Members A and B each forward a byte to the other's peer when called, ``hops`` calls in all: each call makes
    the next step's input, as a producer's next PUB after its OK. Returns the poller task's resumptions from the
    first call to the last, and the calls. ``busy``: each call also starts a task. ``last_read``: the members'
    (light by default, as producers of single PUBs). The poller should have no fresh look (``repoll_after`` inf):
    a call that took long would have the next member served in the same step."""
    (a, peer_a), (b, peer_b) = pairs(2)
    calls: list = []
    done = trio.Event()
    instrument = TaskSteps()

    def forward(member: Member) -> None:
        if busy:
            nursery.start_soon(trio.lowlevel.checkpoint)  # a task the step made ready (a writer, the dispatcher)
        if len(calls) < hops:
            (peer_b if member is member_a else peer_a).sendall(b"x")
        else:
            done.set()

    member_a = Member(a, on_call=forward, calls=calls, last_read=last_read)
    member_b = Member(b, on_call=forward, calls=calls, last_read=last_read)

    async with trio.open_nursery() as nursery:
        instrument.task = await nursery.start(_run_and_report, poller)
        poller.add(a.fileno(), member_a)
        poller.add(b.fileno(), member_b)
        await kick_and_wait(instrument, peer_a, done)
        nursery.cancel_scope.cancel()
    return instrument.steps, calls


async def kick_and_wait(instrument: TaskSteps, peer: socket.socket, event: trio.Event) -> None:
    """Count the poller task's resumptions from the byte ``peer`` sends (which starts a relay) until ``event``."""
    trio.lowlevel.add_instrument(instrument)
    try:
        peer.sendall(b"x")
        with trio.fail_after(10):
            await event.wait()
    finally:
        trio.lowlevel.remove_instrument(instrument)


async def _run_and_report(poller: ReadPoller, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """``poller.run`` in a task that reports itself when started (for ``TaskSteps``)."""
    task_status.started(trio.lowlevel.current_task())
    await poller.run()


async def test_one_wake_up_serves_further_steps_while_trio_has_nothing_else_to_run(pairs):
    poller = ReadPoller(wake_budget=60.0, repoll_after=math.inf)
    steps, calls = await relay_through_poller(pairs, poller, hops=20)
    assert len(calls) == 20
    assert steps == 1  # the one wake-up served the whole relay


async def test_a_task_a_step_woke_ends_the_wake_up(pairs):
    poller = ReadPoller(wake_budget=60.0, repoll_after=math.inf)
    steps, calls = await relay_through_poller(pairs, poller, hops=20, busy=True)
    assert len(calls) == 20 and steps == 20  # one call per resumption


async def test_a_step_with_a_heavy_member_ends_the_wake_up(pairs):
    """An MPUB batch or a burst of FINs: trio's round (the dispatcher, the writers) comes after such a step."""
    poller = ReadPoller(wake_budget=60.0, repoll_after=math.inf)
    steps, calls = await relay_through_poller(pairs, poller, hops=20, last_read=poller.light_read + 1)
    assert len(calls) == 20 and steps == 20


async def test_no_budget_is_one_step_per_wake_up(pairs):
    poller = ReadPoller(wake_budget=0.0, repoll_after=math.inf)
    steps, calls = await relay_through_poller(pairs, poller, hops=20)
    assert len(calls) == 20 and steps == 20  # one call per resumption


def endless_relay(pairs, poller: ReadPoller, stop: list, on_call=None, limit: int = 200_000) -> socket.socket:
    """Two members of ``poller`` that forward a byte to each other's peer on every call, until ``stop`` has an
    entry: the poller always has a next step. After ``limit`` calls "starved" goes in first (bounds a test that
    would otherwise hang). ``on_call(calls)`` runs in each call. Returns the peer whose byte starts it."""
    (a, peer_a), (b, peer_b) = pairs(2)
    calls = []

    def keep_going(member: Member) -> None:
        calls.append(member)
        if on_call is not None:
            on_call(len(calls))
        if len(calls) > limit and not stop:
            stop.append("starved")
        if not stop:
            (peer_b if member is member_a else peer_a).sendall(b"x")

    member_a, member_b = Member(a, on_call=keep_going, last_read=1), Member(b, on_call=keep_going, last_read=1)
    poller.add(a.fileno(), member_a)
    poller.add(b.fileno(), member_b)
    return peer_a


async def test_a_deadline_ends_the_wake_up(pairs):
    """Members that always have input keep the poller's steps coming; a deadline that comes due (a sleeping task's)
    ends the wake-up. Whether the sleeper then runs before the poller's next wake-up is trio's order within a
    round (a task made ready in the poller's round and run after it is not visible to it; the budget bounds
    that), so what is checked is the end of the first wake-up."""
    poller = ReadPoller(wake_budget=60.0)
    stop: list = []
    ended = trio.Event()
    instrument = TaskSteps()
    resumption_of_call: list[int] = []

    def note(calls: int) -> None:
        resumption_of_call.append(instrument.steps)
        if stop:
            ended.set()

    async def timer() -> None:
        await trio.sleep(0.02)
        stop.append("timer")
        ended.set()

    async with trio.open_nursery() as nursery:
        instrument.task = await nursery.start(_run_and_report, poller)
        start = endless_relay(pairs, poller, stop, note, limit=20_000)
        nursery.start_soon(timer)
        await trio.sleep(0)
        await kick_and_wait(instrument, start, ended)
        nursery.cancel_scope.cancel()
    first = resumption_of_call[0]
    assert 0 < resumption_of_call.count(first) < 20_000  # the deadline ended it, not the relay's bound


async def test_the_budget_ends_the_wake_up(pairs):
    """With no task and no deadline waiting, the budget alone gives trio its turn: a relay that never ends still
    lets a task woken by trio's own epoll (a socket trio waits on) run."""
    poller = ReadPoller(wake_budget=0.002)
    [(c, peer_c)] = pairs(1)
    stop: list = []

    def ping_from_inside(calls: int) -> None:  # once the relay runs: only trio's epoll_wait can see it
        if calls == 10:
            peer_c.sendall(b"ping")

    async with trio.open_nursery() as nursery:
        await nursery.start(poller.run)
        start = endless_relay(pairs, poller, stop, ping_from_inside)
        start.sendall(b"x")
        with trio.fail_after(10):
            await trio.lowlevel.wait_readable(c)
        stop.append("trio")
        nursery.cancel_scope.cancel()
    assert stop[0] == "trio"


@pytest.mark.parametrize("internals", [True, False], ids=["runner", "current_statistics"])
async def test_scheduler_idle_sees_ready_tasks_and_due_deadlines(internals, monkeypatch):
    """Both ways of asking (trio's runner, or its public statistics where the runner's layout differs) agree."""
    if internals:
        idle = scheduler_idle()
    else:
        with monkeypatch.context() as patch:  # no await until it is undone: trio itself reads this global
            patch.setattr(trio._core._run, "GLOBAL_RUN_CONTEXT", types.SimpleNamespace())
            idle = scheduler_idle()
    now = trio.current_time
    assert idle(now())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 0)
        assert not idle(now())  # a task ready to run
    with trio.CancelScope(deadline=now() + 60):
        assert idle(now()) and not idle(now() + 61)  # a deadline, due only later


def test_step_end_calls_come_after_every_member_and_every_deferred_answer(pairs):
    """``at_step_end`` (durable mode's commit of the publishes that came over the workers' links): called once the
    heavy members were served too and the answers deferred before them were sent, then what it deferred is sent."""
    poller = ReadPoller(light_read=2048)
    events: list[str] = []

    class Answering(Member):
        def send_deferred(self) -> None:
            events.append(f"answer {self.last_read}")

    def on_call(member: Member) -> None:
        events.append(f"read {member.last_read}")
        assert poller.defer_reply(member)
        if member.last_read == 10:
            assert poller.at_step_end(step_end)

    def step_end() -> None:
        events.append("step end")
        assert poller.defer_reply(late)  # an answer the commit made: sent in the same step

    late = Answering(pairs(1)[0][0])
    late.last_read = 0
    for size, (ours, peer) in zip((10, 70_000), pairs(2), strict=True):
        poller.add(ours.fileno(), Answering(ours, last_read=size, on_call=on_call))
        peer.sendall(b"x")
    assert not poller.at_step_end(step_end)  # outside a step
    assert poller.poll_once() == 2
    assert events == ["read 10", "answer 10", "read 70000", "answer 70000", "step end", "answer 0"]
