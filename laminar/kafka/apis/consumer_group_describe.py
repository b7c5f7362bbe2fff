"""ConsumerGroupDescribe (key 69): KIP-848 groups with each member's current and target
assignment (what librdkafka's admin asks for a ``group.protocol=consumer`` group). A classic
group, or a group that does not exist, is GROUP_ID_NOT_FOUND, as in Kafka 4."""

from __future__ import annotations

from typing import Any

from laminar.durable import Reply
from laminar.errors import GroupIdNotFoundError
from laminar.groups.coordinator import Coordinator
from laminar.groups.views import GroupView
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.apis.metadata import topic_uuid
from laminar.kafka.codec import BOOL, INT16, INT32, STRING, UUID, Array, F, Struct
from laminar.kafka.group_calls import try_call

AUTHORIZED_OPERATIONS_UNSET = -(1 << 31)
STATES = {"empty": "Empty", "reconciling": "Reconciling", "stable": "Stable"}

ASSIGNMENT = Struct(
    [
        F(
            "topic_partitions",
            Array(
                Struct(
                    [F("topic_id", UUID), F("topic_name", STRING), F("partitions", Array(INT32))]
                )
            ),
        )
    ]
)
MEMBER = Struct(
    [
        F("member_id", STRING),
        F("instance_id", STRING, nullable="0+"),
        F("rack_id", STRING, nullable="0+"),
        F("member_epoch", INT32),
        F("client_id", STRING),
        F("client_host", STRING),
        F("subscribed_topic_names", Array(STRING)),
        F("subscribed_topic_regex", STRING, nullable="0+"),
        F("assignment", ASSIGNMENT),
        F("target_assignment", ASSIGNMENT),
    ]
)
GROUP = Struct(
    [
        F("error_code", INT16),
        F("error_message", STRING, nullable="0+"),
        F("group_id", STRING),
        F("group_state", STRING),
        F("group_epoch", INT32),
        F("assignment_epoch", INT32),
        F("assignor_name", STRING),
        F("members", Array(MEMBER)),
        F("authorized_operations", INT32, default=AUTHORIZED_OPERATIONS_UNSET),
    ]
)
REQUEST = Struct([F("group_ids", Array(STRING)), F("include_authorized_operations", BOOL)])
RESPONSE = Struct([F("throttle_time_ms", INT32), F("groups", Array(GROUP))])


def _describe(c: Coordinator, group: str) -> Reply[GroupView]:
    if group not in c.state.groups or group in c.classic.groups:
        raise GroupIdNotFoundError(f"group {group} is not a consumer group")
    return c.describe_group(group)


def _assignment(partitions: tuple[tuple[str, int], ...], ids: dict[str, bytes]) -> dict[str, Any]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return {
        "topic_partitions": [
            {"topic_id": ids[t], "topic_name": t, "partitions": ps}
            for t, ps in by_topic.items()
            if t in ids
        ]
    }


async def _one(ctx: RequestContext, group: str) -> dict[str, Any]:
    view, code = await try_call(ctx, group, lambda c, _now: _describe(c, group))
    if view is None:
        return {"error_code": code, "group_id": group, "members": []}
    ids = {t.name: topic_uuid(t.topic_id) for t in ctx.broker.topics.values()}
    return {
        "error_code": errors.NONE,
        "group_id": group,
        "group_state": STATES.get(view.state, view.state),
        "group_epoch": view.epoch,
        "assignment_epoch": view.epoch,
        "assignor_name": "uniform",
        "members": [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "rack_id": m.rack,
                "member_epoch": m.epoch,
                "client_id": "",
                "client_host": "",
                "subscribed_topic_names": list(m.topics),
                "subscribed_topic_regex": None,
                "assignment": _assignment(m.assigned, ids),
                "target_assignment": _assignment(m.target, ids),
            }
            for m in view.members
        ],
    }


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "groups": [await _one(ctx, g) for g in request["group_ids"]]}


API = Api(69, "ConsumerGroupDescribe", 0, 0, REQUEST, RESPONSE, handle, flexible_from=0)
