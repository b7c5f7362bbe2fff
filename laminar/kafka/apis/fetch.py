"""Fetch (key 1): whole committed batches, headers converted to Kafka's v2, long polling.

Any replica serves (like the native protocol) up to its high watermark; the last stable
offset is the high watermark (no transactions). Fetch sessions are never created: the
response's session id 0 tells the client to keep sending full fetches, as Kafka allows.
"""

from __future__ import annotations

from typing import Any

from laminar.auth.acl import CONSUME
from laminar.errors import LaminarError, OffsetOutOfRangeError
from laminar.kafka import errors, records
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import INT8, INT16, INT32, INT64, RECORDS, STRING, Array, F, Struct
from laminar.node.replica import Replica

MAX_WAIT_MS = 30_000
MAX_RESPONSE_BYTES = 64 << 20

REQUEST = Struct(
    [
        F("replica_id", INT32, default=-1),
        F("max_wait_ms", INT32),
        F("min_bytes", INT32),
        F("max_bytes", INT32, "3+", default=0x7FFFFFFF),
        F("isolation_level", INT8, "4+"),
        F("session_id", INT32, "7+"),
        F("session_epoch", INT32, "7+", default=-1),
        F(
            "topics",
            Array(
                Struct(
                    [
                        F("topic", STRING),
                        F(
                            "partitions",
                            Array(
                                Struct(
                                    [
                                        F("partition", INT32),
                                        F("current_leader_epoch", INT32, "9+", default=-1),
                                        F("fetch_offset", INT64),
                                        F("last_fetched_epoch", INT32, "12+", default=-1),
                                        F("log_start_offset", INT64, "5+", default=-1),
                                        F("partition_max_bytes", INT32),
                                    ]
                                )
                            ),
                        ),
                    ]
                )
            ),
        ),
        F(
            "forgotten_topics_data",
            Array(Struct([F("topic", STRING), F("partitions", Array(INT32))])),
            "7+",
        ),
        F("rack_id", STRING, "11+"),
    ]
)
PARTITION = Struct(
    [
        F("partition_index", INT32),
        F("error_code", INT16),
        F("high_watermark", INT64, default=-1),
        F("last_stable_offset", INT64, "4+", default=-1),
        F("log_start_offset", INT64, "5+", default=-1),
        F(
            "aborted_transactions",
            Array(Struct([F("producer_id", INT64), F("first_offset", INT64)])),
            "4+",
            nullable="4+",
        ),
        F("preferred_read_replica", INT32, "11+", default=-1),
        F("records", RECORDS, nullable="0+"),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "1+"),
        F("error_code", INT16, "7+"),
        F("session_id", INT32, "7+"),
        F("responses", Array(Struct([F("topic", STRING), F("partitions", Array(PARTITION))]))),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    io = ctx.broker.io
    if request["session_id"] != 0:  # we never hand out sessions
        return {"error_code": errors.FETCH_SESSION_ID_NOT_FOUND, "responses": []}
    asks: list[tuple[str, dict[str, Any], Replica | LaminarError]] = []
    for topic in request["topics"]:
        name = topic["topic"]
        for part in topic["partitions"]:
            try:
                ctx.authorize(CONSUME, name)
                replica = io.any_replica(name, part["partition"])
                io.check_fetch_offset(replica, part["fetch_offset"])
                asks.append((name, part, replica))
            except LaminarError as exc:
                asks.append((name, part, exc))
    live = [r for _, _, r in asks if isinstance(r, Replica)]
    has_data = any(
        isinstance(r, Replica) and p["fetch_offset"] < r.high_watermark for _, p, r in asks
    )
    if not has_data and len(live) == len(asks):
        await io.wait_for_data(live, min(request["max_wait_ms"], MAX_WAIT_MS) / 1000)
    budget = min(request["max_bytes"], MAX_RESPONSE_BYTES)
    if budget <= 0:
        budget = MAX_RESPONSE_BYTES
    first = True
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for name, part, replica in asks:
        out: dict[str, Any] = {"partition_index": part["partition"], "error_code": 0}
        by_topic.setdefault(name, []).append(out)
        if isinstance(replica, LaminarError):
            out["error_code"] = errors.code_of(replica)
            if isinstance(replica, OffsetOutOfRangeError):
                out["high_watermark"] = replica.end
                out["log_start_offset"] = replica.start
            continue
        high = replica.high_watermark
        out["high_watermark"] = out["last_stable_offset"] = high
        out["log_start_offset"] = replica.log.start_offset
        offset = part["fetch_offset"]
        if offset >= high or replica.closed or (budget <= 0 and not first):
            out["records"] = b""
            continue
        limit = max(1, min(part["partition_max_bytes"], budget))
        try:
            data = io.read(replica, offset, limit)
        except LaminarError as exc:
            out["error_code"] = errors.code_of(exc)
            continue
        chunks: list[bytes | memoryview] = []
        size = records.to_kafka(data, chunks)
        out["records"] = chunks
        budget -= size
        if size:
            first = False
    return {
        "error_code": 0,
        "session_id": 0,
        "responses": [{"topic": t, "partitions": p} for t, p in by_topic.items()],
    }


API = Api(1, "Fetch", 4, 12, REQUEST, RESPONSE, handle, flexible_from=12)
