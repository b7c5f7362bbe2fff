"""Client-protocol handlers of the group requests: Cap'n Proto in, coordinator call, reply out.

Each handler reads its request body completely (readers must not outlive their frame) before
it awaits anything, and fills the response only once the coordinator's reply is released.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from laminar.errors import InvalidRequestError
from laminar.groups.coordinator import Coordinator
from laminar.groups.records import OffsetValue, TopicPartition
from laminar.groups.service import GroupService
from laminar.groups.views import GroupView

Handler = Callable[[Any, Any, memoryview], Awaitable[None]]
MAX_REBALANCE_TIMEOUT_MS = 30 * 60 * 1000


def handlers(service: GroupService, node_id: int) -> dict[str, Handler]:
    """The request kinds this module serves, by their name in ``Request.body``."""

    async def group_heartbeat(body: Any, response: Any, _payload: memoryview) -> None:
        group, member_id, epoch = body.group, body.memberId, body.memberEpoch
        instance_id, rack = body.instanceId or None, body.rack or None
        rebalance_timeout = body.rebalanceTimeoutMs or service.settings.session_timeout_ms
        if rebalance_timeout > MAX_REBALANCE_TIMEOUT_MS:
            raise InvalidRequestError(f"rebalance timeout above {MAX_REBALANCE_TIMEOUT_MS} ms")
        topics = list(body.topics)
        owned = _partitions(body.owned)

        def request(c: Coordinator, now: int) -> Any:
            return c.heartbeat(
                group, member_id, epoch, instance_id, rebalance_timeout, topics, owned, now, rack
            )

        reply = await service.call(group, request)
        out = response.body.init("groupHeartbeat")
        out.memberId = reply.member_id
        out.memberEpoch = reply.member_epoch
        out.heartbeatIntervalMs = reply.heartbeat_interval_ms
        out.sessionTimeoutMs = service.config.session_timeout_ms
        _fill_partitions(out, "assignment", sorted(reply.assignment))

    async def leave_group(body: Any, response: Any, _payload: memoryview) -> None:
        group, member_id, epoch, keep = (
            body.group,
            body.memberId,
            body.memberEpoch,
            body.keepAssignment,
        )
        await service.call(group, lambda c, now: c.leave(group, member_id, epoch, now, keep))
        response.body.none = None

    async def commit_offsets(body: Any, response: Any, _payload: memoryview) -> None:
        group, member_id, epoch = body.group, body.memberId, body.memberEpoch
        offsets: dict[TopicPartition, tuple[int, str]] = {}
        for item in body.offsets:
            tp = (item.topic, item.partition)
            if tp in offsets:
                raise InvalidRequestError(f"{tp[0]}/{tp[1]} appears twice in one commit")
            offsets[tp] = (item.offset, item.metadata)
        await service.call(
            group, lambda c, now: c.commit_offsets(group, member_id, epoch, offsets, now)
        )
        response.body.none = None

    async def fetch_offsets(body: Any, response: Any, _payload: memoryview) -> None:
        group = body.group
        wanted = _partitions(body.partitions) or None
        found = await service.call(group, lambda c, _now: c.fetch_offsets(group, wanted))
        _fill_offsets(response.body.init("offsets"), found)

    async def list_groups(_body: Any, response: Any, _payload: memoryview) -> None:
        views = await service.list_groups()
        out = response.body.init("groups").init("groups", len(views))
        for slot, (_shard, view) in zip(out, views, strict=True):
            slot.group = view.name
            slot.state = view.state
            slot.members = len(view.members)
            slot.coordinator = node_id
            slot.protocol = view.protocol

    async def describe_group(group: str, response: Any, _payload: memoryview) -> None:
        view = await service.call(group, lambda c, _now: c.describe_group(group))
        _fill_description(response.body.init("group"), view, node_id)

    async def delete_group(group: str, response: Any, _payload: memoryview) -> None:
        await service.call(group, lambda c, _now: c.delete_group(group))
        response.body.none = None

    return {
        "groupHeartbeat": group_heartbeat,
        "leaveGroup": leave_group,
        "commitOffsets": commit_offsets,
        "fetchOffsets": fetch_offsets,
        "listGroups": list_groups,
        "describeGroup": describe_group,
        "deleteGroup": delete_group,
    }


def _partitions(items: Iterable[Any]) -> list[TopicPartition]:
    return [(item.topic, item.partition) for item in items]


def _fill_partitions(builder: Any, field: str, partitions: Iterable[TopicPartition]) -> None:
    partitions = list(partitions)
    slots = builder.init(field, len(partitions))
    for slot, (topic, partition) in zip(slots, partitions, strict=True):
        slot.topic = topic
        slot.partition = partition


def _fill_offsets(builder: Any, offsets: dict[TopicPartition, OffsetValue]) -> None:
    slots = builder.init("offsets", len(offsets))
    for slot, (tp, value) in zip(slots, sorted(offsets.items()), strict=True):
        slot.topic, slot.partition = tp
        slot.offset = value.offset
        slot.metadata = value.metadata
        slot.commitMs = value.commit_ms


def _fill_description(out: Any, view: GroupView, node_id: int) -> None:
    out.group = view.name
    out.state = view.state
    out.epoch = view.epoch
    out.coordinator = node_id
    out.protocol = view.protocol
    members = out.init("members", len(view.members))
    for slot, member in zip(members, view.members, strict=True):
        slot.memberId = member.member_id
        slot.instanceId = member.instance_id or ""
        slot.rack = member.rack or ""
        slot.memberEpoch = member.epoch
        slot.topics = list(member.topics)
        _fill_partitions(slot, "assigned", member.assigned)
        _fill_partitions(slot, "revoking", member.revoking)
        _fill_partitions(slot, "target", member.target)
        slot.fenced = member.fenced
    _fill_offsets(out, view.offsets)
