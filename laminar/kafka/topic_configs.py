"""Topic settings under their Kafka config names (CreateTopics, DescribeConfigs)."""

from __future__ import annotations

from typing import Any

from laminar.kafka import errors
from laminar.kafka.errors import KafkaError
from laminar.node.metadata import TopicSettings

# Kafka name -> laminar settings key
SETTINGS = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
}
ACCEPTED_AS_IS = {"cleanup.policy": "delete"}
"""Configs laminar has fixed: given with this value they are accepted, otherwise refused."""


def spec_from_configs(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """CreateTopics' configs as ``topic_admin`` settings; unknown names are ignored (as a
    broker ignores what it does not use), values laminar cannot honour are INVALID_CONFIG."""
    spec: dict[str, Any] = {}
    for item in configs:
        name, value = item["name"], item["value"]
        if name in SETTINGS and value is not None:
            try:
                number = int(value)
            except ValueError:
                raise KafkaError(errors.INVALID_CONFIG, f"{name}={value!r}") from None
            spec[SETTINGS[name]] = number
        elif name in ACCEPTED_AS_IS and value != ACCEPTED_AS_IS[name]:
            raise KafkaError(errors.INVALID_CONFIG, f"{name}={value!r} is not supported")
    return spec


def describe(settings: TopicSettings, max_message_bytes: int) -> list[tuple[str, str]]:
    """(name, value) of every topic config laminar has, in Kafka's names and units."""
    return [
        ("cleanup.policy", "delete"),
        ("retention.ms", str(-1 if settings.retention_ms is None else settings.retention_ms)),
        ("retention.bytes", str(settings.retention_bytes or -1)),
        ("segment.bytes", str(settings.segment_bytes)),
        ("segment.ms", str(settings.segment_ms)),
        ("max.message.bytes", str(max_message_bytes)),
        ("message.timestamp.type", "CreateTime"),
        ("compression.type", "producer"),
        ("min.insync.replicas", str(settings.replication_factor // 2 + 1)),
    ]
