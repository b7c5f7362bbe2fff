"""OffsetFetch (key 9): committed offsets of one group (v0-v7) or several (v8+); a partition
without a commit answers offset -1. Partitions of a group are all-or-nothing on errors."""

from __future__ import annotations

from typing import Any

from laminar.auth.acl import CONSUME
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import BOOL, INT16, INT32, INT64, STRING, Array, F, Struct
from laminar.kafka.group_calls import INVALID_GROUP_ID, try_call

WANTED = Struct([F("name", STRING), F("partition_indexes", Array(INT32))])
REQUEST = Struct(
    [
        F("group_id", STRING, "0-7"),
        F("topics", Array(WANTED), "0-7", nullable="2-7"),
        F(
            "groups",
            Array(
                Struct(
                    [
                        F("group_id", STRING),
                        F("member_id", STRING, "9+", nullable="9+"),
                        F("member_epoch", INT32, "9+", default=-1),
                        F("topics", Array(WANTED), nullable="8+"),
                    ]
                )
            ),
            "8+",
        ),
        F("require_stable", BOOL, "7+"),
    ]
)
PARTITION = Struct(
    [
        F("partition_index", INT32),
        F("committed_offset", INT64),
        F("committed_leader_epoch", INT32, "5+", default=-1),
        F("metadata", STRING, nullable="0+"),
        F("error_code", INT16),
    ]
)
TOPIC = Struct([F("name", STRING), F("partitions", Array(PARTITION))])
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "3+"),
        F("topics", Array(TOPIC), "0-7"),
        F("error_code", INT16, "2-7"),
        F(
            "groups",
            Array(
                Struct([F("group_id", STRING), F("topics", Array(TOPIC)), F("error_code", INT16)])
            ),
            "8+",
        ),
    ]
)


async def _fetch(
    ctx: RequestContext, group: str, wanted: list[dict[str, Any]] | None
) -> tuple[list[dict[str, Any]], int]:
    partitions = None
    if wanted is not None:
        partitions = [(t["name"], p) for t in wanted for p in t["partition_indexes"]]
    if not group:
        return [], INVALID_GROUP_ID
    found, code = await try_call(ctx, group, lambda c, _now: c.fetch_offsets(group, partitions))
    if found is None:
        return [], code
    if partitions is None:
        partitions = sorted(found)
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for topic, index in partitions:
        stored = found.get((topic, index))
        allowed = ctx.broker.authorizer.allowed(ctx.session.principal, CONSUME, topic)
        if not allowed and wanted is None:
            continue  # all of the group's offsets: those the user may read (as Kafka does)
        if not allowed:
            stored = None
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": index,
                "committed_offset": stored.offset if stored else -1,
                "committed_leader_epoch": -1,
                "metadata": stored.metadata if stored else "",
                "error_code": errors.NONE if allowed else errors.TOPIC_AUTHORIZATION_FAILED,
            }
        )
    return [{"name": t, "partitions": ps} for t, ps in by_topic.items()], errors.NONE


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    if ctx.api_version >= 8:
        groups = []
        for g in request["groups"]:
            topics, code = await _fetch(ctx, g["group_id"], g["topics"])
            groups.append({"group_id": g["group_id"], "topics": topics, "error_code": code})
        return {"throttle_time_ms": 0, "groups": groups}
    topics, code = await _fetch(ctx, request["group_id"], request["topics"])
    if code != errors.NONE and ctx.api_version < 2:  # no group-level code before v2
        topics = [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p,
                        "committed_offset": -1,
                        "metadata": "",
                        "error_code": code,
                    }
                    for p in t["partition_indexes"]
                ],
            }
            for t in request["topics"] or []
        ]
    return {"throttle_time_ms": 0, "topics": topics, "error_code": code}


API = Api(9, "OffsetFetch", 0, 9, REQUEST, RESPONSE, handle, flexible_from=6)
