"""The group commit as a follower's runtime drives it, on real files with a running flush thread.

An acknowledgement of new entries leaves only after a pass made them durable; the
acknowledgement of a commit notice (an empty append: nothing new to make durable) leaves at
once, the commit it carries costs no pass either, and it wakes a fetch parked on the follower.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from laminar.errors import CorruptLogError
from laminar.node.raft_codec import GroupMessage
from laminar.node.replica import Replica
from laminar.node.runtime import POOL_FROM_LOGS, MultiRaft, _sync_together, runs_inline
from laminar.raft import ConfState, Entry, EntryKind, Message, MessageType, RaftConfig
from laminar.segment.batch import build_batch
from laminar.segment.fileio import filesystem_syncer
from laminar.segment.log import LogConfig

FOLLOWER = 2
GROUP = 7


def entries(term: int, first: int, count: int) -> list[Entry]:
    return [
        Entry(term, i, i, EntryKind.NORMAL, build_batch([(None, b"v%d" % i, (), 1_000)]))
        for i in range(first, first + count)
    ]


def append(prev: int, prev_term: int, ents: list[Entry], commit: int) -> Message:
    return Message(MessageType.APPEND, FOLLOWER, 1, 1, prev_term, prev, ents, commit)


def follower_replica(tmp_path: Path, group: int) -> Replica:
    return Replica.open(
        group,
        FOLLOWER,
        tmp_path / f"p{group}",
        LogConfig(),
        ConfState(voters=(1, 2, 3)),
        RaftConfig(deliver_committed=False, seed=group),
    )


class Sent:
    """What the runtime sent to its peers, and an event per arrival."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.arrived = asyncio.Event()

    def __call__(self, _peer: int, messages: list[GroupMessage]) -> None:
        self.messages += [message for _group, message in messages]
        self.arrived.set()

    async def next_ack(self) -> Message:
        while True:
            for message in self.messages:
                if message.type is MessageType.APPEND_RESP:
                    self.messages.remove(message)
                    return message
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 10)


async def test_a_commit_notice_is_acknowledged_without_a_pass(tmp_path: Path) -> None:
    sent = Sent()
    runtime = MultiRaft(FOLLOWER, 1.0, sent, lambda _replica: None)
    replica = Replica.open(
        GROUP,
        FOLLOWER,
        tmp_path / "p",
        LogConfig(),
        ConfState(voters=(1, 2, 3)),
        RaftConfig(deliver_committed=False, seed=1),
    )
    runtime.start()
    runtime.add(replica)
    try:
        # New entries (and a new term): acknowledged only once a pass made them durable.
        runtime.step(GROUP, append(-1, 0, entries(1, 0, 3), -1))
        ack = await sent.next_ack()
        assert ack.index == 2 and not ack.reject
        assert runtime.flush_cycles >= 1
        assert replica.log.durable_offset == 3
        assert replica.high_watermark == 0

        # A fetch parked at the end of what the follower may serve.
        parked = asyncio.get_running_loop().create_future()
        replica.fetch_waiters.append(parked)
        passes = runtime.flush_cycles

        # The leader's commit notice: nothing new to make durable.
        runtime.step(GROUP, append(2, 1, [], 2))
        ack = await sent.next_ack()
        assert ack.index == 2 and not ack.reject
        assert runtime.flush_cycles == passes, "the ack waited for a pass it did not need"
        assert replica.high_watermark == 3
        assert parked.done(), "the parked fetch was not woken by the commit"

        # More entries: their ack waits for a pass again (durability is not skipped), and
        # it is the first pass since the commit notice (which needed none, not even an empty
        # one for its moved commit: a commit alone is never saved).
        runtime.step(GROUP, append(2, 1, entries(1, 3, 2), 2))
        ack = await sent.next_ack()
        assert ack.index == 4
        assert runtime.flush_cycles == passes + 1
        assert replica.log.durable_offset == 5
    finally:
        await runtime.stop()


@pytest.mark.parametrize("how", ["syncfs", "pool"])
async def test_a_pass_over_many_logs_makes_them_durable_before_any_ack(
    tmp_path: Path, how: str
) -> None:
    # Many groups written at once: one pass makes their logs durable (one syncfs of the
    # filesystem, or fdatasyncs spread over the flush pool where there is none), and no
    # group's acknowledgement leaves before its own log is durable to the acked end.
    count = 24
    durable_when_acked: dict[int, tuple[int, int]] = {}
    replicas: dict[int, Replica] = {}

    def send(_peer: int, messages: list[GroupMessage]) -> None:
        for group, message in messages:
            if message.type is MessageType.APPEND_RESP:
                durable_when_acked[group] = (message.index, replicas[group].log.durable_offset)
        if len(durable_when_acked) == count:
            done.set()

    done = asyncio.Event()
    runtime = MultiRaft(FOLLOWER, 1.0, send, lambda _replica: None, flush_threads=4)
    syncs = 0
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    if how == "syncfs":
        syncfs = filesystem_syncer(directory)
        assert syncfs is not None, "syncfs(2) is missing on this Linux"

        def counted() -> None:
            nonlocal syncs
            syncs += 1
            syncfs()

        runtime.sync_filesystem = counted
    runtime.start()
    try:
        for i in range(count):
            replicas[GROUP + i] = replica = follower_replica(tmp_path, GROUP + i)
            runtime.add(replica)
        for i in range(count):  # all in one loop turn: one drain, one pass for them all
            runtime.step(GROUP + i, append(-1, 0, entries(1, 0, 3), -1))
        await asyncio.wait_for(done.wait(), 20)
        assert all(index == 2 and durable >= 3 for index, durable in durable_when_acked.values())
        assert runtime.flush_cycles < count  # passes covered many logs each
        if how == "syncfs":  # one sync per pass over many logs, and nothing else
            assert 1 <= syncs <= runtime.flush_cycles
            assert runtime.fsync_seconds.count == syncs
        else:
            assert runtime.fsync_seconds.count >= count  # every log's flush was timed
    finally:
        await runtime.stop()
        os.close(directory)


@pytest.mark.parametrize("inline", [True, False])
async def test_a_pass_on_the_loop_or_in_the_thread_acks_only_what_it_made_durable(
    tmp_path: Path, inline: bool
) -> None:
    # An idle node with a fast disk syncs a lone write on the loop itself (no thread hand-over
    # and back); one with a slow disk (here: any, the limit being 0) in the flush thread.
    # Either way the acknowledgement leaves only once the entries it names are durable.
    durable_when_acked: list[tuple[int, int]] = []
    sync_threads: list[str] = []

    def send(_peer: int, messages: list[GroupMessage]) -> None:
        for _group, message in messages:
            if message.type is MessageType.APPEND_RESP:
                durable_when_acked.append((message.index, replica.log.durable_offset))
        acked.set()

    acked = asyncio.Event()
    limit = 60.0 if inline else 0.0
    runtime = MultiRaft(FOLLOWER, 1.0, send, lambda _r: None, inline_sync_below=limit)
    replica = follower_replica(tmp_path, GROUP)
    real_flush = replica.log.flush

    def flush() -> int:  # the real flush, noting the thread it ran on
        sync_threads.append(threading.current_thread().name)
        return real_flush()

    replica.log.flush = flush  # type: ignore[method-assign]
    runtime.start()
    runtime.add(replica)
    try:
        for first in range(0, 9, 3):
            acked.clear()
            runtime.step(GROUP, append(first - 1, 1 if first else 0, entries(1, first, 3), -1))
            await asyncio.wait_for(acked.wait(), 10)
            await asyncio.sleep(0.1)  # idle between writes (longer than a slow disk's sync)
        assert durable_when_acked == [(2, 3), (5, 6), (8, 9)]
        main = threading.main_thread().name
        if inline:
            assert sync_threads == [main] * 3
        else:
            assert sync_threads and main not in sync_threads
    finally:
        await runtime.stop()


async def test_the_tick_task_sleeps_while_every_group_is_quiet(tmp_path: Path) -> None:
    # No timer fires for a node whose groups all sleep (an idle node woke 20 times a second
    # for nothing); a message that wakes a group wakes the ticks with it.
    runtime = MultiRaft(FOLLOWER, 0.01, lambda _peer, _messages: None, lambda _r: None)
    replica = follower_replica(tmp_path, GROUP)
    runtime.start()
    runtime.add(replica)
    try:
        await asyncio.sleep(0.05)
        assert runtime.ticks > 0  # a new follower ticks toward an election
        quiesce = Message(MessageType.HEARTBEAT, FOLLOWER, 1, 1, index=1, commit=-1, quiesce=True)
        runtime.step(GROUP, quiesce)
        await asyncio.sleep(0.03)
        assert runtime.awake == 0
        ticks = runtime.ticks
        await asyncio.sleep(0.1)  # ten ticks' time
        assert runtime.ticks == ticks
        runtime.step(GROUP, append(-1, 1, entries(1, 0, 1), -1))  # new entries wake it
        await asyncio.sleep(0.05)
        assert runtime.awake == 1 and runtime.ticks > ticks
    finally:
        await runtime.stop()


def test_only_a_small_pass_of_an_idle_node_on_a_fast_disk_runs_on_the_loop() -> None:
    limit = 0.002
    assert runs_inline(1, 0.0004, 0.003, limit)
    assert not runs_inline(POOL_FROM_LOGS, 0.0004, 0.003, limit)  # many logs: syncfs or pool
    assert not runs_inline(1, 0.0025, 0.003, limit)  # a slow disk would stall the loop
    assert not runs_inline(1, 0.0004, 0.0001, limit)  # back-to-back passes: the loop is busy


def test_flush_threads_must_be_positive() -> None:
    with pytest.raises(ValueError, match="flush_threads"):
        MultiRaft(FOLLOWER, 1.0, lambda _peer, _messages: None, lambda _r: None, flush_threads=0)


@pytest.fixture
def written(tmp_path: Path) -> Iterator[list[Replica]]:
    """Three follower replicas, each with three entries written and none made durable."""
    replicas = [follower_replica(tmp_path, GROUP + i) for i in range(3)]
    for replica in replicas:
        replica.storage.append(entries(1, 0, 3))
    yield replicas
    for replica in replicas:
        with contextlib.suppress(CorruptLogError):
            replica.close()


def test_a_failed_filesystem_sync_fails_every_log_of_its_pass(written: list[Replica]) -> None:
    # After a failed sync the kernel may have dropped written pages: no log of the pass may
    # count its writes as durable, each refuses further flushes (their locks are free again),
    # and the error reaches the flush thread (which then stops the node).
    def failing() -> None:
        raise OSError(errno.EIO, "injected writeback error")

    with pytest.raises(OSError, match="injected"):
        _sync_together([(r, 2, 1, [], None) for r in written], failing, None)
    for replica in written:
        assert replica.log.durable_offset == 0
        with pytest.raises(CorruptLogError, match="reopen the log"):
            replica.log.flush()


def test_a_pass_with_a_failed_log_counts_no_log_durable(written: list[Replica]) -> None:
    # One log of the pass already failed (an earlier sync error): the pass fails before its
    # sync, and the logs taken before that one must not count their writes as durable.
    synced: list[int] = []
    broken = written[1].log
    with pytest.raises(CorruptLogError):
        broken.finish_flush(broken.begin_flush(), OSError(errno.EIO, "earlier failure"))
    with pytest.raises(CorruptLogError):
        _sync_together([(r, 2, 1, [], None) for r in written], lambda: synced.append(1), None)
    assert not synced
    assert [r.log.durable_offset for r in written] == [0, 0, 0]
