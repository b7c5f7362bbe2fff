"""ListGroups (key 16): the groups this node coordinates, classic and consumer (Kafka clients
ask every broker). v4+ filters by state, v5+ by type."""

from __future__ import annotations

from typing import Any

from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT16, INT32, STRING, Array, F, Struct

KAFKA_STATES = {
    "empty": "Empty",
    "preparing-rebalance": "PreparingRebalance",
    "completing-rebalance": "CompletingRebalance",
    "stable": "Stable",
    "reconciling": "Reconciling",
    "dead": "Dead",
}

REQUEST = Struct([F("states_filter", Array(STRING), "4+"), F("types_filter", Array(STRING), "5+")])
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "1+"),
        F("error_code", INT16),
        F(
            "groups",
            Array(
                Struct(
                    [
                        F("group_id", STRING),
                        F("protocol_type", STRING),
                        F("group_state", STRING, "4+"),
                        F("group_type", STRING, "5+"),
                    ]
                )
            ),
        ),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    states = {s.lower() for s in request["states_filter"] or ()}
    types = {t.lower() for t in request["types_filter"] or ()}
    out = []
    for _shard, view in await ctx.broker.groups.list_groups():
        state = KAFKA_STATES.get(view.state, view.state)
        if (states and state.lower() not in states) or (types and view.protocol not in types):
            continue
        out.append(
            {
                "group_id": view.name,
                "protocol_type": view.protocol_type,
                "group_state": state,
                "group_type": view.protocol,
            }
        )
    return {"throttle_time_ms": 0, "error_code": errors.NONE, "groups": out}


API = Api(16, "ListGroups", 0, 5, REQUEST, RESPONSE, handle, flexible_from=3)
