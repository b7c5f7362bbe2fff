"""The Raft state machine: sans-I/O, deterministic, one instance per Raft group.

Inputs are method calls (``step``, ``tick``, ``propose``, ...); outputs are collected into a
``Ready`` the driver takes with ``ready()`` and acknowledges with ``advance()``. Calls must not be
interleaved between ``ready()`` and ``advance()``. Nothing in here does I/O, reads a clock or
draws randomness other than from the node's own seeded ``random.Random``.

Message fields by type (offsets are partition offsets; an entry occupies [index, last]):

* APPEND: ``index``/``log_term`` = offset and term just before ``entries``; ``commit``;
  ``quiesce``: the entries end the leader's log, all committed, and every other member holds
  them: once it holds them too, the follower stops ticking (``_send_append``); ``context`` =
  then the heartbeat round it counts as (8 bytes, big-endian).
* APPEND_RESP: ``index`` = highest offset now matching (success) or the rejected ``index``;
  ``reject_hint``/``log_term`` = the follower's suggestion where to probe next and its term;
  ``commit`` = the follower's commit; ``quiesce`` = it sleeps.
* VOTE/PRE_VOTE: ``index``/``log_term`` = candidate's last offset and its term; ``context``
  = b"transfer" when a leader transfer forces the election. *_RESP: ``reject``.
* HEARTBEAT: ``index`` = the leader's heartbeat round (orders reordered heartbeats),
  ``commit`` (capped at the follower's match), ``context`` = read-index round, ``quiesce``;
  ``reject`` = silent: a round that quiesces the group, sent to a follower holding every
  entry, which then goes to sleep without answering (``_send_heartbeat``).
  HEARTBEAT_RESP echoes ``context`` and reports ``commit``.
* TIMEOUT_NOW: start an election now (leader transfer).
* RESET: the follower's needed entries are gone from the leader's log: reset the log to start
  at ``index + 1`` with ``log_term`` as the term before it; ``context`` = the leader's committed
  configuration as of offset ``commit``. Answered with APPEND_RESP.
"""

from __future__ import annotations

import contextlib
import random
from collections import deque
from itertools import repeat
from operator import add, attrgetter, itemgetter, le

from laminar.errors import InvalidRequestError
from laminar.raft.confchange import apply_change, decode_conf, encode_conf
from laminar.raft.log import RaftLog
from laminar.raft.progress import NEVER, PROBE, REPLICATE, RESET, Progress
from laminar.raft.quorum import VoteResult, committed_index, has_quorum, vote_result
from laminar.raft.storage import CompactedError, Storage, UnavailableError, entries_size
from laminar.raft.types import (
    ConfChange,
    ConfChangeRejected,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageType,
    NotLeader,
    PeerStatus,
    ProposalDropped,
    RaftConfig,
    Ready,
    Role,
    Status,
)

APPEND = MessageType.APPEND
APPEND_RESP = MessageType.APPEND_RESP
VOTE = MessageType.VOTE
VOTE_RESP = MessageType.VOTE_RESP
PRE_VOTE = MessageType.PRE_VOTE
PRE_VOTE_RESP = MessageType.PRE_VOTE_RESP
HEARTBEAT = MessageType.HEARTBEAT
HEARTBEAT_RESP = MessageType.HEARTBEAT_RESP
TIMEOUT_NOW = MessageType.TIMEOUT_NOW
RESET_MSG = MessageType.RESET

NORMAL = EntryKind.NORMAL
NOOP = EntryKind.NOOP
CONFIG = EntryKind.CONFIG

FOLLOWER = Role.FOLLOWER
PRE_CANDIDATE = Role.PRE_CANDIDATE
CANDIDATE = Role.CANDIDATE
LEADER = Role.LEADER

TRANSFER_CTX = b"transfer"
# Messages a leader sends may leave before its own entries are durable; everything else
# (votes, acks, heartbeat answers) speaks for durable state. A heartbeat answer sent early would
# overtake the follower's held append acknowledgements, and the leader answers each one whose
# match lags with a probe, so groups stopped going quiet (Raft simulation seed 16273).
_EARLY_TYPES = frozenset({APPEND, HEARTBEAT, TIMEOUT_NOW, RESET_MSG})
_LIVENESS_TYPES = frozenset({HEARTBEAT, HEARTBEAT_RESP})
_NO_LIMIT = 1 << 62
_PRE, _ELECTION, _TRANSFER = 0, 1, 2
QUICK_CAMPAIGNS = 3
"""Pre-vote rounds a dead leader's picked successor runs a few ticks apart (then the usual
randomized timeout): a voter that has not yet seen the leader die ignores the first (lease)."""
QUICK_RETRY_TICKS = 3
COMMIT_NOTICE_WAIT_ROUNDS = 2
"""A follower that owes the answer to a commit notice misses only the heartbeat round right
after it, so it hears from its leader every other round (skipped for half an election
timeout, with slow deliveries, its election timer ran out: Raft simulation seed 7362)."""
_INDEX = attrgetter("index")
_LAST = attrgetter("last")
_TERM = attrgetter("term")
_KIND = attrgetter("kind")
_SECOND = itemgetter(1)
_KINDS = frozenset(EntryKind)
_ONLY_NORMAL = {EntryKind.NORMAL}
_ONE = {1}


class RaftNode:
    """One replica of one Raft group."""

    def __init__(
        self,
        node_id: int,
        storage: Storage,
        conf: ConfState,
        hard_state: HardState | None = None,
        config: RaftConfig | None = None,
    ) -> None:
        if node_id <= 0:
            raise ValueError("node ids must be > 0")
        self.cfg = cfg = config or RaftConfig()
        self.id = node_id
        self._rng = random.Random(cfg.seed)
        self.log = log = RaftLog(storage)
        hs = hard_state or HardState()
        self.term = hs.term
        self.elections = 0
        """Elections this node started (real ones, not pre-votes); read by the metrics."""
        self.pre_votes = 0
        """Pre-vote rounds this node started; read by the metrics."""
        self.vote = hs.vote
        first = log.first_index()
        last = log.last_index()
        self.commit = min(max(hs.commit, first - 1), last)
        self.applied = max(min(cfg.applied, self.commit), first - 1)
        self.role = FOLLOWER
        self.lead = 0
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self._quorum_elapsed = 0
        self._timeout = cfg.election_tick
        self._reset_randomized_timeout()
        self.votes: dict[int, bool] = {}
        self.prs: dict[int, Progress] = {}
        self.msgs: list[Message] = []
        self._unsent_heartbeats: dict[int, Message] = {}
        """Heartbeats in ``msgs`` that no ``ready`` has taken yet, by follower: a newer round
        replaces its follower's (see ``_send_heartbeat``)."""
        self.read_states: list[tuple[bytes, int]] = []
        self.transferee = 0
        self._quiesced = False
        self._down: set[int] = set()
        self._quick_campaigns = 0
        self._hb_seq = 0  # heartbeat rounds sent as leader
        self._answer_wait_rounds = max(2, cfg.election_tick // (2 * max(1, cfg.heartbeat_tick)))
        """Heartbeat rounds a follower that owes an append's answer goes without a heartbeat:
        well within its election timeout (see ``_bcast_heartbeat``)."""
        self._hb_seen = -1  # newest heartbeat round seen from the current leader
        self._persisted = last  # what storage holds at construction is durable
        self._noop_index = _NO_LIMIT
        # (leader) The newest entry whose commit is announced at once (``_announce_now``).
        self._prompt_index = _NO_LIMIT
        # Configuration: base (as of base.index) plus CONFIG entries above it, oldest first.
        self._base = ConfState(tuple(sorted(conf.voters)), tuple(sorted(conf.learners)), conf.index)
        self._conf_log: list[tuple[int, ConfState]] = []
        self._conf = self._base
        self._committed_conf = self._base
        self._scan_configs(max(conf.index, self.commit) + 1, last)
        # Leader batching state.
        self._dirty: set[int] = set()
        self._dirty_all = False
        self._bcast_commit = -1
        self._quiesce_check = False  # an answer brought a follower level: quiesce now?
        self._uncommitted: deque[tuple[int, int]] = deque()
        self._uncommitted_bytes = 0
        # Read index.
        self._read_seq = 0
        self._reads: deque[tuple[int, bytes, int]] = deque()
        self._read_acks: dict[int, int] = {}
        self._reads_waiting: list[bytes] = []
        # Ready bookkeeping.
        self._prev_hs = (self.term, self.vote, self.commit)
        self._prev_conf = self._committed_conf
        self._handed: tuple[list[Entry], int, tuple[int, int] | None] | None = None
        self._pending_ack: Message | None = None

    # ----------------------------------------------------------------- properties

    @property
    def role_name(self) -> str:
        return self.role.name

    @property
    def leader_id(self) -> int:
        return self.lead

    @property
    def last_index(self) -> int:
        return self.log.last_index()

    @property
    def durable_commit(self) -> int:
        """The commit as far as this replica's own log is durable: what a saved hard state
        may claim. A saved commit above the durable log could name entries a power cut then
        lost, with older entries still at those offsets, and a restart would take them for
        committed (Raft simulation seed 14291: the state file survived, a truncation did not).
        """
        return min(self.commit, self._persisted)

    @property
    def conf(self) -> ConfState:
        return self._conf

    @property
    def committed_conf(self) -> ConfState:
        return self._committed_conf

    @property
    def quiesced(self) -> bool:
        return self._quiesced

    @property
    def is_learner(self) -> bool:
        return self.id in self._conf.learners

    def promotable(self) -> bool:
        """A voter whose log reaches the offset its configuration is known to hold at."""
        return self.id in self._conf.voters and self.log.last_index() >= self._base.index

    def matches(self) -> dict[int, int]:
        """A leader's view of how far each member's log matches its own (empty unless
        leading): ``status()`` without the rest, for a status of thousands of groups."""
        return {nid: pr.match for nid, pr in self.prs.items()} if self.role == LEADER else {}

    def status(self) -> Status:
        progress = {}
        if self.role == LEADER:
            for nid, pr in self.prs.items():
                progress[nid] = PeerStatus(
                    pr.match, pr.next, pr.state, pr.recent_active, pr.learner
                )
        return Status(
            self.id,
            self.role,
            self.term,
            self.vote,
            self.lead,
            self.commit,
            self.applied,
            self.log.last_index(),
            self._conf,
            self._quiesced,
            self.is_learner,
            self.transferee,
            progress,
        )

    # ----------------------------------------------------------------- configuration

    def _scan_configs(self, lo: int, last: int) -> None:
        """Restart: find CONFIG entries not covered by the persisted configuration (in
        storage: nothing is unstable yet)."""
        lo = max(lo, self.log.first_index())
        found = False
        for e in self.log.storage.config_entries(lo, last + 1) if lo <= last else ():
            if e.index > self._base.index:
                c = decode_conf(e.data, e.index)
                if c is not None:
                    self._conf_log.append((e.index, c))
                    found = True
        if found:
            self._conf = self._conf_log[-1][1]

    def _note_configs(self, ents: list[Entry]) -> None:
        if CONFIG not in map(_KIND, ents):
            return
        base_index = self._base.index
        changed = False
        for e in ents:
            if e.kind == CONFIG and e.index > base_index:
                c = decode_conf(e.data, e.index)
                if c is not None:
                    self._conf_log.append((e.index, c))
                    changed = True
        if changed:
            self._conf_changed()

    def _truncate_configs(self, index: int) -> None:
        cl = self._conf_log
        if cl and cl[-1][0] >= index:
            self._conf_log = [x for x in cl if x[0] < index]
            self._conf_changed()

    def _conf_changed(self) -> None:
        self._conf = conf = self._conf_log[-1][1] if self._conf_log else self._base
        if self.role != LEADER:
            return
        members = set(conf.voters) | set(conf.learners)
        for nid in list(self.prs):
            if nid not in members:
                del self.prs[nid]
                self._dirty.discard(nid)
                self._read_acks.pop(nid, None)
        nxt = self.log.last_index() + 1
        learners = set(conf.learners)
        for nid in members:
            pr = self.prs.get(nid)
            if pr is None:
                pr = self._new_progress(nxt)
                self.prs[nid] = pr
                self._dirty.add(nid)
                # A member just added is expected to catch up: never quiesce past it on the
                # strength of an old down report from before it was a member.
                self._down.discard(nid)
            pr.learner = nid in learners
        if self.transferee and self.transferee not in conf.voters:
            self.transferee = 0
        self._maybe_commit()

    def _new_progress(self, nxt: int) -> Progress:
        return Progress(nxt, self.cfg.max_inflight_msgs, self.cfg.max_inflight_bytes)

    # ----------------------------------------------------------------- role changes

    def _reset_randomized_timeout(self) -> None:
        et = self.cfg.election_tick
        self._timeout = et + self._rng.randrange(et)

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = 0
        self.lead = 0
        self._hb_seen = -1
        self._quick_campaigns = 0
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self._quorum_elapsed = 0
        self._reset_randomized_timeout()
        self.votes = {}
        self.transferee = 0
        self._quiesced = False
        self._reads.clear()
        self._read_acks.clear()
        self._reads_waiting.clear()
        self._dirty.clear()
        self._dirty_all = False
        self._uncommitted.clear()
        self._uncommitted_bytes = 0
        self._noop_index = _NO_LIMIT

    def _become_follower(self, term: int, lead: int) -> None:
        self._reset(term)
        self.lead = lead
        self.role = FOLLOWER
        self.prs = {}

    def _become_pre_candidate(self) -> None:
        # Term and vote stay: a pre-vote must not disturb anything if it fails.
        self.role = PRE_CANDIDATE
        self.votes = {}
        self.lead = 0
        self._quiesced = False

    def _become_candidate(self) -> None:
        self.elections += 1
        self._reset(self.term + 1)
        self.vote = self.id
        self.role = CANDIDATE

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.role = LEADER
        self.lead = self.id
        last = self.log.last_index()
        conf = self._conf
        learners = set(conf.learners)
        self.prs = {}
        for nid in (*conf.voters, *conf.learners):
            pr = self._new_progress(last + 1)
            pr.learner = nid in learners
            self.prs[nid] = pr
        me = self.prs.get(self.id)
        if me is None:  # cannot happen through campaign(); keep the leader self-consistent
            me = self.prs[self.id] = self._new_progress(last + 1)
        me.match = min(self._persisted, last)
        me.next = last + 1
        me.recent_active = True
        self._bcast_commit = -1
        noop = Entry(self.term, last + 1, last + 1, NOOP, b"")
        self._noop_index = self._prompt_index = noop.index
        self.log.append([noop])
        self._dirty_all = True

    # ----------------------------------------------------------------- ticking

    def tick(self) -> bool:
        """Advance the clocks one tick. False when only a follower's election clock moved:
        the tick made no work for a Ready, so a driver ticking thousands of groups need not
        ask ``has_ready`` of each (two thirds of them follow)."""
        if self.role == LEADER:
            self._tick_leader()
            return True
        self.election_elapsed += 1
        if self.election_elapsed >= self._timeout and self.promotable():
            self.election_elapsed = 0
            if self._quick_campaigns:  # (a pre-vote round keeps this count and timer)
                self._quick_campaigns -= 1
                self.election_elapsed = self._timeout - QUICK_RETRY_TICKS
            self._campaign(_PRE)
            return True
        return False

    def _tick_leader(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        self._quorum_elapsed += 1
        cfg = self.cfg
        if cfg.check_quorum and self._quorum_elapsed >= (
            cfg.check_quorum_tick or cfg.election_tick
        ):
            self._quorum_elapsed = 0
            active = {nid for nid, pr in self.prs.items() if pr.recent_active}
            active.add(self.id)
            for nid, pr in self.prs.items():
                if nid != self.id:
                    pr.recent_active = False
            if not has_quorum(self._conf.voters, active):
                self._become_follower(self.term, 0)
                return
        if self.election_elapsed >= cfg.election_tick:
            self.election_elapsed = 0
            self.transferee = 0
        if self.heartbeat_elapsed >= cfg.heartbeat_tick:
            self.heartbeat_elapsed = 0
            self._bcast_heartbeat()

    def _can_quiesce(self) -> bool:
        """Every live member holds every entry, all committed: the quiescing heartbeat
        carries the commit to followers that do not know it yet."""
        last = self.log.last_index()
        if self.transferee or self._reads or self._reads_waiting or self.commit != last:
            return False
        down = self._down
        return all(pr.match == last for nid, pr in self.prs.items() if nid not in down)

    def _answer_owed(self) -> bool:
        """A live follower was sent every entry and has not answered yet. The commit notice
        waits for that answer: then one heartbeat round tells every follower the commit and
        quiesces the group, where notices (an empty append each, answered), then a quiescing
        round took twice the messages. Meanwhile a follower that has every entry learns the
        commit from the heartbeat rounds, and one that never answers (a dead node not yet
        reported) would not take a notice either."""
        last = self.log.last_index()
        down = self._down
        for nid, pr in self.prs.items():
            if nid != self.id and nid not in down and pr.sent_all_unanswered(last):
                return True
        return False

    def _bcast_heartbeat(self) -> None:
        """One heartbeat round. A follower that owes an answer to entries sent it within the
        last few rounds is skipped, unless its window is full: that append already reset its
        election timer, and its answer will say what a heartbeat's would. One that owes the
        answer to a commit notice (the empty append after a write) is skipped in the round
        right after it. With thousands of groups written at once on a busy node, a round of
        appends takes many ticks, and the heartbeats sent meanwhile were most of the messages
        exchanged (3,000 partitions written once each: 9.3 heartbeats per write, 4.7 of them
        while a commit notice was unanswered; now 3.9). Nothing is skipped in a round that
        quiesces the group, while a read waits, or while leadership is being handed over.
        (Skipping rounds to a follower that has everything failed the simulation: one lost
        heartbeat then let its election timer run out.) A node reported down gets none: its
        window was full, so every round heartbeated it, a third of the messages of a
        survivor's thousands of new leaders after a node died. A follower asleep since the
        last quiescing round (``Progress.asleep``) gets one heartbeat per quorum check only, a
        quiescing one that it answers, while the leader ticks for another member: a restarted
        node's leaders otherwise woke each group's up-to-date follower and heartbeated it
        every round until the restarted node had answered (two thirds of the messages of its
        catching up). Should the follower wake for its own reasons, its first campaign
        message wakes the leader and is heartbeated again at once."""
        self._hb_seq += 1
        seq = self._hb_seq
        quiesce = self._can_quiesce()
        skip = not (quiesce or self._reads or self._reads_waiting or self.transferee)
        last = self.log.last_index()
        wait = self._answer_wait_rounds
        ctx = self._read_seq.to_bytes(8, "big") if self._reads else b""
        down = self._down
        calm = not (self._reads or self._reads_waiting or self.transferee)
        commit = self.commit
        for nid, pr in self.prs.items():
            if nid != self.id:
                if nid in down:
                    continue
                if calm and pr.asleep and pr.commit >= min(pr.match, commit):
                    if not pr.recent_active:  # once per quorum check: is it still there?
                        self._send_heartbeat(nid, pr, True)  # (keeps it asleep)
                    continue
                if pr.match < last:
                    window = wait
                elif pr.commit < pr.sent_commit:
                    window = COMMIT_NOTICE_WAIT_ROUNDS
                else:
                    window = 0
                if skip and seq - pr.sent_round < window and not pr.stuck():
                    continue
                # A follower level with a group that cannot quiesce yet (another one's answer is
                # owed) sleeps already. (One put to sleep by a quiescing append, and sent
                # nothing since, is kept asleep: a plain heartbeat overtaken by that append's
                # slow answer woke it.)
                sleep = quiesce or (calm and pr.match == last == commit)
                self._send_heartbeat(nid, pr, sleep or pr.quiesce_round > 0, ctx, silent=sleep)
        if quiesce:
            self._quiesced = True

    def _send_heartbeat(
        self, nid: int, pr: Progress, quiesce: bool, ctx: bytes = b"", silent: bool = False
    ) -> None:
        """A heartbeat of the current round. One of an earlier round still unsent (no Ready
        took it) is dropped, as if lost: the newer says all it said (commit, quiesce decision,
        read context). A loaded node that ticked a group again before draining it sent both
        rounds at once (see ``MultiRaft._drain``'s slices).

        ``silent``: the round quiesces the group, and a follower holding every entry goes to
        sleep without answering; the leader counts it asleep, knowing the commit and heard
        from, at once. Its answer said only that: 3,000 partitions written once each took 7.6
        peer messages per write instead of 11.9 (handling the answers also sent probes,
        commit notices and heartbeats nobody needed). Should the heartbeat be lost, the
        follower stays awake and its election timer runs out; its first campaign message (a
        pre-vote the leader's lease refuses) wakes the leader, which quiets it again. The
        liveness check of a sleeping follower (``_bcast_heartbeat``) is not silent: its
        answer is what it asks for."""
        pr.sent_round = self._hb_seq
        if quiesce:
            pr.quiesce_round = self._hb_seq
        else:
            pr.woken()
        commit = min(pr.match, self.commit)
        silent = silent and quiesce and not ctx and pr.match == self.log.last_index()
        if silent:
            pr.asleep = True
            pr.recent_active = True
            if commit > pr.commit:
                pr.commit = commit
        older = self._unsent_heartbeats.get(nid)
        if older is not None:
            msgs = self.msgs
            for i in range(len(msgs) - 1, -1, -1):
                if msgs[i] is older:
                    del msgs[i]
                    break
        heartbeat = Message(
            HEARTBEAT,
            nid,
            self.id,
            self.term,
            index=self._hb_seq,
            commit=commit,
            context=ctx,
            quiesce=quiesce,
            reject=silent,
        )
        self._unsent_heartbeats[nid] = heartbeat
        self._send(heartbeat)

    # ----------------------------------------------------------------- elections

    def campaign(self) -> None:
        """Start an election now (pre-vote first when enabled)."""
        if self.role != LEADER and self.promotable():
            self._campaign(_PRE)

    def _campaign(self, kind: int) -> None:
        """kind: _PRE (pre-vote round), _ELECTION (real vote), _TRANSFER (forced by TIMEOUT_NOW)."""
        if self.cfg.pre_vote and kind == _PRE:
            self.pre_votes += 1
            self._become_pre_candidate()
            mtype = PRE_VOTE
            term = self.term + 1
        else:
            self._become_candidate()
            mtype = VOTE
            term = self.term
        self.votes[self.id] = True
        if self._poll() != VoteResult.PENDING:
            return
        last = self.log.last_index()
        last_term = self.log.term(last)
        ctx = TRANSFER_CTX if kind == _TRANSFER else b""
        for v in self._conf.voters:
            if v != self.id:
                self._send(
                    Message(mtype, v, self.id, term, log_term=last_term, index=last, context=ctx)
                )

    def _poll(self) -> VoteResult:
        res = vote_result(self._conf.voters, self.votes)
        if res == VoteResult.WON:
            if self.role == PRE_CANDIDATE:
                self._campaign(_ELECTION)
            else:
                self._become_leader()
        elif res == VoteResult.LOST:
            self._become_follower(self.term, 0)
        return res

    def report_node_down(self, node_id: int, *, first: bool | None = None) -> None:
        """The peer-liveness layer saw ``node_id`` die: a follower it led (or that knows no
        leader) wakes up, and elects soon. A quiet group with a live leader stays asleep:
        nothing changes for it.

        Until ``report_node_up(node_id)``, a leader neither heartbeats that node nor waits for
        it to quiesce, and a follower does not let it quiesce the group (a heartbeat still in
        flight from a dead leader must not put the survivors back to sleep).

        ``first``: whether the liveness layer picked this replica as the dead leader's
        successor (one per group, the same pick on every survivor). The pick campaigns at its
        next tick; the others give it a whole election timeout before campaigning themselves,
        so survivors do not split the vote (with thousands of groups losing their leader at
        once, split votes and their randomized retries made the tail of a failover). None:
        no pick, every survivor campaigns within one election timeout.
        """
        if self.role != LEADER and self.lead in (0, node_id):
            self._quiesced = False
        pr = self.prs.get(node_id)
        if pr is not None:
            pr.woken()
        self._down.add(node_id)
        if self.role != LEADER and node_id == self.lead:
            self.lead = 0
            if first is None:
                self.election_elapsed = max(self.election_elapsed, self.cfg.election_tick)
            elif first:
                self.election_elapsed = max(self.election_elapsed, self._timeout)
                self._quick_campaigns = QUICK_CAMPAIGNS
            else:
                self.election_elapsed = 0

    def report_node_up(self, node_id: int) -> bool:
        """The peer-liveness layer sees ``node_id`` alive again: include it again, and wake
        up if the group owes it something. True when the group has work (a ``Ready`` to
        drain, or ticks to take): as leader, when that node lacks entries or the commit
        (written while it was away); as a quiet leader otherwise, one heartbeat telling the
        node who leads (it may have restarted and be resting, see ``rest``) while the group
        stays asleep; as follower, when no leader is known. Only for a node reported down
        before: the liveness layer may report a node up twice (its connection, then its
        gossip). After a busy peer's brief silence, waking every group it shares cost more
        CPU than the silence, and caused the next one."""
        pr = self.prs.get(node_id)
        was_down = node_id in self._down
        if pr is not None and was_down:  # what was sent to it while away is lost: ask at once
            # (Only then: the second report of the same return, its gossip after its
            # connection, undid the quiescing append just sent and had every group of a
            # restarted node heartbeat it awake again, 1.3-1.7 heartbeats a group.)
            pr.sent_round = NEVER
            pr.woken()
        self._down.discard(node_id)
        if self.role == LEADER:
            if pr is None:
                return False
            if pr.match < self.log.last_index() or pr.commit < self.commit:
                if not was_down:
                    return False  # (its next heartbeat round asks at once)
                # What was in flight to it is lost: probe at once, instead of a heartbeat
                # round trip first (etcd does the same on MsgUnreachable). A pipeline probes
                # again from its match; a probe is sent again where it stood. (Probing from
                # the match of a node never heard from, -1 under a leader elected while it
                # was away, sent a returning node the whole log it already held.)
                if pr.state == PROBE:
                    pr.probe_sent = False
                else:
                    pr.become_probe()
                self._send_append(node_id, pr, if_empty=True)
                self._quiesced = False
                return True
            if was_down and self._quiesced:
                self._send_heartbeat(node_id, pr, quiesce=True)
                return True
            return False
        if was_down and self.lead == 0:
            self._quiesced = False
            return True
        return False

    def resume_sends(self, to: int) -> None:
        """The driver's send gate opened for ``to`` again: send it what waits (at the next
        ``has_ready``/``ready``)."""
        if self.role == LEADER and to in self.prs and to != self.id:
            self._dirty.add(to)

    def rest(self) -> None:
        """Sleep, as a follower that knows no leader, until a message comes: a restarted
        node's replicas wait for their leaders to call (each quiet leader sends one heartbeat
        when the liveness layer reports the node up) instead of ticking and campaigning,
        which at 10,000 groups took the CPU the catching up needed. Whoever calls this must
        ``wake`` the replica if no leader has called after a while (every node restarted)."""
        if self.role == FOLLOWER and self.lead == 0:
            self._quiesced = True

    def wake(self) -> None:
        """Tick again: a resting follower no leader called campaigns in due course."""
        if self.role != LEADER:
            self._quiesced = False

    # ----------------------------------------------------------------- step

    def step(self, m: Message) -> None:
        """Handle a peer message; anything stale, misaddressed or malformed is ignored."""
        if m.to != self.id or m.frm <= 0 or m.frm == self.id or m.term < 0:
            return
        try:
            self._step(m)
        except (CompactedError, UnavailableError):
            # A malformed message may point outside the log; every lookup happens before the
            # handler changes anything, so dropping the message is safe.
            return

    def _step(self, m: Message) -> None:
        t = m.type
        if t not in _LIVENESS_TYPES:
            woken = self._quiesced and self.role == FOLLOWER and self.lead not in (0, m.frm)
            self._quiesced = False
            if woken:
                self._tell_leader_awake()
            pr = self.prs.get(m.frm)
            if pr is not None and not (t == APPEND_RESP and m.quiesce):
                pr.woken()  # (it is awake: heartbeat it again; see _handle_append_resp)
        if m.term > self.term:
            if t in (VOTE, PRE_VOTE):
                force = m.context == TRANSFER_CTX
                in_lease = (
                    self.cfg.check_quorum
                    and self.lead != 0
                    and self.election_elapsed < self.cfg.election_tick
                )
                if in_lease and not force:
                    return
            if t == PRE_VOTE or (t == PRE_VOTE_RESP and not m.reject):
                pass
            elif t in (APPEND, HEARTBEAT, RESET_MSG):
                self._become_follower(m.term, m.frm)
            elif t == VOTE:
                # The election timer restarts on hearing from a leader or on granting a vote
                # (Raft, figure 2), not on merely seeing a higher term: when this vote is refused
                # because the candidate's log is behind ours, restarting the timer would let that
                # hopeless candidate hold back the one node that can win, election after election.
                elapsed, timeout = self.election_elapsed, self._timeout
                self._become_follower(m.term, 0)
                self.election_elapsed, self._timeout = elapsed, timeout
            else:
                self._become_follower(m.term, 0)
        elif m.term < self.term:
            if t in (APPEND, HEARTBEAT, RESET_MSG):
                # Tell a stale leader about the newer term so it steps down. (etcd does this
                # only with check-quorum or pre-vote, counting on this node to campaign at its
                # higher term otherwise; a learner, or a voter whose log has not reached its
                # promotion yet, never campaigns, and would ignore the leader forever.)
                self._send(Message(APPEND_RESP, m.frm, self.id, self.term))
            elif t == PRE_VOTE:
                self._send(Message(PRE_VOTE_RESP, m.frm, self.id, self.term, reject=True))
            return

        if t in (VOTE, PRE_VOTE):
            self._handle_vote(m)
            return
        role = self.role
        if role == LEADER:
            self._step_leader(m)
        elif role == FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    def _tell_leader_awake(self) -> None:
        """Woken asleep by another node (a pre-vote: its lease, which refuses the pre-vote,
        runs out only while it ticks, should its leader be gone unreported), it tells the
        leader, which counts it asleep and sends it no heartbeats (``_bcast_heartbeat``):
        a flagged heartbeat answer, which a quiet leader answers with a quiescing heartbeat.
        Without it, each woken follower timed out and pre-voted in turn, waking the next."""
        self._answer_heartbeat(self.lead, self._hb_seen, woken=True)

    def _answer_heartbeat(self, to: int, index: int, ctx: bytes = b"", woken: bool = False) -> None:
        """A heartbeat answer: the round answered, the commit, whether this replica sleeps
        (the leader then counts it asleep), and ``woken`` (reject) for ``_tell_leader_awake``."""
        self._send(
            Message(
                HEARTBEAT_RESP,
                to,
                self.id,
                self.term,
                index=index,
                context=ctx,
                commit=self.commit,
                quiesce=self._quiesced,
                reject=woken,
            )
        )

    def _handle_vote(self, m: Message) -> None:
        t = m.type
        resp = VOTE_RESP if t == VOTE else PRE_VOTE_RESP
        can_vote = (
            self.vote == m.frm
            or (self.vote == 0 and self.lead == 0)
            or (t == PRE_VOTE and m.term > self.term)
        )
        last = self.log.last_index()
        last_term = self.log.term(last)
        up_to_date = m.log_term > last_term or (m.log_term == last_term and m.index >= last)
        if can_vote and up_to_date:
            self._send(Message(resp, m.frm, self.id, m.term))
            if t == VOTE:
                self.election_elapsed = 0
                self.vote = m.frm
        else:
            self._send(Message(resp, m.frm, self.id, self.term, reject=True))

    def _step_candidate(self, m: Message) -> None:
        t = m.type
        if t in (APPEND, HEARTBEAT, RESET_MSG):
            self._become_follower(m.term, m.frm)
            self._step_follower(m)
            return
        want = PRE_VOTE_RESP if self.role == PRE_CANDIDATE else VOTE_RESP
        if t == want and m.frm in self._conf.voters:
            self.votes[m.frm] = not m.reject
            self._poll()

    def _step_follower(self, m: Message) -> None:
        t = m.type
        if t == APPEND:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_append(m)
        elif t == HEARTBEAT:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_heartbeat(m)
        elif t == RESET_MSG:
            self.election_elapsed = 0
            self.lead = m.frm
            self._handle_reset(m)
        elif t == TIMEOUT_NOW and self.promotable():
            self._campaign(_TRANSFER)

    # ----------------------------------------------------------------- follower side

    def _ack(self, to: int, index: int) -> None:
        """Success acks to the leader coalesce: one per Ready carries the highest offset."""
        pa = self._pending_ack
        if pa is not None and pa.to == to and pa.term == self.term:
            if index > pa.index:
                pa.index = index
            return
        self._flush_ack()
        self._pending_ack = Message(APPEND_RESP, to, self.id, self.term, index=index)

    def _flush_ack(self) -> None:
        pa = self._pending_ack
        if pa is not None:
            self._pending_ack = None
            pa.commit = self.commit
            pa.quiesce = self._quiesced
            pa.after_persist = True
            self.msgs.append(pa)

    def _handle_append(self, m: Message) -> None:
        log = self.log
        if m.index < self.commit:
            self._ack(m.frm, self.commit)
            return
        ents = m.entries
        if ents and not _valid_entries(ents, m.index, m.term):
            return
        if not log.match_term(m.index, m.log_term):
            last = log.last_index()
            hint = log.find_conflict_by_term(min(m.index, last), m.log_term)
            try:
                hint_term = log.term(hint)
            except CompactedError:
                hint_term = 0
            self._flush_ack()
            self._send(
                Message(
                    APPEND_RESP,
                    m.frm,
                    self.id,
                    self.term,
                    index=m.index,
                    reject=True,
                    reject_hint=hint,
                    log_term=hint_term,
                    commit=self.commit,
                )
            )
            return
        if ents:
            last_new = ents[-1].last
            last = log.last_index()
            start = 0
            if ents[0].index <= last:
                n = len(ents)
                while start < n:
                    e = ents[start]
                    if e.index > last or log.term(e.index) != e.term:
                        break
                    start += 1
            if start < len(ents):
                new = ents[start:] if start else ents
                at = new[0].index
                if at <= last:
                    if at <= self.commit:
                        return  # would rewrite committed entries: a broken peer
                    self._truncate_configs(at)
                    if self._persisted >= at:
                        self._persisted = at - 1
                log.append(new)
                self._note_configs(new)
        else:
            last_new = m.index
        self._commit_to(min(m.commit, last_new))
        if (
            m.quiesce
            and len(m.context) == 8
            and self.commit == last_new == log.last_index()
            and m.frm not in self._down
        ):  # level with a quiet leader: asleep, and its answer says so
            self._take_round(int.from_bytes(m.context, "big"), True, m.frm)
        self._ack(m.frm, last_new)

    def _handle_heartbeat(self, m: Message) -> None:
        c = min(m.commit, self.log.last_index())
        self._commit_to(c)
        self._take_round(m.index, m.quiesce, m.frm)
        if m.reject and self._quiesced and c == m.commit:
            return  # silent: asleep as asked, holding the commit (``_send_heartbeat``)
        self._answer_heartbeat(m.frm, m.index, m.context)

    def _take_round(self, round_: int, quiesce: bool, frm: int) -> None:
        """The leader's quiesce decision of heartbeat round ``round_`` (a heartbeat's
        ``index``, a quiescing append's ``context``): a reordered older round must not undo
        the decision of a newer one."""
        if round_ >= self._hb_seen:
            self._hb_seen = round_
            self._quiesced = quiesce and frm not in self._down

    def _handle_reset(self, m: Message) -> None:
        start = m.index + 1
        if start < 0:
            return
        if m.index <= self.commit:
            self._ack(m.frm, self.commit)
            return
        if self.log.match_term(m.index, m.log_term):
            self._commit_to(m.index)
            self._ack(m.frm, m.index)
            return
        conf = decode_conf(m.context, max(m.commit, m.index))
        if conf is None:
            return
        self.log.reset(start, m.log_term)
        if self._persisted > m.index:
            self._persisted = m.index
        self._base = conf
        self._conf_log = []
        self._conf_changed()
        self._committed_conf = conf
        self.commit = m.index
        if self.applied < m.index:
            self.applied = m.index
        self._ack(m.frm, m.index)

    def _commit_to(self, index: int) -> None:
        if index <= self.commit:
            return
        self.commit = index
        cl = self._conf_log
        if cl and cl[0][0] <= index:
            while cl and cl[0][0] <= index:
                _idx, c = cl.pop(0)
                self._base = c
            self._committed_conf = self._base
        if self.role == LEADER:
            unc = self._uncommitted
            while unc and unc[0][0] <= index:
                self._uncommitted_bytes -= unc.popleft()[1]
            if self._reads_waiting and index >= self._noop_index:
                waiting, self._reads_waiting = self._reads_waiting, []
                for ctx in waiting:
                    self._start_read(ctx)

    # ----------------------------------------------------------------- leader side

    def _step_leader(self, m: Message) -> None:
        t = m.type
        pr = self.prs.get(m.frm)
        if pr is None:
            return
        if t == APPEND_RESP:
            self._handle_append_resp(m, pr)
        elif t == HEARTBEAT_RESP:
            pr.recent_active = True
            pr.probe_sent = False
            if m.reject:  # it woke for another node's message (``_tell_leader_awake``)
                pr.woken()
                if self._quiesced:
                    self._send_heartbeat(m.frm, pr, True)
            elif m.index >= pr.quiesce_round > 0:  # the answer to the latest quiescing round
                if m.quiesce:
                    pr.asleep = True
                else:
                    pr.woken()
            if pr.state == REPLICATE and pr.inflights.full():
                # An append may have been lost: let one more through so the follower can
                # reject it and we fall back to probing.
                pr.inflights.free_first()
            elif pr.state == RESET:
                # The reset or its answer may have been lost; probing settles it either way.
                pr.become_probe()
            if m.commit > pr.commit:
                pr.commit = m.commit
            if pr.match < self.log.last_index():
                # An empty append at next-1 exposes an append lost in flight (the follower
                # rejects it and we fall back to probing).
                self._send_append(m.frm, pr, True)
            elif pr.commit < self.commit:
                self._dirty.add(m.frm)
            if len(m.context) == 8 and self._reads:
                self._ack_read(m.frm, int.from_bytes(m.context, "big"))

    def _handle_append_resp(self, m: Message, pr: Progress) -> None:
        pr.recent_active = True
        last = self.log.last_index()
        if m.quiesce:  # put to sleep by a quiescing append (``_level_but``): asleep, unless
            # something was sent to it since (a heartbeat of a round the group could not
            # quiesce in, which woke it again), or the group has moved on
            if pr.quiesce_round > 0 and m.index == last and m.commit == self.commit:
                pr.asleep = True
            else:
                pr.woken()
        if m.index > last:
            return
        if m.commit > pr.commit:
            pr.commit = min(m.commit, last)
        if m.reject:
            self._handle_reject(m, pr)
            return
        if m.index == last:  # level (perhaps already, told the commit now): quiet group?
            self._quiesce_check = True
        if pr.maybe_update(m.index):
            if pr.state == PROBE:
                pr.become_replicate()
            elif pr.state == REPLICATE:
                pr.inflights.free_le(m.index)
            elif pr.match >= pr.reset_index:
                pr.become_probe()
            if not pr.learner:
                self._maybe_commit()
            if m.frm == self.transferee and pr.match == last:
                pr.woken()
                self._send(Message(TIMEOUT_NOW, m.frm, self.id, self.term))
        elif pr.state == RESET and m.index >= pr.reset_index:
            pr.become_probe()
        self._dirty.add(m.frm)

    def _handle_reject(self, m: Message, pr: Progress) -> None:
        log = self.log
        if pr.learner and m.reject_hint < pr.match:
            # The learner's log is shorter than what it acknowledged: its replica was created
            # afresh (a replica moved back onto a node that held one before). A learner never
            # counts towards commit, so starting its progress over is safe; a voter's log never
            # shrinks, and for voters such a rejection stays a stale one.
            pr.match = max(m.reject_hint, -1)
            pr.state = PROBE
            pr.become_probe()
            self._dirty.add(m.frm)
            return
        probe = min(m.reject_hint, m.index)
        if m.log_term > 0 and probe >= 0:
            probe = log.find_conflict_by_term(probe, m.log_term)
        nxt = probe + 1
        if nxt < pr.match + 1:
            nxt = pr.match + 1
        if nxt <= log.last_index():
            with contextlib.suppress(CompactedError):
                nxt = log.entry_start(nxt)
        if pr.maybe_decr_to(m.index, nxt):
            if pr.state == REPLICATE:
                pr.become_probe()
            self._dirty.add(m.frm)

    def _maybe_commit(self) -> bool:
        prs = self.prs
        q = committed_index(
            self._conf.voters, {nid: pr.match for nid, pr in prs.items() if not pr.learner}
        )
        if q > self.commit and self.log.term(q) == self.term:
            self._commit_to(q)
            return True
        return False

    def _send_append(self, to: int, pr: Progress, if_empty: bool) -> bool:
        if pr.paused():
            return False
        log = self.log
        nxt = pr.next
        last = log.last_index()
        gate = self.cfg.send_gate
        # A closed gate holds the entries (the driver calls resume_sends once ``to`` takes
        # more); an append due anyway (a probe, a commit notice) goes without them.
        held = gate is not None and nxt <= last and not gate.open(to)
        if held and not if_empty:
            return False
        try:
            prev_term = log.term(nxt - 1)
            ents = (
                log.entries(nxt, last + 1, self.cfg.max_msg_bytes)
                if nxt <= last and not held
                else []
            )
        except CompactedError:
            return self._send_reset(to, pr)
        if not ents and not if_empty:
            return False
        end = ents[-1].last if ents else nxt - 1
        if ents:
            size = entries_size(ents)
            if gate is not None:
                gate.sent(to, size)
            if pr.state == REPLICATE:
                pr.next = end + 1
                pr.inflights.add(end, size)
            else:
                pr.probe_sent = True
        elif pr.state == PROBE:
            pr.probe_sent = True
        pr.sent_commit = self.commit
        pr.sent_round = self._hb_seq
        pr.woken()
        quiesce = end == last == self.commit and self._level_but(to, last)
        round_ = b""
        if quiesce:  # numbered as the next heartbeat round: older ones cannot wake it then
            pr.quiesce_round = self._hb_seq + 1
            round_ = pr.quiesce_round.to_bytes(8, "big")
        self.msgs.append(
            Message(
                APPEND,
                to,
                self.id,
                self.term,
                prev_term,
                nxt - 1,
                ents,
                self.commit,
                context=round_,
                quiesce=quiesce,
            )
        )
        return True

    def _level_but(self, to: int, last: int) -> bool:
        """Whether every live member but ``to`` holds ``last``, and nothing needs ticks (a
        read, a transfer). An append that brings ``to`` level then also puts it to sleep, and
        its answer the group: a returning node's catch-up took a quiescing heartbeat round
        more per group (10,000 groups: a third of the messages it exchanged)."""
        if self.transferee or self._reads or self._reads_waiting:
            return False
        down = self._down
        return all(
            pr.match == last for nid, pr in self.prs.items() if nid != to and nid not in down
        )

    def _send_reset(self, to: int, pr: Progress) -> bool:
        log = self.log
        first = log.first_index()
        prev_term = log.term(first - 1)
        cc = self._committed_conf
        conf = encode_conf(cc)
        self.msgs.append(
            Message(
                RESET_MSG,
                to,
                self.id,
                self.term,
                log_term=prev_term,
                index=first - 1,
                commit=self.commit,
                context=conf,
            )
        )
        pr.become_reset(first - 1)
        pr.woken()
        return True

    def _flush(self) -> None:
        """Turn the leader's dirty marks into as few append messages as the windows allow."""
        if self.role == LEADER:
            me = self.id
            prs = self.prs
            if self._dirty_all:
                self._dirty_all = False
                dirty: set[int] | dict[int, Progress] = prs
            else:
                dirty = self._dirty
            if dirty:
                for nid in list(dirty):
                    if nid != me:
                        pr = prs.get(nid)
                        if pr is not None:
                            while self._send_append(nid, pr, False):
                                if pr.state != REPLICATE:
                                    break
                self._dirty.clear()
            check, self._quiesce_check = self._quiesce_check, False
            c = self.commit
            if c > self._bcast_commit and self._announce_now():
                self._announce_commit(c)
            elif check and not self._quiesced and self._can_quiesce() and self._commit_sent(c):
                # A follower caught up on committed entries (a returning node): put the group
                # to sleep now rather than at the next tick's round, which would say nothing new.
                self._bcast_heartbeat()
        if self._pending_ack is not None:
            self._flush_ack()

    def _announce_commit(self, c: int) -> None:
        """Tell followers commit ``c`` now: the quiescing heartbeat round carries it or,
        while the group cannot quiesce, an empty append to each follower that lacks it."""
        self._bcast_commit = c
        if self._can_quiesce():
            self._bcast_heartbeat()
        else:
            for nid, pr in self.prs.items():
                if nid != self.id and pr.sent_commit < c and pr.commit < c:
                    self._send_append(nid, pr, True)

    def _announce_now(self) -> bool:
        """Whether a moved commit is announced at once: always in a prompt group, otherwise
        only the commit of a new term's no-op or of a membership change (``_prompt_index``),
        and not while a live follower owes the answer to entries sent it (that answer then
        brings the round). Other commits ride on the next append or the next tick's
        heartbeat round: writes back to back cost an append and its answer per follower and
        round, not also a commit round (one write in flight, 3 nodes: a third less node CPU
        per round). Groups just elected (10,000 at a topic's creation, thousands after a
        node died) still go to sleep at once, and members learn a change as soon as it
        commits."""
        if self.cfg.prompt_commit:
            return True
        return self._bcast_commit < self._prompt_index <= self.commit and not self._answer_owed()

    def _commit_sent(self, c: int) -> bool:
        """Every live follower was sent commit ``c`` or reported knowing it."""
        down = self._down
        return all(
            pr.sent_commit >= c or pr.commit >= c
            for nid, pr in self.prs.items()
            if nid != self.id and nid not in down
        )

    # ----------------------------------------------------------------- proposals

    def _check_leader(self) -> None:
        if self.role != LEADER:
            raise NotLeader("not the leader", leader_id=self.lead)
        if self.transferee:
            raise NotLeader("leadership is being transferred", leader_id=self.transferee)

    def propose(self, data: bytes | memoryview, count: int = 1) -> tuple[int, int]:
        """Append one NORMAL entry of ``count`` records; returns the offsets it occupies."""
        return self.propose_many([(data, count)])[0]

    def propose_many(self, items: list[tuple[bytes | memoryview, int]]) -> list[tuple[int, int]]:
        """Append several entries at once (all or nothing); one broadcast covers them."""
        self._check_leader()
        if not items:
            return []
        limit = self.cfg.max_uncommitted_bytes
        size = 0
        if limit is not None:
            size = sum(len(d) for d, _ in items)
            if self._uncommitted_bytes and self._uncommitted_bytes + size > limit:
                raise ProposalDropped("too many uncommitted bytes")
        term = self.term
        first = self.log.last_index() + 1
        if set(map(_SECOND, items)) == _ONE:
            # Fast path: single-record entries, built in one comprehension.
            rng = range(first, first + len(items))
            ents = [Entry(term, i, i, NORMAL, d) for i, (d, _) in zip(rng, items, strict=True)]
            out = list(zip(rng, rng, strict=True))
            idx = first + len(items)
        else:
            ents = []
            out = []
            idx = first
            for data, count in items:
                if count < 1:
                    raise InvalidRequestError(f"record count must be >= 1, got {count}")
                last = idx + count - 1
                ents.append(Entry(term, idx, last, NORMAL, data))
                out.append((idx, last))
                idx = last + 1
        self.log.append(ents)
        if limit is not None:
            self._uncommitted.append((idx - 1, size))
            self._uncommitted_bytes += size
        self._dirty_all = True
        self._quiesced = False
        if len(self._conf.voters) == 1:
            self._maybe_commit()
        return out

    def propose_conf_change(self, change: ConfChange) -> tuple[int, int]:
        """Append a CONFIG entry; one change at a time, see ``laminar.raft.confchange``."""
        self._check_leader()
        if self.commit < self._noop_index:
            raise ConfChangeRejected("the leader has not committed an entry of its term yet")
        if self._conf_log:
            raise ConfChangeRejected("another membership change is pending")
        new = apply_change(self._conf, change, self.id)
        idx = self.log.last_index() + 1
        e = Entry(self.term, idx, idx, CONFIG, encode_conf(new))
        self.log.append([e])
        self._prompt_index = idx
        self._note_configs([e])
        self._dirty_all = True
        self._quiesced = False
        return (idx, idx)

    def transfer_leader(self, target: int) -> None:
        """Hand leadership to ``target`` once it is caught up (TIMEOUT_NOW)."""
        if self.role != LEADER:
            raise NotLeader("not the leader", leader_id=self.lead)
        if target == self.id:
            return
        if target not in self._conf.voters:
            raise InvalidRequestError(f"node {target} is not a voter")
        self._quiesced = False
        if self.transferee == target:
            return
        self.transferee = target
        self.election_elapsed = 0
        pr = self.prs[target]
        if pr.match == self.log.last_index():
            pr.woken()
            self._send(Message(TIMEOUT_NOW, target, self.id, self.term))
        else:
            self._dirty.add(target)

    def read_index(self, context: bytes) -> None:
        """Linearizable read: ``(context, index)`` shows up in ``Ready.read_states`` once this
        leader has confirmed its leadership; serve the read when applied >= index."""
        if self.role != LEADER:
            raise NotLeader("not the leader", leader_id=self.lead)
        self._quiesced = False
        if self.commit < self._noop_index:
            self._reads_waiting.append(context)
            return
        self._start_read(context)

    def _start_read(self, context: bytes) -> None:
        if len(self._conf.voters) == 1:
            self.read_states.append((context, self.commit))
            return
        self._read_seq += 1
        self._reads.append((self._read_seq, context, self.commit))
        self._bcast_heartbeat_read()

    def _bcast_heartbeat_read(self) -> None:
        self._hb_seq += 1
        ctx = self._read_seq.to_bytes(8, "big")
        for nid, pr in self.prs.items():
            if nid != self.id and not pr.learner:
                self._send_heartbeat(nid, pr, False, ctx)

    def _ack_read(self, frm: int, seq: int) -> None:
        if seq > self._read_seq or frm not in self._conf.voters:
            return
        if seq > self._read_acks.get(frm, 0):
            self._read_acks[frm] = seq
        reads = self._reads
        voters = self._conf.voters
        while reads:
            rseq = reads[0][0]
            acked = {v for v in voters if v == self.id or self._read_acks.get(v, 0) >= rseq}
            if not has_quorum(voters, acked):
                break
            _, ctx, index = reads.popleft()
            self.read_states.append((ctx, index))

    # ----------------------------------------------------------------- durability

    def persisted(self, index: int, term: int) -> None:
        """The driver made entries up to ``index`` durable (``term`` is the term at index)."""
        if not self.log.match_term(index, term):
            return
        if index > self._persisted:
            self._persisted = index
        if self.role == LEADER:
            pr = self.prs.get(self.id)
            if pr is not None and pr.maybe_update(index):
                self._maybe_commit()

    # ----------------------------------------------------------------- ready / advance

    def _send(self, m: Message) -> None:
        m.after_persist = m.type not in _EARLY_TYPES
        self.msgs.append(m)

    def has_ready(self) -> bool:
        self._flush()
        if self.msgs or self.log.unstable or self.log.snap is not None or self.read_states:
            return True
        if (self.term, self.vote, self.commit) != self._prev_hs:
            return True
        if self._committed_conf is not self._prev_conf:
            return True
        return self.commit > self.applied

    def ready(self) -> Ready:
        self._flush()
        hs_t = (self.term, self.vote, self.commit)
        hs = None
        if hs_t != self._prev_hs:
            hs = HardState(self.term, self.vote, self.durable_commit)
            self._prev_hs = hs_t
        conf_state = None
        cc = self._committed_conf
        if cc is not self._prev_conf:
            if not cc.same_members(self._prev_conf) or cc.index != self._prev_conf.index:
                conf_state = cc
            self._prev_conf = cc
        log = self.log
        entries = log.unstable
        snap = log.snap
        committed: list[Entry] = []
        if self.commit > self.applied:
            if self.cfg.deliver_committed:
                committed = log.entries(self.applied + 1, self.commit + 1)
                while committed[-1].last < self.commit:
                    committed += log.entries(committed[-1].last + 1, self.commit + 1)
            self.applied = self.commit
        msgs = self.msgs
        self.msgs = []
        if self._unsent_heartbeats:
            self._unsent_heartbeats = {}
        reads = self.read_states
        if reads:
            self.read_states = []
        self._handed = (entries, len(entries), snap)
        return Ready(hs, conf_state, entries, snap, msgs, committed, reads)

    def advance(self, ready: Ready) -> None:
        """The driver applied ``ready``'s entries/reset to storage (readable, maybe not durable)."""
        handed = self._handed
        if handed is not None:
            self._handed = None
            self.log.stable(*handed)


def _valid_entries(ents: list[Entry], prev: int, term: int) -> bool:
    """Entries from a peer must be contiguous from ``prev + 1``, well-formed and not from the
    future. Checked with C-level passes: this runs for every entry a follower receives."""
    idx = list(map(_INDEX, ents))
    lasts = list(map(_LAST, ents))
    if idx == lasts:  # all single-offset entries: contiguous iff they count up from prev + 1
        if idx != list(range(prev + 1, prev + 1 + len(idx))):
            return False
    elif (
        idx[0] != prev + 1
        or idx[1:] != list(map(add, lasts[:-1], repeat(1, len(ents) - 1)))
        or not all(map(le, idx, lasts))
    ):
        return False
    terms = list(map(_TERM, ents))
    if max(terms) > term or min(terms) <= 0:
        return False
    kinds = set(map(_KIND, ents))
    if kinds - _KINDS:
        return False
    if kinds != _ONLY_NORMAL:
        return all(e.kind == NORMAL or e.last == e.index for e in ents)
    return True
