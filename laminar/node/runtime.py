"""Multi-Raft runtime: drives every hosted Raft group with one tick task and one flush thread.

No task or timer exists per group. Inputs (peer messages, proposals, ticks) mark a group as
having work; one coalesced callback then drains every such group's Ready: entries are written to
the group's log (page cache), messages that may leave before durability go to the per-peer
outbox, the rest wait for the flush. The group commit: at the end of a drain, unless a pass is
already running, one pass of fdatasyncs in the flush thread covers every append of every group
since the previous pass; the thread hands the result straight back to the loop (one hop), and
only then are the held-back messages (votes, append acknowledgements) sent and the cores told
what is durable; that drain starts the next pass if more was written meanwhile. A node that
is not busy runs a small pass on the loop itself (``runs_inline``): handing one fdatasync to
a thread and back cost more CPU and time than the sync. A pass over many logs makes them
durable with one syncfs(2) of their filesystem: one journal commit instead of one per log
(bench/partitions_bench.py measures both on the disk at hand). Where
there is no syncfs, it fdatasyncs them in parallel on a pool of ``flush_threads`` threads: one
fdatasync releases the GIL and waits mostly on the device, which serves many at once. A held-back
message of a replica with nothing waiting to become durable (the acknowledgement of a commit
notice) leaves at once instead of costing a pass. Idle groups quiesce: they are not ticked at
all until a message or proposal wakes them.

A fault in one group stays in that group: an exception while stepping, ticking or draining a
replica (a crc mismatch in its log, a full disk) takes only that replica offline (``fail``) and
is reported to ``on_replica_failed``; every other group keeps running. A failed fdatasync is
the exception: the kernel may have dropped written pages, so the node stops (fsyncgate).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

import structlog

from laminar.errors import CorruptLogError, NotLeaderError
from laminar.node.raft_codec import GroupMessage
from laminar.node.raft_state import StateToSave
from laminar.node.replica import Replica
from laminar.node.send_gate import PeerBacklog
from laminar.node.state_journal import StateJournal
from laminar.raft import EntryKind, Message, MessageType
from laminar.segment.log import PendingFlush
from laminar.stats import COUNT_BOUNDS, Buckets

_TIMEOUT_NOW = MessageType.TIMEOUT_NOW
_NORMAL = EntryKind.NORMAL

FlushJob = tuple[Replica, int, int, list[Message], StateToSave | None]

log = structlog.get_logger(__name__)

EXIT_STORAGE_FAILURE = 74  # EX_IOERR

POOL_FROM_LOGS = 8
"""A pass over fewer logs fdatasyncs them in the flush thread itself: handing a few over to
the pool and back costs thread wake-ups (CPU on a busy machine) for little gain. A pass over
more syncs the whole filesystem once where it can (``MultiRaft.sync_filesystem``)."""

INLINE_SYNC_BELOW = 0.002
"""A small pass runs on the loop, not in the flush thread, while the disk's syncs take less
than this (a running average) and the loop has been idle for longer than one since the last
pass. One record in flight through 3 nodes on 2 cores: the thread's wake-ups and GIL hand-overs
cost 0.6-0.7 ms of CPU per write (of ~3.5) and 0.3-0.8 ms of latency at every node. A node busy
with back-to-back passes keeps the thread: the loop works on the next pass while the disk
syncs (inline passes at full load cost 20-27 % of produce_bench's throughput)."""

DRAIN_AT_ONCE = 1024
"""Groups one drain callback processes; more wait for the next one. With 10,000 groups
marked at once (a restarted peer catching up, a write to every partition) one callback ran
for seconds: the loop answered nothing meanwhile, and peers took the silence for a death."""

WAKE_AT_ONCE = 256
"""Groups a returning peer wakes in one slice (see ``MultiRaft._wake_gradually``)."""
BUSY_GROUPS = 1024
WAKE_WAIT_TICKS = 20
"""A slice waits at most this many ticks for fewer than ``BUSY_GROUPS`` groups to be awake:
a node busy with traffic on many groups still catches the returning peer up."""

SendToPeer = Callable[[int, list[GroupMessage]], None]
ReplicaFailed = Callable[[Replica, Exception], None]
"""Told once a replica was taken offline by a fault: (the closed replica, the error)."""
MayCampaign = Callable[[int], bool]
"""Whether a group's replica may stand for election (not if it lost state, see amnesia.py)."""
BeforeCut = Callable[[int, int], None]
"""Told (group, new end) before the runtime cuts a replica's log back (truncation or reset)."""


class MultiRaft:
    def __init__(
        self,
        node_id: int,
        tick_seconds: float,
        send: SendToPeer,
        on_leader_change: Callable[[Replica], None],
        on_replica_failed: ReplicaFailed | None = None,
        may_campaign: MayCampaign | None = None,
        before_cut: BeforeCut | None = None,
        before_release: Callable[[], None] | None = None,
        flush_threads: int = 16,
        backlog: PeerBacklog | None = None,
        inline_sync_below: float = INLINE_SYNC_BELOW,
    ) -> None:
        if flush_threads < 1:
            raise ValueError(f"flush_threads must be >= 1, not {flush_threads}")
        self.node_id = node_id
        self.tick_seconds = tick_seconds
        self.replicas: dict[int, Replica] = {}
        self._send = send
        self._on_leader_change = on_leader_change
        self._on_replica_failed = on_replica_failed
        self._may_campaign = may_campaign
        self._before_cut = before_cut
        self._backlog = backlog
        """Bounds the entries all groups queue toward a peer (``send_gate``)."""
        self._active: set[Replica] = set()
        self._any_active = asyncio.Event()
        """Set once a group is awake: the tick task waits for it while every group sleeps
        (an idle node's 20 wake-ups a second for nothing)."""
        self._pending: set[Replica] = set()
        self._dirty: set[Replica] = set()
        self._down_nodes: set[int] = set()
        """Peers reported down and not up since: never picked as a dead leader's successor."""
        self._outbox: defaultdict[int, list[GroupMessage]] = defaultdict(list)
        self._scheduled = False
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="flush")
        # The pass runs in _executor; with more than one log it spreads them over this pool.
        self.flush_threads = flush_threads
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(flush_threads, thread_name_prefix="fsync")
            if flush_threads > 1
            else None
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wakers: set[asyncio.Task[None]] = set()
        self.flush_cycles = 0
        self.ticks = 0
        # metrics (node/metrics.py reads them at scrape time): fsync_seconds is written by the
        # pass in progress (one at a time, in the flush thread or on the loop), the other two
        # by the loop only
        self.fsync_seconds = Buckets()
        self.commit_seconds = Buckets()
        self.commit_logs = Buckets(COUNT_BOUNDS)
        self._pass_started = 0.0
        self._pass_ended = 0.0
        self._sync_average = 0.0
        """Running average of a pass's sync time (``runs_inline`` reads it)."""
        self.inline_sync_below = inline_sync_below
        self._flushing = False
        self._stopping = False
        self._close_after_flush: list[Replica] = []
        self.flushed: set[Replica] = set()
        """Replicas a pass synced since ``Readmission.watermark_loop`` last took this set: only
        their durable offsets can have moved (visiting all 10,000 replicas each second was a
        third of an idle node's CPU)."""
        self.tails_moved: set[Replica] = set()
        """The same since the node's tail checkpoint last took it (``tail_checkpoint``)."""
        self._in_pass: set[Replica] = set()
        """Replicas of the pass in the flush thread (their held messages leave after it)."""
        self.sync_filesystem: Callable[[], None] | None = None
        """syncfs(2) of the filesystem holding the logs (``fileio.filesystem_syncer``), set
        by the node: a pass over many logs makes them durable with this one call. On this
        machine 3,334 logs took 65-130 ms of fdatasyncs on 16 threads, about as much CPU
        again, against 25 ms and under 1 ms of CPU for one syncfs."""
        self.before_release = before_release
        """Made durable by every pass, in the flush thread, before the messages it held leave
        (the node's markers of new replicas, ``Amnesia.sync_markers``): whatever a replica says
        in its group that counts (a vote, an acknowledgement) waits for a pass."""

    # lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [asyncio.create_task(self._tick_loop(), name="raft-ticks")]
        for task in self._tasks:
            task.add_done_callback(_stop_if_died)

    @property
    def awake(self) -> int:
        """Groups the tick task visits now (not quiesced): idle ones cost nothing."""
        return len(self._active)

    async def stop(self) -> None:
        self._stopping = True  # a pass still in the flush thread releases nothing more
        for task in (*self._tasks, *self._wakers):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._wakers, return_exceptions=True)
        # (after any pass in flight: the executor has one thread)
        await asyncio.get_running_loop().run_in_executor(self._executor, self._sync_all_logs)
        for replica in self._close_after_flush:
            _close(replica)
        self._close_after_flush.clear()
        for replica in list(self.replicas.values()):
            replica.close()
        self.replicas.clear()
        self._executor.shutdown(wait=True)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _sync_all_logs(self) -> None:
        journals = set()
        for replica in self.replicas.values():
            replica.log.flush()
            state = replica.state_to_save()
            if state is not None:
                replica.write_state(state)
                journals.add(replica.states)
        _sync_journals(journals)
        if self.before_release is not None:
            self.before_release()

    def add(self, replica: Replica) -> None:
        """Host ``replica``; the peers reported down and not up since count as down for it
        too (opened after the report, it would otherwise wait for them)."""
        self.replicas[replica.group] = replica
        if self._backlog is not None:
            replica.raft.cfg.send_gate = self._backlog.gate(replica)
        for node_id in self._down_nodes:
            self._report_down(replica, node_id)
        self._activate(replica)
        self.wake(replica)

    def remove(self, group: int) -> Replica | None:
        replica = self.replicas.pop(group, None)
        if replica is not None:
            self._active.discard(replica)
            self._pending.discard(replica)
            self._dirty.discard(replica)
            if self._flushing:
                replica.closed = True
                self._close_after_flush.append(replica)
            else:
                _close(replica)
        return replica

    # inputs ------------------------------------------------------------------------------
    def step(self, group: int, message: Message) -> None:
        replica = self.replicas.get(group)
        if replica is None:
            return  # not (yet) hosted here: the sender retries
        if message.type is _TIMEOUT_NOW and not replica.accepts_leadership():
            return  # repaired after a fault lately (see Replica.shun_leadership_until)
        try:
            replica.raft.step(message)
        except Exception as exc:
            self.fail(replica, exc)
            return
        if not replica.raft.quiesced:  # (a quiet leader taking answers stays out of the
            # ticks: ticked before its drain, it sent another quiescing round for nothing)
            self._activate(replica)
        self.wake(replica)

    def node_down(self, node_id: int) -> None:
        """A peer node is gone: its groups stop counting on it, and those it led (or that know
        no leader) wake to elect without it. Of those, each picks one successor among the
        voters still up, spread by group number, the same pick on every survivor
        (``RaftNode.report_node_down``). A quiet group it only followed in stays asleep:
        waking thousands of them at once only made them heartbeat and go quiet again, on the
        CPU the elections needed."""
        self._down_nodes.add(node_id)
        for replica in self.replicas.values():
            if self._report_down(replica, node_id):
                self._activate(replica)
                self.wake(replica)

    def _report_down(self, replica: Replica, node_id: int) -> bool:
        """Tell one group ``node_id`` is down; returns whether the group must wake."""
        raft = replica.raft
        conf = raft.conf
        if node_id not in conf.voters and node_id not in conf.learners:
            return False
        orphaned = raft.leader_id in (node_id, 0)
        asleep = raft.quiesced  # (before the report, which wakes an orphan)
        live = sorted(v for v in conf.voters if v not in self._down_nodes)
        first = bool(live) and live[replica.group % len(live)] == self.node_id
        raft.report_node_down(node_id, first=first)
        return orphaned or not asleep

    def node_up(self, node_id: int) -> None:
        """A peer node is back: every group counts it again, including groups it is not (yet)
        a member of: a group that later adds it (a move) must wait for it to catch up before
        going quiet, or a lagging learner would only move on with the next proposal. The
        groups that owe it entries or a leader wake to catch it up, and the quiet ones it
        leads here tell it so (``report_node_up``), with those not quiet yet, a slice at a
        time once many are awake (see ``_wake_gradually``)."""
        self._down_nodes.discard(node_id)
        members = []
        for replica in list(self.replicas.values()):
            raft = replica.raft
            conf = raft.conf
            member = node_id in conf.voters or node_id in conf.learners
            try:  # (a leader reads the entries it owes that node: a damaged log fails here)
                work = raft.report_node_up(node_id)
            except Exception as exc:
                self.fail(replica, exc)
                continue
            if work or (member and not raft.quiesced):
                members.append(replica)
        self._wake_many(members)

    def rest(self, replicas: Iterable[Replica]) -> None:
        """A restart: these replicas, knowing no leader, wait for their leaders to call
        instead of ticking (``RaftNode.rest``); ``wake_uncalled`` wakes the others."""
        for replica in replicas:
            replica.raft.rest()
            if replica.raft.quiesced:
                self._active.discard(replica)

    def _resting(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.raft.quiesced and r.raft.lead == 0]

    async def wake_uncalled(self, interval: float) -> None:
        """Wake the resting replicas once leaders stopped calling them: after an
        ``interval`` in which no resting replica heard from a leader (all of them then if
        nothing called at all: every node restarted, and only elections help)."""
        resting = self._resting()
        while resting:
            await asyncio.sleep(interval)
            before, resting = len(resting), self._resting()
            if len(resting) == before:
                break
        for replica in resting:
            replica.raft.wake()
        self._wake_many(resting)

    def _wake_many(self, replicas: list[Replica]) -> None:
        if len(replicas) <= WAKE_AT_ONCE:
            self._wake_all(replicas)
            return
        waker = asyncio.get_running_loop().create_task(self._wake_gradually(replicas))
        self._wakers.add(waker)
        waker.add_done_callback(self._wakers.discard)

    def _wake_all(self, replicas: list[Replica]) -> None:
        for replica in replicas:
            if not replica.closed:
                self._activate(replica)
                self.wake(replica)

    async def _wake_gradually(self, replicas: list[Replica]) -> None:
        """Wake ``replicas`` ``WAKE_AT_ONCE`` at a time, each slice once no more than
        ``BUSY_GROUPS`` groups are awake (or after ``WAKE_WAIT_TICKS``). Woken all at once,
        10,000 groups ticked, heartbeated both peers every tick and answered each other's
        heartbeats until the returning node had caught up on every one; the node it waited for
        was the busiest, so that took a minute of every node's CPU."""
        for start in range(0, len(replicas), WAKE_AT_ONCE):
            for _ in range(WAKE_WAIT_TICKS):
                if len(self._active) <= BUSY_GROUPS:
                    break
                await asyncio.sleep(self.tick_seconds)
            self._wake_all(replicas[start : start + WAKE_AT_ONCE])
            await asyncio.sleep(0)

    def _activate(self, replica: Replica) -> None:
        """Have the tick task visit ``replica`` (waking the task if every group slept)."""
        self._active.add(replica)
        self._any_active.set()

    def streaming_to(self, node_id: int) -> bool:
        """Whether entries for ``node_id`` wait behind this node's send gate (send_gate.py)."""
        return self._backlog is not None and self._backlog.streaming(node_id)

    def is_down(self, node_id: int) -> bool:
        """Whether ``node_id`` was reported down and not up since."""
        return node_id in self._down_nodes

    def wake(self, replica: Replica) -> None:
        """Mark a group as having work; one callback soon drains all marked groups."""
        self._pending.add(replica)
        self._schedule()

    def process_now(self, replica: Replica) -> None:
        """Drain one group's Ready right away (a produce with acks=leader waits on the write)."""
        self._process_guarded(replica)
        self._schedule()  # its messages leave, and its pass starts, with the next drain

    def fail(self, replica: Replica, error: Exception) -> None:
        """Take a replica offline after a fault: it stops ticking, stepping, acknowledging and
        voting, its waiters fail, its log is closed; then ``on_replica_failed`` is told.

        Nothing it had not yet sent leaves: its outbox messages and held-back acknowledgements
        are dropped, so what peers know of it stays what it made durable before the fault."""
        if self.replicas.get(replica.group) is not replica:
            return  # already removed (a second error from the same pass)
        log.error(
            "replica failed; taking it offline",
            group=replica.group,
            topic=replica.topic,
            partition=replica.partition,
            error=str(error),
            error_type=type(error).__name__,
            exc_info=error,
        )
        replica.after_persist.clear()
        for messages in self._outbox.values():
            messages[:] = [m for m in messages if m[0] != replica.group]
        replica.fail_waiters(
            NotLeaderError(f"replica offline after a storage fault ({type(error).__name__})")
        )
        self.remove(replica.group)  # closes the log now or after the flush in flight
        if self._on_replica_failed is not None:
            self._on_replica_failed(replica, error)

    # the Ready loop ------------------------------------------------------------------------
    def _drain(self) -> None:
        self._scheduled = False
        pending = self._pending
        if len(pending) > DRAIN_AT_ONCE:  # the rest in a later callback, after pending I/O
            pending = {pending.pop() for _ in range(DRAIN_AT_ONCE)}
            self._schedule()
        else:
            self._pending = set()
        for replica in pending:
            if not replica.closed:
                self._process_guarded(replica)
        self._send_outbox()
        self._start_flush()

    def _process_guarded(self, replica: Replica) -> None:
        try:
            self._process(replica)
        except Exception as exc:
            self.fail(replica, exc)

    def _process(self, replica: Replica) -> None:
        raft = replica.raft
        while raft.has_ready():
            ready = raft.ready()
            storage = replica.storage
            if ready.reset is not None:
                replica.fail_waiters(NotLeaderError("log reset"), ready.reset[0])
                # A reset removes the CONFIG entries the configuration came from: the state
                # file holds the new one before the (at once durable) reset, or a crash in
                # between restarts the replica with an old configuration (Ready's contract).
                if ready.conf_state is not None:
                    replica.conf = ready.conf_state
                state = replica.state_to_save()
                if state is not None:
                    replica.write_state(state)
                    _sync_journals({replica.states})
                if self._before_cut is not None:
                    self._before_cut(replica.group, ready.reset[0])
                storage.reset(*ready.reset)
                self._dirty.add(replica)
            if ready.entries:
                first = ready.entries[0].index
                if first <= storage.last_index():
                    replica.fail_waiters(NotLeaderError("entries replaced"), first)
                    if self._before_cut is not None:
                        self._before_cut(replica.group, first)
                storage.append(ready.entries)
                self._dirty.add(replica)
            if ready.conf_state is not None:
                replica.conf = ready.conf_state
            # A moved commit alone needs no pass: it is never saved (learnt again from the leader).
            if (
                ready.hard_state is not None or ready.conf_state is not None
            ) and not replica.state_saved():
                self._dirty.add(replica)
            durable: bool | None = None
            for message in ready.messages:
                if message.after_persist:
                    if durable is None:  # (held messages leave in order, with their pass)
                        durable = (
                            not replica.after_persist
                            and replica not in self._in_pass
                            and replica.is_durable()
                        )
                    if durable:  # nothing handed out is waiting for a pass (a commit notice)
                        self._outbox[message.to].append((replica.group, message))
                        continue
                    replica.after_persist.append(message)
                    self._dirty.add(replica)  # released by the next flush pass
                else:
                    self._outbox[message.to].append((replica.group, message))
            if ready.committed_entries and replica.apply is not None:
                self._apply(replica, ready.committed_entries)
            raft.advance(ready)
            replica.resolve_committed()
        # Only now does the log hold every entry the core handed out (a stale tail is cut):
        # the high watermark may follow the commit.
        if replica.refresh_high_watermark():
            replica.wake_fetchers()
        if raft.quiesced and not replica.after_persist:
            self._active.discard(replica)
        else:  # woken by a local call (a leader transfer): it needs ticks to time that out
            self._activate(replica)
        is_leader = replica.is_leader
        if is_leader != replica.was_leader:
            replica.was_leader = is_leader
            if not is_leader:
                replica.fail_waiters(
                    NotLeaderError("leadership lost; the write may or may not be committed")
                )
            self._on_leader_change(replica)

    def _apply(self, replica: Replica, entries: list) -> None:
        assert replica.apply is not None
        if entries[0].index != replica.applied_through + 1 and replica.apply_gap is not None:
            replica.apply_gap(entries[0].index)
        for entry in entries:
            if entry.kind == _NORMAL:
                replica.apply(entry)
            replica.applied_through = entry.last

    def _schedule(self) -> None:
        """One call_soon drains every marked group and then the per-peer outbox."""
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _send_outbox(self) -> None:
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, defaultdict(list)
        for peer, messages in outbox.items():
            if peer == self.node_id:
                for group, message in messages:
                    self.step(group, message)
            else:
                self._send(peer, messages)
        if self._backlog is not None:
            self._backlog.handed_over()

    # tasks ---------------------------------------------------------------------------------
    async def _tick_loop(self) -> None:
        may_campaign = self._may_campaign
        backlog = self._backlog
        while True:
            if not self._active and (backlog is None or not backlog.holding):
                self._any_active.clear()
                await self._any_active.wait()
            await asyncio.sleep(self.tick_seconds)
            self.ticks = ticks = self.ticks + 1
            now = time.monotonic()
            if backlog is not None:
                self._resume_held(backlog)
            for replica in list(self._active):
                if replica.closed:
                    self._active.discard(replica)
                    continue
                if may_campaign and not may_campaign(replica.group) and not replica.is_leader:
                    # A follower's ticks only start elections, and in a group of one its
                    # election needs no vote that the gate could drop: no ticks at all.
                    continue
                if ticks & 1 and replica.shun_leadership_until > now and not replica.is_leader:
                    continue  # repaired lately: campaigns at half speed, a healthy peer goes first
                try:
                    raft = replica.raft
                    ready = raft.tick() and raft.has_ready()
                except Exception as exc:
                    self.fail(replica, exc)
                    continue
                if ready:
                    self.wake(replica)

    def _resume_held(self, backlog: PeerBacklog) -> None:
        """Send the entries held for peers whose connections drained (see send_gate.py)."""
        for peer, replicas in backlog.resumable():
            for replica in replicas:
                if not replica.closed:
                    replica.raft.resume_sends(peer)
                    self.wake(replica)

    # the group commit ----------------------------------------------------------------------
    def _start_flush(self) -> None:
        """Start a pass for everything written since the last one, unless one is running (it
        starts the next itself when it ends). Called at the end of every drain, so a lone
        write goes to the flush thread in the same loop turn that wrote it."""
        if self._flushing or not self._dirty or self._stopping or self._loop is None:
            return  # (not started: nothing is made durable, as before start)
        dirty, self._dirty = self._dirty, set()
        jobs: list[FlushJob] = []
        for replica in dirty:
            if replica.closed:
                continue
            last = replica.storage.last_index()
            term = replica.storage.term(last) if last >= 0 else 0
            held, replica.after_persist = replica.after_persist, []
            jobs.append((replica, last, term, held, replica.state_to_save()))
        if not jobs:
            return
        self._flushing = True
        self._in_pass = {job[0] for job in jobs}
        started = self._pass_started = time.perf_counter()
        idle = started - self._pass_ended
        if runs_inline(len(jobs), self._sync_average, idle, self.inline_sync_below):
            # After the writes this drain queued (call_soon is FIFO): appends leave first.
            self._loop.call_soon(self._inline_pass, jobs)
            return
        self._executor.submit(
            _sync_then_call,
            self._loop,
            self._flushed,
            jobs,
            self.fsync_seconds,
            self._pool,
            self.flush_threads,
            self.sync_filesystem,
            self.before_release,
        )

    def _inline_pass(self, jobs: list[FlushJob]) -> None:
        """A small pass on the loop itself (``runs_inline``), then its bookkeeping at once."""
        error = None
        started = time.perf_counter()
        if not self._stopping:  # (else stop() syncs everything in the flush thread)
            error = _run_pass(jobs, self.fsync_seconds, None, 1, None, self.before_release)
        self._flushed(jobs, error, time.perf_counter() - started)

    def _flushed(
        self, jobs: list[FlushJob], error: BaseException | None, sync_seconds: float
    ) -> None:
        """On the loop thread once a pass is done (straight from the flush thread, one hop, or
        right after an inline pass): tell the cores what is durable, release held messages,
        then drain (which starts the next pass)."""
        try:
            self._flushing = False
            self._in_pass = set()
            self._pass_ended = time.perf_counter()
            self._sync_average += (sync_seconds - self._sync_average) / 8
            if error is not None:
                # The kernel may have dropped dirty pages: acknowledging anything more could
                # lose it. Crash-stop; a restart recovers from what is really on disk.
                log.error("group commit failed; stopping the node", exc_info=error)
                os._exit(EXIT_STORAGE_FAILURE)
            if self._stopping:
                return  # stop() closes what waited for this pass
            for replica in self._close_after_flush:
                _close(replica)
            self._close_after_flush.clear()
            self.flush_cycles += 1
            self.commit_seconds.observe(time.perf_counter() - self._pass_started)
            self.commit_logs.observe(len(jobs))
            flushed, tails_moved = self.flushed, self.tails_moved
            for replica, last, term, held, _ in jobs:
                if replica.closed:
                    continue
                flushed.add(replica)
                tails_moved.add(replica)
                if last >= 0:
                    try:
                        replica.raft.persisted(last, term)
                    except Exception as exc:
                        self.fail(replica, exc)
                        continue
                for message in held:
                    self._outbox[message.to].append((replica.group, message))
                self._pending.add(replica)
            self._drain()
        except BaseException:
            # A bug here would leave a node that gossips "alive" but never acknowledges or
            # votes again: stop it loudly instead (as for a dead background task).
            log.critical("group commit bookkeeping failed; stopping the node", exc_info=True)
            os._exit(EXIT_STORAGE_FAILURE)


def runs_inline(logs: int, sync_average: float, idle: float, limit: float) -> bool:
    """Whether a pass runs on the loop rather than in the flush thread (INLINE_SYNC_BELOW): it
    covers few logs, the disk's syncs take less than ``limit`` on average, and the loop has been
    ``idle`` (no pass since the last ended) for longer than one takes."""
    return logs < POOL_FROM_LOGS and sync_average < limit and idle > sync_average


def _close(replica: Replica) -> None:
    """Close a replica that leaves the runtime; a close that fails stays with that replica,
    except a failed fdatasync (written pages may be gone: the node stops, see flush)."""
    try:
        replica.close()
    except Exception:
        log.exception("closing a replica failed", group=replica.group, topic=replica.topic)
    if replica.log.sync_failed:
        log.critical("fdatasync failed while closing a replica; stopping", group=replica.group)
        os._exit(EXIT_STORAGE_FAILURE)


def _stop_if_died(task: asyncio.Task[None]) -> None:
    """The tick and flush tasks never end on their own: one that died leaves a node that
    gossips "alive" but never acknowledges or votes again. Stop it loudly instead."""
    if task.cancelled():
        return
    error = task.exception()
    log.critical("raft task died; stopping the node", task=task.get_name(), exc_info=error)
    os._exit(EXIT_STORAGE_FAILURE)


def _sync_then_call(
    loop: asyncio.AbstractEventLoop,
    done: Callable[[list[FlushJob], BaseException | None, float], None],
    jobs: list[FlushJob],
    fsync_seconds: Buckets | None = None,
    pool: concurrent.futures.ThreadPoolExecutor | None = None,
    threads: int = 1,
    sync_filesystem: Callable[[], None] | None = None,
    before_release: Callable[[], None] | None = None,
) -> None:
    """Runs in the flush thread: one pass, then hand the result straight to the loop."""
    started = time.perf_counter()
    error = _run_pass(jobs, fsync_seconds, pool, threads, sync_filesystem, before_release)
    with contextlib.suppress(RuntimeError):  # the loop is closed: stop() syncs once more
        loop.call_soon_threadsafe(done, jobs, error, time.perf_counter() - started)


def _run_pass(
    jobs: list[FlushJob],
    fsync_seconds: Buckets | None,
    pool: concurrent.futures.ThreadPoolExecutor | None,
    threads: int,
    sync_filesystem: Callable[[], None] | None,
    before_release: Callable[[], None] | None,
) -> BaseException | None:
    """Make the pass's logs and states durable (in the flush thread, or on the loop for a
    small pass); returns the failure, if any."""
    try:
        if len(jobs) < POOL_FROM_LOGS:
            _sync(jobs, fsync_seconds)
        elif sync_filesystem is not None:
            _sync_together(jobs, sync_filesystem, fsync_seconds)
        elif pool is not None:
            _sync_parallel(jobs, pool, threads, fsync_seconds)
        else:
            _sync(jobs, fsync_seconds)
        if before_release is not None:
            before_release()
    except BaseException as exc:
        return exc
    return None


def _sync(jobs: list[FlushJob], fsync_seconds: Buckets | None = None) -> None:
    """Runs in the flush thread: make logs and changed hard states durable."""
    seconds, journals = _sync_chunk(jobs)
    _sync_journals(journals)
    if fsync_seconds is not None:
        for value in seconds:
            fsync_seconds.observe(value)


def _sync_parallel(
    jobs: list[FlushJob],
    pool: concurrent.futures.ThreadPoolExecutor,
    threads: int,
    fsync_seconds: Buckets | None = None,
) -> None:
    """Runs in the flush thread: the pass's logs in interleaved chunks on the pool, one chunk
    per pool thread; returns when every chunk is done (the pass covers them all) and raises
    the first failure. Durations are observed here, by one thread (Buckets is not shared)."""
    chunks = min(threads, len(jobs))
    futures = [pool.submit(_sync_chunk, jobs[i::chunks]) for i in range(chunks)]
    concurrent.futures.wait(futures)
    journals: set[StateJournal | None] = set()
    for future in futures:
        seconds, written = future.result()  # raises a chunk's failure (the node then stops)
        journals |= written
        if fsync_seconds is not None:
            for value in seconds:
                fsync_seconds.observe(value)
    _sync_journals(journals)


def _sync_together(
    jobs: list[FlushJob], sync_filesystem: Callable[[], None], fsync_seconds: Buckets | None
) -> None:
    """Runs in the flush thread: make the pass's logs durable with one sync of their whole
    filesystem, then write and sync the changed hard states (after the logs they may name)."""
    begun: list[tuple[Replica, PendingFlush]] = []
    error: OSError | None = None
    try:
        for replica, _last, _term, _held, _state in jobs:
            if not replica.closed:
                begun.append((replica, replica.log.begin_flush()))
        started = time.perf_counter()
        sync_filesystem()
        if fsync_seconds is not None:
            fsync_seconds.observe(time.perf_counter() - started)
    except BaseException as exc:  # (a failed log, a failed sync: the node stops)
        error = exc if isinstance(exc, OSError) else OSError(f"pass abandoned: {exc!r}")
        raise
    finally:
        for replica, pending in begun:  # (each releases its log's flush lock)
            with contextlib.suppress(CorruptLogError):
                replica.log.finish_flush(pending, error)
    journals: set[StateJournal | None] = set()
    for replica, _last, _term, _held, state in jobs:
        if state is not None and not replica.closed:
            replica.write_state(state)
            journals.add(replica.states)
    _sync_journals(journals)


def _sync_chunk(jobs: list[FlushJob]) -> tuple[list[float], set[StateJournal | None]]:
    """Make these replicas' logs durable and write their changed hard states (each after its
    own log: a state may name its entries): each log's flush time, and the journals written
    (the caller syncs each once for the whole pass, not two fsyncs per group)."""
    clock = time.perf_counter
    seconds: list[float] = []
    journals: set[StateJournal | None] = set()
    for replica, _last, _term, _held, state in jobs:
        if replica.closed:
            continue
        started = clock()
        replica.log.flush()
        seconds.append(clock() - started)
        if state is not None:
            replica.write_state(state)
            journals.add(replica.states)
    return seconds, journals


def _sync_journals(journals: set[StateJournal | None]) -> None:
    for journal in journals:
        if journal is not None:
            journal.sync()
