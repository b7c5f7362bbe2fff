"""Vote requests for a group this node does not host yet, kept until its replica opens.

When a topic is created, every node opens its replicas in slices, each at its own pace; the
preferred replica campaigns as soon as it opens. A (pre-)vote request that reached a node still
opening that group was dropped, and the candidate asked again only after a randomized election
timeout. Here the newest few requests of such a group wait, briefly (a group never opened here,
one moved away, say, lets them expire), and the node hands them to the replica when it opens,
through the same admission checks as any message. To Raft they are delayed messages, which it
tolerates. Only vote requests are kept: they are small, and a leader's appends are retried by
the leader itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from laminar.raft import Message, MessageType

KEPT_TYPES = frozenset({MessageType.PRE_VOTE, MessageType.VOTE})
PER_GROUP = 2
"""Requests kept per group (the newest)."""
MAX_GROUPS = 20_000
"""Groups with kept requests; past it, nothing more is kept until some expire or open."""
KEEP_SECONDS = 5.0
"""A group's requests are forgotten this long after the newest arrived."""

Kept = tuple[int, Message]
"""(peer it came from, message)"""


class EarlyMessages:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._kept: dict[int, tuple[float, list[Kept]]] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, group: int, peer: int, message: Message) -> None:
        if message.type not in KEPT_TYPES:
            return
        entry = self._kept.get(group)
        if entry is None and len(self._kept) >= MAX_GROUPS:
            self.expire()
            if len(self._kept) >= MAX_GROUPS:
                return
        kept = [] if entry is None else entry[1]
        kept.append((peer, message))
        if len(kept) > PER_GROUP:
            del kept[0]
        self._kept[group] = (self._clock(), kept)

    def take(self, group: int) -> list[Kept]:
        """The kept requests of a group that just opened, oldest first (none if expired)."""
        entry = self._kept.pop(group, None)
        if entry is None or self._clock() - entry[0] > KEEP_SECONDS:
            return []
        return entry[1]

    def expire(self) -> None:
        """Forget groups whose newest request came more than ``KEEP_SECONDS`` ago."""
        if not self._kept:
            return
        cutoff = self._clock() - KEEP_SECONDS
        for group in [g for g, (newest, _) in self._kept.items() if newest < cutoff]:
            del self._kept[group]
