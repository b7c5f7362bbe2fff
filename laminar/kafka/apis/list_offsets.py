"""ListOffsets (key 2): earliest (-2), latest (-1, the high watermark) and by timestamp."""

from __future__ import annotations

from typing import Any

from laminar.errors import LaminarError
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT8, INT16, INT32, INT64, STRING, Array, F, Struct

LATEST, EARLIEST = -1, -2

REQUEST = Struct(
    [
        F("replica_id", INT32, default=-1),
        F("isolation_level", INT8, "2+"),
        F(
            "topics",
            Array(
                Struct(
                    [
                        F("name", STRING),
                        F(
                            "partitions",
                            Array(
                                Struct(
                                    [
                                        F("partition_index", INT32),
                                        F("current_leader_epoch", INT32, "4+", default=-1),
                                        F("timestamp", INT64),
                                    ]
                                )
                            ),
                        ),
                    ]
                )
            ),
        ),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "2+"),
        F(
            "topics",
            Array(
                Struct(
                    [
                        F("name", STRING),
                        F(
                            "partitions",
                            Array(
                                Struct(
                                    [
                                        F("partition_index", INT32),
                                        F("error_code", INT16),
                                        F("timestamp", INT64, default=-1),
                                        F("offset", INT64, default=-1),
                                        F("leader_epoch", INT32, "4+", default=-1),
                                    ]
                                )
                            ),
                        ),
                    ]
                )
            ),
        ),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    io = ctx.broker.io
    topics = []
    for topic in request["topics"]:
        name = topic["name"]
        parts = []
        for part in topic["partitions"]:
            out: dict[str, Any] = {"partition_index": part["partition_index"], "error_code": 0}
            parts.append(out)
            try:
                ctx.authorize_describe(name)
                # Offsets are asked of the leader (clients send it there; its high watermark
                # is the freshest).
                replica = io.leader_replica(name, part["partition_index"])
                ts = part["timestamp"]
                if ts == EARLIEST:
                    out["offset"] = replica.log.start_offset
                elif ts == LATEST:
                    out["offset"] = replica.high_watermark
                elif ts < 0:
                    out["error_code"] = errors.UNSUPPORTED_VERSION
                else:
                    found = io.record_at_time(replica, ts)
                    if found is not None:
                        out["offset"], out["timestamp"] = found
            except LaminarError as exc:
                out["error_code"] = errors.code_of(exc)
        topics.append({"name": name, "partitions": parts})
    return {"topics": topics}


API = Api(2, "ListOffsets", 1, 6, REQUEST, RESPONSE, handle, flexible_from=6)
