"""FindCoordinator (key 10): the node coordinating a group is the leader of its shard of
``__consumer_offsets`` (created on first use). v4+ batches keys. Only group keys are served:
laminar has no transactions (a transaction key gets COORDINATOR_NOT_AVAILABLE)."""

from __future__ import annotations

from typing import Any

from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT8, INT16, INT32, STRING, Array, F, Struct
from laminar.kafka.group_calls import COORDINATOR_NOT_AVAILABLE, coordinator_address

GROUP_KEY = 0

REQUEST = Struct(
    [
        F("key", STRING, "0-3"),
        F("key_type", INT8, "1+"),
        F("coordinator_keys", Array(STRING), "4+"),
    ]
)
COORDINATOR = Struct(
    [
        F("key", STRING),
        F("node_id", INT32),
        F("host", STRING),
        F("port", INT32),
        F("error_code", INT16),
        F("error_message", STRING, nullable="0+"),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "1+"),
        F("error_code", INT16, "0-3"),
        F("error_message", STRING, "1-3", nullable="1-3"),
        F("node_id", INT32, "0-3"),
        F("host", STRING, "0-3"),
        F("port", INT32, "0-3"),
        F("coordinators", Array(COORDINATOR), "4+"),
    ]
)


async def _find(ctx: RequestContext, key: str, key_type: int) -> dict[str, Any]:
    if key_type != GROUP_KEY:
        address, code = None, COORDINATOR_NOT_AVAILABLE
    elif not key:
        address, code = None, errors.INVALID_REQUEST
    else:
        address, code = await coordinator_address(ctx, key)
    if address is None:
        return {"key": key, "node_id": -1, "host": "", "port": -1, "error_code": code}
    return {
        "key": key,
        "node_id": address.node_id,
        "host": address.host,
        "port": address.port,
        "error_code": errors.NONE,
        "error_message": None,
    }


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    if ctx.api_version >= 4:
        found = [await _find(ctx, key, request["key_type"]) for key in request["coordinator_keys"]]
        return {"throttle_time_ms": 0, "coordinators": found}
    one = await _find(ctx, request["key"], request["key_type"])
    return {
        "throttle_time_ms": 0,
        "error_code": one["error_code"],
        "error_message": None,
        "node_id": one["node_id"],
        "host": one["host"],
        "port": one["port"],
    }


API = Api(10, "FindCoordinator", 0, 4, REQUEST, RESPONSE, handle, flexible_from=3)
