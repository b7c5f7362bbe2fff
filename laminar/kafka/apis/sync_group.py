"""SyncGroup (key 14): the leader hands in every member's assignment; followers wait for it."""

from __future__ import annotations

from typing import Any

from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import BYTES, INT16, INT32, STRING, Array, F, Struct
from laminar.kafka.group_calls import try_call

REQUEST = Struct(
    [
        F("group_id", STRING),
        F("generation_id", INT32),
        F("member_id", STRING),
        F("group_instance_id", STRING, "3+", nullable="3+"),
        F("protocol_type", STRING, "5+", nullable="5+"),
        F("protocol_name", STRING, "5+", nullable="5+"),
        F("assignments", Array(Struct([F("member_id", STRING), F("assignment", BYTES)]))),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "1+"),
        F("error_code", INT16),
        F("protocol_type", STRING, "5+", nullable="5+"),
        F("protocol_name", STRING, "5+", nullable="5+"),
        F("assignment", BYTES),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    group = request["group_id"]
    assignments = {a["member_id"]: bytes(a["assignment"]) for a in request["assignments"]}

    def sync(c: Any, now: int) -> Any:
        return c.classic.sync(
            group,
            request["generation_id"],
            request["member_id"],
            request["group_instance_id"] or None,
            request["protocol_type"] or None,
            request["protocol_name"] or None,
            assignments,
            now,
        )

    result, code = await try_call(ctx, group, sync)
    if result is None:
        return {"throttle_time_ms": 0, "error_code": code, "assignment": b""}
    return {
        "throttle_time_ms": 0,
        "error_code": errors.NONE,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol,
        "assignment": result.assignment,
    }


API = Api(14, "SyncGroup", 0, 5, REQUEST, RESPONSE, handle, flexible_from=4)
