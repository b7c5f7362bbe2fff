"""LeaveGroup (key 13): classic members leave at once instead of waiting for their session to
run out (v3+: a batch; a static member may be named by its instance id alone)."""

from __future__ import annotations

from typing import Any

from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT16, INT32, STRING, Array, F, Struct
from laminar.kafka.group_calls import group_error, try_call

IDENTITY = Struct(
    [
        F("member_id", STRING),
        F("group_instance_id", STRING, nullable="0+"),
        F("reason", STRING, "5+", nullable="5+"),
    ]
)
REQUEST = Struct(
    [
        F("group_id", STRING),
        F("member_id", STRING, "0-2"),
        F("members", Array(IDENTITY), "3+"),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "1+"),
        F("error_code", INT16),
        F(
            "members",
            Array(
                Struct(
                    [
                        F("member_id", STRING),
                        F("group_instance_id", STRING, nullable="0+"),
                        F("error_code", INT16),
                    ]
                )
            ),
            "3+",
        ),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    group = request["group_id"]
    if ctx.api_version >= 3:
        members = [(m["member_id"], m["group_instance_id"] or None) for m in request["members"]]
    else:
        members = [(request["member_id"], None)]
    results, code = await try_call(ctx, group, lambda c, now: c.classic.leave(group, members, now))
    if results is None:
        return {"throttle_time_ms": 0, "error_code": code, "members": []}
    codes = [errors.NONE if r is None else group_error(r) for r in results]
    out = [
        {"member_id": m, "group_instance_id": i, "error_code": c}
        for (m, i), c in zip(members, codes, strict=True)
    ]
    top = codes[0] if ctx.api_version < 3 else errors.NONE
    return {"throttle_time_ms": 0, "error_code": top, "members": out}


API = Api(13, "LeaveGroup", 0, 5, REQUEST, RESPONSE, handle, flexible_from=4)
