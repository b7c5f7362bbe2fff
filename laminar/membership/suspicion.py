"""Lifeguard suspicion timer: starts long and shrinks as independent accusers confirm it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class Suspicion:
    """A suspect's timer; ``k`` confirmations (besides the first accuser) bring it to ``min``."""

    incarnation: int
    start_tick: int
    min_ticks: int
    max_ticks: int
    k: int
    accusers: set[int] = field(default_factory=set)
    checked: bool = False  # a last direct check of the suspect has been sent
    extension: int = 0  # ticks added to wait for that check
    _deadline: int | None = None

    def confirm(self, accuser: int) -> bool:
        """Record an accuser; True if it is a new one (then the news is worth re-gossiping)."""
        if accuser in self.accusers:
            return False
        self.accusers.add(accuser)
        self._deadline = None
        return True

    def extend(self, ticks: int) -> None:
        self.extension += ticks
        self._deadline = None

    def deadline(self) -> int:
        """The tick at which the suspect is declared dead (cached: checked every tick)."""
        if self._deadline is None:
            self._deadline = self._compute()
        return self._deadline

    def _compute(self) -> int:
        confirmations = max(0, len(self.accusers) - 1)
        if self.k <= 0:
            return self.start_tick + self.min_ticks + self.extension
        frac = math.log(confirmations + 1) / math.log(self.k + 1)
        timeout = self.max_ticks - (self.max_ticks - self.min_ticks) * frac
        return self.start_tick + max(self.min_ticks, math.floor(timeout)) + self.extension
