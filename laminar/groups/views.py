"""Read-only views of group state for list and describe requests (plain values, no records)."""

from __future__ import annotations

from dataclasses import dataclass

from laminar.groups.classic import ClassicGroupView
from laminar.groups.consumer_protocol import assignment_partitions, subscription_topics
from laminar.groups.records import GroupState, OffsetValue, TopicPartition

EMPTY = "empty"
RECONCILING = "reconciling"
STABLE = "stable"


@dataclass(frozen=True, slots=True)
class MemberView:
    member_id: str
    instance_id: str | None
    rack: str | None
    epoch: int
    topics: tuple[str, ...]
    assigned: tuple[TopicPartition, ...]
    revoking: tuple[TopicPartition, ...]
    target: tuple[TopicPartition, ...]
    fenced: bool


@dataclass(frozen=True, slots=True)
class GroupView:
    name: str
    state: str
    epoch: int
    members: tuple[MemberView, ...]
    offsets: dict[TopicPartition, OffsetValue]
    protocol: str = "consumer"
    """``consumer`` (KIP-848, laminar's own) or ``classic`` (Kafka's JoinGroup/SyncGroup)."""
    protocol_type: str = "consumer"
    """A classic group's protocol type (``consumer`` for consumers, ``connect``...)."""


def state_name(group: GroupState) -> str:
    """``empty`` (no members), ``stable`` (every member owns exactly its target) or
    ``reconciling`` (partitions are still being revoked or handed over)."""
    if not group.members:
        return EMPTY
    for member_id, current in group.assignments.items():
        target = group.target_members.get(member_id)
        wanted = target.partitions if target is not None else ()
        if current.fenced or current.revoking or current.assigned != wanted:
            return RECONCILING
    return STABLE


def describe(name: str, group: GroupState | None) -> GroupView:
    """The view of ``group`` (a group that does not exist is described as empty)."""
    if group is None:
        return GroupView(name, EMPTY, 0, (), {})
    members = []
    for member_id, meta in sorted(group.members.items()):
        current = group.assignments[member_id]
        target = group.target_members.get(member_id)
        members.append(
            MemberView(
                member_id,
                meta.instance_id,
                meta.rack,
                current.epoch,
                meta.topics,
                current.assigned,
                current.revoking,
                target.partitions if target is not None else (),
                current.fenced,
            )
        )
    epoch = group.meta.epoch if group.meta is not None else 0
    return GroupView(name, state_name(group), epoch, tuple(members), dict(group.offsets))


CLASSIC_STATES = {
    "Empty": EMPTY,
    "PreparingRebalance": "preparing-rebalance",
    "CompletingRebalance": "completing-rebalance",
    "Stable": STABLE,
    "Dead": "dead",
}


def describe_classic(
    view: ClassicGroupView, offsets: dict[TopicPartition, OffsetValue]
) -> GroupView:
    """A classic group in the native view: the epoch is the generation, topics and partitions
    are read from the consumer protocol's subscription and assignment (empty for others)."""
    members = []
    for m in view.members:
        assigned = assignment_partitions(m.assignment)
        members.append(
            MemberView(
                m.member_id,
                m.instance_id,
                None,
                view.generation,
                subscription_topics(m.metadata),
                assigned,
                (),
                assigned,
                False,
            )
        )
    state = CLASSIC_STATES.get(view.state, view.state)
    return GroupView(
        view.name,
        state,
        view.generation,
        tuple(members),
        offsets,
        "classic",
        view.protocol_type or "consumer",
    )
