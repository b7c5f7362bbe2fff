"""The log interface of a sans-I/O state machine whose changes are records made durable by a
driver (the group coordinator, a queue's share partition).

The machine writes records into an outbox; the driver takes them (``take_batch``), appends each
batch as one Raft entry and reports how many are durable (``records_committed``). Every result
a client waits for is a ``Reply`` naming how many records must be durable before it is sent,
because it may depend on any of them. If an append fails, the driver calls ``records_lost`` and
rebuilds the machine from the durable records; the lost object refuses every further call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from laminar.errors import LaminarError

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Reply(Generic[T]):
    """A result to send once the first ``after`` records of its state machine are durable."""

    value: T
    after: int


class RecordOutbox(Generic[R]):
    """Records written but not yet taken, and how many of them are durable."""

    lost_error: type[LaminarError] = LaminarError
    lost_message = "state was lost with a failed append; rebuild it from the records"
    """Raised by every call after ``records_lost``."""

    def __init__(self) -> None:
        self._outbox: list[R] = []
        self._written = 0
        self._committed = 0
        self._lost = False

    @property
    def written(self) -> int:
        """Records written so far (taken or not)."""
        return self._written

    @property
    def committed(self) -> int:
        return self._committed

    def take_batch(self) -> tuple[R, ...]:
        """Records written since the last call, in order: the driver appends them as one
        atomic entry, so a batch always holds whole requests."""
        out, self._outbox = tuple(self._outbox), []
        return out

    def records_committed(self, up_to: int) -> None:
        """The first ``up_to`` records of this instance are durable."""
        self._alive()
        if up_to > self._written:
            raise ValueError(f"{up_to} records committed but only {self._written} written")
        self._committed = max(self._committed, up_to)

    def records_lost(self) -> None:
        """An append failed: this object is unusable; rebuild from the durable records."""
        self._lost = True

    def is_released(self, reply: Reply) -> bool:
        return reply.after <= self._committed

    def _alive(self) -> None:
        if self._lost:
            raise self.lost_error(self.lost_message)

    def _emit(self, records: list[R]) -> None:
        """Queue records already folded into the state."""
        self._outbox += records
        self._written += len(records)
