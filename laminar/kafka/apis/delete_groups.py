"""DeleteGroups (key 42): only groups without members, offsets included."""

from __future__ import annotations

from typing import Any

from laminar.durable import Reply
from laminar.errors import GroupIdNotFoundError
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT16, INT32, STRING, Array, F, Struct
from laminar.kafka.group_calls import try_call

REQUEST = Struct([F("groups_names", Array(STRING))])
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32),
        F("results", Array(Struct([F("group_id", STRING), F("error_code", INT16)]))),
    ]
)


def _delete(c: Any, group: str) -> Reply[None]:
    if group not in c.state.groups and group not in c.classic.groups:
        raise GroupIdNotFoundError(f"group {group} does not exist")
    return c.delete_group(group)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    results = []
    superuser = ctx.broker.authorizer.allowed_superuser(ctx.session.principal)
    for group in request["groups_names"]:
        if not superuser:
            results.append({"group_id": group, "error_code": errors.GROUP_AUTHORIZATION_FAILED})
            continue
        _value, code = await try_call(ctx, group, lambda c, _now, g=group: _delete(c, g))
        results.append({"group_id": group, "error_code": code})
    return {"throttle_time_ms": 0, "results": results}


API = Api(42, "DeleteGroups", 0, 2, REQUEST, RESPONSE, handle, flexible_from=2)
