"""The split driver's decisions, sans-I/O: what to ask next to finish open splits and merges.

The driver runs on the metadata leader. It is fed the operations open in the metadata (``step``,
with the time) and the outcomes of what it asked (``sealed``, ``seal_failed``,
``finish_failed``); it answers with actions: ``Seal`` (ask a parent's leader to seal it; the
seal is idempotent, so asking twice is harmless) and ``Finish`` (propose ``finish_op`` with
every parent's end). It keeps no durable state: every fact it needs is in the metadata (the
open operation) or in the parents' logs (their seals), so a new metadata leader's fresh driver
picks up where the last one stopped, and an answer that arrives for an operation no longer open
is ignored. ``service.py`` carries the actions out; ``tests/split_sim.py`` checks the whole
protocol under crashes and lost messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RETRY_AFTER = 10.0
"""Seconds before a seal or finish is asked again while no answer came (the service always
reports one; a lost answer is what this bounds)."""


@dataclass(frozen=True, slots=True)
class Seal:
    topic: str
    partition: int
    op_id: str


@dataclass(frozen=True, slots=True)
class Finish:
    topic: str
    op_id: str
    ends: dict[int, int]


Action = Seal | Finish


@dataclass(slots=True)
class _Progress:
    topic: str
    parents: list[int]
    ends: dict[int, int] = field(default_factory=dict)
    asked: dict[int, float] = field(default_factory=dict)
    """Parent -> when its seal may be asked again."""
    finish_after: float = -1.0
    """When a finish may be proposed (again); -1: not asked yet."""


class SplitDriver:
    """Decides the next steps of every open operation; see the module docstring."""

    def __init__(self, retry_after: float = RETRY_AFTER) -> None:
        self.retry_after = retry_after
        self._open: dict[str, _Progress] = {}

    def step(self, now: float, operations: list[tuple[str, dict[str, Any]]]) -> list[Action]:
        """The actions due now, given the open ``(topic, operation)``s in the metadata."""
        current = {op["id"]: (topic, op) for topic, op in operations}
        for op_id in [k for k in self._open if k not in current]:
            del self._open[op_id]  # finished (or its topic deleted): forget it
        actions: list[Action] = []
        for op_id, (topic, op) in current.items():
            progress = self._open.get(op_id)
            if progress is None:
                progress = self._open[op_id] = _Progress(topic, list(op["parents"]))
            missing = [p for p in progress.parents if p not in progress.ends]
            for parent in missing:
                if progress.asked.get(parent, -1.0) <= now:
                    progress.asked[parent] = now + self.retry_after
                    actions.append(Seal(topic, parent, op_id))
            if not missing and progress.finish_after <= now:
                progress.finish_after = now + self.retry_after
                actions.append(Finish(topic, op_id, dict(progress.ends)))
        return actions

    def sealed(self, op_id: str, parent: int, end: int) -> None:
        """A parent's leader answered: sealed, every record below ``end``."""
        progress = self._open.get(op_id)
        if progress is not None and parent in progress.parents:
            progress.ends[parent] = end
            progress.finish_after = -1.0  # finish at the next step

    def seal_failed(self, op_id: str, parent: int, now: float) -> None:
        """Asking failed (no leader, lost connection): ask again after a short pause."""
        progress = self._open.get(op_id)
        if progress is not None:
            progress.asked[parent] = min(progress.asked.get(parent, now), now + 0.2)

    def finish_failed(self, op_id: str, now: float) -> None:
        progress = self._open.get(op_id)
        if progress is not None:
            progress.finish_after = now + 0.2

    def open_operations(self) -> int:
        return len(self._open)
