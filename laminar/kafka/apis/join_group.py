"""JoinGroup (key 11): a classic member joins; the answer is held until the rebalance completes
(``laminar/groups/classic.py``). v4+ new members first get MEMBER_ID_REQUIRED with their id."""

from __future__ import annotations

import uuid
from typing import Any

from laminar.errors import LaminarError, MemberIdRequiredError
from laminar.groups.classic import JoinResult
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import BOOL, BYTES, INT16, INT32, STRING, Array, F, Struct
from laminar.kafka.group_calls import INVALID_GROUP_ID, call, group_error

REQUEST = Struct(
    [
        F("group_id", STRING),
        F("session_timeout_ms", INT32),
        F("rebalance_timeout_ms", INT32, "1+", default=-1),
        F("member_id", STRING),
        F("group_instance_id", STRING, "5+", nullable="5+"),
        F("protocol_type", STRING),
        F("protocols", Array(Struct([F("name", STRING), F("metadata", BYTES)]))),
        F("reason", STRING, "8+", nullable="8+"),
    ]
)
MEMBER = Struct(
    [
        F("member_id", STRING),
        F("group_instance_id", STRING, "5+", nullable="5+"),
        F("metadata", BYTES),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "2+"),
        F("error_code", INT16),
        F("generation_id", INT32, default=-1),
        F("protocol_type", STRING, "7+", nullable="7+"),
        F("protocol_name", STRING, nullable="7+"),
        F("leader", STRING),
        F("skip_assignment", BOOL, "9+"),
        F("member_id", STRING),
        F("members", Array(MEMBER)),
    ]
)


def _error(ctx: RequestContext, code: int, member_id: str) -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "generation_id": -1,
        "protocol_type": None,
        "protocol_name": None if ctx.api_version >= 7 else "",
        "leader": "",
        "member_id": member_id,
        "members": [],
    }


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    group = request["group_id"]
    if not group:
        return _error(ctx, INVALID_GROUP_ID, request["member_id"])
    version = ctx.api_version
    client_id = ctx.client_id or ""
    new_member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
    protocols = [(p["name"], bytes(p["metadata"])) for p in request["protocols"]]

    def join(c: Any, now: int) -> Any:
        return c.classic.join(
            group,
            request["member_id"],
            request["group_instance_id"] or None,
            request["protocol_type"],
            protocols,
            request["session_timeout_ms"],
            request["rebalance_timeout_ms"],
            now,
            new_member_id=new_member_id,
            require_known_member=version >= 4,
            client_id=client_id,
            client_host=ctx.peer,
        )

    try:
        result: JoinResult = await call(ctx, group, join)
    except MemberIdRequiredError as exc:
        return _error(ctx, group_error(exc), exc.member_id)
    except (LaminarError, TimeoutError) as exc:
        return _error(ctx, group_error(exc), request["member_id"])
    return {
        "throttle_time_ms": 0,
        "error_code": errors.NONE,
        "generation_id": result.generation,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol,
        "leader": result.leader,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [
            {"member_id": m, "group_instance_id": i, "metadata": meta}
            for m, i, meta in result.members
        ],
    }


API = Api(11, "JoinGroup", 0, 9, REQUEST, RESPONSE, handle, flexible_from=6)
