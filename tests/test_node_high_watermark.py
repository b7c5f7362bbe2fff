"""A follower's log and Raft state as the runtime writes them: its high watermark never covers
bytes that are not committed on its disk, a reset never outruns its configuration, and a cut
never outruns the durable watermark that tells a damaged log from an intact one.

A follower's Raft commit moves inside ``step``, while a conflicting stale tail is cut from its
log only when the runtime drains the group's Ready. A fetch that runs in between (any task the
event loop schedules before the drain) must not read the stale, never-committed bytes below the
reported high watermark. Driven deterministically: one follower replica on real files, Raft
messages crafted as two successive leaders would send them, a "fetch" between step and drain.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from laminar.node.amnesia import Amnesia
from laminar.node.raft_state import load_state
from laminar.node.replica import Replica
from laminar.node.runtime import MultiRaft
from laminar.raft import (
    ConfState,
    Entry,
    EntryKind,
    Message,
    MessageType,
    RaftConfig,
    encode_conf,
)
from laminar.segment.batch import build_batch, decode_records, iter_batches
from laminar.segment.log import LogConfig

FOLLOWER = 2


def batch(value: bytes) -> bytes:
    return build_batch([(None, value, (), 1_000)])


def entries(term: int, first: int, values: list[bytes]) -> list[Entry]:
    return [
        Entry(term, first + i, first + i, EntryKind.NORMAL, batch(value))
        for i, value in enumerate(values)
    ]


def append(frm: int, term: int, prev: int, prev_term: int, ents: list[Entry], commit: int):
    return Message(MessageType.APPEND, FOLLOWER, frm, term, prev_term, prev, ents, commit)


def committed_values(replica: Replica) -> list[bytes]:
    """What a consumer reading this replica up to its high watermark gets."""
    high = replica.high_watermark
    with replica.log.read(replica.log.start_offset, 1 << 20, upto=high) as log_slice:
        data = log_slice.tobytes()
    values: list[bytes] = []
    for position, header in iter_batches(data):
        assert header.next_offset <= high
        one = data[position : position + header.batch_length]
        values += [record.value or b"" for record in decode_records(one)]
    return values


def follower(tmp_path: Path, amnesia: Amnesia | None = None) -> tuple[MultiRaft, Replica]:
    """Replica 2 of group 7 (voters 1, 2, 3) on real files, driven by a runtime of its own."""
    runtime = MultiRaft(
        FOLLOWER,
        1.0,
        lambda _peer, _messages: None,
        lambda _replica: None,
        before_cut=amnesia.cutting if amnesia is not None else None,
    )
    if amnesia is not None:
        amnesia.opening(7, "p", tmp_path / "p")
    replica = Replica.open(
        7,
        FOLLOWER,
        tmp_path / "p",
        LogConfig(),
        ConfState(voters=(1, 2, 3)),
        RaftConfig(deliver_committed=False, seed=1),
    )
    runtime.add(replica)
    return runtime, replica


async def test_fetch_between_step_and_drain_never_reads_a_stale_tail(tmp_path: Path) -> None:
    runtime, replica = follower(tmp_path)
    try:
        # Leader 1, term 1: five entries, the first two committed.
        runtime.step(7, append(1, 1, -1, 0, entries(1, 0, [b"a0", b"a1", b"x2", b"x3", b"x4"]), 1))
        await asyncio.sleep(0)  # the drain writes them to the log
        assert replica.log.end_offset == 5
        assert replica.high_watermark == 2

        # Leader 3, term 2, never had x2..x4: it replaces them and commits its own 2 and 3.
        runtime.step(7, append(3, 2, 1, 1, entries(2, 2, [b"b2", b"b3"]), 3))
        # A fetch scheduled before the drain runs now: it may see the old committed prefix,
        # never x2/x3, which were never committed by anyone.
        seen = committed_values(replica)
        assert seen == [b"a0", b"a1"][: len(seen)], seen
        assert all(not value.startswith(b"x") for value in seen), seen

        await asyncio.sleep(0)  # the drain truncates and appends
        assert committed_values(replica) == [b"a0", b"a1", b"b2", b"b3"]
        assert replica.high_watermark == 4
    finally:
        await runtime.stop()


async def test_a_reset_is_never_on_disk_before_its_configuration(tmp_path: Path) -> None:
    """The segment log's reset is durable when it returns; the configuration it carries must
    be in the state file by then (a crash right after must not restart the replica with the
    voters of the entries the reset removed)."""
    runtime, replica = follower(tmp_path)
    try:
        runtime.step(7, append(1, 1, -1, 0, entries(1, 0, [b"a0", b"a1"]), 1))
        await asyncio.sleep(0)
        # The leader's log now starts at 100, with voters (1, 2, 4) committed as of offset 99.
        moved = ConfState(voters=(1, 2, 4), index=99)
        reset = Message(
            MessageType.RESET, FOLLOWER, 1, 1, log_term=1, index=99, commit=99,
            context=encode_conf(moved),
        )  # fmt: skip
        runtime.step(7, reset)
        await asyncio.sleep(0)  # the drain resets the log (durable at once); no flush yet
        assert replica.log.start_offset == 100
        _hard, on_disk = load_state(replica.directory)  # what a crash now would restart from
        assert on_disk is not None and on_disk.voters == (1, 2, 4)
    finally:
        await runtime.stop()


async def test_a_raft_truncation_lowers_the_durable_watermark_first(tmp_path: Path) -> None:
    """A new leader replaces a follower's uncommitted tail: its durable watermark must follow
    the cut before the cut is made, or a crash before the next periodic save reopens a log
    below its watermark, taken for lost fsynced batches (a long fault run found a group whose
    majority was then taken for lost: it could re-admit nobody)."""
    amnesia = Amnesia(tmp_path)
    runtime, replica = follower(tmp_path, amnesia)
    try:
        runtime.step(7, append(1, 1, -1, 0, entries(1, 0, [b"a0", b"a1", b"x2", b"x3", b"x4"]), 1))
        await asyncio.sleep(0)
        replica.log.flush()
        amnesia.note_durable(7, replica.log.durable_offset)
        assert amnesia.save_watermarks()  # the periodic save: 5 offsets durable

        runtime.step(7, append(3, 2, 1, 1, entries(2, 2, [b"b2"]), 2))
        await asyncio.sleep(0)  # the drain cuts x2..x4 and appends b2
        assert replica.log.end_offset == 3
        restarted = Amnesia(tmp_path)  # a crash now, before any periodic save
        restarted.opening(7, "p", tmp_path / "p")
        assert not restarted.check_log(7, replica.log.end_offset)
    finally:
        await runtime.stop()
