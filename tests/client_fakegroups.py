"""Consumer-group requests for the in-memory test cluster (client_fakenode.py).

The group logic is the real sans-I/O Coordinator (laminar/groups/coordinator.py); this only
routes like the node does: the coordinator of group ``g`` is the leader of partition
``crc32c(g) % N`` of ``__consumer_offsets``; the first group request creates that topic and is
answered NotLeader with no leader, and a node that is not the coordinator answers NotLeader
naming it. Records are durable at once (no log), so every reply is released immediately.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import crc32c

from laminar.errors import NotLeaderError
from laminar.groups.coordinator import Coordinator, CoordinatorConfig
from laminar.groups.records import GroupState

if TYPE_CHECKING:
    from tests.client_fakenode import FakeCluster

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_PARTITIONS = 3


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class FakeGroups:
    """One Coordinator per shard of the internal topic, shared by all fake nodes."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.config = CoordinatorConfig(session_timeout_ms=3_000, heartbeat_interval_ms=200)
        self.shards: dict[int, Coordinator] = {}

    def coordinator_for(self, node_id: int, group: str) -> Coordinator:
        cluster = self.cluster
        if OFFSETS_TOPIC not in cluster.topics:
            cluster.create_topic(OFFSETS_TOPIC, OFFSETS_PARTITIONS)
            raise NotLeaderError("creating the group coordinators", 0, "")
        shard = crc32c.crc32c(group.encode()) % len(cluster.topics[OFFSETS_TOPIC])
        leader = cluster.topics[OFFSETS_TOPIC][shard].leader
        if leader != node_id:
            raise NotLeaderError("not the group coordinator", leader, cluster.address_of(leader))
        return self._shard(shard)

    def local_shards(self, node_id: int) -> list[Coordinator]:
        parts = self.cluster.topics.get(OFFSETS_TOPIC, [])
        return [self._shard(i) for i, p in enumerate(parts) if p.leader == node_id]

    def _shard(self, shard: int) -> Coordinator:
        coordinator = self.shards.get(shard)
        if coordinator is None:
            coordinator = Coordinator(self.config, self.user_topics(), now_ms())
            self.shards[shard] = coordinator
        if coordinator.topics != self.user_topics():
            coordinator.topics_changed(self.user_topics(), now_ms())
        coordinator.tick(now_ms())
        return coordinator

    def user_topics(self) -> dict[str, int]:
        return {n: len(p) for n, p in self.cluster.topics.items() if n != OFFSETS_TOPIC}


def release(coordinator: Coordinator) -> None:
    coordinator.take_batch()
    coordinator.records_committed(coordinator.written)


def state_name(group: GroupState | None) -> str:
    if group is None or not group.members:
        return "empty"
    for member_id, current in group.assignments.items():
        target = group.target_members.get(member_id)
        wanted = target.partitions if target is not None else ()
        if current.fenced or current.revoking or current.assigned != wanted:
            return "reconciling"
    return "stable"


def fill_partitions(builder: Any, name: str, tps: Any) -> None:
    items = sorted(tps)
    slots = builder.init(name, len(items))
    for slot, (topic, partition) in zip(slots, items, strict=True):
        slot.topic = topic
        slot.partition = partition


def fill_offsets(builder: Any, offsets: dict[Any, Any]) -> None:
    items = sorted(offsets.items())
    slots = builder.init("offsets", len(items))
    for slot, ((topic, partition), value) in zip(slots, items, strict=True):
        slot.topic = topic
        slot.partition = partition
        slot.offset = value.offset
        slot.metadata = value.metadata
        slot.commitMs = value.commit_ms


class GroupHandlers:
    """FakeNode request handlers for the group requests."""

    cluster: FakeCluster
    node_id: int

    async def _on_groupHeartbeat(self, body: Any, response: Any, _payload: memoryview) -> None:
        coordinator = self.cluster.groups.coordinator_for(self.node_id, body.group)
        reply = coordinator.heartbeat(
            body.group,
            body.memberId,
            body.memberEpoch,
            body.instanceId or None,
            body.rebalanceTimeoutMs,
            list(body.topics),
            [(p.topic, p.partition) for p in body.owned],
            now_ms(),
            body.rack or None,
        ).value
        release(coordinator)
        out = response.body.init("groupHeartbeat")
        out.memberId = reply.member_id
        out.memberEpoch = reply.member_epoch
        out.heartbeatIntervalMs = reply.heartbeat_interval_ms
        out.sessionTimeoutMs = coordinator.config.session_timeout_ms
        fill_partitions(out, "assignment", reply.assignment)

    async def _on_leaveGroup(self, body: Any, response: Any, _payload: memoryview) -> None:
        coordinator = self.cluster.groups.coordinator_for(self.node_id, body.group)
        coordinator.leave(
            body.group, body.memberId, body.memberEpoch, now_ms(), static=body.keepAssignment
        )
        release(coordinator)
        response.body.none = None

    async def _on_commitOffsets(self, body: Any, response: Any, _payload: memoryview) -> None:
        coordinator = self.cluster.groups.coordinator_for(self.node_id, body.group)
        offsets = {(o.topic, o.partition): (o.offset, o.metadata) for o in body.offsets}
        coordinator.commit_offsets(body.group, body.memberId, body.memberEpoch, offsets, now_ms())
        release(coordinator)
        response.body.none = None

    async def _on_fetchOffsets(self, body: Any, response: Any, _payload: memoryview) -> None:
        coordinator = self.cluster.groups.coordinator_for(self.node_id, body.group)
        wanted = [(p.topic, p.partition) for p in body.partitions] or None
        found = coordinator.fetch_offsets(body.group, wanted).value
        fill_offsets(response.body.init("offsets"), found)

    async def _on_listGroups(self, _body: Any, response: Any, _payload: memoryview) -> None:
        rows = []
        for coordinator in self.cluster.groups.local_shards(self.node_id):
            for name, group in sorted(coordinator.state.groups.items()):
                rows.append((name, state_name(group), len(group.members)))
        out = response.body.init("groups").init("groups", len(rows))
        for slot, (name, state, members) in zip(out, rows, strict=True):
            slot.group = name
            slot.state = state
            slot.members = members
            slot.coordinator = self.node_id

    async def _on_describeGroup(self, name: str, response: Any, _payload: memoryview) -> None:
        coordinator = self.cluster.groups.coordinator_for(self.node_id, name)
        group = coordinator.state.groups.get(name)
        out = response.body.init("group")
        out.group = name
        out.state = state_name(group)
        out.coordinator = self.node_id
        if group is None:
            return
        out.epoch = group.meta.epoch if group.meta else 0
        members = out.init("members", len(group.members))
        for slot, (member_id, meta) in zip(members, sorted(group.members.items()), strict=True):
            current = group.assignments[member_id]
            target = group.target_members.get(member_id)
            slot.memberId = member_id
            slot.instanceId = meta.instance_id or ""
            slot.rack = meta.rack or ""
            slot.memberEpoch = current.epoch
            slot.topics = list(meta.topics)
            fill_partitions(slot, "assigned", current.assigned)
            fill_partitions(slot, "revoking", current.revoking)
            fill_partitions(slot, "target", target.partitions if target else ())
            slot.fenced = current.fenced
        fill_offsets(out, group.offsets)

    async def _on_deleteGroup(self, name: str, response: Any, _payload: memoryview) -> None:
        coordinator = self.cluster.groups.coordinator_for(self.node_id, name)
        coordinator.delete_group(name)
        release(coordinator)
        response.body.none = None
