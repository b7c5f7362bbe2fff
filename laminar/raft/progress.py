"""Per-follower replication progress as the leader sees it.

PROBE: we do not know where the follower's log matches ours; send one append at a time and
wait for the answer (or a heartbeat response) before sending the next. REPLICATE: the follower
is known to match up to ``match``; stream appends optimistically, bounded by the in-flight
window (messages and bytes). RESET: the follower was told to reset its log to our start offset;
wait until it acknowledges that position.
"""

from __future__ import annotations

from collections import deque

from laminar.raft.types import ProgressState

PROBE = ProgressState.PROBE
REPLICATE = ProgressState.REPLICATE
RESET = ProgressState.RESET


class Inflights:
    """The window of appends sent but not yet acknowledged: (last offset, bytes) per message."""

    __slots__ = ("bytes", "max_bytes", "max_msgs", "q")

    def __init__(self, max_msgs: int, max_bytes: int) -> None:
        self.q: deque[tuple[int, int]] = deque()
        self.bytes = 0
        self.max_msgs = max_msgs
        self.max_bytes = max_bytes

    def full(self) -> bool:
        return len(self.q) >= self.max_msgs or self.bytes >= self.max_bytes

    def add(self, last: int, size: int) -> None:
        self.q.append((last, size))
        self.bytes += size

    def free_le(self, index: int) -> None:
        q = self.q
        while q and q[0][0] <= index:
            self.bytes -= q.popleft()[1]

    def free_first(self) -> None:
        if self.q:
            self.bytes -= self.q.popleft()[1]

    def reset(self) -> None:
        self.q.clear()
        self.bytes = 0


NEVER = -(1 << 30)


class Progress:
    """Leader-side state of one replica (voter or learner)."""

    __slots__ = (
        "asleep",
        "commit",
        "inflights",
        "learner",
        "match",
        "next",
        "probe_sent",
        "quiesce_round",
        "recent_active",
        "reset_index",
        "sent_commit",
        "sent_round",
        "state",
    )

    def __init__(
        self, next_index: int, max_msgs: int, max_bytes: int, learner: bool = False
    ) -> None:
        self.match = -1
        self.next = next_index
        self.state = PROBE
        self.probe_sent = False
        self.recent_active = False
        self.learner = learner
        self.reset_index = -1
        self.commit = -1
        self.sent_commit = -1
        self.sent_round = NEVER
        """The leader's heartbeat round in which it last sent this replica an append or a
        heartbeat (see ``RaftNode._bcast_heartbeat``)."""
        self.inflights = Inflights(max_msgs, max_bytes)
        self.quiesce_round = 0
        """The round of the quiescing heartbeat last sent, while nothing was sent since (0)."""
        self.asleep = False
        """The replica answered that quiescing heartbeat asleep (or was sent it silent, holding
        every entry: ``RaftNode._send_heartbeat``), and has been sent nothing and has sent
        nothing but heartbeat answers since: it does not tick, so it needs no heartbeats (see
        ``RaftNode._bcast_heartbeat``)."""

    def woken(self) -> None:
        """Something other than a quiescing heartbeat went to or came from the replica."""
        self.asleep = False
        self.quiesce_round = 0

    def become_probe(self) -> None:
        # After a reset, probing restarts right above the reset point.
        if self.state == RESET:
            self.next = max(self.match + 1, self.reset_index + 1)
        else:
            self.next = self.match + 1
        self.state = PROBE
        self.probe_sent = False
        self.reset_index = -1
        self.inflights.reset()

    def become_replicate(self) -> None:
        self.state = REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflights.reset()

    def become_reset(self, index: int) -> None:
        self.state = RESET
        self.reset_index = index
        self.probe_sent = False
        self.inflights.reset()

    def maybe_update(self, index: int) -> bool:
        """Record an ack up to ``index``; True when ``match`` moved."""
        updated = False
        if index > self.match:
            self.match = index
            updated = True
            self.probe_sent = False
        if index + 1 > self.next:
            self.next = index + 1
        return updated

    def maybe_decr_to(self, rejected: int, hint_next: int) -> bool:
        """Handle a rejection of an append whose previous offset was ``rejected``.

        ``hint_next`` is where the leader now wants to probe (already aligned to an entry
        start). Returns False when the rejection is stale.
        """
        if self.state == REPLICATE:
            if rejected <= self.match:
                return False
            self.next = max(self.match + 1, hint_next)
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(min(rejected, hint_next), self.match + 1)
        self.probe_sent = False
        return True

    def paused(self) -> bool:
        if self.state == PROBE:
            return self.probe_sent
        if self.state == REPLICATE:
            return self.inflights.full()
        return True

    def sent_all_unanswered(self, last: int) -> bool:
        """Replicating, the entries through ``last`` are sent and their answer is owed."""
        return self.state == REPLICATE and self.match < last < self.next

    def stuck(self) -> bool:
        """Whether appends are stuck behind a full window (or a reset): the follower's
        heartbeat answer frees a slot (or probes again), so it is heartbeated every round. A
        probe in flight is paused, not stuck: its answer is owed, and a heartbeat meanwhile
        made that answer trigger a second probe (a restarted node's 10,000 groups were sent a
        heartbeat and an empty probe every round while it caught up)."""
        if self.state == REPLICATE:
            return self.inflights.full()
        return self.state == RESET
