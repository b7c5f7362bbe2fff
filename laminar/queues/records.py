"""The durable form of one share partition's queue state: range records and the fold over them.

Every change ``SharePartition`` makes to the durable state is a record, folded by
``ShareState.apply`` - the same function a replay uses after a failover, so the live state and
the replayed one cannot drift apart. Unlike the group records (one key per fact), these records
are *transitions over offset ranges* and are folded in log order: a batch of 500 acks of
contiguous offsets is one ``Acked`` record with one run, not 500 records.

Per offset (``Slot``) the durable facts are: its state, its delivery count (written at
acquisition, so it never goes back), the member holding it and the lock duration it was given
(so a new leader can restart the lock, never shorter than the member was told), the time it
becomes due when it waits for a delay, and why it was archived. Offsets at or after ``start``
without a slot are fresh: available, never delivered. Below ``start`` everything is done and
nothing is stored: the fold drops the slots of a done prefix as soon as it forms.

Record kinds (runs are half-open ``[start, end)`` offset ranges):

* ``Acquired(member, lock_ms, runs of (start, end, delivery count))`` -> ACQUIRED;
* ``Extended(lock_ms, runs)`` -> the lock duration of ACQUIRED offsets;
* ``Acked(runs)`` -> ACKED (acks and skipped offsets that hold no record);
* ``Released(due_ms, runs)`` -> AVAILABLE from ``due_ms`` on (0: at once), count kept; also
  what a delayed record that was never delivered becomes (count 0);
* ``Archived(reason, runs)`` -> ARCHIVING: never delivered again, to be copied to the
  dead-letter topic;
* ``DeadLettered(runs)`` -> ARCHIVED: the copy is durable, the offset is done;
* ``StartMoved(offset)``: everything below is done (a new group's start, log retention);
* ``Snapshot(start, runs of (start, end, state, count, member, lock_ms, due_ms, reason))``:
  the whole state restated (a checkpoint): a replay may begin at it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import IntEnum

Run = tuple[int, int]  # [start, end)


class SlotState(IntEnum):
    AVAILABLE = 0
    ACQUIRED = 1
    ACKED = 2
    ARCHIVING = 3  # archived, the dead-letter copy is not yet durable: blocks the start
    ARCHIVED = 4


DONE = (SlotState.ACKED, SlotState.ARCHIVED)
_ACKED = (SlotState.ACKED, "", 0, 0, "")  # an acked slot: its count kept, the rest cleared


@dataclass(slots=True)
class Slot:
    state: int
    count: int = 0
    member: str = ""
    lock_ms: int = 0
    due_ms: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Acquired:
    member: str
    lock_ms: int
    runs: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True, slots=True)
class Extended:
    lock_ms: int
    runs: tuple[Run, ...]


@dataclass(frozen=True, slots=True)
class Acked:
    runs: tuple[Run, ...]


@dataclass(frozen=True, slots=True)
class Released:
    due_ms: int
    runs: tuple[Run, ...]


@dataclass(frozen=True, slots=True)
class Archived:
    reason: str
    runs: tuple[Run, ...]


@dataclass(frozen=True, slots=True)
class DeadLettered:
    runs: tuple[Run, ...]


@dataclass(frozen=True, slots=True)
class StartMoved:
    offset: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    start: int
    runs: tuple[tuple[int, int, int, int, str, int, int, str], ...]


Record = Acquired | Extended | Acked | Released | Archived | DeadLettered | StartMoved | Snapshot


@dataclass
class ShareState:
    """The durable state of one share partition; ``apply`` is the only way it changes."""

    start: int = 0
    slots: dict[int, Slot] = field(default_factory=dict)

    def apply(self, record: Record) -> None:
        slots, start = self.slots, self.start
        if isinstance(record, Acquired):
            member, lock_ms = record.member, record.lock_ms
            for lo, hi, count in record.runs:
                for o in range(max(lo, start), hi):
                    slots[o] = Slot(SlotState.ACQUIRED, count, member, lock_ms)
        elif isinstance(record, Extended):
            for o in _offsets(record.runs, start):
                slot = slots.get(o)
                if slot is not None and slot.state == SlotState.ACQUIRED:
                    slot.lock_ms = record.lock_ms
        elif isinstance(record, Released):
            for o in _offsets(record.runs, start):
                slot = slots.get(o)
                count = slot.count if slot is not None else 0
                slots[o] = Slot(SlotState.AVAILABLE, count, due_ms=record.due_ms)
        elif isinstance(record, Acked):
            # The common transition (an acked acquisition): its slot changes in place (it
            # belongs to this state alone), and the done prefix is dropped right after.
            for o in _offsets(record.runs, start):
                slot = slots.get(o)
                if slot is None:
                    slots[o] = Slot(SlotState.ACKED)
                else:
                    slot.state, slot.member, slot.lock_ms, slot.due_ms, slot.reason = _ACKED
            self._advance()
        elif isinstance(record, Archived | DeadLettered):
            for o in _offsets(record.runs, start):
                slot = slots.get(o)
                count = slot.count if slot is not None else 0
                if isinstance(record, Archived):
                    slots[o] = Slot(SlotState.ARCHIVING, count, reason=record.reason)
                else:
                    reason = slot.reason if slot is not None else ""
                    slots[o] = Slot(SlotState.ARCHIVED, count, reason=reason)
            self._advance()
        elif isinstance(record, StartMoved):
            if record.offset > start:
                if record.offset - start <= len(slots):
                    for o in range(start, record.offset):
                        slots.pop(o, None)
                else:
                    for o in [o for o in slots if o < record.offset]:
                        del slots[o]
                self.start = record.offset
                self._advance()
        elif isinstance(record, Snapshot):
            self.start = record.start
            self.slots = {
                o: Slot(state, count, member, lock_ms, due, reason)
                for lo, hi, state, count, member, lock_ms, due, reason in record.runs
                for o in range(lo, hi)
            }
        else:
            raise TypeError(f"not a share record: {record!r}")

    def _advance(self) -> None:
        """Drop the done prefix: the start only moves over offsets that are acked or archived."""
        slots, start = self.slots, self.start
        while True:
            slot = slots.get(start)
            if slot is None or slot.state not in DONE:
                break
            del slots[start]
            start += 1
        self.start = start


def _offsets(runs: Iterable[Run], start: int) -> Iterable[int]:
    for lo, hi in runs:
        yield from range(max(lo, start), hi)


def replay(records: Iterable[Record]) -> ShareState:
    """The state a sequence of records describes (what a new leader starts from)."""
    state = ShareState()
    for record in records:
        state.apply(record)
    return state


def snapshot(state: ShareState) -> Snapshot:
    """The whole state as one record: consecutive offsets with equal slots share a run."""
    runs: list[tuple[int, int, int, int, str, int, int, str]] = []
    for o in sorted(state.slots):
        s = state.slots[o]
        fields = (int(s.state), s.count, s.member, s.lock_ms, s.due_ms, s.reason)
        if runs and runs[-1][1] == o and runs[-1][2:] == fields:
            runs[-1] = (runs[-1][0], o + 1, *fields)
        else:
            runs.append((o, o + 1, *fields))
    return Snapshot(state.start, tuple(runs))


def runs_of(offsets: Iterable[int]) -> tuple[Run, ...]:
    """Offsets as sorted half-open runs of consecutive offsets (duplicates merged)."""
    out: list[list[int]] = []
    for o in sorted(offsets):
        if out and out[-1][1] >= o:
            out[-1][1] = max(out[-1][1], o + 1)
        else:
            out.append([o, o + 1])
    return tuple((lo, hi) for lo, hi in out)


# --------------------------------------------------------------------------- encoding

_KINDS = {
    cls.__name__: cls
    for cls in (Acquired, Extended, Acked, Released, Archived, DeadLettered, StartMoved, Snapshot)
}


def _tuples(value: object) -> object:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def encode(record: Record) -> bytes:
    """A record as compact, stable JSON bytes for the partition's replicated log."""
    body = [type(record).__name__, *(getattr(record, f) for f in record.__slots__)]
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: bytes) -> Record:
    """The inverse of ``encode``; raises ``ValueError`` on anything else."""
    try:
        body = json.loads(data)
        cls = _KINDS[body[0]]
        return cls(*(_tuples(v) for v in body[1:]))
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ValueError(f"not a share record: {e}") from e
