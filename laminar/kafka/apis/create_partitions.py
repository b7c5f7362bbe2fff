"""CreatePartitions (key 37): grow a topic to a partition count (``TopicAdmin.add_partitions``,
laminar places the new replicas itself)."""

from __future__ import annotations

from typing import Any

from laminar.auth.acl import ADMIN
from laminar.errors import InvalidRequestError, LaminarError
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import BOOL, INT16, INT32, STRING, Array, F, Struct
from laminar.kafka.errors import KafkaError

REQUEST = Struct(
    [
        F(
            "topics",
            Array(
                Struct(
                    [
                        F("name", STRING),
                        F("count", INT32),
                        F(
                            "assignments",
                            Array(Struct([F("broker_ids", Array(INT32))])),
                            nullable="0+",
                        ),
                    ]
                )
            ),
        ),
        F("timeout_ms", INT32),
        F("validate_only", BOOL),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32),
        F(
            "results",
            Array(
                Struct(
                    [
                        F("name", STRING),
                        F("error_code", INT16),
                        F("error_message", STRING, nullable="0+"),
                    ]
                )
            ),
        ),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    broker = ctx.broker
    results = []
    for item in request["topics"]:
        name, count = item["name"], item["count"]
        result: dict[str, Any] = {"name": name, "error_code": 0}
        results.append(result)
        try:
            ctx.authorize(ADMIN, name)
            if item["assignments"]:
                raise KafkaError(errors.INVALID_REPLICA_ASSIGNMENT, "laminar places replicas")
            topic = broker.topics.get(name)
            if topic is None:
                raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
            if broker.is_internal(name):
                raise KafkaError(errors.INVALID_TOPIC_EXCEPTION, f"{name} is the cluster's own")
            if count <= len(topic.partitions):
                raise KafkaError(
                    errors.INVALID_PARTITIONS,
                    f"topic {name!r} has {len(topic.partitions)} partitions already",
                )
            if not request["validate_only"]:
                await broker.add_partitions(name, count)
        except InvalidRequestError as exc:
            result["error_code"] = errors.INVALID_PARTITIONS
            result["error_message"] = str(exc)
        except LaminarError as exc:
            result["error_code"] = errors.code_of(exc)
            result["error_message"] = str(exc)
    return {"throttle_time_ms": 0, "results": results}


API = Api(37, "CreatePartitions", 0, 3, REQUEST, RESPONSE, handle, flexible_from=2)
