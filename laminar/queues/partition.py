"""One share group's queue state on one partition: a deterministic sans-I/O state machine.

Any number of members of a share group read the same partition. ``acquire`` hands a member the
lowest available offsets, each with a lock (visibility timeout) and a delivery count; the member
settles each with the ``Receipt`` it was given: ``ack`` (done), ``release`` (deliver again, now
or after a delay), ``reject`` (to the dead-letter topic) or ``extend`` (keep the lock longer). A
receipt that is not its offset's current acquisition is refused with ``ReceiptExpiredError``.

Per offset::

    fresh/AVAILABLE --acquire--> ACQUIRED --ack/skip--> ACKED (done)
         ^   (due_ms: delayed)      |  \\--reject, or expiry/release at max_deliveries-->
         |                          |      ARCHIVING --dead_letters_copied--> ARCHIVED (done)
         +--release / lock expiry / member_gone--+

Ordering: available offsets go out in offset order, so an offset that comes back (released,
lock expired, member gone, delay due) goes out again before any higher offset not yet
delivered; relative to offsets already delivered after it, it is of course out of order. A
delayed offset goes out once due, in offset order among those available then.

Bounds: ``start`` is the lowest offset not done; state exists only for offsets in
``[start, start + max_in_flight)`` and nothing at or beyond ``window_end`` is handed out, so one
stuck offset (long delay, slow member) stops delivery ``max_in_flight`` offsets later.

Durability (the model of ``laminar.groups.coordinator``): every change to the durable state is
a record (``records.py``) folded by ``ShareState.apply``, the function a replay uses. The driver
takes the records with ``take_batch``, appends each batch as one entry of the partition's log and
reports ``records_committed(n)``; every call a client waits for returns a ``Reply`` whose
``after`` says how many records must be durable before it is sent. Decisions:

* acquisitions are durable (member, delivery count, lock duration) and an acquire's reply waits
  for them: a delivery a member has seen is always in the durable state, so delivery counts
  never go back across a failover and ``max_deliveries`` holds exactly, and after a failover a
  member's receipts stay valid (its acks still succeed, no needless redelivery);
* lock deadlines are timers, not records: a new leader restarts every lock at its take-over
  time with the last durable lock duration (``extend`` writes one), so a lock is never shorter
  than what its member was told. A client whose ``extend`` got no reply must assume the shorter
  of its old and new lock (the extend may or may not be durable);
* due times of delays are absolute times in the records: ``now_ms`` must be a clock shared by
  the nodes (wall-clock ms), as ``deliver_at`` of a producer is;
* ``end_offset`` and the dead letters handed out are not durable: after a failover the driver
  reports the end again (re-reporting skips and defers is harmless) and every archived offset
  whose copy is not durable is handed out again (at-least-once into the dead-letter topic).

Time is always passed in; nothing here reads a clock, does I/O or draws randomness.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal, NamedTuple

from laminar.durable import RecordOutbox, Reply
from laminar.errors import InvalidRequestError, LaminarError, ReceiptExpiredError
from laminar.queues.records import (
    Acked,
    Acquired,
    Archived,
    DeadLettered,
    Extended,
    Record,
    Released,
    ShareState,
    SlotState,
    StartMoved,
    runs_of,
    snapshot,
)

MAX_DELIVERIES_REASON = "max deliveries"
REJECTED_REASON = "rejected"
AVAILABLE, ACQUIRED, ARCHIVING = SlotState.AVAILABLE, SlotState.ACQUIRED, SlotState.ARCHIVING


@dataclass(frozen=True, slots=True)
class ShareConfig:
    lock_ms: int = 30_000  # default visibility timeout
    max_deliveries: int = 5
    max_in_flight: int = 10_000  # offsets tracked at/after start (bounds memory and state size)
    max_lock_ms: int = 12 * 3600 * 1000  # the longest lock an acquire or extend may ask for

    def __post_init__(self) -> None:
        if not 0 < self.lock_ms <= self.max_lock_ms:
            raise ValueError("need 0 < lock_ms <= max_lock_ms")
        if self.max_deliveries < 1 or self.max_in_flight < 1:
            raise ValueError("max_deliveries and max_in_flight must be >= 1")


class Receipt(NamedTuple):
    """Proof of one delivery: who holds which offset at which delivery count."""

    member_id: str
    offset: int
    delivery_count: int


class Delivery(NamedTuple):
    receipt: Receipt
    lock_until_ms: int  # the lock runs out then unless extended

    @property
    def offset(self) -> int:
        return self.receipt.offset

    @property
    def delivery_count(self) -> int:
        return self.receipt.delivery_count


Kind = Literal["ack", "release", "reject", "extend"]
AcquiredRun = tuple[int, int, int, int]
"""Offsets ``[first, end)`` acquired with one delivery count and lock deadline (ms)."""
SettleRun = tuple[int, int, int, Kind, int]
"""``count`` settlements from offset ``first`` alike: (first, count, delivery count, kind, ms)."""


class Acknowledgement(NamedTuple):
    """One settlement in a batch; ``ms``: the delay of a release, the new lock of an extend."""

    receipt: Receipt
    kind: Kind
    ms: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetter:
    offset: int
    delivery_count: int
    reason: str


@dataclass(frozen=True, slots=True)
class ShareView:
    """What ``laminar queue describe`` shows for one partition."""

    start: int
    end: int
    available: int
    acquired: int
    delayed: int
    archiving: int


class SharePartition(RecordOutbox[Record]):
    """The queue state of one share group on one partition. See the module docstring."""

    lost_message = "this share partition lost its log; rebuild it from the records"

    def __init__(
        self,
        config: ShareConfig,
        now_ms: int,
        records: Iterable[Record] = (),
        start: int | None = None,
    ) -> None:
        """Replay ``records`` (the durable log, or the log from its newest ``Snapshot`` on).
        ``start``: where a share group that has no records yet begins (written as a record)."""
        super().__init__()
        self.config = config
        self.state = ShareState()
        for record in records:
            self.state.apply(record)
        self._urgent = False  # the outbox holds more than skips (see ``urgent``)
        self._end = self.state.start
        self._cursor = self.state.start  # every offset below is either < start or has a slot
        self._deadline: dict[int, int] = {}
        # (deadline, first, end, delivery count): one entry per acquired run, not per offset;
        # an entry is stale for offsets whose ``_deadline`` differs (settled, extended)
        self._locks: list[tuple[int, int, int, int]] = []
        self._delays: list[tuple[int, int]] = []  # (due, offset)
        self._ready: list[int] = []  # AVAILABLE slots that are due (may hold stale entries)
        self._dead: list[int] = []  # ARCHIVING offsets not handed to the driver yet
        self._dead_out: set[int] = set()  # ARCHIVING offsets handed out, copy not confirmed
        self._rebuild_indexes(now_ms)
        if start is not None and start > self.state.start:
            self._write(StartMoved(start))
        self._enforce_delivery_limit()

    # ------------------------------------------------------------------ log interface

    def take_batch(self) -> tuple[Record, ...]:
        self._urgent = False
        return super().take_batch()

    @property
    def urgent(self) -> bool:
        """The outbox holds a record other than a ``skip``'s. Skips restate facts of the log
        (a new instance finds them again), so they wait for the next other record instead of
        being appended alone: appending them would write a control batch, which is one more
        offset to skip, and a long-polling member would keep an idle partition writing."""
        return self._urgent

    def checkpoint(self) -> int:
        """Restate the whole state as one ``Snapshot`` record (returns 1). Once it is durable a
        replay may start at it, so the log before it can be dropped."""
        self._alive()
        self._emit([snapshot(self.state)])
        return 1

    def configure(self, config: ShareConfig) -> None:
        """The group's settings changed (``laminar.queues.config``). A new lock applies to
        acquisitions from now on; locks held keep their deadline and, after a failover, their
        durable duration. A lower ``max_deliveries`` archives at once every available offset
        already delivered that often (it would otherwise go out once more than allowed)."""
        self._alive()
        if config.max_in_flight != self.config.max_in_flight:
            raise ValueError("max_in_flight is the node's, not a group setting")
        lowered = config.max_deliveries < self.config.max_deliveries
        self.config = config
        if lowered:
            self._enforce_delivery_limit()

    # ------------------------------------------------------------------ the partition

    @property
    def start(self) -> int:
        return self.state.start

    @property
    def end(self) -> int:
        return self._end

    @property
    def window_end(self) -> int:
        """Nothing at or beyond this is tracked or handed out (``start + max_in_flight``)."""
        return self.state.start + self.config.max_in_flight

    def end_offset(self, end: int) -> None:
        """Offsets below ``end`` exist and the driver has reported the ``skip`` and ``defer`` of
        every one of them. It reads each record once it is committed and below ``window_end``:
        ``hi = min(high_watermark, window_end)``; report ``[end, hi)``; ``end_offset(hi)``.
        A smaller value than before is ignored. Not durable: a new instance starts at
        ``start`` and the driver reports again."""
        self._alive()
        self._end = max(self._end, min(end, self.window_end))

    def skip(self, first: int, end: int) -> None:
        """Offsets ``[first, end)`` hold no record (control batch, no-op entry): done. Only
        offsets that are available or acquired change (an archived one holds a record)."""
        self._alive()
        lo, hi = self._range(first, end)
        todo = [o for o in range(lo, hi) if self._slot_state(o) in (None, AVAILABLE, ACQUIRED)]
        if todo:
            self._settled(todo)
            self._write(Acked(runs_of(todo)), lazy=True)

    def defer(self, first: int, end: int, until_ms: int) -> None:
        """Records ``[first, end)`` must not be delivered before ``until_ms`` (``deliver_at``).
        Only offsets never delivered are parked (no delivery is counted); the rest are left
        alone, so reporting the same records again after a failover is harmless."""
        self._alive()
        lo, hi = self._range(first, end)
        todo = []
        for o in range(lo, hi):
            slot = self.state.slots.get(o)
            if slot is None or (
                slot.state == AVAILABLE and slot.count == 0 and slot.due_ms != until_ms
            ):
                todo.append(o)
        if todo:
            self._write(Released(until_ms, runs_of(todo)))
            for o in todo:  # available once tick() reaches the due time (acquire ticks first)
                heapq.heappush(self._delays, (until_ms, o))

    def advance_start(self, offset: int) -> None:
        """Everything below ``offset`` is done without delivery (log retention removed it, or an
        admin reset): its state, dead letters not yet copied included, is dropped."""
        self._alive()
        if offset > self.state.start:
            self._write(StartMoved(offset))
            for o in [o for o in self._deadline if o < offset]:
                del self._deadline[o]
            self._dead_out = {o for o in self._dead_out if o >= offset}
            self._cursor = max(self._cursor, self.state.start)

    # ------------------------------------------------------------------ members

    def acquire(
        self, member_id: str, max_records: int, now_ms: int, lock_ms: int | None = None
    ) -> Reply[list[Delivery]]:
        """Lock up to ``max_records`` of the lowest available offsets for ``member_id``."""
        reply = self.acquire_runs(member_id, max_records, now_ms, lock_ms)
        new = tuple.__new__  # a NamedTuple's own __new__ costs a Python call per offset
        out = [
            new(Delivery, (new(Receipt, (member_id, o, count)), deadline))
            for lo, hi, count, deadline in reply.value
            for o in range(lo, hi)
        ]
        return Reply(out, reply.after)

    def acquire_runs(
        self, member_id: str, max_records: int, now_ms: int, lock_ms: int | None = None
    ) -> Reply[list[AcquiredRun]]:
        """``acquire``, the offsets given as ascending runs ``(first, end, delivery count, lock
        deadline)``: what the wire carries, without an object per offset."""
        self._alive()
        _require_member(member_id)
        lock = self.config.lock_ms if lock_ms is None else lock_ms
        if not 0 < lock <= self.config.max_lock_ms:
            raise InvalidRequestError(f"lock_ms must be in (0, {self.config.max_lock_ms}]")
        if not isinstance(max_records, int) or max_records < 1:
            raise InvalidRequestError("max_records must be >= 1")
        self.tick(now_ms)
        slots, ready = self.state.slots, self._ready
        limit = min(self._end, self.window_end)
        cursor = self._cursor
        runs: list[tuple[int, int, int]] = []  # ascending: both sources are taken lowest first
        n = 0
        taken: set[int] = set()

        def add(lo: int, hi: int, count: int) -> None:
            if runs and runs[-1][1] == lo and runs[-1][2] == count:
                runs[-1] = (runs[-1][0], hi, count)
            else:
                runs.append((lo, hi, count))

        while n < max_records:
            while ready:
                slot = slots.get(ready[0])
                if (
                    slot is not None
                    and slot.state == AVAILABLE
                    and slot.due_ms <= now_ms
                    and ready[0] not in taken
                ):
                    break
                heapq.heappop(ready)
            if not ready:  # the common case: only fresh offsets are left, taken as runs
                while n < max_records and cursor < limit:
                    if cursor in slots:
                        cursor += 1
                        continue
                    lo, hi = cursor, min(limit, cursor + max_records - n)
                    while cursor < hi and cursor not in slots:
                        cursor += 1
                    add(lo, cursor, 1)
                    n += cursor - lo
                break
            while cursor in slots:
                cursor += 1
            if ready[0] < cursor:
                if ready[0] >= limit:
                    break
                o = heapq.heappop(ready)
                taken.add(o)
                add(o, o + 1, slots[o].count + 1)
            elif cursor < limit:
                add(cursor, cursor + 1, 1)
                cursor += 1
            else:
                break
            n += 1
        self._cursor = cursor
        if not runs:
            return Reply([], self._written)
        self._write(Acquired(member_id, lock, tuple(runs)))
        deadline = now_ms + lock
        deadlines, locks, push = self._deadline, self._locks, heapq.heappush
        for lo, hi, count in runs:
            deadlines.update(dict.fromkeys(range(lo, hi), deadline))
            push(locks, (deadline, lo, hi, count))
        return Reply([(lo, hi, count, deadline) for lo, hi, count in runs], self._written)

    def acknowledge(
        self, items: Sequence[Acknowledgement], now_ms: int
    ) -> Reply[list[LaminarError | None]]:
        """Settle many receipts at once, each on its own: the result lists ``None`` (done) or
        the error of that item (``ReceiptExpiredError``, ``InvalidRequestError``), so one stale
        receipt in a batch does not undo the others. Items apply in order: a receipt settled
        earlier in the batch is expired for the later items (an extend does not settle)."""
        self._alive()
        self.tick(now_ms)
        slots, cfg = self.state.slots, self.config
        results: list[LaminarError | None] = []
        settled: set[int] = set()
        acks: list[int] = []
        rejects: list[int] = []
        maxed: list[int] = []
        releases: dict[int, list[int]] = {}
        extends: dict[int, int] = {}  # offset -> lock ms (the last extend of it wins)
        for item in items:
            r = item.receipt
            slot = slots.get(r.offset)
            if (
                slot is None
                or slot.state != ACQUIRED
                or slot.member != r.member_id
                or slot.count != r.delivery_count
                or r.offset in settled
            ):
                results.append(ReceiptExpiredError(f"receipt {r} is not current"))
                continue
            kind = item.kind
            if kind == "ack":
                acks.append(r.offset)
            elif kind == "reject":
                rejects.append(r.offset)
            elif kind == "release":
                if not isinstance(item.ms, int) or item.ms < 0:
                    results.append(InvalidRequestError("a release delay must be >= 0 ms"))
                    continue
                if slot.count >= cfg.max_deliveries:
                    maxed.append(r.offset)
                else:
                    releases.setdefault(now_ms + item.ms, []).append(r.offset)
            elif kind == "extend":
                if not isinstance(item.ms, int) or not 0 < item.ms <= cfg.max_lock_ms:
                    results.append(
                        InvalidRequestError(f"extend ms must be in (0, {cfg.max_lock_ms}]")
                    )
                    continue
                extends[r.offset] = item.ms
                results.append(None)
                continue
            else:
                results.append(InvalidRequestError(f"unknown acknowledgement {kind!r}"))
                continue
            settled.add(r.offset)
            results.append(None)
        by_ms: dict[int, list[int]] = {}
        for o, ms in extends.items():
            if o not in settled:
                by_ms.setdefault(ms, []).append(o)
        for ms, offsets in by_ms.items():
            self._write(Extended(ms, runs_of(offsets)))
            for o in offsets:
                self._lock(o, now_ms + ms, slots[o].count)
        self._settled(settled)
        if acks:
            self._write(Acked(runs_of(acks)))
        self._archive(rejects, REJECTED_REASON)
        self._archive(maxed, MAX_DELIVERIES_REASON)
        for due, offsets in releases.items():
            self._write(Released(due if due > now_ms else 0, runs_of(offsets)))
            self._became_available(offsets, due, now_ms)
        return Reply(results, self._written)

    def settle_runs(
        self, member_id: str, runs: Sequence[SettleRun], now_ms: int
    ) -> Reply[list[list[tuple[int, LaminarError]]]]:
        """``acknowledge`` for runs ``(first offset, count, delivery count, kind, ms)`` of
        ``member_id``'s receipts (what the wire carries): the result lists, per run, the
        offsets that failed with their error. Runs of acks (a member's steady state) are
        checked and written as ranges, with no object per offset; anything else goes through
        ``acknowledge`` item by item, in order."""
        if any(run[3] != "ack" for run in runs):
            new = tuple.__new__
            items = [
                new(Acknowledgement, (new(Receipt, (member_id, o, count)), kind, ms))
                for first, n, count, kind, ms in runs
                for o in range(first, first + n)
            ]
            reply = self.acknowledge(items, now_ms)
            errors = iter(reply.value)
            out = []
            for first, n, _count, _kind, _ms in runs:
                failed = []
                for o in range(first, first + n):
                    error = next(errors)
                    if error is not None:
                        failed.append((o, error))
                out.append(failed)
            return Reply(out, reply.after)
        self._alive()
        self.tick(now_ms)
        slots = self.state.slots
        # Runs in ascending order without overlap (what a member sends) cannot settle an
        # offset twice, and their acked offsets come out as ascending ranges as they are
        # checked; otherwise a set catches repeats and the ranges are sorted afterwards.
        ordered = all(a[0] + a[1] <= b[0] for a, b in pairwise(runs))
        settled: set[int] | None = None if ordered else set()
        acked: list[list[int]] = []  # [first, end) ranges
        results: list[list[tuple[int, LaminarError]]] = []
        for first, n, count, _kind, _ms in runs:
            failed: list[tuple[int, LaminarError]] = []
            for o in range(first, first + n):
                slot = slots.get(o)
                if (
                    slot is None
                    or slot.state != ACQUIRED
                    or slot.member != member_id
                    or slot.count != count
                    or (settled is not None and o in settled)
                ):
                    receipt = Receipt(member_id, o, count)
                    failed.append((o, ReceiptExpiredError(f"receipt {receipt} is not current")))
                    continue
                if settled is not None:
                    settled.add(o)
                if acked and acked[-1][1] == o:
                    acked[-1][1] = o + 1
                else:
                    acked.append([o, o + 1])
            results.append(failed)
        if acked:
            done = tuple((lo, hi) for lo, hi in acked) if settled is None else runs_of(settled)
            deadlines = self._deadline
            for lo, hi in done:
                for o in range(lo, hi):
                    deadlines.pop(o, None)
            self._write(Acked(done))
        return Reply(results, self._written)

    def ack(self, receipt: Receipt, now_ms: int) -> Reply[None]:
        return self._one(Acknowledgement(receipt, "ack"), now_ms)

    def release(self, receipt: Receipt, now_ms: int, delay_ms: int = 0) -> Reply[None]:
        """Deliver again after ``delay_ms``; at ``max_deliveries`` it is archived instead."""
        return self._one(Acknowledgement(receipt, "release", delay_ms), now_ms)

    def reject(self, receipt: Receipt, now_ms: int) -> Reply[None]:
        return self._one(Acknowledgement(receipt, "reject"), now_ms)

    def extend(self, receipt: Receipt, now_ms: int, ms: int) -> Reply[None]:
        """The lock now runs out at ``now_ms + ms`` (sooner or later than before)."""
        return self._one(Acknowledgement(receipt, "extend", ms), now_ms)

    def member_gone(self, member_id: str, now_ms: int) -> None:
        """The member left or timed out: what it holds is available at once (count kept).
        Scans the window: membership changes are rare next to acquires."""
        self._alive()
        self.tick(now_ms)
        held = [
            o for o, s in self.state.slots.items() if s.state == ACQUIRED and s.member == member_id
        ]
        self._unlock(held, now_ms)

    def tick(self, now_ms: int) -> None:
        """Expired locks come back (or are archived at ``max_deliveries``); due delays become
        available. Costs O(log n) per expired lock or due delay, nothing otherwise."""
        self._alive()
        slots, locks, deadlines = self.state.slots, self._locks, self._deadline
        expired = []
        while locks and locks[0][0] <= now_ms:
            deadline, lo, hi, count = heapq.heappop(locks)
            for o in range(lo, hi):
                slot = slots.get(o)
                if (
                    slot is not None
                    and slot.state == ACQUIRED
                    and slot.count == count
                    and deadlines.get(o) == deadline
                ):
                    expired.append(o)
                    del deadlines[o]  # an equal entry (an extend to the same deadline) is stale
        if expired:
            self._unlock(expired, now_ms)
        delays = self._delays
        while delays and delays[0][0] <= now_ms:
            due, o = heapq.heappop(delays)
            slot = slots.get(o)
            if slot is not None and slot.state == AVAILABLE and slot.due_ms == due:
                heapq.heappush(self._ready, o)
        self._compact_indexes()

    # ------------------------------------------------------------------ dead letters

    def take_dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        """Archived offsets to copy to the dead-letter topic (lowest first), each handed out
        once per instance; confirm with ``dead_letters_copied`` once the copies are durable,
        or hand them back with ``dead_letters_failed``."""
        self._alive()
        out: list[DeadLetter] = []
        slots, dead = self.state.slots, self._dead
        while dead and (limit is None or len(out) < limit):
            o = heapq.heappop(dead)
            slot = slots.get(o)
            if slot is not None and slot.state == ARCHIVING and o not in self._dead_out:
                self._dead_out.add(o)
                out.append(DeadLetter(o, slot.count, slot.reason))
        return out

    def dead_letters_failed(self, offsets: Iterable[int]) -> None:
        """Copies that did not become durable: hand these out again."""
        self._alive()
        for o in offsets:
            if o in self._dead_out:
                self._dead_out.discard(o)
                if self._slot_state(o) == ARCHIVING:
                    heapq.heappush(self._dead, o)

    def dead_letters_copied(self, offsets: Iterable[int]) -> Reply[None]:
        """The copies of these archived offsets are durable: they are done."""
        self._alive()
        done = [o for o in offsets if self._slot_state(o) == ARCHIVING]
        self._dead_out.difference_update(done)
        if done:
            self._write(DeadLettered(runs_of(done)))
        return Reply(None, self._written)

    # ------------------------------------------------------------------ views

    def describe(self, now_ms: int) -> ShareView:
        """Counts over the window (O(window): for admin requests, not the fetch path)."""
        counts = {s: 0 for s in SlotState}
        delayed = beyond = 0
        limit = min(self._end, self.window_end)
        for o, slot in self.state.slots.items():
            if slot.state == AVAILABLE and slot.due_ms > now_ms:
                delayed += 1
            else:
                counts[SlotState(slot.state)] += 1
            if o >= self._cursor and o < limit:
                beyond += 1
        fresh = max(0, limit - self._cursor - beyond)
        return ShareView(
            self.state.start,
            self._end,
            counts[SlotState.AVAILABLE] + fresh,
            counts[SlotState.ACQUIRED],
            delayed,
            counts[SlotState.ARCHIVING],
        )

    def index_sizes(self) -> dict[str, int]:
        """Sizes of the in-memory indexes (bounded: the simulation checks them)."""
        return {
            "slots": len(self.state.slots),
            "locks": len(self._locks),
            "delays": len(self._delays),
            "ready": len(self._ready),
            "dead": len(self._dead) + len(self._dead_out),
            "deadlines": len(self._deadline),
        }

    # ------------------------------------------------------------------ internals

    def _one(self, item: Acknowledgement, now_ms: int) -> Reply[None]:
        reply = self.acknowledge([item], now_ms)
        error = reply.value[0]
        if error is not None:
            raise error
        return Reply(None, reply.after)

    def _write(self, record: Record, lazy: bool = False) -> None:
        self.state.apply(record)
        self._emit([record])
        self._urgent = self._urgent or not lazy
        if self._cursor < self.state.start:
            self._cursor = self.state.start

    def _slot_state(self, o: int) -> int | None:
        slot = self.state.slots.get(o)
        return None if slot is None else slot.state

    def _range(self, first: int, end: int) -> tuple[int, int]:
        if not (isinstance(first, int) and isinstance(end, int)) or first > end:
            raise InvalidRequestError(f"bad offset range [{first}, {end})")
        if end > self.window_end:
            raise InvalidRequestError(f"[{first}, {end}) reaches past window_end {self.window_end}")
        return max(first, self.state.start), end

    def _lock(self, o: int, deadline: int, count: int) -> None:
        self._deadline[o] = deadline
        heapq.heappush(self._locks, (deadline, o, o + 1, count))

    def _settled(self, offsets: Iterable[int]) -> None:
        for o in offsets:
            self._deadline.pop(o, None)

    def _unlock(self, offsets: list[int], now_ms: int) -> None:
        """Acquired offsets come back at once, or are archived at ``max_deliveries``."""
        if not offsets:
            return
        self._settled(offsets)
        slots, cap = self.state.slots, self.config.max_deliveries
        again = [o for o in offsets if slots[o].count < cap]
        self._archive([o for o in offsets if slots[o].count >= cap], MAX_DELIVERIES_REASON)
        if again:
            self._write(Released(0, runs_of(again)))
            self._became_available(again, 0, now_ms)

    def _enforce_delivery_limit(self) -> None:
        """Available offsets delivered ``max_deliveries`` times already go to the dead letters
        (only after the limit was lowered: otherwise an offset at the limit never comes back)."""
        cap = self.config.max_deliveries
        over = sorted(
            o for o, s in self.state.slots.items() if s.state == AVAILABLE and s.count >= cap
        )
        self._archive(over, MAX_DELIVERIES_REASON)

    def _archive(self, offsets: list[int], reason: str) -> None:
        if offsets:
            self._write(Archived(reason, runs_of(offsets)))
            for o in offsets:
                heapq.heappush(self._dead, o)

    def _became_available(self, offsets: Iterable[int], due: int, now_ms: int) -> None:
        if due > now_ms:
            for o in offsets:
                heapq.heappush(self._delays, (due, o))
        else:
            for o in offsets:
                heapq.heappush(self._ready, o)

    def _compact_indexes(self) -> None:
        """Drop stale heap entries once they outnumber the live ones (settled offsets leave
        their lock entry behind): amortized O(1), and the heaps stay O(max_in_flight)."""
        slack = 1024 + self.config.max_in_flight
        slots = self.state.slots
        if len(self._locks) > slack + 2 * len(self._deadline):
            locks: list[tuple[int, int, int, int]] = []
            for o in sorted(self._deadline):
                d, count = self._deadline[o], slots[o].count
                if locks and locks[-1][2] == o and locks[-1][0] == d and locks[-1][3] == count:
                    locks[-1] = (d, locks[-1][1], o + 1, count)
                else:
                    locks.append((d, o, o + 1, count))
            heapq.heapify(locks)
            self._locks = locks
        if len(self._ready) > slack:
            self._ready = sorted({o for o in self._ready if self._slot_state(o) == AVAILABLE})
        if len(self._delays) > slack:
            self._delays = sorted(
                {(d, o) for d, o in self._delays if o in slots and slots[o].due_ms == d}
            )
        if len(self._dead) > slack:
            self._dead = sorted({o for o in self._dead if self._slot_state(o) == ARCHIVING})

    def _rebuild_indexes(self, now_ms: int) -> None:
        """A new instance: locks restart now with their durable duration; delays keep their
        due time; archived offsets not yet copied are handed out again."""
        for o in sorted(self.state.slots):
            slot = self.state.slots[o]
            if slot.state == ACQUIRED:
                self._lock(o, now_ms + slot.lock_ms, slot.count)
            elif slot.state == AVAILABLE:
                self._became_available((o,), slot.due_ms, now_ms)
            elif slot.state == ARCHIVING:
                heapq.heappush(self._dead, o)


def _require_member(member_id: object) -> None:
    if not isinstance(member_id, str) or not member_id or len(member_id) > 255:
        raise InvalidRequestError("member id must be a non-empty string of at most 255 characters")
