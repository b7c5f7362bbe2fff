"""How much a node queues toward each peer: the ``RaftConfig.send_gate`` of its replicas.

Raft bounds what one group has in flight to a follower (``max_inflight_bytes``), not what all
of a node's groups have together. A node back after writes went on without it is owed by every
group at once: at 10,000 partitions and 4 GiB, the leaders queued gigabytes toward it in a few
drains, its heartbeats and votes waited behind them, groups lost their leaders, and the cluster
was not whole three minutes later. Now a leader holds a group's next entries to a peer while
that peer's connection and this drain's outbox hold ``BACKLOG_BYTES`` or more; the tick sends
them once the connection has taken all but ``RESUME_BYTES``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from laminar.node.replica import Replica

BACKLOG_BYTES = 32 * 1024 * 1024
RESUME_BYTES = BACKLOG_BYTES // 2
STREAMING_S = 2.0
"""A peer counts as still being caught up this long after the gate last held entries for it."""


class PeerBacklog:
    """Entries queued toward each peer by this node's groups, and the groups held back."""

    def __init__(self, unsent: Callable[[int], int]) -> None:
        self._unsent = unsent
        """Bytes a peer's connection holds that the kernel has not taken yet."""
        self._queued: defaultdict[int, int] = defaultdict(int)
        """Entry bytes in this drain's outbox, per peer (not yet in a connection)."""
        self._held: dict[int, dict[Replica, None]] = {}
        """Peer -> groups whose entries wait for it, in the order they were held."""
        self._last_held: dict[int, float] = {}

    def gate(self, replica: Replica) -> ReplicaGate:
        return ReplicaGate(self, replica)

    def open(self, replica: Replica, to: int) -> bool:
        if self._unsent(to) + self._queued[to] < BACKLOG_BYTES:
            return True
        self._held.setdefault(to, {})[replica] = None
        self._last_held[to] = time.monotonic()
        return False

    def sent(self, to: int, size: int) -> None:
        self._queued[to] += size

    def streaming(self, peer: int) -> bool:
        """Whether this node is still catching ``peer`` up past the gate (entries held for it
        lately): leadership is not handed to it meanwhile (``Placement``). Handed back while it
        still took gigabytes for other groups, the 4 GiB return above cost some 2,000
        elections on each survivor and a few hundred leaderless partitions at a time."""
        return time.monotonic() - self._last_held.get(peer, float("-inf")) < STREAMING_S

    def handed_over(self) -> None:
        """The drain's outbox went to the connections (which now count it as unsent)."""
        self._queued.clear()

    @property
    def holding(self) -> bool:
        """Whether any group's entries wait for a peer to take more."""
        return bool(self._held)

    def resumable(self) -> list[tuple[int, list[Replica]]]:
        """The peers that took all but ``RESUME_BYTES`` and the groups held for them (no
        longer held: a group the gate stops again is held again)."""
        if not self._held:
            return []
        ready = [peer for peer in self._held if self._unsent(peer) < RESUME_BYTES]
        return [(peer, list(self._held.pop(peer))) for peer in ready]


class ReplicaGate:
    """One replica's view of its node's backlog (the core's ``SendGate``)."""

    __slots__ = ("_backlog", "_replica")

    def __init__(self, backlog: PeerBacklog, replica: Replica) -> None:
        self._backlog = backlog
        self._replica = replica

    def open(self, to: int) -> bool:
        return self._backlog.open(self._replica, to)

    def sent(self, to: int, size: int) -> None:
        self._backlog.sent(to, size)
