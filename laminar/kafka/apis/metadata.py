"""Metadata (key 3): brokers at their advertised Kafka addresses, topics and partitions.

The partition leader is the Raft leader, replicas are the voters, the ISR the voters caught
up with the commit (exact when answered by the leader). Topics are never auto-created.
"""

from __future__ import annotations

from typing import Any

from laminar.kafka import errors
from laminar.kafka.api import Api, RequestContext
from laminar.kafka.codec import BOOL, INT16, INT32, STRING, UUID, Array, F, Struct
from laminar.node.metadata import Topic

AUTHORIZED_OPERATIONS_UNSET = -(1 << 31)

REQUEST = Struct(
    [
        F(
            "topics",
            Array(Struct([F("topic_id", UUID, "10+"), F("name", STRING, nullable="10+")])),
            nullable="1+",
        ),
        F("allow_auto_topic_creation", BOOL, "4+", default=True),
        F("include_cluster_authorized_operations", BOOL, "8-10"),
        F("include_topic_authorized_operations", BOOL, "8+"),
    ]
)
PARTITION = Struct(
    [
        F("error_code", INT16),
        F("partition_index", INT32),
        F("leader_id", INT32),
        F("leader_epoch", INT32, "7+", default=-1),
        F("replica_nodes", Array(INT32)),
        F("isr_nodes", Array(INT32)),
        F("offline_replicas", Array(INT32), "5+"),
    ]
)
RESPONSE = Struct(
    [
        F("throttle_time_ms", INT32, "3+"),
        F(
            "brokers",
            Array(
                Struct(
                    [
                        F("node_id", INT32),
                        F("host", STRING),
                        F("port", INT32),
                        F("rack", STRING, "1+", nullable="1+"),
                    ]
                )
            ),
        ),
        F("cluster_id", STRING, "2+", nullable="2+"),
        F("controller_id", INT32, "1+", default=-1),
        F(
            "topics",
            Array(
                Struct(
                    [
                        F("error_code", INT16),
                        F("name", STRING, nullable="12+"),
                        F("topic_id", UUID, "10+"),
                        F("is_internal", BOOL, "1+"),
                        F("partitions", Array(PARTITION)),
                        F(
                            "topic_authorized_operations",
                            INT32,
                            "8+",
                            default=AUTHORIZED_OPERATIONS_UNSET,
                        ),
                    ]
                )
            ),
        ),
        F("cluster_authorized_operations", INT32, "8-10", default=AUTHORIZED_OPERATIONS_UNSET),
    ]
)


def topic_uuid(topic_id: int) -> bytes:
    """laminar's integer topic id as Kafka's 16-byte topic id (never the all-zero id)."""
    return topic_id.to_bytes(16, "big")


def uuid_topic(uuid: bytes) -> int:
    return int.from_bytes(uuid, "big")


async def handle(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    broker = ctx.broker
    topics = broker.topics
    wanted = request["topics"]
    if wanted is None or (ctx.api_version == 0 and not wanted):
        names: list[str | None] = sorted(topics)
        ids: list[bytes] = [bytes(16)] * len(names)
    else:
        names, ids = [], []
        by_id = {topic_uuid(t.topic_id): t.name for t in topics.values()}
        for item in wanted:
            name = item["name"]
            if name is None:
                name = by_id.get(item["topic_id"])
            names.append(name)
            ids.append(item["topic_id"])
    out_topics = []
    for name, wanted_id in zip(names, ids, strict=True):
        topic = topics.get(name) if name is not None else None
        if topic is None:
            out_topics.append(
                {
                    "error_code": errors.UNKNOWN_TOPIC_OR_PARTITION,
                    # an unknown topic id has no name; before v12 the name cannot be null
                    "name": name if name is not None or ctx.api_version >= 12 else "",
                    "topic_id": wanted_id,
                    "partitions": [],
                }
            )
            continue
        out_topics.append(_topic(ctx, topic))
    return {
        "brokers": [
            {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
            for b in broker.brokers()
        ],
        "cluster_id": broker.cluster_id,
        "controller_id": broker.controller_id,
        "topics": out_topics,
    }


def _topic(ctx: RequestContext, topic: Topic) -> dict[str, Any]:
    broker = ctx.broker
    partitions = []
    for index in range(len(topic.partitions)):
        view = broker.partition(topic, index)
        partitions.append(
            {
                "error_code": errors.NONE if view.leader > 0 else errors.LEADER_NOT_AVAILABLE,
                "partition_index": index,
                "leader_id": view.leader,
                "leader_epoch": -1,
                "replica_nodes": view.replicas,
                "isr_nodes": view.isr,
                "offline_replicas": [],
            }
        )
    return {
        "error_code": 0,
        "name": topic.name,
        "topic_id": topic_uuid(topic.topic_id),
        "is_internal": broker.is_internal(topic.name),
        "partitions": partitions,
    }


API = Api(3, "Metadata", 0, 12, REQUEST, RESPONSE, handle, flexible_from=9)
