"""CreateTopics (key 19): through the metadata group, like the native createTopic."""

from __future__ import annotations

from typing import Any

from laminar.auth.acl import ADMIN
from laminar.errors import InvalidRequestError, LaminarError, NotEnoughReplicasError
from laminar.kafka import errors, topic_configs
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.apis.metadata import topic_uuid
from laminar.kafka.codec import BOOL, INT8, INT16, INT32, STRING, UUID, Array, F, Struct
from laminar.kafka.errors import KafkaError

DEFAULT_PARTITIONS = 1
DEFAULT_REPLICATION = 3

REQUEST = Struct(
    [
        F(
            "topics",
            Array(
                Struct(
                    [
                        F("name", STRING),
                        F("num_partitions", INT32),
                        F("replication_factor", INT16),
                        F(
                            "assignments",
                            Array(
                                Struct([F("partition_index", INT32), F("broker_ids", Array(INT32))])
                            ),
                        ),
                        F(
                            "configs",
                            Array(Struct([F("name", STRING), F("value", STRING, nullable="0+")])),
                        ),
                    ]
                )
            ),
        ),
        F("timeout_ms", INT32),
        F("validate_only", BOOL, "1+"),
    ]
)
CONFIG = Struct(
    [
        F("name", STRING),
        F("value", STRING, nullable="0+"),
        F("read_only", BOOL),
        F("config_source", INT8, default=-1),
        F("is_sensitive", BOOL),
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
                        F("topic_id", UUID, "7+"),
                        F("error_code", INT16),
                        F("error_message", STRING, "1+", nullable="0+"),
                        F("topic_config_error_code", INT16, "5+", tag=0, default=0),
                        F("num_partitions", INT32, "5+", default=-1),
                        F("replication_factor", INT16, "5+", default=-1),
                        F("configs", Array(CONFIG), "5+", nullable="5+"),
                    ]
                )
            ),
        ),
    ]
)
CONFIG_SOURCE_TOPIC = 1


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    broker = ctx.broker
    out = []
    for item in request["topics"]:
        name = item["name"]
        result: dict[str, Any] = {"name": name, "error_code": 0}
        out.append(result)
        try:
            ctx.authorize(ADMIN, name)
            if item["assignments"]:
                raise InvalidRequestError("laminar places replicas itself")
            partitions = item["num_partitions"]
            replication = item["replication_factor"]
            if partitions == -1:
                partitions = DEFAULT_PARTITIONS
            if replication == -1:
                replication = min(DEFAULT_REPLICATION, broker.node_count)
            if partitions < 1:
                raise KafkaError(errors.INVALID_PARTITIONS, "at least one partition")
            if replication < 1 or replication > broker.node_count:
                raise KafkaError(
                    errors.INVALID_REPLICATION_FACTOR,
                    f"replication factor {replication} with {broker.node_count} nodes",
                )
            spec = {"partitions": partitions, "replication_factor": replication}
            spec.update(topic_configs.spec_from_configs(item["configs"]))
            if name in broker.topics:
                raise KafkaError(errors.TOPIC_ALREADY_EXISTS, f"topic {name!r} exists")
            if request["validate_only"]:
                broker.check_create(name, spec)
                topic_settings = broker.settings_for(spec)
                result["num_partitions"] = partitions
                result["replication_factor"] = replication
            else:
                topic = await broker.create_topic(name, spec)
                topic_settings = topic.settings
                result["topic_id"] = topic_uuid(topic.topic_id)
                result["num_partitions"] = topic_settings.partitions
                result["replication_factor"] = topic_settings.replication_factor
            result["configs"] = [
                {"name": k, "value": v, "config_source": CONFIG_SOURCE_TOPIC}
                for k, v in topic_configs.describe(topic_settings, broker.io.max_batch_bytes)
            ]
        except NotEnoughReplicasError as exc:
            result["error_code"] = errors.INVALID_REPLICATION_FACTOR
            result["error_message"] = str(exc)
        except LaminarError as exc:
            code = errors.code_of(exc)
            if code == errors.INVALID_REQUEST and broker.is_internal(name):
                code = errors.INVALID_TOPIC_EXCEPTION
            result["error_code"] = code
            result["error_message"] = str(exc)
    return {"topics": out}


API = Api(19, "CreateTopics", 0, 7, REQUEST, RESPONSE, handle, flexible_from=5)
