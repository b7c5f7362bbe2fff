"""Seeded deterministic simulator for the Raft core.

One ``Sim(seed)`` runs a 3- or 5-voter cluster through a random schedule (delay, drop,
duplication and reordering of messages, symmetric and one-way partitions, power-loss crashes,
restarts, log compaction, membership changes, leader transfers, read-index requests and client
proposals), then heals everything and checks liveness: a leader emerges and commits, the idle
group quiesces, and a new leader takes over from a crashed one.

Each host has a ``SimDisk`` (tests/raft_sim_disk.py): the node writes to the page cache, an
fsync makes it durable, and a crash keeps only what a real disk could: the synced log plus a
prefix of the later writes (maybe with a torn last record that recovery cuts off), and either
the synced or the last written Raft state file. Messages a node marks ``after_persist`` (votes,
acknowledgements) leave only after the next fsync, as in the node runtime.

Checked all along: election safety (one leader per term), log matching, leader completeness,
state-machine safety (a committed offset never changes), commit never moves back, a leader
commits only what a quorum of its voters holds *durably*, after every crash every acknowledged
(committed) entry is still durable on a quorum of the committed configuration, read-index
answers are not stale, and at the end every acknowledged entry is in the leader's log. Any
violation raises ``SimFailure`` naming the seed and the command that replays it.
"""

from __future__ import annotations

import heapq
import os
import random
from collections import deque
from dataclasses import dataclass, field

from laminar.raft import (
    CompactedError,
    ConfChange,
    ConfChangeRejected,
    ConfChangeType,
    ConfState,
    Entry,
    EntryKind,
    Message,
    NotLeader,
    RaftConfig,
    RaftNode,
    Role,
    decode_conf,
)
from tests.raft_sim_disk import SimDisk

REPLAY = "LAMINAR_SIM_SEED={seed} .venv/bin/pytest tests/test_raft_sim.py -k replay"
ELECTION_TICK = 6
QUIESCE_STEPS = 40
CATCH_UP_STEPS = 200
REST_STEPS = 2 * ELECTION_TICK
"""Steps a restarted node rests before it ticks again if no leader called it."""
LEADER = Role.LEADER
STAT_KEYS = (
    "leaders",
    "crashes",
    "conf_changes",
    "transfers",
    "resets",
    "dirty_crashes",
    "lost_writes",
    "torn",
    "state_survived",
    "state_lost",
    "rests",
    "rests_called",
    "rests_woken",
)


class SimFailure(AssertionError):
    pass


@dataclass
class Host:
    """One simulated machine: its disk and, when up, its Raft node."""

    id: int
    disk: SimDisk
    node: RaftNode | None = None
    waiting: list[Message] = field(default_factory=list)
    next_apply: int = 0
    removed: bool = False
    seen_commit: int = -1
    rest_until: int = -1
    """A restarted node resting (``RaftNode.rest``) until then, as the node runtime's
    ``wake_uncalled`` would wake it."""
    gate: SimGate | None = None


class SimGate:
    """A driver's send gate (``RaftConfig.send_gate``, the node's ``PeerBacklog``) closed at
    random: entries held for a peer go once the simulation calls ``resume_sends``, as the
    node's tick does once the peer's connection drained."""

    def __init__(self, rng: random.Random, p_closed: float) -> None:
        self.rng = rng
        self.p_closed = p_closed
        self.held: set[int] = set()

    def open(self, to: int) -> bool:
        if self.rng.random() < self.p_closed:
            self.held.add(to)
            return False
        return True

    def sent(self, to: int, size: int) -> None:
        pass


def _entry_key(e: Entry) -> tuple[int, int, int, bytes]:
    d = e.data
    return (e.term, e.last, e.kind, d if type(d) is bytes else bytes(d))


def _quorum(n: int) -> int:
    return n // 2 + 1


class Sim:
    def __init__(
        self,
        seed: int,
        voters: int | None = None,
        fault_steps: int = 130,
        liveness_steps: int = 220,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.n_voters = voters if voters is not None else (3 if seed % 2 == 0 else 5)
        self.fault_steps = fault_steps
        self.liveness_steps = liveness_steps
        self.now = 0
        self.seq = 0
        self.net: list[tuple[int, int, Message]] = []
        self.blocked: set[tuple[int, int]] = set()
        self.hosts: dict[int, Host] = {}
        self.next_id = self.n_voters + 1
        self.trace: deque[tuple] = deque(maxlen=300)
        # Checker state.
        self.leaders: dict[int, int] = {}
        self.committed: dict[int, tuple[int, int, int, bytes]] = {}
        self.max_committed = -1
        self.acked: dict[bytes, int] = {}
        self.proposed = 0
        self.reads: dict[bytes, int] = {}
        self.read_count = 0
        self.reads_served = 0
        self.stats = dict.fromkeys(STAT_KEYS, 0)
        # Fault knobs, drawn per seed so schedules differ in character.
        r = self.rng
        self.p_drop = r.choice((0.0, 0.03, 0.1))
        self.p_dup = r.choice((0.0, 0.03))
        self.max_delay = r.choice((0, 1, 3))
        self.p_crash = r.choice((0.0, 0.01, 0.03))
        self.p_partition = r.choice((0.0, 0.02))
        self.p_fsync = r.choice((0.3, 0.7, 1.0))
        self.pre_vote = r.random() < 0.8
        self.check_quorum = r.random() < 0.8
        self.rest_restarts = r.random() < 0.5
        self.prompt_commit = r.random() < 0.3  # (the metadata group's commit notices)
        # (a generator of its own: seeds without a send gate keep their schedules)
        self.gate_rng = random.Random(seed * 7919 + 1)
        self.p_gate = self.gate_rng.choice((0.0, 0.0, 0.2, 0.6))
        self.faults = True
        self.clients = True
        conf = ConfState(tuple(range(1, self.n_voters + 1)))
        # The configuration of the committed log, as the checker learns it from applied entries;
        # every member it ever had (ids are never reused).
        self.committed_conf = conf
        self.committed_members: set[int] = set(conf.voters)
        self._reaped_for: ConfState | None = None
        for nid in conf.voters:
            self._create_host(nid, conf)

    # ------------------------------------------------------------------ hosts

    def _create_host(self, nid: int, conf: ConfState) -> Host:
        h = Host(nid, SimDisk(conf))
        self.hosts[nid] = h
        self._start(h)
        return h

    def _start(self, h: Host) -> None:
        cfg = RaftConfig(
            election_tick=ELECTION_TICK,
            heartbeat_tick=1,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            prompt_commit=self.prompt_commit,
            seed=self.rng.randrange(1 << 30),
            max_inflight_msgs=self.rng.choice((1, 4, 64)),
            max_msg_bytes=self.rng.choice((64, 4096)),
        )
        if self.p_gate:
            cfg.send_gate = h.gate = SimGate(self.gate_rng, self.p_gate)
        d = h.disk
        h.node = RaftNode(h.id, d.written, d.conf, d.hs, cfg)
        if self.rest_restarts and self.now > 0:  # a restart waits for its leader to call
            h.node.rest()
            h.rest_until = self.now + REST_STEPS
            self.stats["rests"] += h.node.quiesced
        h.next_apply = d.written.first_index()
        h.seen_commit = h.node.commit
        h.waiting = []

    def crash(self, h: Host) -> None:
        """Power loss: the page cache and every message not yet sent are gone."""
        report = h.disk.crash(self.rng)
        h.node = None
        h.waiting = []
        st = self.stats
        st["crashes"] += 1
        st["dirty_crashes"] += (
            report.kept_ops + report.lost_ops > 0 or report.state_survived or report.state_lost
        )
        st["lost_writes"] += report.lost_ops
        st["torn"] += report.torn
        if report.state_survived:
            st["state_survived"] += 1
        elif report.state_lost:
            st["state_lost"] += 1
        self.trace.append((self.now, "crash", h.id, report))
        # As the node's runtime does: every survivor makes the same pick of a successor.
        live = self.live()
        pick = self.successor(h.id, [other.id for other in live])
        for other in live:
            other.node.report_node_down(h.id, first=other.id == pick)
        self.check_acked_durable()

    def live(self) -> list[Host]:
        return [h for h in self.hosts.values() if h.node is not None]

    # ------------------------------------------------------------------ network

    def send(self, m: Message) -> None:
        r = self.rng.random
        if self.faults:
            if self.p_drop and r() < self.p_drop:
                return
            copies = 2 if self.p_dup and r() < self.p_dup else 1
        else:
            copies = 1
        net = self.net
        for _ in range(copies):
            self.seq += 1
            delay = int(r() * (self.max_delay + 1)) if self.max_delay else 0
            heapq.heappush(net, (self.now + delay, self.seq, m))

    def deliver_due(self) -> None:
        """Deliver every message due by now. Like the node runtime, a host steps everything
        that arrived and then drains its Ready once; messages sent with no delay arrive in
        the next round of the same step."""
        net = self.net
        hosts = self.hosts
        blocked = self.blocked
        trace = self.trace.append
        now = self.now
        pop = heapq.heappop
        budget = 20000
        while net and net[0][0] <= now:
            touched: dict[int, Host] = {}
            while net and net[0][0] <= now:
                budget -= 1
                if budget < 0:
                    self.fail("message storm: the cluster never stops talking within one step")
                m = pop(net)[2]
                if blocked and (m.frm, m.to) in blocked:
                    continue
                h = hosts.get(m.to)
                if h is None or h.node is None:
                    continue
                trace((now, m))  # formatted only when a failure prints the trace
                h.node.step(m)
                touched[m.to] = h
            for h in touched.values():
                if h.node is not None:
                    self.process(h)

    # ------------------------------------------------------------------ driver

    def process(self, h: Host) -> None:
        node = h.node
        assert node is not None
        disk = h.disk
        rounds = 0
        while node.has_ready():
            rounds += 1
            if rounds > 10:
                self.fail("has_ready() never settles")
            rd = node.ready()
            if rd.reset is not None:
                # Ready's contract, as the node runtime keeps it: the state file holds the
                # configuration the reset log no longer does before the reset is durable.
                disk.save_state(rd.hard_state, rd.conf_state)
                disk.sync_state()
                disk.reset(*rd.reset)
                h.next_apply = rd.reset[0]
                self.stats["resets"] += 1
            if rd.entries:
                disk.append(rd.entries)
            if rd.hard_state is not None or rd.conf_state is not None:
                disk.save_state(rd.hard_state, rd.conf_state)
            for m in rd.messages:
                if m.after_persist:
                    h.waiting.append(m)
                else:
                    self.send(m)
            for e in rd.committed_entries:
                self.check_committed(h, e)
            for ctx, index in rd.read_states:
                floor = self.reads.pop(ctx, None)
                if floor is None:
                    self.fail(f"read state for unknown context {ctx!r}")
                if index < floor:
                    self.fail(f"read index {index} below acknowledged commit {floor}")
                self.reads_served += 1
            node.advance(rd)
            if node.commit != h.seen_commit:
                if node.commit < h.seen_commit:
                    self.fail(f"node {h.id} commit went back from {h.seen_commit} to {node.commit}")
                if node.role == LEADER:
                    self.check_commit_durable(h)
                h.seen_commit = node.commit
            if node.role == LEADER:
                self.check_leader(h)
        if rounds and self.p_fsync >= 1.0:
            self.fsync(h)

    def fsync(self, h: Host) -> None:
        """A completed fsync: what was written is durable, held-back messages leave."""
        node = h.node
        assert node is not None
        disk = h.disk
        if not disk.dirty() and not h.waiting:
            return
        disk.fsync()
        waiting, h.waiting = h.waiting, []
        for m in waiting:
            self.send(m)
        st = disk.written
        last = st.last_index()
        node.persisted(last, st.term(last))
        self.process(h)

    # ------------------------------------------------------------------ checks

    def fail(self, why: str) -> None:
        tail = "\n".join(
            _format_event(t)
            for t in list(self.trace)[-int(os.environ.get("LAMINAR_SIM_TRACE", "40")) :]
        )
        raise SimFailure(
            f"seed {self.seed} step {self.now}: {why}\nreplay: "
            f"{REPLAY.format(seed=self.seed)}\nlast events:\n{tail}"
        )

    def check_committed(self, h: Host, e: Entry) -> None:
        if e.index != h.next_apply:
            self.fail(f"node {h.id} applied {e.index}, expected {h.next_apply}")
        h.next_apply = e.last + 1
        key = _entry_key(e)
        prev = self.committed.get(e.index)
        if prev is None:
            self.committed[e.index] = key
            if e.last > self.max_committed:
                self.max_committed = e.last
            if e.kind == EntryKind.CONFIG:
                self._note_committed_conf(e)
        elif prev != key:
            self.fail(f"committed entry at {e.index} changed: {prev} vs {key} (node {h.id})")
        if e.kind == EntryKind.NORMAL and key[3] not in self.acked:
            self.acked[key[3]] = e.index

    def _note_committed_conf(self, e: Entry) -> None:
        conf = decode_conf(e.data, e.index)
        if conf is None:
            self.fail(f"committed CONFIG entry at {e.index} does not decode")
        if conf.index > self.committed_conf.index:
            self.committed_conf = conf
            self.committed_members |= {*conf.voters, *conf.learners}

    def durable_holders(self, voters: tuple[int, ...], index: int, term: int) -> int:
        """Voters whose durable log holds the entry at ``index`` of ``term`` (or was compacted
        or reset past it: they hold its effect)."""
        n = 0
        for v in voters:
            h = self.hosts.get(v)
            if h is not None and h.disk.durable_term(index) in (term, -1):
                n += 1
        return n

    def check_commit_durable(self, h: Host) -> None:
        """A leader commits (and so acknowledges to clients) only what a quorum of its
        configuration's voters holds durably."""
        node = h.node
        c = node.commit
        try:
            term = node.log.term(c)
        except CompactedError:
            return
        voters = node.conf.voters
        n = self.durable_holders(voters, c, term)
        if n < _quorum(len(voters)):
            self.fail(f"leader {h.id} committed {c} with {n} durable copies among {voters}")

    def check_acked_durable(self) -> None:
        """No acknowledged entry is lost: each is durable on at least one voter of every quorum
        of the committed configuration, so no leader can be elected without it. (Not on a whole
        quorum: an entry may have been committed under the next configuration, which counts
        from the moment it is appended; single-voter changes keep the quorums of both
        intersecting.)"""
        voters = self.committed_conf.voters
        need = len(voters) - _quorum(len(voters)) + 1
        committed = self.committed
        for payload, idx in self.acked.items():
            n = self.durable_holders(voters, idx, committed[idx][0])
            if n < need:
                self.fail(f"acknowledged {payload!r} at {idx} is durable on {n} of {voters} only")

    def check_leader(self, h: Host) -> None:
        node = h.node
        assert node is not None
        t = node.term
        prev = self.leaders.get(t)
        if prev is None:
            self.leaders[t] = h.id
            self.stats["leaders"] += 1
            self.trace.append((self.now, "leader", h.id, t))
            # Leader completeness: every committed entry still retained must be in its log,
            # but for entries of a later term than its own. Those were committed by a later
            # leader: this one was elected late, by votes given in its term before the voters
            # moved on (a delayed vote answer), and steps down as soon as it hears of the later
            # term; the property holds for the leaders of later terms (seed 1506044).
            log = node.log
            first = log.first_index()
            last = log.last_index()
            for idx, key in self.committed.items():
                if idx < first or key[0] > t:
                    continue
                ents = log.entries(idx, idx + 1, 0) if idx <= last else []
                if not ents or ents[0].index != idx or _entry_key(ents[0]) != key:
                    self.fail(f"leader {h.id} of term {t} lacks committed entry {idx}")
        elif prev != h.id:
            self.fail(f"two leaders in term {t}: {prev} and {h.id}")

    def check_log_matching(self) -> None:
        """Two logs holding an entry of the same term at the same offset agree on everything
        before it."""
        logs = {}
        for h in self.hosts.values():
            if h.node is not None:
                logs[h.id] = {e.index: e for e in h.disk.written.all_entries()}
        ids = sorted(logs)
        for i, a in enumerate(ids):
            la = logs[a]
            for b in ids[i + 1 :]:
                lb = logs[b]
                matched = False
                for idx in sorted(la.keys() & lb.keys(), reverse=True):
                    ea, eb = la[idx], lb[idx]
                    if ea is eb:  # the same entry object, handed on by the leader
                        matched = True
                        continue
                    if not matched and ea.term == eb.term:
                        matched = True
                    if matched and _entry_key(ea) != _entry_key(eb):
                        self.fail(f"log matching broken between {a} and {b} at {idx}")

    # ------------------------------------------------------------------ actions

    def leader(self) -> Host | None:
        best = None
        for h in self.live():
            if h.node.role == Role.LEADER and (best is None or h.node.term > best.node.term):
                best = h
        return best

    def propose(self) -> None:
        hosts = self.live()
        if not hosts:
            return
        h = self.rng.choice(hosts)
        self.proposed += 1
        payload = f"s{self.seed}-p{self.proposed}".encode()
        count = self.rng.choice((1, 1, 1, 3))
        try:
            if self.rng.random() < 0.3:
                h.node.propose_many([(payload, count), (payload + b"b", 1)])
            else:
                h.node.propose(payload, count)
        except NotLeader as e:
            if h.node.role == Role.LEADER and not h.node.transferee:
                self.fail("NotLeader raised on a leader")
            expected = h.node.transferee or h.node.leader_id
            if e.leader_id != expected:
                self.fail(f"NotLeader carries {e.leader_id}, expected {expected}")
            return
        self.process(h)

    def conf_change(self) -> None:
        h = self.leader()
        if h is None:
            return
        node = h.node
        conf = node.conf
        r = self.rng
        choices: list[ConfChange] = []
        if len(self.hosts) < self.n_voters + 3:
            choices.append(ConfChange(ConfChangeType.ADD_LEARNER, self.next_id))
        for lid in conf.learners:
            choices.append(ConfChange(ConfChangeType.PROMOTE, lid))
            choices.append(ConfChange(ConfChangeType.REMOVE, lid))
        if len(conf.voters) > 3:
            for vid in conf.voters:
                if vid != h.id:
                    choices.append(ConfChange(ConfChangeType.REMOVE, vid))
        if not choices:
            return
        cc = r.choice(choices)
        try:
            node.propose_conf_change(cc)
        except (NotLeader, ConfChangeRejected):
            return
        self.stats["conf_changes"] += 1
        self.trace.append((self.now, "conf", cc.type.name, cc.node_id))
        if cc.type == ConfChangeType.ADD_LEARNER:
            self.next_id += 1
            self._create_host(cc.node_id, ConfState(()))
        self.process(h)

    def reap_removed(self) -> None:
        """Stop replicas whose removal is committed (decommissioned machines).

        Ids are never reused, so a replica that was in a committed configuration and is absent
        from the latest committed one is gone for good. The checker's own view of the committed
        log decides, not any node's: a deposed leader that has not heard of newer
        configurations must not get a live member shut down."""
        cc = self.committed_conf
        if cc is self._reaped_for:
            return
        self._reaped_for = cc
        members = {*cc.voters, *cc.learners}
        for other in self.hosts.values():
            if other.id not in members and other.id in self.committed_members and not other.removed:
                other.removed = True
                other.node = None
                self.trace.append((self.now, "reap", other.id))

    def transfer(self) -> None:
        h = self.leader()
        if h is None:
            return
        voters = [v for v in h.node.conf.voters if v != h.id]
        if not voters:
            return
        target = self.rng.choice(voters)
        h.node.transfer_leader(target)
        self.stats["transfers"] += 1
        self.trace.append((self.now, "transfer", h.id, target))
        self.process(h)

    def read(self) -> None:
        h = self.leader()
        if h is None:
            return
        self.read_count += 1
        ctx = f"r{self.read_count}".encode()
        self.reads[ctx] = self.max_committed_before_read()
        h.node.read_index(ctx)
        self.process(h)

    def max_committed_before_read(self) -> int:
        return max(self.acked.values(), default=-1)

    def compact(self) -> None:
        hosts = self.live()
        if not hosts:
            return
        h = self.rng.choice(hosts)
        d = h.disk
        # Retention removes old data only: applied, and long since durable with the state
        # file that records the configuration as of there.
        upto = min(h.node.applied, d.durable_hs.commit, d.durable.last_index())
        first = d.written.first_index()
        if upto > first:
            d.compact(self.rng.randint(first, upto))

    def partition(self) -> None:
        ids = [h.id for h in self.hosts.values() if not h.removed]
        r = self.rng
        if r.random() < 0.5:
            r.shuffle(ids)
            cut = r.randint(1, len(ids) - 1)
            side = set(ids[:cut])
            for a in ids:
                for b in ids:
                    if (a in side) != (b in side):
                        self.blocked.add((a, b))
        else:
            a, b = r.sample(ids, 2)
            self.blocked.add((a, b))
        self.trace.append((self.now, "partition", tuple(sorted(self.blocked))))
        for h in self.live():
            # Each side picks among the nodes it still reaches, as a node would: the two
            # sides' picks may differ (they elect on their own side, where one can win).
            reached = [o for o in ids if (o, h.id) not in self.blocked]
            for other in ids:
                if (other, h.id) in self.blocked:
                    h.node.report_node_down(other, first=h.id == self.successor(other, reached))

    @staticmethod
    def successor(dead: int, reached: list[int]) -> int:
        """A deterministic pick of the dead node's successor among ``reached`` nodes."""
        candidates = sorted(i for i in reached if i != dead)
        return candidates[dead % len(candidates)] if candidates else 0

    # ------------------------------------------------------------------ main loop

    def step(self) -> None:
        r = self.rng
        self.now += 1
        faults = self.faults
        # A crash hits either here (after the previous step's fsyncs) or just before this
        # step's fsyncs, when the most is written and not yet durable.
        crash_at = r.random() if faults and self.p_crash and r.random() < self.p_crash else -1.0
        if faults:
            if 0.0 <= crash_at < 0.5:
                self.crash_some()
            for h in list(self.hosts.values()):
                if h.node is None and not h.removed and r.random() < 0.08:
                    self._start(h)
                    self.trace.append((self.now, "restart", h.id))
                    self.report_up(h.id)
            if self.p_partition and r.random() < self.p_partition:
                self.partition()
            if self.blocked and r.random() < 0.05:
                self.blocked.clear()
                self.trace.append((self.now, "heal"))
                for h in self.hosts.values():
                    self.report_up(h.id)
            if r.random() < 0.03:
                self.conf_change()
            if r.random() < 0.01:
                self.transfer()
            if r.random() < 0.02:
                self.compact()
        if self.clients and r.random() < 0.03:
            self.read()
        for h in self.live():
            if 0 <= h.rest_until <= self.now:
                h.rest_until = -1
                if h.node.quiesced and h.node.lead == 0:  # no leader called
                    h.node.wake()
                    self.stats["rests_woken"] += 1
                elif h.node.lead:
                    self.stats["rests_called"] += 1
            if not h.node.quiesced and r.random() < 0.95:
                h.node.tick()
                self.process(h)
            gate = h.gate
            if gate is not None and gate.held and self.gate_rng.random() < 0.3:
                held, gate.held = gate.held, set()
                for to in sorted(held):
                    h.node.resume_sends(to)
                self.process(h)
        self.deliver_due()
        if self.clients and r.random() < 0.5:
            self.propose()
        if crash_at >= 0.5:
            self.crash_some()
        for h in self.live():
            if self.p_fsync >= 1.0 or r.random() < self.p_fsync:
                self.fsync(h)
        self.reap_removed()
        if self.now % 5 == 0:
            self.check_log_matching()

    def crash_some(self) -> None:
        """Power loss of one host, or now and then of every host at once."""
        hosts = self.live()
        if not hosts:
            return
        r = self.rng
        if r.random() < 0.1:
            self.trace.append((self.now, "power loss of all hosts"))
            for h in hosts:
                self.crash(h)
        else:
            # The worst moment is the likeliest: a host with writes not yet durable.
            dirty = [h for h in hosts if h.disk.dirty()]
            self.crash(r.choice(dirty if dirty and r.random() < 0.7 else hosts))

    def heal(self) -> None:
        self.faults = False
        self.blocked.clear()
        self.p_fsync = 1.0
        for h in self.hosts.values():
            if h.node is None and not h.removed:
                self._start(h)
        for h in self.hosts.values():
            self.report_up(h.id)
        self.trace.append((self.now, "heal-all"))

    def report_up(self, nid: int) -> None:
        """The liveness layer sees ``nid`` again (restart or healed partition)."""
        for other in self.live():
            if other.id != nid:
                other.node.report_node_up(nid)

    def run(self) -> None:
        for _ in range(self.fault_steps):
            self.step()
        self.heal()
        self.check_liveness("final")
        self.check_quiesce()
        # Fail the leader of the quiesced group: only report_node_down can wake the followers.
        leader = self.leader()
        assert leader is not None
        self.crash(leader)
        self.check_liveness("failover")
        self.check_final()

    def check_quiesce(self) -> None:
        """Without client traffic a healthy group must catch every member up and then go quiet
        (nobody needs ticks). Catching up is timed apart: a member that fell behind under
        64-byte messages, one append in flight and reordering (each out-of-order append is
        refused and the leader probes again) can need more steps than quiescing itself."""
        self.clients = False
        for _ in range(CATCH_UP_STEPS):
            h = self.leader()
            if h is not None and self._caught_up(h):
                break
            self.step()
        else:
            self.fail(f"members not caught up within {CATCH_UP_STEPS} idle steps")
        for _ in range(QUIESCE_STEPS):
            self.step()
            h = self.leader()
            if h is not None and all(self.hosts[m].node.quiesced for m in self.members()):
                self.clients = True
                return
        self.fail(f"group did not quiesce within {QUIESCE_STEPS} idle steps of catching up")

    def _caught_up(self, h: Host) -> bool:
        last = h.node.last_index
        for m in self.members():
            node = self.hosts[m].node
            if node.last_index != last or node.commit != last:
                return False
        return True

    def check_liveness(self, tag: str) -> None:
        """After healing, a leader must emerge and a fresh proposal must commit everywhere."""
        payload = f"s{self.seed}-{tag}".encode()
        proposed_by: tuple[int, int] | None = None
        for _ in range(self.liveness_steps):
            self.step()
            h = self.leader()
            if payload in self.acked:
                target = self.acked[payload]
                if h is not None and all(
                    self.hosts[m].node.commit >= target for m in self.members()
                ):
                    return
                continue
            if h is None or h.node.transferee or proposed_by == (h.id, h.node.term):
                continue
            try:
                h.node.propose(payload)
            except NotLeader:
                continue
            proposed_by = (h.id, h.node.term)
            self.process(h)
        self.fail(f"no progress within {self.liveness_steps} steps ({tag})")

    def members(self) -> list[int]:
        h = self.leader()
        assert h is not None
        conf = h.node.conf
        return [m for m in (*conf.voters, *conf.learners) if self.hosts[m].node is not None]

    def check_final(self) -> None:
        self.check_log_matching()
        h = self.leader()
        assert h is not None
        log = h.node.log
        first = log.first_index()
        for payload, idx in self.acked.items():
            if idx < first:
                continue
            ents = log.entries(idx, idx + 1, 0)
            if bytes(ents[0].data) != payload:
                self.fail(f"acknowledged proposal {payload!r} at {idx} lost")


def _format_event(t: tuple) -> str:
    if len(t) == 2 and isinstance(t[1], Message):
        m = t[1]
        extra = " reject" if m.reject else ""
        return (
            f"({t[0]}, deliver {m.type.name} {m.frm}->{m.to} term {m.term} index {m.index}{extra})"
        )
    return repr(t)
