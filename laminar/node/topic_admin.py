"""Topic and node administration as metadata commands, shared by every client protocol.

Each operation checks what it can before proposing (so a bad request stores nothing and gets a
typed error at once), proposes one metadata command, and returns the applied state. The
metadata state machine (``laminar/node/metadata.py``) checks again what depends on the order
of commands.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from laminar.errors import InvalidRequestError, UnknownTopicError
from laminar.node.metadata import ALTERABLE_SETTINGS, MetadataState, Topic, TopicSettings
from laminar.segment.log import LogConfig
from laminar.topic_names import is_internal, validate_topic_name

Propose = Callable[[dict[str, Any]], Awaitable[Any]]

KEEP = -2
"""An ``alter_topic`` value that leaves the setting as it is."""


@dataclass(frozen=True, slots=True)
class TopicAdmin:
    propose: Propose
    state: MetadataState
    settings_for: Callable[[dict[str, Any]], TopicSettings]
    """Fills node defaults into a topic spec (``Node.settings_for``)."""
    max_batch_bytes: int

    async def create_topic(self, spec: dict[str, Any]) -> Topic:
        """``spec``: name, partitions, replication_factor and optional log settings (0 or
        missing: the node default; retention_ms -1: keep forever)."""
        name = spec["name"]
        settings = self.check_create(spec)
        await self.propose({"op": "create_topic", "name": name, "settings": asdict(settings)})
        topic = self.state.topics.get(name)
        if topic is None:  # a delete committed right behind the create
            raise UnknownTopicError(f"topic {name!r} was deleted as it was created")
        return topic

    def check_create(self, spec: dict[str, Any]) -> TopicSettings:
        """What ``create_topic`` refuses before proposing (also Kafka's validate_only); the
        settings it would create the topic with."""
        validate_topic_name(spec["name"])
        if is_internal(spec["name"]):
            raise InvalidRequestError("topic names starting with '__' are the cluster's own")
        if spec["partitions"] < 1:
            raise InvalidRequestError("a topic needs at least one partition")
        if spec["replication_factor"] < 1:
            raise InvalidRequestError("replication factor must be at least 1")
        settings = self.settings_for(spec)
        self._check_log_settings(settings)
        return settings

    async def delete_topic(self, name: str) -> None:
        self._existing(name)
        await self.propose({"op": "delete_topic", "name": name})

    async def add_partitions(self, name: str, total: int) -> Topic:
        """Grow ``name`` to ``total`` partitions (Kafka's CreatePartitions)."""
        topic = self._existing(name)
        if total <= len(topic.partitions):
            raise InvalidRequestError(
                f"topic {name!r} has {len(topic.partitions)} partitions; {total} would not add any"
            )
        await self.propose({"op": "add_partitions", "name": name, "total": total})
        return self._existing(name)

    async def alter_topic(self, name: str, changes: dict[str, int]) -> Topic:
        """Change log settings at run time; ``changes`` maps setting names to new values
        (``KEEP`` skips one; -1 for a retention removes the limit)."""
        topic = self._existing(name)
        wanted: dict[str, int | None] = {}
        for setting, value in changes.items():
            if setting not in ALTERABLE_SETTINGS:
                raise InvalidRequestError(f"{setting} cannot be altered")
            if value == KEEP:
                continue
            if setting.startswith("retention"):
                if value < -1:
                    raise InvalidRequestError(f"{setting} must be -1 (no limit) or >= 0")
                wanted[setting] = None if value == -1 else value
            else:
                wanted[setting] = value
        if not wanted:
            raise InvalidRequestError("nothing to alter: give at least one setting")
        self._check_log_settings(TopicSettings(**{**asdict(topic.settings), **wanted}))
        await self.propose({"op": "alter_topic", "name": name, "settings": wanted})
        return self._existing(name)

    async def drain_node(self, node_id: int) -> None:
        """Decommission: every replica on ``node_id`` moves elsewhere."""
        await self.propose({"op": "drain_node", "node_id": node_id})

    async def undrain_node(self, node_id: int) -> None:
        """Undo a drain: the node takes replicas again as the rebalancer evens out load."""
        await self.propose({"op": "undrain_node", "node_id": node_id})

    def _existing(self, name: str) -> Topic:
        if is_internal(name):
            raise InvalidRequestError(f"{name} is the cluster's own topic; it cannot be changed")
        topic = self.state.topics.get(name)
        if topic is None:
            raise UnknownTopicError(f"unknown topic {name!r}")
        return topic

    def _check_log_settings(self, settings: TopicSettings) -> None:
        """Refuse now what every replica's log would refuse when opened with these settings."""
        try:
            log_config(settings, self.max_batch_bytes)
        except ValueError as exc:
            raise InvalidRequestError(f"invalid topic settings: {exc}") from None


def log_config(settings: TopicSettings, max_batch_bytes: int) -> LogConfig:
    """What a replica's log is opened with, and changed to by ``alter_topic``."""
    return LogConfig(
        segment_bytes=settings.segment_bytes,
        segment_ms=settings.segment_ms,
        retention_ms=settings.retention_ms,
        retention_bytes=settings.retention_bytes,
        max_batch_bytes=max_batch_bytes,
    )
