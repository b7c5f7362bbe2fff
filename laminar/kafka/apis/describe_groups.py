"""DescribeGroups (key 15): classic groups with their members' subscriptions and assignments.
A group that does not exist is ``Dead``; a consumer (KIP-848) group with members is
GROUP_ID_NOT_FOUND here, as in Kafka 4 (ConsumerGroupDescribe is its API)."""

from __future__ import annotations

from typing import Any

from laminar.errors import GroupIdNotFoundError
from laminar.groups.classic import ClassicGroupView
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import BOOL, BYTES, INT16, INT32, STRING, Array, F, Struct
from laminar.kafka.group_calls import try_call

AUTHORIZED_OPERATIONS_UNSET = -(1 << 31)

REQUEST = Struct([F("groups", Array(STRING)), F("include_authorized_operations", BOOL, "3+")])
MEMBER = Struct(
    [
        F("member_id", STRING),
        F("group_instance_id", STRING, "4+", nullable="4+"),
        F("client_id", STRING),
        F("client_host", STRING),
        F("member_metadata", BYTES),
        F("member_assignment", BYTES),
    ]
)
GROUP = Struct(
    [
        F("error_code", INT16),
        F("error_message", STRING, "6+", nullable="6+"),
        F("group_id", STRING),
        F("group_state", STRING),
        F("protocol_type", STRING),
        F("protocol_data", STRING),
        F("members", Array(MEMBER)),
        F("authorized_operations", INT32, "3+", default=AUTHORIZED_OPERATIONS_UNSET),
    ]
)
RESPONSE = Struct([F("throttle_time_ms", INT32, "1+"), F("groups", Array(GROUP))])


def _describe(c: Any, group: str) -> Any:
    from laminar.durable import Reply

    state = c.state.groups.get(group)
    if state is not None and state.members:
        raise GroupIdNotFoundError(f"group {group} is a consumer group, not a classic group")
    view = c.classic.describe(group)
    if view is None:
        view = ClassicGroupView(group, "Empty" if state else "Dead", "", "", 0, "", ())
    return Reply(view, c.written)


async def _one(ctx: RequestContext, group: str) -> dict[str, Any]:
    view, code = await try_call(ctx, group, lambda c, _now: _describe(c, group))
    if view is None:
        return {"error_code": code, "group_id": group, "group_state": "", "members": []}
    return {
        "error_code": errors.NONE,
        "group_id": group,
        "group_state": view.state,
        "protocol_type": view.protocol_type,
        "protocol_data": view.protocol,
        "members": [
            {
                "member_id": m.member_id,
                "group_instance_id": m.instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "member_metadata": m.metadata,
                "member_assignment": m.assignment,
            }
            for m in view.members
        ],
    }


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    return {"throttle_time_ms": 0, "groups": [await _one(ctx, g) for g in request["groups"]]}


API = Api(15, "DescribeGroups", 0, 5, REQUEST, RESPONSE, handle, flexible_from=5)
