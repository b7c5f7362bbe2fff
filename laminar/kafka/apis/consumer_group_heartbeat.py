"""ConsumerGroupHeartbeat (key 68): KIP-848 members (e.g. librdkafka's
``group.protocol=consumer``) on laminar's own coordinator (``laminar/groups/coordinator.py``),
which is KIP-848 style already. Topics travel as topic ids. Fields a member sends as null
("unchanged since my last heartbeat") are filled in from what the coordinator holds. Epoch -1
leaves, -2 leaves keeping a static member's assignment for its next incarnation."""

from __future__ import annotations

import uuid
from typing import Any

from laminar.durable import Reply
from laminar.errors import InvalidRequestError, LaminarError
from laminar.groups.coordinator import Coordinator, HeartbeatResponse
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.apis.metadata import topic_uuid
from laminar.kafka.codec import INT16, INT32, STRING, UUID, Array, F, Struct
from laminar.kafka.group_calls import group_error

LEAVE = -1
STATIC_LEAVE = -2
MAX_REBALANCE_TIMEOUT_MS = 30 * 60 * 1000

TOPIC_PARTITIONS = Struct([F("topic_id", UUID), F("partitions", Array(INT32))])
REQUEST = Struct(
    [
        F("group_id", STRING),
        F("member_id", STRING),
        F("member_epoch", INT32),
        F("instance_id", STRING, nullable="0+"),
        F("rack_id", STRING, nullable="0+"),
        F("rebalance_timeout_ms", INT32, default=-1),
        F("subscribed_topic_names", Array(STRING), nullable="0+"),
        F("subscribed_topic_regex", STRING, "1+", nullable="1+"),
        F("server_assignor", STRING, nullable="0+"),
        F("topic_partitions", Array(TOPIC_PARTITIONS), nullable="0+"),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32),
        F("error_code", INT16),
        F("error_message", STRING, nullable="0+"),
        F("member_id", STRING, nullable="0+"),
        F("member_epoch", INT32),
        F("heartbeat_interval_ms", INT32),
        F("assignment", Struct([F("topic_partitions", Array(TOPIC_PARTITIONS))]), nullable="0+"),
    ]
)


def _heartbeat(
    c: Coordinator,
    now: int,
    request: dict[str, Any],
    member_id: str,
    owned: list[tuple[str, int]] | None,
    default_timeout_ms: int,
) -> Reply[HeartbeatResponse | None]:
    group, epoch = request["group_id"], request["member_epoch"]
    if epoch in (LEAVE, STATIC_LEAVE):
        return c.leave(group, member_id, 0, now, static=epoch == STATIC_LEAVE)
    state = c.state.groups.get(group)
    old = state.members.get(member_id) if state is not None else None
    current = state.assignments.get(member_id) if state is not None else None
    topics = request["subscribed_topic_names"]
    if topics is None:
        if old is None:
            raise InvalidRequestError("a joining member must name its subscribed topics")
        topics = list(old.topics)
    timeout = request["rebalance_timeout_ms"]
    if timeout <= 0:
        timeout = old.rebalance_timeout_ms if old is not None else default_timeout_ms
    if timeout > MAX_REBALANCE_TIMEOUT_MS:
        raise InvalidRequestError(f"rebalance timeout above {MAX_REBALANCE_TIMEOUT_MS} ms")
    rack = request["rack_id"]
    if rack is None and old is not None:
        rack = old.rack
    instance = request["instance_id"]
    if instance is None and old is not None:
        instance = old.instance_id
    if owned is None:  # unchanged: nothing is released by this heartbeat
        owned = [*current.assigned, *current.revoking] if current is not None else []
    return c.heartbeat(
        group, member_id, epoch, instance or None, timeout, topics, owned, now, rack or None
    )


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    group = request["group_id"]
    member_id = request["member_id"] or str(uuid.uuid4())  # v0: the coordinator names it
    names = {topic_uuid(t.topic_id): t.name for t in ctx.broker.topics.values()}
    ids = {name: tid for tid, name in names.items()}
    owned = None
    if request["topic_partitions"] is not None:
        owned = [
            (names[tp["topic_id"]], p)
            for tp in request["topic_partitions"]
            if tp["topic_id"] in names
            for p in tp["partitions"]
        ]
    default_timeout = ctx.broker.groups.settings.session_timeout_ms
    reply, code = None, errors.NONE
    message = None
    try:
        reply = await ctx.broker.groups.call(
            group, lambda c, now: _heartbeat(c, now, request, member_id, owned, default_timeout)
        )
    except (LaminarError, TimeoutError) as exc:
        code, message = group_error(exc), str(exc)
    if code != errors.NONE:
        return {"error_code": code, "error_message": message, "member_id": None, "member_epoch": -1}
    if reply is None:  # left
        return {
            "error_code": errors.NONE,
            "member_id": member_id,
            "member_epoch": request["member_epoch"],
        }
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(reply.assignment):
        by_topic.setdefault(topic, []).append(partition)
    assignment = [{"topic_id": ids[t], "partitions": ps} for t, ps in by_topic.items() if t in ids]
    return {
        "error_code": errors.NONE,
        "member_id": reply.member_id,
        "member_epoch": reply.member_epoch,
        "heartbeat_interval_ms": reply.heartbeat_interval_ms,
        "assignment": {"topic_partitions": assignment},
    }


API = Api(68, "ConsumerGroupHeartbeat", 0, 1, REQUEST, RESPONSE, handle, flexible_from=0)
