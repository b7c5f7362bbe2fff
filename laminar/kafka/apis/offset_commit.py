"""OffsetCommit (key 8): a classic member commits at its generation, a consumer-group member
(v9+) at its member epoch, anyone with generation -1 while the group has no members. Errors are
per partition: unknown partitions and oversized metadata alone, a group-level refusal for all."""

from __future__ import annotations

from typing import Any

from laminar.auth.acl import CONSUME
from laminar.groups.coordinator import MAX_METADATA_CHARS
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT16, INT32, INT64, STRING, Array, F, Struct
from laminar.kafka.group_calls import INVALID_GROUP_ID, OFFSET_METADATA_TOO_LARGE, try_call

PARTITION = Struct(
    [
        F("partition_index", INT32),
        F("committed_offset", INT64),
        F("committed_leader_epoch", INT32, "6+", default=-1),
        F("commit_timestamp", INT64, "1", default=-1),
        F("committed_metadata", STRING, nullable="0+"),
    ]
)
REQUEST = Struct(
    [
        F("group_id", STRING),
        F("generation_id_or_member_epoch", INT32, "1+", default=-1),
        F("member_id", STRING, "1+"),
        F("group_instance_id", STRING, "7+", nullable="7+"),
        F("retention_time_ms", INT64, "2-4", default=-1),
        F("topics", Array(Struct([F("name", STRING), F("partitions", Array(PARTITION))]))),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "3+"),
        F(
            "topics",
            Array(
                Struct(
                    [
                        F("name", STRING),
                        F(
                            "partitions",
                            Array(Struct([F("partition_index", INT32), F("error_code", INT16)])),
                        ),
                    ]
                )
            ),
        ),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    group = request["group_id"]
    topics = ctx.broker.topics
    codes: dict[tuple[str, int], int] = {}
    offsets: dict[tuple[str, int], tuple[int, str]] = {}
    for t in request["topics"]:
        topic = topics.get(t["name"])
        for p in t["partitions"]:
            tp = (t["name"], p["partition_index"])
            metadata = p["committed_metadata"] or ""
            if not ctx.broker.authorizer.allowed(ctx.session.principal, CONSUME, tp[0]):
                codes[tp] = errors.TOPIC_AUTHORIZATION_FAILED
            elif topic is None or not 0 <= tp[1] < len(topic.partitions):
                codes[tp] = errors.UNKNOWN_TOPIC_OR_PARTITION
            elif len(metadata) > MAX_METADATA_CHARS:
                codes[tp] = OFFSET_METADATA_TOO_LARGE
            else:
                offsets[tp] = (max(0, p["committed_offset"]), metadata)
    code = INVALID_GROUP_ID if not group else errors.NONE
    if offsets and code == errors.NONE:

        def commit(c: Any, now: int) -> Any:
            return c.commit_classic_offsets(
                group,
                request["generation_id_or_member_epoch"],
                request["member_id"],
                request["group_instance_id"] or None,
                offsets,
                now,
                group_not_found=ctx.api_version >= 9,
            )

        _value, code = await try_call(ctx, group, commit)
    for tp in offsets:
        codes[tp] = code
    out = [
        {
            "name": t["name"],
            "partitions": [
                {
                    "partition_index": p["partition_index"],
                    "error_code": codes[(t["name"], p["partition_index"])],
                }
                for p in t["partitions"]
            ],
        }
        for t in request["topics"]
    ]
    return {"throttle_time_ms": 0, "topics": out}


API = Api(8, "OffsetCommit", 0, 9, REQUEST, RESPONSE, handle, flexible_from=8)
