"""IncrementalAlterConfigs (key 44): a topic's retention and segment settings at run time
(``TopicAdmin.alter_topic``). SET gives a value, DELETE returns the node default; the list
operations (APPEND, SUBTRACT) and any other config are INVALID_CONFIG, other resource types
INVALID_REQUEST."""

from __future__ import annotations

from typing import Any

from laminar.auth.acl import ADMIN
from laminar.errors import InvalidRequestError, LaminarError
from laminar.kafka import errors, topic_configs
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import BOOL, INT8, INT16, INT32, STRING, Array, F, Struct
from laminar.kafka.errors import KafkaError

RESOURCE_TOPIC = 2
SET, DELETE = 0, 1

REQUEST = Struct(
    [
        F(
            "resources",
            Array(
                Struct(
                    [
                        F("resource_type", INT8),
                        F("resource_name", STRING),
                        F(
                            "configs",
                            Array(
                                Struct(
                                    [
                                        F("name", STRING),
                                        F("config_operation", INT8),
                                        F("value", STRING, nullable="0+"),
                                    ]
                                )
                            ),
                        ),
                    ]
                )
            ),
        ),
        F("validate_only", BOOL),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32),
        F(
            "responses",
            Array(
                Struct(
                    [
                        F("error_code", INT16),
                        F("error_message", STRING, nullable="0+"),
                        F("resource_type", INT8),
                        F("resource_name", STRING),
                    ]
                )
            ),
        ),
    ]
)


def changes_of(broker: Any, configs: list[dict[str, Any]]) -> dict[str, int]:
    """Kafka config operations as ``alter_topic`` changes (-1: no retention limit)."""
    defaults = broker.settings_for({"partitions": 1, "replication_factor": 1})
    changes: dict[str, int] = {}
    for item in configs:
        name, operation, value = item["name"], item["config_operation"], item["value"]
        setting = topic_configs.SETTINGS.get(name)
        if setting is None:
            raise KafkaError(errors.INVALID_CONFIG, f"{name} cannot be altered")
        if operation == SET:
            try:
                changes[setting] = int(value or "")
            except ValueError:
                raise KafkaError(errors.INVALID_CONFIG, f"{name}={value!r}") from None
        elif operation == DELETE:
            default = getattr(defaults, setting)
            changes[setting] = -1 if default is None else default
        else:
            raise KafkaError(errors.INVALID_CONFIG, f"{name}: only SET and DELETE apply")
    return changes


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    broker = ctx.broker
    out = []
    for resource in request["resources"]:
        kind, name = resource["resource_type"], resource["resource_name"]
        result: dict[str, Any] = {"error_code": 0, "resource_type": kind, "resource_name": name}
        out.append(result)
        try:
            if kind != RESOURCE_TOPIC:
                raise KafkaError(errors.INVALID_REQUEST, f"resource type {kind} is not altered")
            ctx.authorize(ADMIN, name)
            if name not in broker.topics:
                raise KafkaError(errors.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}")
            changes = changes_of(broker, resource["configs"])
            if changes and not request["validate_only"]:
                await broker.alter_topic(name, changes)
        except KafkaError as exc:
            result["error_code"] = exc.kafka_code
            result["error_message"] = str(exc)
        except InvalidRequestError as exc:  # a value the topic's log would refuse
            result["error_code"] = errors.INVALID_CONFIG
            result["error_message"] = str(exc)
        except LaminarError as exc:
            result["error_code"] = errors.code_of(exc)
            result["error_message"] = str(exc)
    return {"throttle_time_ms": 0, "responses": out}


API = Api(44, "IncrementalAlterConfigs", 0, 1, REQUEST, RESPONSE, handle, flexible_from=1)
