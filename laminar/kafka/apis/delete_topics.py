"""DeleteTopics (key 20): by name (and, from v6, by topic id)."""

from __future__ import annotations

from typing import Any

from laminar.auth.acl import ADMIN
from laminar.errors import LaminarError
from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.apis.metadata import topic_uuid, uuid_topic
from laminar.kafka.codec import INT16, INT32, STRING, UUID, Array, F, Struct

REQUEST = Struct(
    [
        F("topics", Array(Struct([F("name", STRING, nullable="6+"), F("topic_id", UUID)])), "6+"),
        F("topic_names", Array(STRING), "0-5"),
        F("timeout_ms", INT32),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "1+"),
        F(
            "responses",
            Array(
                Struct(
                    [
                        F("name", STRING, nullable="6+"),
                        F("topic_id", UUID, "6+"),
                        F("error_code", INT16),
                        F("error_message", STRING, "5+", nullable="5+"),
                    ]
                )
            ),
        ),
    ]
)


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    broker = ctx.broker
    wanted: list[tuple[str | None, bytes]] = [(n, bytes(16)) for n in request["topic_names"]]
    for item in request["topics"]:
        name = item["name"]
        if name is None:
            by_id = {t.topic_id: t.name for t in broker.topics.values()}
            name = by_id.get(uuid_topic(item["topic_id"]))
        wanted.append((name, item["topic_id"]))
    out = []
    for name, topic_id in wanted:
        result: dict[str, Any] = {"name": name, "topic_id": topic_id, "error_code": 0}
        out.append(result)
        topic = broker.topics.get(name) if name is not None else None
        if name is not None and not broker.authorizer.allowed(ctx.session.principal, ADMIN, name):
            result["error_code"] = errors.TOPIC_AUTHORIZATION_FAILED
            result["error_message"] = f"not allowed to delete topic {name!r}"
            continue
        if topic is None:
            result["error_code"] = errors.UNKNOWN_TOPIC_OR_PARTITION
            continue
        result["topic_id"] = topic_uuid(topic.topic_id)
        if broker.is_internal(topic.name):
            result["error_code"] = errors.INVALID_TOPIC_EXCEPTION
            result["error_message"] = f"{topic.name} is the cluster's own topic"
            continue
        try:
            await broker.delete_topic(topic.name)
        except LaminarError as exc:
            result["error_code"] = errors.code_of(exc)
            result["error_message"] = str(exc)
    return {"responses": out}


API = Api(20, "DeleteTopics", 0, 6, REQUEST, RESPONSE, handle, flexible_from=4)
