"""Seeded deterministic simulation of the group coordinator with its clients and its log.

One ``GroupSim(seed)`` runs two groups of simulated consumer processes (some static) against one
``Coordinator`` whose records go through a simulated internal partition: records are durable only
once "committed" (a random lag), replies are released only after that, and a coordinator
fail-over keeps only the durable records (a random prefix of the pending ones survives) and
rebuilds the coordinator from them, sometimes from a compacted log, sometimes from the start of
the newest durable checkpoint on (what a shard's log holds after its old segments were dropped).

Faults during the first phase: processes crash and restart (static ones under the same instance
id), pause (SIGSTOP) for up to twice the session timeout and resume as zombies, close gracefully,
change subscriptions; topics are created, grown and deleted; heartbeats and their replies are
lost, delayed and reordered (commits travel on a per-member FIFO connection that can lose them);
the coordinator fails over. Then a quiet phase: every process is up, the network is clean.

The simulated client follows the rules the real client must: it owns exactly what its newest
heartbeat reply lists; it holds partitions only while its lease runs (send time of its last
accepted heartbeat + session timeout); after an unknown-member or fenced error it drops all and
joins again under a new member id; it commits only what it owns.

Invariants checked after every step (any violation raises ``SimFailure`` naming the seed and the
replay command):

* no partition is owned by two processes at once, from the processes' own view (lease-gated);
* inside the coordinator, the partitions members may own or are revoking are disjoint;
* a commit at an epoch the durable state removed or fenced its member at is never accepted;
* committed offsets never go back, and every acknowledged commit survives fail-over;
* the live state equals a replay of the records written (checked periodically), and a compacted
  log, or the log from the newest durable checkpoint on, replays to the same state as the full
  one.

After the quiet phase: every live process owns exactly its target, the target is balanced
(members with equal subscriptions differ by at most one) and covers every subscribed partition,
nothing is being revoked, and no assignment changes any more.
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from dataclasses import dataclass, field

from laminar.durable import Reply
from laminar.errors import FencedMemberEpochError, LaminarError, UnknownMemberIdError
from laminar.groups.coordinator import Coordinator, CoordinatorConfig, HeartbeatResponse
from laminar.groups.records import GroupsState, Record, compact, replay

REPLAY = (
    "LAMINAR_GROUP_SIM_SEEDS=1 LAMINAR_GROUP_SIM_SEED_BASE={seed} "
    ".venv/bin/pytest tests/test_group_sim.py -k many_seeds"
)
STEP_MS = 100
CONFIG = CoordinatorConfig(session_timeout_ms=3000, heartbeat_interval_ms=500)
REBALANCE_TIMEOUT_MS = 2000
REQUEST_TIMEOUT_MS = 1000
TOPIC_POOL = ("t0", "t1", "t2", "t3")
GROUPS = {"g1": ("p0", "p1", "p2", "p3"), "g2": ("p4", "p5", "p6")}
STATIC = {"p0", "p1", "p4"}


class SimFailure(AssertionError):
    pass


@dataclass
class Process:
    """One consumer process; ``member_id`` changes with each incarnation."""

    name: str
    group: str
    topics: tuple[str, ...]
    instance_id: str | None
    member_id: str = ""
    incarnation: int = 0
    epoch: int = 0
    owned: frozenset = frozenset()
    lease_until: int = -1
    up: bool = True
    paused_until: int = -1
    in_flight: tuple[int, int] | None = None  # (request number, sent at)
    requests: int = 0
    next_heartbeat: int = 0
    commit_busy: bool = False
    inbox: list = field(default_factory=list)

    def effective(self, now: int) -> frozenset:
        return self.owned if self.up and now < self.lease_until else frozenset()


class GroupSim:
    def __init__(self, seed: int, fault_steps: int = 300, quiet_steps: int = 160) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.fault_steps = fault_steps
        self.quiet_steps = quiet_steps
        self.now = 0
        self.topics: dict[str, int] = {"t0": 6, "t1": 4, "t2": 3}
        self.topic_gen: dict[str, int] = {t: 0 for t in TOPIC_POOL}
        self.coord = Coordinator(CONFIG, self.topics, 0)
        self.log: list[Record] = []  # durable records of all coordinator incarnations
        self.pending: list[tuple[Record, ...]] = []  # appended batches, not yet durable
        self.durable_count = 0  # durable records of the current incarnation
        # Where the newest checkpoint starts and ends in the log once durable ([start, end)).
        self.checkpoint: tuple[int, int] | None = None
        self.checkpoint_start = -1  # start of the newest checkpoint that is wholly durable
        self.held: list[tuple[Reply, object]] = []
        self.down_until = -1
        self.mirror = GroupsState()  # replay of the durable log, kept incrementally
        # Per (group, member id): its newest durable epoch, and the newest epoch at which the
        # durable state removed or fenced it (a commit at or below that epoch is a zombie's).
        self.last_epoch: dict[tuple[str, str], int] = {}
        self.dead: dict[tuple[str, str], int] = {}
        self.acked: dict[tuple[str, str, int], tuple[int, int]] = {}  # -> (offset, topic gen)
        self.offset_counter = 0
        self.net: list[tuple[int, int, str, object]] = []  # (deliver at, seq, kind, payload)
        self.fifo_at: dict[str, int] = {}
        self.seq = 0
        self.loss = 0.0
        self.quiet = False
        self.stats = Counter()
        self.procs: dict[str, Process] = {}
        for group, names in GROUPS.items():
            for name in names:
                topics = self._random_topics()
                inst = f"inst-{name}" if name in STATIC else None
                proc = Process(name, group, topics, inst)
                self._new_incarnation(proc)
                proc.next_heartbeat = self.rng.randrange(0, 5) * STEP_MS
                self.procs[name] = proc

    # ------------------------------------------------------------------ helpers

    def fail(self, message: str) -> None:
        raise SimFailure(
            f"seed {self.seed} at {self.now} ms: {message}\nreplay: {REPLAY.format(seed=self.seed)}"
        )

    def _random_topics(self) -> tuple[str, ...]:
        if self.rng.random() < 0.6:
            return ("t0", "t1")
        k = self.rng.randint(1, 3)
        return tuple(sorted(self.rng.sample(TOPIC_POOL, k)))

    def _new_incarnation(self, proc: Process) -> None:
        proc.incarnation += 1
        proc.member_id = f"{proc.name}.{proc.incarnation}"
        proc.epoch = 0
        proc.owned = frozenset()
        proc.lease_until = -1
        proc.in_flight = None
        proc.commit_busy = False

    def _send(self, kind: str, payload: object, fifo: str | None = None) -> None:
        if not self.quiet and self.rng.random() < self.loss:
            self.stats["lost"] += 1
            return
        if self.quiet:
            at = self.now + self.rng.randint(0, 1) * STEP_MS
        elif self.rng.random() < 0.05:  # a long stall: arrives after later messages
            at = self.now + self.rng.randint(4, 25) * STEP_MS
        else:
            at = self.now + self.rng.randint(0, 3) * STEP_MS
        if fifo is not None:
            at = max(at, self.fifo_at.get(fifo, 0))
            self.fifo_at[fifo] = at
        self.seq += 1
        self.net.append((at, self.seq, kind, payload))

    # ------------------------------------------------------------------ the run

    def run(self) -> None:
        for _ in range(self.fault_steps):
            self._faults()
            self.step()
        self._heal()
        for _ in range(self.quiet_steps):
            self.step()
        self._check_converged()
        before = self._assignments()
        for _ in range(20):
            self.step()
        if self._assignments() != before:
            self.fail("assignments still change after quiet time")

    def _assignments(self) -> list:
        return [
            (g.target, g.target_members, g.assignments, g.members)
            for g in (self.coord.state.groups.get(name) for name in sorted(GROUPS))
            if g is not None
        ]

    def step(self) -> None:
        self.now += STEP_MS
        if self.now >= self.down_until and self.coord.topics != self.topics:
            self.coord.topics_changed(self.topics, self.now)  # it changed while it was down
        self._deliver()
        if self.now >= self.down_until:
            self.coord.tick(self.now)
            if self.checkpoint is None and self.rng.random() < 0.03:
                self._take()  # as the driver does: a checkpoint starts an entry of its own
                start = len(self.log) + sum(len(b) for b in self.pending)
                self.checkpoint = (start, start + self.coord.checkpoint())
                self.stats["checkpoints"] += 1
        for name in sorted(self.procs):
            self._act(self.procs[name])
        self._log_progress()
        self._check()

    # ------------------------------------------------------------------ faults

    def _faults(self) -> None:
        rng = self.rng
        if rng.random() < 0.02:
            self.loss = rng.choice([0.0, 0.05, 0.2, 0.5])
        procs = [self.procs[n] for n in sorted(self.procs)]
        for proc in procs:
            r = rng.random()
            if proc.up and r < 0.004:
                self.stats["crashes"] += 1
                proc.up = False
                proc.owned = frozenset()
                proc.in_flight = None
                proc.inbox.clear()
            elif not proc.up and r < 0.05:
                proc.up = True
                self._new_incarnation(proc)  # static ones keep their instance id
                proc.next_heartbeat = self.now
            elif proc.up and proc.paused_until < self.now and r < 0.007:
                self.stats["pauses"] += 1
                proc.paused_until = self.now + rng.randint(5, 60) * STEP_MS
            elif proc.up and proc.paused_until < self.now and r < 0.01 and proc.epoch > 0:
                self.stats["leaves"] += 1
                static = proc.instance_id is not None and rng.random() < 0.5
                self._send("leave", (proc.group, proc.member_id, proc.epoch, static))
                self._new_incarnation(proc)
                proc.next_heartbeat = self.now + rng.randint(0, 20) * STEP_MS
            elif r < 0.013:
                self.stats["subscriptions"] += 1
                proc.topics = self._random_topics()
        r = rng.random()
        if r < 0.006:
            self._failover()
        elif r < 0.016:
            self._change_topics()

    def _change_topics(self) -> None:
        rng = self.rng
        existing = sorted(self.topics)
        r = rng.random()
        if r < 0.4 and existing:
            topic = rng.choice(existing)
            self.topics[topic] = min(12, self.topics[topic] + rng.randint(1, 3))
            self.stats["grown"] += 1
        elif r < 0.7 and existing:
            topic = rng.choice(existing)
            del self.topics[topic]
            self.topic_gen[topic] += 1
            self.stats["deleted"] += 1
        else:
            missing = [t for t in TOPIC_POOL if t not in self.topics]
            if not missing:
                return
            self.topics[rng.choice(missing)] = rng.randint(1, 6)
            self.stats["created"] += 1
        if self.now >= self.down_until:
            self.coord.topics_changed(self.topics, self.now)

    def _failover(self) -> None:
        self.stats["failovers"] += 1
        if self.now < self.down_until:
            return
        self._take()
        keep = self.rng.randint(0, len(self.pending))
        self._make_durable([r for batch in self.pending[:keep] for r in batch])
        self.stats["records_lost"] += sum(len(b) for b in self.pending[keep:])
        self.pending = []
        self.coord.records_lost()
        self.held = []
        self.down_until = self.now + self.rng.randint(0, 5) * STEP_MS
        self.checkpoint = None  # one not wholly durable is lost with the pending records
        log = self.log
        if self.checkpoint_start >= 0 and self.rng.random() < 0.5:
            trimmed = self.log[self.checkpoint_start :]
            if replay(trimmed) != replay(self.log):
                self.fail("the log from the newest checkpoint on replays to a different state")
            self.log = log = trimmed
            self.stats["trims"] += 1
        elif self.rng.random() < 0.5:
            compacted = compact(self.log)
            if replay(compacted) != replay(self.log):
                self.fail("the compacted log replays to a different state")
            self.log = log = compacted
            self.stats["compactions"] += 1
        self.checkpoint_start = -1  # positions in the new log are unknown
        self.coord = Coordinator(CONFIG, self.topics, self.down_until, records=log)
        self.durable_count = 0
        self._check_acked_durable()

    def _heal(self) -> None:
        self.quiet = True
        self.loss = 0.0
        for name in sorted(self.procs):
            proc = self.procs[name]
            proc.paused_until = -1
            if not proc.up:
                proc.up = True
                self._new_incarnation(proc)
                proc.next_heartbeat = self.now

    # ------------------------------------------------------------------ the log

    def _take(self) -> None:
        batch = self.coord.take_batch()
        if batch:
            self.pending.append(batch)

    def _make_durable(self, records: list[Record]) -> None:
        self.log.extend(records)
        if self.checkpoint is not None and len(self.log) >= self.checkpoint[1]:
            self.checkpoint_start = self.checkpoint[0]
            self.checkpoint = None
        for record in records:
            self.mirror.apply(record)
        for group in GROUPS:
            state = self.mirror.groups.get(group)
            members = state.assignments if state else {}
            for mid, cur in members.items():
                self.last_epoch[(group, mid)] = cur.epoch
                if cur.fenced:
                    self.dead[(group, mid)] = cur.epoch
            for key in [k for k in self.last_epoch if k[0] == group and k[1] not in members]:
                self.dead[key] = self.last_epoch.pop(key)

    def _log_progress(self) -> None:
        self._take()
        if self.pending and (self.quiet or self.rng.random() < 0.7):
            records = [r for batch in self.pending for r in batch]
            self._make_durable(records)
            self.durable_count += len(records)
            self.pending = []
            self.coord.records_committed(self.durable_count)
        still = []
        for reply, deliver in self.held:
            if self.coord.is_released(reply):
                deliver()
            else:
                still.append((reply, deliver))
        self.held = still

    # ------------------------------------------------------------------ the network

    def _deliver(self) -> None:
        self.net.sort(key=lambda m: (m[0], m[1]))
        due = [m for m in self.net if m[0] <= self.now]
        self.net = [m for m in self.net if m[0] > self.now]
        for _, _, kind, payload in due:
            if kind.startswith("reply"):
                name = payload[0]
                self.procs[name].inbox.append((kind, payload[1:]))
            elif self.now >= self.down_until:
                getattr(self, f"_serve_{kind}")(payload)

    def _serve_heartbeat(self, payload) -> None:
        name, req, group, mid, epoch, inst, topics, owned = payload
        try:
            reply = self.coord.heartbeat(
                group, mid, epoch, inst, REBALANCE_TIMEOUT_MS, topics, owned, self.now
            )
        except (UnknownMemberIdError, FencedMemberEpochError) as e:
            self._send("reply_hb", (name, req, mid, e))
            return
        self._hold(reply, lambda: self._send("reply_hb", (name, req, mid, reply.value)))

    def _serve_leave(self, payload) -> None:
        group, mid, epoch, static = payload
        with contextlib.suppress(LaminarError):  # nobody waits for the answer to a leave
            self.coord.leave(group, mid, epoch, self.now, static=static)

    def _serve_commit(self, payload) -> None:
        name, group, mid, epoch, offsets = payload
        try:
            reply = self.coord.commit_offsets(group, mid, epoch, offsets, self.now)
        except LaminarError as e:
            self.stats["commits_refused"] += 1
            self._send("reply_commit", (name, mid, e), fifo=mid)
            return
        if epoch <= self.dead.get((group, mid), -1):
            self.fail(f"commit from removed or fenced {mid} at epoch {epoch} accepted: {offsets}")
        gens = {tp: self.topic_gen[tp[0]] for tp in offsets}
        self._hold(reply, lambda: self._ack(name, group, mid, offsets, gens))

    def _ack(self, name, group, mid, offsets, gens) -> None:
        self.stats["commits_acked"] += 1
        for (topic, partition), (offset, _) in offsets.items():
            key = (group, topic, partition)
            if gens[(topic, partition)] == self.topic_gen[topic]:
                prev = self.acked.get(key)
                if prev is None or prev[1] != gens[(topic, partition)] or prev[0] < offset:
                    self.acked[key] = (offset, gens[(topic, partition)])
        self._send("reply_commit", (name, mid, None), fifo=mid)

    def _hold(self, reply: Reply, deliver) -> None:
        if self.coord.is_released(reply):
            deliver()
        else:
            self.held.append((reply, deliver))

    # ------------------------------------------------------------------ the clients

    def _act(self, proc: Process) -> None:
        if not proc.up or proc.paused_until >= self.now:
            return
        if proc.owned and self.now >= proc.lease_until:
            proc.owned = frozenset()  # the lease ran out: stop reading at once
            self.stats["lease_expired"] += 1
        inbox, proc.inbox = proc.inbox, []
        for kind, payload in inbox:
            if kind == "reply_hb":
                self._on_heartbeat_reply(proc, *payload)
            elif payload[0] == proc.member_id:
                proc.commit_busy = False
        if proc.in_flight and self.now - proc.in_flight[1] >= REQUEST_TIMEOUT_MS:
            proc.in_flight = None
        if proc.in_flight is None and self.now >= proc.next_heartbeat:
            proc.requests += 1
            proc.in_flight = (proc.requests, self.now)
            proc.next_heartbeat = self.now + CONFIG.heartbeat_interval_ms
            payload = (
                proc.name,
                proc.requests,
                proc.group,
                proc.member_id,
                proc.epoch,
                proc.instance_id,
                proc.topics,
                tuple(sorted(proc.owned)),
            )
            self._send("heartbeat", payload)
        if proc.owned and not proc.commit_busy and proc.epoch > 0 and self.rng.random() < 0.3:
            chosen = self.rng.sample(sorted(proc.owned), min(2, len(proc.owned)))
            offsets = {}
            for tp in chosen:
                self.offset_counter += 1
                offsets[tp] = (self.offset_counter, f"by {proc.member_id}")
            proc.commit_busy = True
            self._send(
                "commit",
                (proc.name, proc.group, proc.member_id, proc.epoch, offsets),
                fifo=proc.member_id,
            )

    def _on_heartbeat_reply(self, proc: Process, req: int, mid: str, value) -> None:
        if mid != proc.member_id or proc.in_flight is None or proc.in_flight[0] != req:
            return  # an answer to an older request or incarnation
        sent_at = proc.in_flight[1]
        proc.in_flight = None
        if isinstance(value, LaminarError):
            self.stats["fenced"] += 1
            self._new_incarnation(proc)
            proc.next_heartbeat = self.now
            return
        assert isinstance(value, HeartbeatResponse)
        proc.epoch = value.member_epoch
        proc.owned = value.assignment
        proc.lease_until = sent_at + CONFIG.session_timeout_ms
        if proc.owned:
            # Ask again soon while the assignment is still moving.
            proc.next_heartbeat = min(proc.next_heartbeat, self.now + STEP_MS * 2)

    # ------------------------------------------------------------------ invariants

    def _check(self) -> None:
        for group in GROUPS:
            owners: dict = {}
            for name in GROUPS[group]:
                for tp in self.procs[name].effective(self.now):
                    if tp in owners:
                        self.fail(f"{tp} of {group} owned by {owners[tp]} and {name}")
                    owners[tp] = name
            state = self.coord.state.groups.get(group)
            if state is not None:
                held: dict = {}
                for mid, cur in state.assignments.items():
                    for tp in (*cur.assigned, *cur.revoking):
                        if tp in held:
                            self.fail(f"coordinator gives {tp} to {held[tp]} and {mid}")
                        held[tp] = mid
                for tp, value in state.offsets.items():
                    acked = self.acked.get((group, *tp))
                    if acked and acked[1] == self.topic_gen[tp[0]] and value.offset < acked[0]:
                        self.fail(f"offset of {tp} went back: {value.offset} < acked {acked[0]}")
        if self.now % (STEP_MS * 25) == 0:
            self._take()
            written = self.log + [r for batch in self.pending for r in batch]
            if replay(written) != self.coord.state:
                self.fail("live state differs from a replay of the records written")

    def _check_acked_durable(self) -> None:
        for (group, topic, partition), (offset, gen) in sorted(self.acked.items()):
            if gen != self.topic_gen[topic]:
                continue
            state = self.coord.state.groups.get(group)
            stored = state.offsets.get((topic, partition)) if state else None
            if stored is None or stored.offset < offset:
                self.fail(
                    f"acknowledged commit {group} {topic}/{partition}={offset} lost in fail-over"
                    f" (now {stored})"
                )

    def _check_converged(self) -> None:
        for group, names in GROUPS.items():
            state = self.coord.state.groups.get(group)
            if state is None:
                self.fail(f"group {group} vanished")
            live = {self.procs[n].member_id: self.procs[n] for n in names}
            if set(state.members) != set(live):
                self.fail(f"{group}: members {sorted(state.members)} != live {sorted(live)}")
            covered: Counter = Counter()
            counts: dict[tuple, list[int]] = {}
            for mid, proc in live.items():
                target = frozenset(state.target_members[mid].partitions)
                cur = state.assignments[mid]
                if cur.revoking or frozenset(cur.assigned) != target:
                    self.fail(f"{mid} not reconciled: {cur} target {sorted(target)}")
                if proc.effective(self.now) != target:
                    self.fail(f"{mid} owns {sorted(proc.owned)}, target {sorted(target)}")
                if set(state.members[mid].topics) != set(proc.topics):
                    self.fail(f"{mid}: subscription not up to date")
                covered.update(target)
                counts.setdefault(proc.topics, []).append(len(target))
            wanted = {
                (t, i)
                for proc in live.values()
                for t in proc.topics
                for i in range(self.topics.get(t, 0))
            }
            if set(covered) != wanted or any(n != 1 for n in covered.values()):
                self.fail(f"{group}: target does not cover each subscribed partition once")
            for topics, c in counts.items():
                if max(c) - min(c) > 1:
                    self.fail(f"{group}: unbalanced for {topics}: {c}")
