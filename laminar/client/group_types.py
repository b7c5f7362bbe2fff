"""Plain-Python values of the consumer-group replies, copied out of Cap'n Proto readers.

Readers must not outlive their reply buffers, so every group reply is converted here first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from laminar.client.types import TopicPartition


class OffsetAndMetadata(NamedTuple):
    """A committed position: the next offset to read, plus an application string."""

    offset: int
    metadata: str = ""


@dataclass(slots=True, frozen=True)
class CommittedOffset:
    topic: str
    partition: int
    offset: int
    """The next offset to read."""
    metadata: str
    commit_ms: int


@dataclass(slots=True, frozen=True)
class HeartbeatReply:
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    session_timeout_ms: int
    assignment: frozenset[TopicPartition]
    """What the member may own now: it gives up anything else it owns."""


@dataclass(slots=True, frozen=True)
class GroupSummary:
    group: str
    state: str
    """empty, reconciling or stable."""
    members: int
    coordinator: int
    protocol: str = "consumer"
    """consumer (laminar's own protocol, KIP-848) or classic (Kafka JoinGroup/SyncGroup)."""


@dataclass(slots=True, frozen=True)
class GroupMemberDescription:
    member_id: str
    instance_id: str | None
    rack: str | None
    member_epoch: int
    topics: tuple[str, ...]
    assigned: tuple[TopicPartition, ...]
    """Owned now."""
    revoking: tuple[TopicPartition, ...]
    """Still to be given up."""
    target: tuple[TopicPartition, ...]
    """Where the group is heading."""
    fenced: bool


@dataclass(slots=True, frozen=True)
class PartitionLag:
    """One row of `laminar group describe`: who reads a partition and how far behind it is."""

    topic: str
    partition: int
    member_id: str | None
    committed: int | None
    end_offset: int | None
    lag: int | None
    """end_offset - committed; None when either is unknown (nothing committed yet)."""


@dataclass(slots=True, frozen=True)
class GroupDescription:
    group: str
    state: str
    epoch: int
    coordinator: int
    members: tuple[GroupMemberDescription, ...]
    offsets: tuple[CommittedOffset, ...]
    partitions: tuple[PartitionLag, ...] = ()
    """Filled by Admin.describe_group (needs the partitions' end offsets)."""
    protocol: str = "consumer"
    """consumer or classic (a classic group's epoch is its generation)."""


def partitions_of(reader: Any) -> tuple[TopicPartition, ...]:
    return tuple(sorted(TopicPartition(p.topic, p.partition) for p in reader))


def committed_from_reader(reader: Any) -> tuple[CommittedOffset, ...]:
    rows = (CommittedOffset(o.topic, o.partition, o.offset, o.metadata, o.commitMs) for o in reader)
    return tuple(sorted(rows, key=lambda o: (o.topic, o.partition)))


def heartbeat_from_reader(reply: Any) -> HeartbeatReply:
    return HeartbeatReply(
        member_id=reply.memberId,
        member_epoch=reply.memberEpoch,
        heartbeat_interval_ms=reply.heartbeatIntervalMs,
        session_timeout_ms=reply.sessionTimeoutMs,
        assignment=frozenset(partitions_of(reply.assignment)),
    )


def summaries_from_reader(reply: Any) -> list[GroupSummary]:
    return [
        GroupSummary(g.group, g.state, g.members, g.coordinator, g.protocol or "consumer")
        for g in reply.groups
    ]


def description_from_reader(reply: Any) -> GroupDescription:
    members = tuple(
        GroupMemberDescription(
            member_id=m.memberId,
            instance_id=m.instanceId or None,
            rack=m.rack or None,
            member_epoch=m.memberEpoch,
            topics=tuple(m.topics),
            assigned=partitions_of(m.assigned),
            revoking=partitions_of(m.revoking),
            target=partitions_of(m.target),
            fenced=m.fenced,
        )
        for m in reply.members
    )
    return GroupDescription(
        group=reply.group,
        state=reply.state,
        epoch=reply.epoch,
        coordinator=reply.coordinator,
        members=tuple(sorted(members, key=lambda m: m.member_id)),
        offsets=committed_from_reader(reply.offsets),
        protocol=reply.protocol or "consumer",
    )
