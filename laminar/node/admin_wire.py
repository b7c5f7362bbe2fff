"""Client-protocol handlers of topic and node administration: Cap'n Proto in, TopicAdmin call,
reply out. Each handler reads its request body completely before it awaits anything."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from laminar.node.metadata import Topic
from laminar.node.topic_admin import TopicAdmin

Handler = Callable[[Any, Any, memoryview], Awaitable[None]]
FillTopic = Callable[[Any, Topic], None]


def handlers(admin: TopicAdmin, fill_topic: FillTopic) -> dict[str, Handler]:
    """The request kinds this module serves, by their name in ``Request.body``;
    ``fill_topic`` writes a topic's description into a ``TopicInfo``."""

    async def create_topic(spec: Any, response: Any, _payload: memoryview) -> None:
        topic = await admin.create_topic(
            {
                "name": spec.name,
                "partitions": spec.partitions,
                "replication_factor": spec.replicationFactor,
                "segment_bytes": spec.segmentBytes,
                "segment_ms": spec.segmentMs,
                "retention_ms": spec.retentionMs,
                "retention_bytes": spec.retentionBytes,
                "partitioning": spec.partitioning,
                "auto_split_above": spec.autoSplitAbove,
                "auto_merge_below": spec.autoMergeBelow,
                "auto_window_ms": spec.autoWindowMs,
                "max_partitions": spec.maxPartitions,
            }
        )
        fill_topic(response.body.init("topic"), topic)

    async def delete_topic(name: str, response: Any, _payload: memoryview) -> None:
        await admin.delete_topic(name)
        response.body.none = None

    async def add_partitions(body: Any, response: Any, _payload: memoryview) -> None:
        topic = await admin.add_partitions(body.name, body.total)
        fill_topic(response.body.init("topic"), topic)

    async def alter_topic(body: Any, response: Any, _payload: memoryview) -> None:
        changes = {
            "segment_bytes": body.segmentBytes,
            "segment_ms": body.segmentMs,
            "retention_ms": body.retentionMs,
            "retention_bytes": body.retentionBytes,
            "auto_split_above": body.autoSplitAbove,
            "auto_merge_below": body.autoMergeBelow,
            "auto_window_ms": body.autoWindowMs,
            "max_partitions": body.maxPartitions,
        }
        topic = await admin.alter_topic(body.name, changes)
        fill_topic(response.body.init("topic"), topic)

    async def split_partition(body: Any, response: Any, _payload: memoryview) -> None:
        name, partition, at = body.name, body.partition, body.at
        topic = await admin.split_partition(name, partition, None if at < 0 else at)
        fill_topic(response.body.init("topic"), topic)

    async def merge_partitions(body: Any, response: Any, _payload: memoryview) -> None:
        topic = await admin.merge_partitions(body.name, body.first, body.second)
        fill_topic(response.body.init("topic"), topic)

    async def drain_node(node_id: int, response: Any, _payload: memoryview) -> None:
        await admin.drain_node(node_id)
        response.body.none = None

    async def undrain_node(node_id: int, response: Any, _payload: memoryview) -> None:
        await admin.undrain_node(node_id)
        response.body.none = None

    return {
        "createTopic": create_topic,
        "deleteTopic": delete_topic,
        "addPartitions": add_partitions,
        "alterTopic": alter_topic,
        "splitPartition": split_partition,
        "mergePartitions": merge_partitions,
        "drainNode": drain_node,
        "undrainNode": undrain_node,
    }
