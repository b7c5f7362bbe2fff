"""Member records and the events the membership core reports about them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class MemberState(StrEnum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


LIVE_STATES = frozenset({MemberState.ALIVE, MemberState.SUSPECT})

# The codec refuses larger incarnations and the core ignores news at this one, so a refutation
# (one more than anything accepted) always stays encodable. Nobody counts that high honestly.
MAX_INCARNATION = 2**62


@dataclass(slots=True)
class Member:
    """One node as this member currently believes it to be; ``address`` is its UDP host:port."""

    node_id: int
    address: str
    incarnation: int
    state: MemberState
    meta: dict[str, str] = field(default_factory=dict)

    def copy(self) -> Member:
        """A detached copy, so callers can never mutate the core's own records."""
        return Member(self.node_id, self.address, self.incarnation, self.state, dict(self.meta))


class EventKind(StrEnum):
    JOINED = "joined"  # first time this member is known
    ALIVE = "alive"  # back to alive from suspect, dead or left
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"
    UPDATED = "updated"  # address or metadata changed while alive
    REAPED = "reaped"  # down for reap_after_ticks: forgotten (the event carries its last record)


@dataclass(frozen=True, slots=True)
class MemberEvent:
    kind: EventKind
    member: Member
