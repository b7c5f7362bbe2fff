"""One hosted replica of a Raft group: its log, its Raft core and the requests waiting on it."""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laminar.errors import NotLeaderError
from laminar.node.log_storage import LogStorage
from laminar.node.raft_state import StateToSave, StateWriter, load_state, save_state
from laminar.node.state_journal import StateJournal
from laminar.node.tail_checkpoint import TailState
from laminar.raft import ConfState, HardState, Message, RaftConfig, RaftNode, Role
from laminar.segment.descriptors import DescriptorCache
from laminar.segment.log import LogConfig, PartitionLog

LOG_DIR = "log"
"""A replica directory's subdirectory holding its partition log (beside the Raft state)."""
_LEADER = Role.LEADER  # (an Enum member read off its class costs ~0.1 us: a hot path)


@dataclass(slots=True)
class Waiter:
    """A request waiting until the entry ending at ``last`` is committed."""

    last: int
    future: asyncio.Future[Any]


@dataclass(slots=True)
class SavedState:
    term: int
    vote: int
    conf: ConfState
    commit: int = -1


@dataclass(eq=False)
class Replica:
    group: int
    directory: Path
    log: PartitionLog
    storage: LogStorage
    raft: RaftNode
    topic: str = ""
    partition: int = 0
    apply: Callable[[Any], Any] | None = None
    """Metadata group only: applies committed NORMAL entries and returns their result."""
    apply_gap: Callable[[int], None] | None = None
    """Metadata group only: told the offset of a committed entry handed out right after a gap
    (a log that starts above 0, or was reset): what precedes it was never applied here."""
    applied_through: int = -1
    """Metadata group only: the last offset of the committed entries handed to ``apply`` so
    far, the core's own NOOP and CONFIG entries included (``apply`` sees only NORMAL ones)."""
    saved: SavedState | None = None
    saves_commit: bool = False
    """Save the commit offset whenever it moved (metadata group): a restart then applies the
    commands committed before it stopped (and opens their partitions) from its own log, before
    it talks to any peer. Other groups learn the commit again from their leader."""
    conf: ConfState | None = None
    """The committed configuration the core last handed out (what a restart starts from)."""
    commit_waiters: collections.deque[Waiter] = field(default_factory=collections.deque)
    fetch_waiters: list[asyncio.Future[None]] = field(default_factory=list)
    after_persist: list[Message] = field(default_factory=list)
    was_leader: bool = False
    high_watermark: int = 0
    """Offsets below this are committed and on this replica's log (readable by consumers).

    Set by the runtime only after a Ready's entries are written (``refresh_high_watermark``):
    a follower's Raft commit moves when a message arrives, before a conflicting stale tail is
    cut from the log, and a fetch in between must not read that tail as committed."""
    shun_leadership_until: float = 0.0
    """time.monotonic() until which this replica declines leadership handed to it and campaigns
    at half speed (it was repaired after a fault lately: a disk still full would fail it again
    as the leader). Whether it may vote at all is the amnesia gate's business (amnesia.py)."""
    reopen: Callable[..., Replica] | None = None
    """Opens this replica again from its directory, with the arguments it was opened with."""
    closed: bool = False
    log_closed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the log's files are closed (a close may wait for a flush in flight)."""
    states: StateJournal | None = None
    """Where term, vote and membership are saved: the node's journal (one fdatasync covers
    every group of a pass), else a state file in the replica's directory."""
    _state_stamp: int = 0
    _state_writer: StateWriter = field(default_factory=StateWriter)

    @classmethod
    def open(
        cls,
        group: int,
        node_id: int,
        directory: Path,
        log_config: LogConfig,
        initial_conf: ConfState,
        raft_config: RaftConfig,
        *,
        cut_damage: bool = False,
        roll_at_control: bool = False,
        descriptors: DescriptorCache | None = None,
        synced: bool = False,
        same_boot: bool = False,
        exists: bool | None = None,
        resume: TailState | None = None,
        **kwargs: Any,
    ) -> Replica:
        """Open (or create) the replica in ``directory``; with ``cut_damage`` every batch is
        crc-checked first and the log cut before the first damaged one (a repair: the caller
        has marked the replica as one that lost state, see repair.py); ``roll_at_control``:
        see LogStorage. ``descriptors``: the node's budget of open log files; a node passing
        it holds the lock of its whole data directory, so the log takes no lock of its own
        (one descriptor per replica fewer). ``synced`` and ``same_boot``: see
        ``PartitionLog.open`` (not kept for ``reopen``, which syncs and checks afresh).
        ``exists``: whether ``directory`` exists, if the caller just looked, and
        ``resume``: its log's tail as saved in this boot (``tail_checkpoint``), are not kept
        for ``reopen`` either."""
        reopen = functools.partial(
            cls.open,
            group,
            node_id,
            directory,
            log_config,
            initial_conf,
            raft_config,
            roll_at_control=roll_at_control,
            descriptors=descriptors,
            **kwargs,
        )
        states: StateJournal | None = kwargs.get("states")
        if states is not None:
            hard, conf = states.load(directory, exists)
        else:
            hard, conf = load_state(directory)
        # (no mkdir of the replica's directory: opening the log creates it with its parents)
        log = PartitionLog.open(
            directory / LOG_DIR,
            log_config,
            descriptors=descriptors,
            lock=descriptors is None,
            synced=synced,
            same_boot=same_boot,
        )
        try:
            if cut_damage:
                log.cut_at_damage()
            storage = LogStorage(log, roll_at_control, resume=resume)
            conf = conf or initial_conf
            raft = RaftNode(node_id, storage, conf, hard, raft_config)
        except BaseException:
            log.close()
            raise
        saved = SavedState(hard.term, hard.vote, conf, hard.commit) if hard is not None else None
        replica = cls(
            group,
            directory,
            log,
            storage,
            raft,
            saved=saved,
            conf=conf,
            reopen=reopen,
            **kwargs,
        )
        replica.refresh_high_watermark()
        return replica

    def accepts_leadership(self) -> bool:
        """Whether a leader may hand leadership to this replica (TIMEOUT_NOW)."""
        return time.monotonic() >= self.shun_leadership_until

    def refresh_high_watermark(self) -> bool:
        """Recompute the high watermark once the log holds what the core handed out; returns
        whether it moved (fetchers waiting on it are then woken by the caller)."""
        high = min(self.raft.commit + 1, self.log.end_offset)
        moved = high != self.high_watermark
        self.high_watermark = high
        return moved

    @property
    def is_leader(self) -> bool:
        return self.raft.role == _LEADER

    def is_durable(self) -> bool:
        """Whether everything handed to this replica so far is on disk: its whole log is
        fdatasynced and its hard state saved."""
        return self.log.durable_offset >= self.log.end_offset and self.state_saved()

    def state_saved(self) -> bool:
        """Whether term, vote and membership are as last saved (``state_to_save`` would save
        nothing). A moved commit alone is saved only with ``saves_commit``."""
        raft = self.raft
        saved = self.saved
        return (
            saved is not None
            and saved.term == raft.term
            and saved.vote == raft.vote
            and saved.conf == (self.conf or raft.committed_conf)
            and (not self.saves_commit or saved.commit == raft.durable_commit)
        )

    def state_to_save(self) -> StateToSave | None:
        """The hard state to persist if term, vote or membership changed since last saved."""
        if self.state_saved():
            return None
        raft = self.raft
        conf = self.conf or raft.committed_conf
        commit = raft.durable_commit
        self.saved = SavedState(raft.term, raft.vote, conf, commit)
        self._state_stamp += 1
        return StateToSave(self._state_stamp, HardState(raft.term, raft.vote, commit), conf)

    def write_state(self, state: StateToSave) -> None:
        """Save a captured term, vote and membership: into the journal (durable with its next
        ``sync``, which the caller owes), or durably into the replica's own state file. The
        loop (a log reset) and flush threads both call this; ``StateWriter`` keeps an older
        capture from replacing a newer one."""
        self._state_writer.save(state, self._write_state)

    def _write_state(self, hard: HardState, conf: ConfState) -> None:
        if self.states is not None:
            self.states.write(self.directory, hard, conf)
        else:
            save_state(self.directory, hard, conf)

    def wake_fetchers(self) -> None:
        waiters, self.fetch_waiters = self.fetch_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def resolve_committed(self) -> None:
        commit = self.raft.commit
        waiters = self.commit_waiters
        while waiters and waiters[0].last <= commit:
            waiter = waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(None)

    def fail_waiters(self, error: Exception, from_offset: int = -1) -> None:
        """Fail waiters whose entry may now never commit (at or after ``from_offset``)."""
        kept: collections.deque[Waiter] = collections.deque()
        for waiter in self.commit_waiters:
            if waiter.last >= from_offset:
                if not waiter.future.done():
                    waiter.future.set_exception(error)
            else:
                kept.append(waiter)
        self.commit_waiters = kept

    def not_leader(self, address_of: Callable[[int], str]) -> NotLeaderError:
        leader = self.raft.leader_id
        return NotLeaderError(
            f"node is not the leader of {self.topic}/{self.partition}",
            leader,
            address_of(leader) if leader else "",
        )

    def close(self) -> None:
        self.closed = True
        self.wake_fetchers()
        self.fail_waiters(NotLeaderError("replica closed"))
        try:
            self.log.close()
        finally:
            self.log_closed.set()
