"""Heartbeat (key 12): a classic member's liveness; REBALANCE_IN_PROGRESS tells it to rejoin."""

from __future__ import annotations

from typing import Any

from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT16, INT32, STRING, F, Struct
from laminar.kafka.group_calls import try_call

REQUEST = Struct(
    [
        F("group_id", STRING),
        F("generation_id", INT32),
        F("member_id", STRING),
        F("group_instance_id", STRING, "3+", nullable="3+"),
    ]
)
RESPONSE = Struct([F("throttle_time_ms", INT32, "1+"), F("error_code", INT16)])


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    group = request["group_id"]

    def heartbeat(c: Any, now: int) -> Any:
        return c.classic.heartbeat(
            group,
            request["generation_id"],
            request["member_id"],
            request["group_instance_id"] or None,
            now,
        )

    _value, code = await try_call(ctx, group, heartbeat)
    return {"throttle_time_ms": 0, "error_code": code}


API = Api(12, "Heartbeat", 0, 4, REQUEST, RESPONSE, handle, flexible_from=4)
