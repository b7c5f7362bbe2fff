"""Topic and node administration as metadata commands, shared by every client protocol.

Each operation checks what it can before proposing (so a bad request stores nothing and gets a
typed error at once), proposes one metadata command, and returns the applied state. The
metadata state machine (``laminar/node/metadata.py``) checks again what depends on the order
of commands.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from laminar.errors import InvalidRequestError, UnknownTopicError
from laminar.node.metadata import ALTERABLE_SETTINGS, MetadataState, Topic, TopicSettings
from laminar.segment.log import LogConfig
from laminar.splits.ops import RANGE, plan_children
from laminar.topic_names import is_internal, validate_topic_name

Propose = Callable[[dict[str, Any]], Awaitable[Any]]

OPERATION_WAIT = 20.0
"""How long a split or merge request waits for the operation to finish before answering."""

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
        if spec.get("partitioning") not in (None, "", "hash", RANGE):
            raise InvalidRequestError(
                f"partitioning is hash or range, not {spec.get('partitioning')!r}"
            )
        settings = self.settings_for(spec)
        self._check_log_settings(settings)
        check_auto_policy(settings)
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

    async def split_partition(self, name: str, partition: int, at: int | None = None) -> Topic:
        """Begin splitting ``partition`` of a range topic at hash ``at`` (default: the middle
        of its range); the split driver seals it and activates the two children."""
        command = {"op": "begin_split", "name": name, "partition": partition, "at": at}
        return await self._operate(name, command)

    async def merge_partitions(self, name: str, first: int, second: int) -> Topic:
        """Begin merging two active partitions with adjacent ranges into one child."""
        command = {"op": "begin_merge", "name": name, "partitions": [first, second]}
        return await self._operate(name, command)

    async def _operate(self, name: str, command: dict[str, Any]) -> Topic:
        """Begin a split or merge and wait (up to ``OPERATION_WAIT`` s) until the driver has
        finished it; the topic as it is then (an operation still open shows in it)."""
        plan_children(self._existing(name), command)  # refuse now what apply would refuse
        op_id = command["request_id"] = uuid.uuid4().hex
        await self.propose(command)
        deadline = time.monotonic() + OPERATION_WAIT
        while time.monotonic() < deadline:
            operation = self._existing(name).operation
            if operation is None or operation["id"] != op_id:
                break
            await asyncio.sleep(0.02)
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
        altered = TopicSettings(**{**asdict(topic.settings), **wanted})
        self._check_log_settings(altered)
        check_auto_policy(altered)
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


def check_auto_policy(settings: TopicSettings) -> None:
    """An automatic split/merge policy: only for range topics, sane thresholds and window."""
    values = (settings.auto_split_above, settings.auto_merge_below, settings.max_partitions)
    if any(value < 0 for value in values) or settings.auto_window_ms < 1000:
        raise InvalidRequestError("auto thresholds are >= 0 and the window at least 1 s")
    if not (settings.auto_split_above or settings.auto_merge_below):
        return
    if settings.partitioning != RANGE:
        raise InvalidRequestError("automatic splits and merges need --partitioning range")
    if (
        settings.auto_split_above
        and settings.auto_merge_below
        and settings.auto_merge_below * 2 > settings.auto_split_above
    ):
        raise InvalidRequestError(
            "--auto-merge-below must be at most half of --auto-split-above (a merged partition "
            "would be split again at once)"
        )


def log_config(settings: TopicSettings, max_batch_bytes: int) -> LogConfig:
    """What a replica's log is opened with, and changed to by ``alter_topic``."""
    return LogConfig(
        segment_bytes=settings.segment_bytes,
        segment_ms=settings.segment_ms,
        retention_ms=settings.retention_ms,
        retention_bytes=settings.retention_bytes,
        max_batch_bytes=max_batch_bytes,
    )
