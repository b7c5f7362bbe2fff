"""Creating and deleting topics, protocol-neutral (the native and the Kafka listeners)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from laminar.errors import InvalidRequestError, UnknownTopicError
from laminar.groups.service import is_internal
from laminar.node.metadata import Topic
from laminar.segment.log import LogConfig

if TYPE_CHECKING:
    from laminar.node.node import Node


def check_settings_spec(node: Node, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Validate a create request; returns the create_topic command to propose."""
    if is_internal(name):
        raise InvalidRequestError("topic names starting with '__' are the cluster's own")
    if spec["partitions"] < 1:
        raise InvalidRequestError("a topic needs at least one partition")
    if spec["replication_factor"] < 1:
        raise InvalidRequestError("replication factor must be at least 1")
    settings = node.settings_for(spec)
    try:  # what every replica's log will be opened with: refuse now what it would refuse
        LogConfig(
            segment_bytes=settings.segment_bytes,
            segment_ms=settings.segment_ms,
            retention_ms=settings.retention_ms,
            retention_bytes=settings.retention_bytes,
            max_batch_bytes=node.config.max_batch_bytes,
        )
    except ValueError as exc:
        raise InvalidRequestError(f"invalid topic settings: {exc}") from None
    return {"op": "create_topic", "name": name, "settings": asdict(settings)}


async def create_topic(node: Node, name: str, spec: dict[str, Any]) -> Topic:
    """``spec``: partitions, replication_factor and optional segment_bytes, segment_ms,
    retention_ms (-1: forever), retention_bytes (0/None: unlimited)."""
    await node.metadata_service.propose(check_settings_spec(node, name, spec))
    topic = node.state.topics.get(name)
    if topic is None:  # a delete committed right behind the create
        raise UnknownTopicError(f"topic {name!r} was deleted as it was created")
    return topic


async def delete_topic(node: Node, name: str) -> None:
    if name not in node.state.topics:
        raise UnknownTopicError(f"unknown topic {name!r}")
    if is_internal(name):
        raise InvalidRequestError(f"{name} is the cluster's own topic; it cannot be deleted")
    await node.metadata_service.propose({"op": "delete_topic", "name": name})
