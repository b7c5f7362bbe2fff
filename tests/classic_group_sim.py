"""Seeded deterministic simulation of classic (JoinGroup/SyncGroup) groups on the coordinator.

One ``ClassicSim(seed)`` runs two groups of simulated Kafka consumers (eager rebalancing, the
range assignor on the leader, some static members) against one ``Coordinator`` whose records
go through a simulated internal partition: records become durable after a random lag, replies
(held joins and syncs included) are released only after that, and a coordinator fail-over keeps
the durable records plus a random prefix of the pending ones and rebuilds the coordinator from
them (sometimes from a compacted log, sometimes from the newest durable checkpoint on).
Faults during the first phase: processes crash and restart (static ones under the same
instance id), pause for up to twice the session timeout, close (LeaveGroup); requests and
replies are lost and delayed; the coordinator checkpoints and fails over. Then a quiet phase.

The simulated client behaves like Kafka's: on REBALANCE_IN_PROGRESS it commits what it owns
and drops it before joining again; on ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID /
FENCED_INSTANCE_ID it drops everything without committing; a request without an answer within
its timeout counts as failed.

Invariants (a violation raises ``SimFailure`` naming the seed and the replay command):

* every SyncGroup answer a member gets is exactly what its generation's leader assigned it;
* no two processes that completed the same generation own the same partition;
* join answers released for a group never go back in generation, and one generation has one
  leader and one member list, across fail-overs too;
* an offset commit is accepted only at a generation no older than any generation already
  answered (a zombie of an older generation never commits), and an acknowledged commit survives
  fail-over (the offset is it or a later accepted commit);
* a fail-over replays to exactly the durable records' state, from the whole log, a compacted
  one or the newest durable checkpoint on, and keeps the newest answered generation.

After the quiet phase every process is in one stable generation and the group's partitions are
split disjointly and completely among them.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from laminar.durable import Reply
from laminar.errors import (
    FencedInstanceIdError,
    IllegalGenerationError,
    LaminarError,
    MemberIdRequiredError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from laminar.groups.classic import ClassicConfig, JoinResult, SyncResult, Waiting
from laminar.groups.consumer_protocol import (
    assignment_partitions,
    encode_assignment,
    encode_subscription,
)
from laminar.groups.coordinator import Coordinator, CoordinatorConfig
from laminar.groups.records import Record, compact, replay

REPLAY = (
    "LAMINAR_CLASSIC_SIM_SEEDS=1 LAMINAR_CLASSIC_SIM_SEED_BASE={seed} "
    ".venv/bin/pytest tests/test_classic_group_sim.py -k many_seeds"
)
STEP_MS = 100
SESSION_MS = 3000
REBALANCE_MS = 2000
HEARTBEAT_MS = 500
JOIN_TIMEOUT_MS = REBALANCE_MS + 2500
REQUEST_TIMEOUT_MS = 1500
CONFIG = CoordinatorConfig(
    session_timeout_ms=SESSION_MS,
    heartbeat_interval_ms=HEARTBEAT_MS,
    classic=ClassicConfig(min_session_timeout_ms=1000, initial_rebalance_delay_ms=300),
)
PARTITIONS = 6
TOPICS = {"t": PARTITIONS}
GROUPS = {"g1": ("p0", "p1", "p2", "p3"), "g2": ("p4", "p5")}
STATIC = {"p1", "p4"}
SUBSCRIPTION = encode_subscription(["t"])


class SimFailure(AssertionError):
    pass


@dataclass
class Client:
    """One consumer process; its member id changes when the coordinator forgets it."""

    name: str
    group: str
    instance_id: str | None
    incarnation: int = 0
    member_id: str = ""
    generation: int = -1
    phase: str = "idle"  # idle, joining, syncing, stable
    owned: frozenset = frozenset()
    up: bool = True
    down_until: int = -1
    paused_until: int = -1
    in_flight: tuple[int, str, int] | None = None  # (request id, kind, sent at)
    next_heartbeat: int = 0
    next_commit: int = 0
    inbox: list = field(default_factory=list)


def range_assign(members: list[str]) -> dict[str, bytes]:
    """Kafka's range assignor for one topic: members by id, contiguous ranges."""
    ordered = sorted(members)
    out: dict[str, bytes] = {}
    per, extra = divmod(PARTITIONS, len(ordered))
    start = 0
    for i, member in enumerate(ordered):
        count = per + (1 if i < extra else 0)
        out[member] = encode_assignment([("t", p) for p in range(start, start + count)])
        start += count
    return out


class ClassicSim:
    def __init__(self, seed: int, fault_steps: int = 300, quiet_steps: int = 200) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.fault_steps = fault_steps
        self.quiet_steps = quiet_steps
        self.now = 0
        self.coord = Coordinator(CONFIG, TOPICS, 0)
        self.log: list[Record] = []  # durable records of every incarnation
        self.pending: list[tuple[Record, ...]] = []
        self.checkpoints: list[tuple[int, int]] = []  # [start, end) in the log, once appended
        self.durable = 0  # durable records of the current incarnation
        self.down_until = -1
        self.held: dict[int, tuple[str, int]] = {}  # token -> (client, request id)
        self.unreleased: list[tuple[int, str, int, object]] = []
        self.net: list[tuple[int, int, str, object]] = []  # (at, seq, destination, message)
        self.seq = 0
        self.ids = 0
        self.loss = 0.0
        self.quiet = False
        self.stats: Counter = Counter()
        # Invariant bookkeeping, per group.
        self.leader_assignment: dict[tuple[str, int], dict[str, bytes]] = {}
        self.generations: dict[tuple[str, int], tuple[str, tuple[str, ...]]] = {}
        self.newest_answered: dict[str, int] = {}
        self.accepted: dict[tuple[str, int], list[int]] = {}
        self.acked: dict[tuple[str, int], int] = {}
        self.offset_counter = 0
        self.commits: dict[tuple[str, int, int], tuple[str, dict]] = {}
        self.by_instance: dict[tuple[str, int], dict[str, bytes]] = {}
        self.clients = {
            name: Client(name, group, f"i-{name}" if name in STATIC else None)
            for group, names in GROUPS.items()
            for name in names
        }
        for client in self.clients.values():
            client.next_heartbeat = self.rng.randrange(0, 5) * STEP_MS

    def fail(self, message: str) -> None:
        raise SimFailure(
            f"seed {self.seed} at {self.now} ms: {message}\nreplay: {REPLAY.format(seed=self.seed)}"
        )

    # ------------------------------------------------------------------ the run

    def run(self) -> None:
        for _ in range(self.fault_steps):
            self._faults()
            self.step()
        self.quiet = True
        self.loss = 0.0
        self.down_until = min(self.down_until, self.now)
        for client in self.clients.values():
            if not client.up:
                client.down_until = self.now
            client.paused_until = min(client.paused_until, self.now)
        for _ in range(self.quiet_steps):
            self.step()
        self._check_converged()

    def step(self) -> None:
        self.now += STEP_MS
        due = sorted(m for m in self.net if m[0] <= self.now)
        self.net = [m for m in self.net if m[0] > self.now]
        for _at, _seq, dest, message in due:  # answers sent meanwhile go out next step
            self._arrive(dest, message)
        if self.now >= self.down_until:
            self.coord.tick(self.now)
            self._collect()
            self._append_and_commit()
        for client in self.clients.values():
            self._client_step(client)
        self._check_owners()

    def _faults(self) -> None:
        rng = self.rng
        self.loss = 0.02 if rng.random() < 0.3 else 0.0
        for client in self.clients.values():
            roll = rng.random()
            if not client.up:
                continue
            if roll < 0.004:
                self._crash(client)
                self.stats["crashes"] += 1
            elif roll < 0.008 and client.paused_until <= self.now:
                client.paused_until = self.now + rng.randint(1, 2 * SESSION_MS // STEP_MS) * STEP_MS
                self.stats["pauses"] += 1
            elif roll < 0.011 and client.member_id and client.phase == "stable":
                self._send_request(client, "leave", (client.member_id, client.instance_id))
                self._crash(client)
                self.stats["leaves"] += 1
        if self.now >= self.down_until and rng.random() < 0.006:
            self._failover()

    def _crash(self, client: Client) -> None:
        client.up = False
        client.down_until = self.now + self.rng.randint(1, 30) * STEP_MS
        client.incarnation += 1
        client.member_id = ""
        client.generation = -1
        client.phase = "idle"
        client.owned = frozenset()
        client.in_flight = None
        client.inbox.clear()

    # ------------------------------------------------------------------ network

    def _send(self, dest: str, message: object) -> None:
        if not self.quiet and self.rng.random() < self.loss:
            self.stats["lost"] += 1
            return
        delay = self.rng.randint(0, 1 if self.quiet else 3) * STEP_MS
        self.seq += 1
        self.net.append((self.now + delay, self.seq, dest, message))

    def _send_request(self, client: Client, kind: str, body: tuple) -> int:
        self.ids += 1
        if kind in ("join", "sync", "heartbeat"):
            client.in_flight = (self.ids, kind, self.now)
        self._send("coordinator", (client.name, client.incarnation, self.ids, kind, body))
        return self.ids

    def _arrive(self, dest: str, message: object) -> None:
        if dest == "coordinator":
            self._serve(message)  # type: ignore[arg-type]
            return
        client = self.clients[dest]
        incarnation, request_id, outcome = message  # type: ignore[misc]
        if incarnation == client.incarnation and client.up:
            client.inbox.append((request_id, outcome))

    # ------------------------------------------------------------------ the coordinator side

    def _serve(self, message: tuple) -> None:
        name, incarnation, request_id, kind, body = message
        if self.now < self.down_until:
            return  # no coordinator: the client times out
        group = self.clients[name].group
        classic = self.coord.classic
        try:
            if kind == "join":
                member_id, instance_id = body
                self.stats["new_ids"] += 1
                reply: Reply = classic.join(
                    group,
                    member_id,
                    instance_id,
                    "consumer",
                    [("range", SUBSCRIPTION)],
                    SESSION_MS,
                    REBALANCE_MS,
                    self.now,
                    new_member_id=f"{name}-{self.seed}-{self.stats['new_ids']}",
                    client_id=name,
                )
            elif kind == "sync":
                generation, member_id, instance_id, assignments = body
                reply = classic.sync(
                    group,
                    generation,
                    member_id,
                    instance_id,
                    "consumer",
                    "range",
                    assignments,
                    self.now,
                )
            elif kind == "heartbeat":
                reply = classic.heartbeat(group, *body, self.now)
            elif kind == "leave":
                reply = classic.leave(group, [body], self.now)
            else:  # commit
                generation, member_id, instance_id, offsets = body
                reply = self.coord.commit_classic_offsets(
                    group, generation, member_id, instance_id, offsets, self.now
                )
                newest = self.newest_answered.get(group, 0)
                if generation < newest:
                    self.fail(f"{group}: a commit at generation {generation} < {newest} accepted")
                for (_t, p), (offset, _m) in offsets.items():
                    self.accepted.setdefault((group, p), []).append(offset)
                self.stats["commits_accepted"] += 1
        except LaminarError as exc:
            self._send(name, (incarnation, request_id, exc))
            self._collect()
            return
        if isinstance(reply.value, Waiting):
            self.held[reply.value.token] = (name, request_id)
        else:
            self.unreleased.append((reply.after, name, request_id, (incarnation, reply.value)))
        self._collect()

    def _collect(self) -> None:
        for token, outcome in self.coord.classic.take_completions():
            target = self.held.pop(token, None)
            if target is None:
                continue
            name, request_id = target
            incarnation = self.clients[name].incarnation
            if isinstance(outcome, LaminarError):
                self._send(name, (incarnation, request_id, outcome))
            else:
                self.unreleased.append(
                    (outcome.after, name, request_id, (incarnation, outcome.value))
                )
        self._release()

    def _release(self) -> None:
        keep = []
        for item in self.unreleased:
            after, name, request_id, (incarnation, value) = item
            if after > self.durable:
                keep.append(item)
                continue
            if isinstance(value, JoinResult):
                self._check_join_answer(self.clients[name].group, value)
            self._send(name, (incarnation, request_id, value))
        self.unreleased = keep

    def _check_join_answer(self, group: str, result: JoinResult) -> None:
        newest = self.newest_answered.get(group, 0)
        if result.generation < newest:
            self.fail(f"{group}: answered generation {result.generation} after {newest}")
        self.newest_answered[group] = result.generation
        if result.members and not result.skip_assignment:
            members = tuple(m for m, _i, _s in result.members)
            seen = self.generations.setdefault((group, result.generation), (result.leader, members))
            if seen != (result.leader, members):
                self.fail(f"{group} generation {result.generation}: {seen} and {members}")

    def _append_and_commit(self) -> None:
        batch = self.coord.take_batch()
        if batch:
            self.pending.append(batch)
        if not self.quiet and self.rng.random() < 0.03:
            # A checkpoint restates every live key in an entry of its own; once durable, a
            # replay may start where it starts (what a shard's log holds after a trim).
            start = len(self.log) + sum(len(p) for p in self.pending)
            self.coord.checkpoint()
            restated = self.coord.take_batch()
            self.pending.append(restated)
            self.checkpoints.append((start, start + len(restated)))
            self.stats["checkpoints"] += 1
        while self.pending and (self.quiet or self.rng.random() < 0.6):
            done = self.pending.pop(0)
            self.log.extend(done)
            self.durable += len(done)
            self.coord.records_committed(self.durable)
        self._release()

    def _failover(self) -> None:
        self.stats["failovers"] += 1
        batch = self.coord.take_batch()
        if batch:
            self.pending.append(batch)
        keep = self.rng.randint(0, len(self.pending))
        for done in self.pending[:keep]:
            self.log.extend(done)
        self.pending = []
        self.coord.records_lost()
        self.held.clear()
        self.unreleased.clear()
        self.down_until = self.now + self.rng.randint(0, 8) * STEP_MS
        start = max(self.down_until, self.now)
        records = self.log
        durable_checkpoints = [c for c in self.checkpoints if c[1] <= len(self.log)]
        self.checkpoints = []
        roll = self.rng.random()
        if roll < 0.4:
            records = compact(self.log)
            self.stats["compactions"] += 1
        elif roll < 0.8 and durable_checkpoints:
            records = self.log[durable_checkpoints[-1][0] :]
            self.stats["from_checkpoint"] += 1
        self.coord = Coordinator(CONFIG, TOPICS, start, records)
        self.durable = 0
        if self.coord.state != replay(self.log):
            self.fail("a fail-over does not replay to the durable state")
        for group, newest in self.newest_answered.items():
            loaded = self.coord.classic.groups.get(group)
            if loaded is None or loaded.generation < newest:
                self.fail(f"{group}: fail-over lost generation {newest}")
        for (group, p), offset in self.acked.items():
            state = self.coord.state.groups.get(group)
            stored = state.offsets.get(("t", p)) if state is not None else None
            history = self.accepted[(group, p)]
            if stored is None or stored.offset not in history[history.index(offset) :]:
                self.fail(f"{group}/{p}: acknowledged commit {offset} lost ({stored})")

    # ------------------------------------------------------------------ the client side

    def _client_step(self, client: Client) -> None:
        if not client.up:
            if self.now >= client.down_until:
                client.up = True
                client.next_heartbeat = self.now
            return
        if self.now < client.paused_until:
            return
        for request_id, outcome in client.inbox:
            if client.in_flight is not None and client.in_flight[0] == request_id:
                client.in_flight = None
                self._handle(client, outcome)
            else:  # a commit's answer, or one that came after its request timed out
                self._note_commit_ack(client, request_id, outcome)
        client.inbox.clear()
        if client.in_flight is not None:
            _rid, kind, sent = client.in_flight
            timeout = JOIN_TIMEOUT_MS if kind in ("join", "sync") else REQUEST_TIMEOUT_MS
            if self.now - sent >= timeout:
                client.in_flight = None
                self.stats["timeouts"] += 1
                if kind in ("join", "sync"):
                    client.phase = "idle"
        if client.in_flight is not None:
            return
        if client.phase == "idle":
            self._send_request(client, "join", (client.member_id, client.instance_id))
            client.phase = "joining"
        elif client.phase == "stable":
            if self.now >= client.next_commit and client.owned:
                self._commit(client)
                client.next_commit = self.now + self.rng.randint(3, 10) * STEP_MS
            if self.now >= client.next_heartbeat:
                body = (client.generation, client.member_id, client.instance_id)
                self._send_request(client, "heartbeat", body)
                client.next_heartbeat = self.now + HEARTBEAT_MS

    def _commit(self, client: Client) -> None:
        offsets = {}
        for tp in sorted(client.owned):
            self.offset_counter += 1
            offsets[tp] = (self.offset_counter, "")
        body = (client.generation, client.member_id, client.instance_id, offsets)
        request_id = self._send_request(client, "commit", body)
        self.commits[(client.name, client.incarnation, request_id)] = (client.group, offsets)

    def _note_commit_ack(self, client: Client, request_id: int, outcome: object = None) -> None:
        sent = self.commits.pop((client.name, client.incarnation, request_id), None)
        if sent is None:
            return
        if isinstance(outcome, LaminarError):
            self.stats["commits_refused"] += 1
            self.stats[f"refused_{type(outcome).__name__}"] += 1
            return
        group, offsets = sent
        for (_t, p), (offset, _m) in offsets.items():
            history = self.accepted.get((group, p), [])
            previous = self.acked.get((group, p))
            if previous is None or history.index(offset) > history.index(previous):
                self.acked[(group, p)] = offset
        self.stats["commits_acked"] += 1

    def _drop(self, client: Client, commit: bool) -> None:
        if commit and client.owned and client.phase == "stable":
            self._commit(client)
        client.owned = frozenset()
        client.phase = "idle"

    def _handle(self, client: Client, outcome: object) -> None:
        if isinstance(outcome, JoinResult):
            client.member_id = outcome.member_id
            client.generation = outcome.generation
            assignments: dict[str, bytes] = {}
            leads = outcome.member_id == outcome.leader and not outcome.skip_assignment
            if leads and outcome.members:
                assignments = range_assign([m for m, _i, _s in outcome.members])
                key = (client.group, outcome.generation)
                if self.leader_assignment.setdefault(key, assignments) != assignments:
                    self.fail(f"{key}: two leader assignments")
                self.by_instance[key] = {
                    i: assignments[m] for m, i, _s in outcome.members if i is not None
                }
            body = (outcome.generation, client.member_id, client.instance_id, assignments)
            self._send_request(client, "sync", body)
            client.phase = "syncing"
        elif isinstance(outcome, SyncResult):
            key = (client.group, client.generation)
            expected = self.leader_assignment.get(key, {}).get(client.member_id, b"")
            if client.instance_id in self.by_instance.get(key, {}):  # taken over statically
                expected = self.by_instance[key][client.instance_id]
            if outcome.assignment != expected:
                self.fail(
                    f"{client.name} got {outcome.assignment!r} in {key}, leader: {expected!r}"
                )
            client.owned = frozenset(assignment_partitions(outcome.assignment))
            client.phase = "stable"
            self.stats["synced"] += 1
        elif isinstance(outcome, MemberIdRequiredError):
            client.member_id = outcome.member_id
            client.phase = "idle"
        elif isinstance(outcome, RebalanceInProgressError):
            self.stats["rebalances_seen"] += 1
            self._drop(client, commit=True)
        elif isinstance(outcome, IllegalGenerationError):
            self.stats["illegal_generation"] += 1
            self._drop(client, commit=False)
        elif isinstance(outcome, UnknownMemberIdError | FencedInstanceIdError):
            self.stats["unknown_member"] += 1
            self._drop(client, commit=False)
            client.member_id = ""
        elif isinstance(outcome, LaminarError):
            self._drop(client, commit=False)

    # ------------------------------------------------------------------ invariants

    def _check_owners(self) -> None:
        owners: dict[tuple[str, int, tuple[str, int]], str] = {}
        for client in self.clients.values():
            if not client.up or client.phase != "stable":
                continue
            for tp in client.owned:
                key = (client.group, client.generation, tp)
                if key in owners:
                    self.fail(f"{tp} of {key[:2]} owned by {owners[key]} and {client.name}")
                owners[key] = client.name

    def _check_converged(self) -> None:
        for group, names in GROUPS.items():
            clients = [self.clients[n] for n in names]
            generations = {c.generation for c in clients}
            phases = {c.phase for c in clients}
            if phases != {"stable"} or len(generations) != 1:
                self.fail(
                    f"{group} did not settle: {[(c.name, c.phase, c.generation) for c in clients]}"
                )
            owned = [tp for c in clients for tp in c.owned]
            if sorted(owned) != [("t", p) for p in range(PARTITIONS)]:
                self.fail(f"{group}: partitions split as {owned}")
            live = self.coord.classic.groups[group]
            if live.state != "Stable" or set(live.members) != {c.member_id for c in clients}:
                self.fail(f"{group}: coordinator is {live.state} with {sorted(live.members)}")
