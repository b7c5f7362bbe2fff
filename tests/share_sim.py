"""Seeded deterministic simulation of one share partition: members, a producer, a driver, a log.

One ``ShareSim(seed)`` runs several members of a share group against one ``SharePartition``
whose records go through a simulated log: records are durable only once "committed" (a random
lag), replies are released only after that, and a failover keeps only the durable records (a
random prefix of the pending batches survives) and rebuilds the state machine from them, from
the full log or from its newest durable checkpoint on. A simulated driver does what the node
will: it reports the partition's new records (control batches are skipped, records with a
future ``deliver_at`` deferred) as they enter the window, ticks, copies dead letters to a
simulated dead-letter topic and confirms the copies, and reports members that crashed as gone.

Faults during the first phase: the producer appends plain, control, delayed and poison records
(a poison record is released by every member that gets it, so it ends in the dead-letter
topic); members crash (their locks expire, or the driver reports them gone), sit on messages
past their lock, release with delays, reject, extend; the partition fails over. Then a quiet
phase: no faults, no new records, members settle all they get.

Invariants checked as replies are released (any violation raises ``SimFailure`` naming the seed
and the replay command):

* an offset is held by at most one member (one delivery) at a time, as the members see it
  (from their delivery until the lock they were told runs out or they settle it);
* an offset whose ack or archiving is durable is never acquired again, across failovers too
  (checked on the durable log itself and on every released delivery);
* the delivery counts of an offset strictly grow from delivery to delivery and never exceed
  ``max_deliveries``; a settlement of a receipt whose lock has not run out is never refused;
* a delayed record, or a message released with a delay, is never acquired before it is due;
* the state stays bounded (slots and every index), and the live state equals a replay of the
  records written, from the start or from the newest checkpoint.

At the end: the start offset reached the end of the partition (every offset acked, skipped or
dead-lettered), every poison record is in the dead-letter topic, and every offset archived in
the durable log was copied there at least once.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from laminar.durable import Reply
from laminar.errors import ReceiptExpiredError
from laminar.queues.partition import (
    Acknowledgement,
    Delivery,
    Receipt,
    ShareConfig,
    SharePartition,
)
from laminar.queues.records import (
    Acked,
    Acquired,
    Archived,
    DeadLettered,
    Record,
    Snapshot,
    replay,
)

REPLAY = (
    "LAMINAR_SHARE_SIM_SEEDS=1 LAMINAR_SHARE_SIM_SEED_BASE={seed} "
    ".venv/bin/pytest tests/test_share_sim.py -k many_seeds"
)
STEP_MS = 100
CONFIG = ShareConfig(lock_ms=1500, max_deliveries=4, max_in_flight=48)
MEMBERS = ("m0", "m1", "m2", "m3")
MAX_DELAY_MS = 3000


class SimFailure(AssertionError):
    pass


@dataclass
class Hold:
    receipt: Receipt
    lock_until: int
    extends: int = 0  # extends sent: only the reply to the newest one sets the lock


@dataclass
class Member:
    name: str
    incarnation: int = 0
    up: bool = True
    down_until: int = -1
    slow: bool = False  # sits on messages past their lock now and then
    held: dict[int, Hold] = field(default_factory=dict)

    @property
    def member_id(self) -> str:
        return f"{self.name}.{self.incarnation}"


@dataclass(frozen=True)
class Entry:
    """One offset of the partition as the producer wrote it."""

    control: bool = False
    deliver_at: int = 0
    poison: bool = False


class ShareSim:
    def __init__(self, seed: int, fault_steps: int = 250, quiet_steps: int = 400) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.fault_steps = fault_steps
        self.quiet_steps = quiet_steps
        self.now = 0
        self.quiet = False
        self.stats: Counter = Counter()
        self.entries: list[Entry] = []  # the partition; its high watermark is len(entries)
        self.sp = SharePartition(CONFIG, 0, start=0)
        self.log: list[Record] = []  # durable records of every incarnation, in log order
        self.pending: list[tuple[Record, ...]] = []  # appended batches, not yet durable
        self.durable_count = 0  # durable records of the current incarnation
        self.checkpoint: tuple[int, int] | None = None  # [start, end) in log once durable
        self.checkpoint_start = -1
        self.held: list[tuple[Reply, object]] = []  # replies waiting for their records
        self.members = {name: Member(name) for name in MEMBERS}
        self.gone_events: list[tuple[int, str]] = []  # (at, member id): driver reports gone
        # What the durable log says, folded incrementally.
        self.done: set[int] = set()  # offsets with a durable ack/skip/archive
        self.archived: dict[int, str] = {}  # durable archivings -> reason
        self.durable_count_of: dict[int, int] = {}  # newest durable delivery count per offset
        # What members have seen.
        self.seen_count: dict[int, int] = {}
        self.not_before: dict[int, int] = {}  # offset -> released with a delay: due time
        self.dlq: Counter = Counter()  # dead-letter topic: offset -> copies

    # ------------------------------------------------------------------ helpers

    def fail(self, message: str) -> None:
        raise SimFailure(
            f"seed {self.seed} at {self.now} ms: {message}\nreplay: {REPLAY.format(seed=self.seed)}"
        )

    def run(self) -> None:
        for _ in range(self.fault_steps):
            self.step()
        self.quiet = True
        for m in self.members.values():
            m.slow = False
            if not m.up:
                m.up, m.incarnation = True, m.incarnation + 1
        for _ in range(self.quiet_steps):
            self.step()
            if self._finished():
                break
        self._check_finished()

    def step(self) -> None:
        self.now += STEP_MS
        if not self.quiet:
            self._faults()
        self._drive()
        for name in self.rng.sample(MEMBERS, len(MEMBERS)):
            self._act(self.members[name])
        self._take()
        self._log_progress()
        self._check_bounds()
        if self.rng.random() < 0.04:
            self._check_replay()

    # ------------------------------------------------------------------ faults

    def _faults(self) -> None:
        rng = self.rng
        if rng.random() < 0.5:
            self._produce()
        for m in self.members.values():
            if m.up and rng.random() < 0.006:
                self.stats["crashes"] += 1
                m.up, m.held = False, {}
                m.down_until = self.now + rng.randrange(500, 4000)
                if rng.random() < 0.5:
                    self.gone_events.append((self.now + rng.randrange(0, 2000), m.member_id))
            elif not m.up and self.now >= m.down_until:
                m.up, m.incarnation = True, m.incarnation + 1
            if rng.random() < 0.01:
                m.slow = not m.slow
        if self.checkpoint is None and rng.random() < 0.03:
            self._take()  # as the driver does: a checkpoint starts an entry of its own
            start = len(self.log) + sum(len(b) for b in self.pending)
            self.checkpoint = (start, start + self.sp.checkpoint())
            self._take()
            self.stats["checkpoints"] += 1
        if rng.random() < 0.012:
            self._failover()

    def _produce(self) -> None:
        rng = self.rng
        r = rng.random()
        if r < 0.1:
            self.entries += [Entry(control=True)] * rng.randint(1, 3)
        elif r < 0.25:
            at = self.now + rng.randrange(100, MAX_DELAY_MS)
            self.entries += [Entry(deliver_at=at)] * rng.randint(1, 6)
        elif r < 0.28:
            self.entries.append(Entry(poison=True))
        else:
            self.entries += [Entry()] * rng.randint(1, 8)

    def _failover(self) -> None:
        self.stats["failovers"] += 1
        self._take()
        keep = self.rng.randint(0, len(self.pending))
        for batch in self.pending[:keep]:
            self._make_durable(batch)
        self.pending = []
        self.held = []  # replies not yet released are lost with their requests
        self.sp.records_lost()
        self.checkpoint = None  # one not wholly durable is lost with the pending records
        records = self.log
        if self.checkpoint_start >= 0 and self.rng.random() < 0.5:
            records = self.log[self.checkpoint_start :]
            if replay(records) != replay(self.log):
                self.fail("the log from the newest checkpoint on replays to a different state")
            self.stats["from_checkpoint"] += 1
        self.sp = SharePartition(CONFIG, self.now, records=records)
        self.durable_count = 0
        self.checkpoint_start = -1  # positions in the log from now on are the new instance's
        self.log = list(records)

    # ------------------------------------------------------------------ the driver

    def _drive(self) -> None:
        sp = self.sp
        hi = min(len(self.entries), sp.window_end)
        o = sp.end
        while o < hi:  # report what enters the window: skips and delays, in contiguous runs
            e = self.entries[o]
            run = o + 1
            while run < hi and self.entries[run] == e:
                run += 1
            if e.control:
                sp.skip(o, run)
                self.stats["skipped"] += run - o
            elif e.deliver_at > self.now:
                sp.defer(o, run, e.deliver_at)
                self.stats["deferred"] += run - o
            o = run
        sp.end_offset(hi)
        due = [mid for at, mid in self.gone_events if at <= self.now]
        self.gone_events = [(at, mid) for at, mid in self.gone_events if at > self.now]
        for mid in due:
            sp.member_gone(mid, self.now)
            self.stats["member_gone"] += 1
        sp.tick(self.now)
        letters = sp.take_dead_letters(limit=self.rng.choice((None, 2)))
        if letters:
            offsets = [d.offset for d in letters]
            if not self.quiet and self.rng.random() < 0.15:
                sp.dead_letters_failed(offsets)  # the copy to the dead-letter topic failed
                return
            for d in letters:
                if self.entries[d.offset].control:
                    self.fail(f"offset {d.offset} holds no record but was dead-lettered")
                self.dlq[d.offset] += 1
            self.stats["dead_letters"] += len(letters)
            sp.dead_letters_copied(offsets)

    def _take(self) -> None:
        batch = self.sp.take_batch()
        if batch:
            self.pending.append(batch)

    def _make_durable(self, batch: tuple[Record, ...]) -> None:
        for record in batch:
            self._fold_durable(record)
        self.log += batch
        self.durable_count += len(batch)
        if self.checkpoint is not None and len(self.log) >= self.checkpoint[1]:
            self.checkpoint_start = self.checkpoint[0]
            self.checkpoint = None

    def _fold_durable(self, record: Record) -> None:
        """Invariants on the durable log itself: what a replay after any failover would see."""
        if isinstance(record, Acquired):
            for lo, hi, count in record.runs:
                for o in range(lo, hi):
                    if o in self.done:
                        self.fail(f"offset {o} acquired again after its ack/archive was durable")
                    if count <= self.durable_count_of.get(o, 0) or count > CONFIG.max_deliveries:
                        before = self.durable_count_of.get(o, 0)
                        self.fail(f"offset {o}: durable delivery count {count} after {before}")
                    self.durable_count_of[o] = count
        elif isinstance(record, Acked | DeadLettered):
            for lo, hi in record.runs:
                self.done.update(range(lo, hi))
        elif isinstance(record, Archived):
            for lo, hi in record.runs:
                for o in range(lo, hi):
                    self.done.add(o)
                    self.archived.setdefault(o, record.reason)
        elif isinstance(record, Snapshot):
            for lo, hi, state, *_ in record.runs:
                if state in (0, 1) and not self.done.isdisjoint(range(lo, hi)):
                    self.fail("a checkpoint restates a done offset as available or acquired")

    def _log_progress(self) -> None:
        if self.pending:
            n = self.rng.choice((0, 1, 1, 2, len(self.pending)))
            for batch in self.pending[:n]:
                self._make_durable(batch)
            self.pending = self.pending[n:]
            self.sp.records_committed(self.durable_count)
        released = [(r, cb) for r, cb in self.held if self.sp.is_released(r)]
        self.held = [(r, cb) for r, cb in self.held if not self.sp.is_released(r)]
        for reply, callback in released:
            callback(reply.value)  # type: ignore[operator]

    # ------------------------------------------------------------------ members

    def _act(self, m: Member) -> None:
        if not m.up:
            return
        rng, now = self.rng, self.now
        for o in [o for o, h in m.held.items() if h.lock_until <= now and not m.slow]:
            del m.held[o]  # the lock ran out: the member gives the message up
        if len(m.held) < 8 and rng.random() < 0.6:
            n = rng.randint(1, 6)
            lock = rng.choice((None, None, 2500))
            if rng.random() < 0.5:
                reply = self.sp.acquire(m.member_id, n, now, lock)
            else:  # the node's form: runs, expanded here to check each delivery alike
                runs = self.sp.acquire_runs(m.member_id, n, now, lock)
                reply = Reply(_expand(m.member_id, runs.value), runs.after)
                self.stats["acquire_runs_calls"] += 1
            self.stats["acquire_calls"] += 1
            self.held.append((reply, self._on_deliveries(m, m.incarnation, now)))
        items: list[tuple[Acknowledgement, bool]] = []
        for o, h in list(m.held.items()):
            if rng.random() < (0.9 if m.slow else 0.6):
                continue  # a slow member keeps messages for long (extending them, or not)
            valid = h.lock_until > now
            entry = self.entries[o]
            r = rng.random()
            if entry.poison:
                kind, ms = "release", 0
            elif not self.quiet and r < 0.06:
                kind, ms = "release", rng.choice((0, 300, 1200))
            elif not self.quiet and r < 0.08:
                kind, ms = "reject", 0
            elif not self.quiet and (r < 0.14 or (m.slow and r < 0.4)):
                kind, ms = "extend", rng.choice((500, 2500, 6000))
            elif not self.quiet and m.slow and r < 0.5:
                continue  # sit on it (past its lock, maybe)
            else:
                kind, ms = "ack", 0
            items.append((Acknowledgement(h.receipt, kind, ms), valid))
            if kind != "extend":
                del m.held[o]  # settled as the member sees it: it stops processing it
            else:  # until the reply comes, the lock may be the shorter of the old and the new
                h.lock_until = min(h.lock_until, now + ms)
                h.extends += 1
        if items:
            if rng.random() < 0.5:
                reply = self.sp.acknowledge([a for a, _ in items], now)
            else:  # the node's form: runs of consecutive offsets settled alike
                runs = _settle_runs([a for a, _ in items])
                ran = self.sp.settle_runs(m.member_id, runs, now)
                reply = Reply(_per_item(runs, ran.value), ran.after)
                kinds = {run[3] for run in runs}
                self.stats["settle_runs_acks" if kinds == {"ack"} else "settle_runs_mixed"] += 1
            self.stats["acknowledge_calls"] += 1
            extends = {
                a.receipt.offset: m.held[a.receipt.offset].extends
                for a, _ in items
                if a.kind == "extend"
            }
            self.held.append((reply, self._on_settled(m, m.incarnation, now, items, extends)))

    def _on_deliveries(self, m: Member, incarnation: int, sent: int):
        def deliver(value: list[Delivery]) -> None:
            for d in value:
                self._check_delivery(d, sent)
                self.stats["deliveries"] += 1
                if d.delivery_count > 1:
                    self.stats["redeliveries"] += 1
                if m.up and m.incarnation == incarnation and d.lock_until_ms > self.now:
                    m.held[d.offset] = Hold(d.receipt, d.lock_until_ms)

        return deliver

    def _check_delivery(self, d: Delivery, sent: int) -> None:
        o, count = d.offset, d.delivery_count
        if o >= len(self.entries) or self.entries[o].control:
            self.fail(f"offset {o} holds no record but was delivered")
        # (That it was not done before its acquisition is checked on the durable log: a done
        # record after it may already be durable, e.g. the member crashed and was reported gone.)
        if not count > self.seen_count.get(o, 0) or count > CONFIG.max_deliveries:
            self.fail(f"offset {o}: delivery count {count} after {self.seen_count.get(o, 0)}")
        self.seen_count[o] = count
        if sent < self.entries[o].deliver_at:
            self.fail(f"offset {o} acquired at {sent}, due at {self.entries[o].deliver_at}")
        if sent < self.not_before.get(o, 0):
            self.fail(f"offset {o} acquired at {sent}, released until {self.not_before[o]}")
        for other in self.members.values():
            h = other.held.get(o)
            if h is not None and h.lock_until > self.now:
                self.fail(f"offset {o} delivered while {other.member_id} holds it ({h})")

    def _on_settled(
        self, m: Member, incarnation: int, sent: int, items: list, extends: dict[int, int]
    ):
        def settled(results: list) -> None:
            for (item, valid), result in zip(items, results, strict=True):
                if result is not None:
                    if not isinstance(result, ReceiptExpiredError):
                        self.fail(f"{item} refused with {result!r}")
                    if valid:
                        self.fail(f"{item} refused although its lock ran until after {sent}")
                    self.stats["refused"] += 1
                    continue
                self.stats[item.kind] += 1
                o = item.receipt.offset
                if item.kind == "release" and item.ms:
                    self.not_before[o] = sent + item.ms
                elif item.kind == "extend":
                    h = m.held.get(o)
                    if (
                        m.incarnation == incarnation
                        and h is not None
                        and h.receipt == item.receipt
                        and h.extends == extends[o]  # no newer extend of it is in flight
                    ):
                        h.lock_until = sent + item.ms

        return settled

    # ------------------------------------------------------------------ checks

    def _check_bounds(self) -> None:
        sizes = self.sp.index_sizes()
        if sizes["slots"] > CONFIG.max_in_flight:
            self.fail(f"{sizes['slots']} slots tracked, max_in_flight is {CONFIG.max_in_flight}")
        if max(sizes.values()) > 1024 + 3 * CONFIG.max_in_flight:
            self.fail(f"indexes grew: {sizes}")

    def _check_replay(self) -> None:
        written = self.log + [r for b in self.pending for r in b]
        if replay(written) != self.sp.state:
            self.fail("the live state differs from a replay of the records written")
        if self.checkpoint_start >= 0 and replay(self.log[self.checkpoint_start :]) != replay(
            self.log
        ):
            self.fail("the log from the newest checkpoint on replays to a different state")
        self.stats["replays"] += 1

    def _finished(self) -> bool:
        return self.sp.start == len(self.entries) and not self.pending and not self.held

    def _check_finished(self) -> None:
        if not self._finished():
            self.fail(
                f"not drained: start {self.sp.start}, end {len(self.entries)}, "
                f"state {dict(list(self.sp.state.slots.items())[:5])}"
            )
        self._check_replay()
        for o, e in enumerate(self.entries):
            if e.poison and not self.dlq[o]:
                self.fail(f"poison offset {o} is not in the dead-letter topic")
        for o in self.archived:
            if not self.dlq[o]:
                self.fail(f"archived offset {o} was never copied to the dead-letter topic")
        self.stats["offsets"] += len(self.entries)


def _expand(member_id: str, runs: list[tuple[int, int, int, int]]) -> list[Delivery]:
    return [
        Delivery(Receipt(member_id, o, count), until)
        for lo, hi, count, until in runs
        for o in range(lo, hi)
    ]


def _settle_runs(items: list[Acknowledgement]) -> list[tuple[int, int, int, str, int]]:
    """Neighbours settling consecutive offsets alike become one run (the order is kept)."""
    runs: list[list] = []
    for a in items:
        r = a.receipt
        if runs:
            last = runs[-1]
            if (r.offset, r.delivery_count, a.kind, a.ms) == (
                last[0] + last[1],
                last[2],
                last[3],
                last[4],
            ):
                last[1] += 1
                continue
        runs.append([r.offset, 1, r.delivery_count, a.kind, a.ms])
    return [tuple(run) for run in runs]  # type: ignore[misc]


def _per_item(runs: list, failures: list[list]) -> list:
    """settle_runs' per-run failures as acknowledge's per-item results."""
    out = []
    for (first, count, *_rest), failed in zip(runs, failures, strict=True):
        errors = dict(failed)
        if any(not first <= o < first + count for o in errors):
            raise SimFailure(f"settle_runs reported offsets outside their run: {failed}")
        out += [errors.get(o) for o in range(first, first + count)]
    return out
