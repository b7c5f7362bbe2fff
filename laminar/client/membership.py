"""One consumer's side of the group protocol, sans I/O: what to send, what to give up, what
to take on, and when the member must consider its partitions lost.

The coordinator (laminar/groups/coordinator.py) answers every heartbeat with the partitions
the member may own *now*. The member reconciles towards that answer in two kinds of steps:

* **revoke**: partitions it owns that the answer no longer lists. The member stops reading
  them, runs the revoke listener (which may commit: the coordinator accepts commits of
  partitions being revoked), and only then reports them gone with ``revoked()``; the next
  heartbeat, sent at once, no longer lists them as owned, which is what lets the coordinator
  hand them to their next owner.
* **assign**: partitions the answer lists that it does not own yet. The member looks up their
  committed offsets, starts reading, then reports them with ``assigned()``.

**Lost** partitions are given up without a commit: the coordinator said the member is unknown
or fenced (``fenced()``: it then joins again under a new member id at epoch 0), or no
heartbeat succeeded for the session timeout (``expire()``: the coordinator has surely removed
the member by now, so a paused-then-resumed process must not go on reading as owner; it keeps
its id and lets the next heartbeat answer say what it owns, if anything).

Time is passed in; nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from laminar.client.group_types import HeartbeatReply
from laminar.client.types import TopicPartition

DEFAULT_SESSION_TIMEOUT_MS = 45_000
DEFAULT_HEARTBEAT_INTERVAL_MS = 5_000


def new_member_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    member_id: str
    member_epoch: int
    topics: tuple[str, ...]
    owned: frozenset[TopicPartition]


@dataclass(frozen=True, slots=True)
class Plan:
    """The next reconciliation step: give up ``revoke`` first, then take on ``assign``."""

    revoke: frozenset[TopicPartition]
    assign: frozenset[TopicPartition]

    def __bool__(self) -> bool:
        return bool(self.revoke or self.assign)


class Membership:
    """The member id, epoch and partitions of one consumer in one group."""

    def __init__(
        self,
        group: str,
        *,
        instance_id: str | None = None,
        id_factory: Callable[[], str] = new_member_id,
    ) -> None:
        self.group = group
        self.instance_id = instance_id
        self._new_id = id_factory
        self.member_id = id_factory()
        self.epoch = 0
        self.topics: tuple[str, ...] = ()
        self.owned: frozenset[TopicPartition] = frozenset()
        self.target: frozenset[TopicPartition] = frozenset()
        """The last answer's assignment: where reconciliation is heading."""
        self.heartbeat_interval_ms = DEFAULT_HEARTBEAT_INTERVAL_MS
        self.session_timeout_ms = DEFAULT_SESSION_TIMEOUT_MS
        self.last_reply_ms: int | None = None
        self.generation = 0
        """Bumped whenever everything is lost: a step started before must not finish."""

    # ----------------------------------------------------------------------------- inputs
    @property
    def joined(self) -> bool:
        """True once a heartbeat answer arrived for this member id."""
        return self.epoch > 0

    def subscribe(self, topics: Iterable[str]) -> bool:
        """Set the subscribed topics; True when they changed (heartbeat at once)."""
        wanted = tuple(sorted(set(topics)))
        changed = wanted != self.topics
        self.topics = wanted
        return changed

    def request(self) -> HeartbeatRequest:
        return HeartbeatRequest(self.member_id, self.epoch, self.topics, self.owned)

    def on_reply(self, sent: HeartbeatRequest, reply: HeartbeatReply, sent_ms: int) -> bool:
        """Take a heartbeat answer; False if it answers an incarnation that is gone.

        ``sent_ms`` is when the request left: the coordinator renewed the session when it
        handled it, which was no earlier, so the session is safely counted from there (a reply
        that sat in a buffer while the process was paused must not look fresh)."""
        if sent.member_id != self.member_id:
            return False
        self.epoch = reply.member_epoch
        self.target = reply.assignment
        if reply.heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = reply.heartbeat_interval_ms
        if reply.session_timeout_ms > 0:
            self.session_timeout_ms = reply.session_timeout_ms
        self.last_reply_ms = sent_ms
        return True

    def plan(self) -> Plan:
        return Plan(self.owned - self.target, self.target - self.owned)

    def revoked(self, tps: Iterable[TopicPartition]) -> None:
        """These are given up (listener run, commits done): the next heartbeat says so."""
        self.owned = self.owned - frozenset(tps)

    def assigned(self, tps: Iterable[TopicPartition]) -> None:
        self.owned = self.owned | (frozenset(tps) & self.target)

    def fenced(self) -> frozenset[TopicPartition]:
        """Unknown member or fenced epoch: lose everything, join again as a new member."""
        lost = self.owned
        self.member_id = self._new_id()
        self.epoch = 0
        self.owned = frozenset()
        self.target = frozenset()
        self.last_reply_ms = None
        self.generation += 1
        return lost

    def session_expired(self, now_ms: int) -> bool:
        """No answer for a whole session timeout while owning partitions."""
        return (
            bool(self.owned)
            and self.last_reply_ms is not None
            and now_ms - self.last_reply_ms >= self.session_timeout_ms
        )

    def expire(self) -> frozenset[TopicPartition]:
        """Lose everything owned; keep the id (the coordinator's next answer decides)."""
        lost = self.owned
        self.owned = frozenset()
        self.target = frozenset()
        self.generation += 1
        return lost

    def left(self) -> None:
        """After leaving the group: a later join is a new incarnation."""
        self.fenced()

    def may_commit(self, tp: TopicPartition) -> bool:
        return tp in self.owned
