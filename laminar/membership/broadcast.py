"""Infection-style dissemination: each update is piggy-backed a bounded number of times."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from laminar.membership.messages import Update, update_size


@dataclass(slots=True)
class _Pending:
    update: Update
    transmits: int
    order: int
    size: int


class BroadcastQueue:
    """Updates waiting to be gossiped; a newer update about a node replaces the older one."""

    def __init__(self) -> None:
        self._items: dict[int, _Pending] = {}
        self._order = 0

    def __len__(self) -> int:
        return len(self._items)

    def push(self, update: Update) -> None:
        self._order += 1
        self._items[update.node_id] = _Pending(update, 0, self._order, update_size(update))

    def take(self, budget_bytes: int, limit: int, skip: Collection[int] = ()) -> list[Update]:
        """Updates fitting ``budget_bytes``, least transmitted (then newest) first.

        Each taken update counts one transmission; after ``limit`` it is forgotten. ``skip`` is a
        collection of node ids whose updates the caller already carries.
        """
        if not self._items:
            return []
        chosen: list[Update] = []
        ranked = sorted(self._items.values(), key=lambda p: (p.transmits, -p.order))
        for pending in ranked:
            if pending.update.node_id in skip:
                continue
            if pending.size > budget_bytes:
                continue
            budget_bytes -= pending.size
            chosen.append(pending.update)
            pending.transmits += 1
            if pending.transmits >= limit:
                del self._items[pending.update.node_id]
        return chosen
