"""DescribeConfigs (key 32): a topic's retention and segment settings in Kafka's names; a
broker resource gets the node-wide defaults."""

from __future__ import annotations

from typing import Any

from laminar.errors import LaminarError
from laminar.kafka import errors, topic_configs
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import BOOL, INT8, INT16, INT32, STRING, Array, F, Struct

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_TOPIC = 1
SOURCE_DEFAULT = 5

REQUEST = Struct(
    [
        F(
            "resources",
            Array(
                Struct(
                    [
                        F("resource_type", INT8),
                        F("resource_name", STRING),
                        F("configuration_keys", Array(STRING), nullable="0+"),
                    ]
                )
            ),
        ),
        F("include_synonyms", BOOL, "1+"),
        F("include_documentation", BOOL, "3+"),
    ]
)
CONFIG = Struct(
    [
        F("name", STRING),
        F("value", STRING, nullable="0+"),
        F("read_only", BOOL),
        F("is_default", BOOL, "0"),
        F("config_source", INT8, "1+", default=-1),
        F("is_sensitive", BOOL),
        F(
            "synonyms",
            Array(
                Struct([F("name", STRING), F("value", STRING, nullable="0+"), F("source", INT8)])
            ),
            "1+",
        ),
        F("config_type", INT8, "3+"),
        F("documentation", STRING, "3+", nullable="0+"),
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
                        F("error_code", INT16),
                        F("error_message", STRING, nullable="0+"),
                        F("resource_type", INT8),
                        F("resource_name", STRING),
                        F("configs", Array(CONFIG)),
                    ]
                )
            ),
        ),
    ]
)


def _may_describe(ctx: RequestContext, topic: str) -> bool:
    try:
        ctx.authorize_describe(topic)
    except LaminarError:
        return False
    return True


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    broker = ctx.broker
    results = []
    for resource in request["resources"]:
        kind, name = resource["resource_type"], resource["resource_name"]
        result: dict[str, Any] = {
            "error_code": 0,
            "resource_type": kind,
            "resource_name": name,
            "configs": [],
        }
        results.append(result)
        if kind == RESOURCE_TOPIC:
            if not _may_describe(ctx, name):
                result["error_code"] = errors.TOPIC_AUTHORIZATION_FAILED
                continue
            topic = broker.topics.get(name)
            if topic is None:
                result["error_code"] = errors.UNKNOWN_TOPIC_OR_PARTITION
                continue
            settings, source = topic.settings, SOURCE_TOPIC
        elif kind == RESOURCE_BROKER:
            settings = broker.settings_for({"partitions": 1, "replication_factor": 3})
            source = SOURCE_DEFAULT
        else:
            result["error_code"] = errors.INVALID_REQUEST
            result["error_message"] = f"resource type {kind} is not described"
            continue
        keys = resource["configuration_keys"]
        for key, value in topic_configs.describe(settings, broker.io.max_batch_bytes):
            if keys is None or key in keys:
                result["configs"].append(
                    {
                        "name": key,
                        "value": value,
                        "read_only": key not in topic_configs.SETTINGS,
                        "config_source": source,
                    }
                )
    return {"throttle_time_ms": 0, "results": results}


API = Api(32, "DescribeConfigs", 0, 4, REQUEST, RESPONSE, handle, flexible_from=4)
