"""Cluster administration: topics, offsets and the cluster's health in one call each."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from ssl import SSLContext
from typing import Any

from laminar.client import share_wire
from laminar.client.cluster import Cluster
from laminar.client.connection import credentials_of
from laminar.client.descriptions import (
    ClusterHealth,
    ClusterStatus,
    TopicDescription,
    health_from_reader,
    status_from_reader,
    topic_from_reader,
)
from laminar.client.group_types import (
    CommittedOffset,
    GroupDescription,
    GroupSummary,
    OffsetAndMetadata,
    PartitionLag,
)
from laminar.client.groups import OFFSETS_TOPIC, GroupClient
from laminar.client.offsets import list_offsets
from laminar.client.queue_admin import config_from_reader, describe_queue
from laminar.client.queue_types import QueueConfig, QueueDescription
from laminar.client.retry import retrying
from laminar.client.types import DEFAULT_BOOTSTRAP, TopicPartition
from laminar.client.user_admin import UserAdmin
from laminar.errors import (
    GroupNotEmptyError,
    InvalidRequestError,
    NodeStartingError,
    NotLeaderError,
    RequestTimeoutError,
    UnknownTopicError,
)
from laminar.protocol import EARLIEST, LATEST


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = _Unchanged()
"""``alter_queue_config``: leave this setting as it is (None resets it to the default)."""


def _transient(error: BaseException) -> bool:
    """Admin answers about topics are final (the node asks the metadata leader); only
    transport trouble, leader changes and a node not yet in the cluster (health: another node
    is asked) are worth another try."""
    return isinstance(
        error, ConnectionError | OSError | RequestTimeoutError | NotLeaderError | NodeStartingError
    )


class Admin(UserAdmin):
    """Topic management and cluster status; any node answers (writes are forwarded)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        request_timeout_ms: int = 30_000,
        ssl: SSLContext | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.ssl = ssl
        self.credentials = credentials_of(username, password)
        self.request_timeout = request_timeout_ms / 1000
        self._cluster: Cluster | None = None

    async def start(self) -> None:
        if self._cluster is None:
            self._cluster = await Cluster.connect(
                self.bootstrap,
                request_timeout=self.request_timeout,
                ssl=self.ssl,
                credentials=self.credentials,
            )

    async def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    async def __aenter__(self) -> Admin:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            raise RuntimeError("admin client is not started")
        return self._cluster

    async def _call(self, fill: Any) -> Any:
        cluster = self.cluster

        async def attempt() -> Any:
            connection = await cluster.any_connection()
            try:
                reply, _ = await connection.request(fill, timeout=self.request_timeout)
            except NodeStartingError:
                cluster.drop_connection(connection.address)  # (the next try asks another)
                raise
            return reply

        return await retrying(cluster, attempt, retriable=_transient)

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 3,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        segment_bytes: int | None = None,
        segment_ms: int | None = None,
        partitioning: str = "hash",
        auto_split_above: int = 0,
        auto_merge_below: int = 0,
        auto_window_ms: int = 60_000,
        max_partitions: int = 0,
    ) -> TopicDescription:
        """Create a topic; TopicExistsError if it exists, NotEnoughReplicasError if too few nodes.

        ``retention_ms=-1`` keeps data forever; None leaves a setting at the node default.
        ``partitioning="range"``: partitions own ranges of the key-hash space and can be split
        and merged (``split_partition``, ``merge_partitions``) with per-key order kept;
        ``auto_split_above`` / ``auto_merge_below`` (bytes/s over ``auto_window_ms``, 0: off)
        let the cluster do it by itself, up to ``max_partitions`` active partitions (0: 64).
        """
        if partitioning not in ("hash", "range"):
            raise InvalidRequestError(f"partitioning is hash or range, not {partitioning!r}")
        if not name:
            raise InvalidRequestError("topic name is empty")
        if partitions < 1:
            raise InvalidRequestError(f"partitions must be >= 1, not {partitions}")
        if replication_factor < 1:
            raise InvalidRequestError(f"replication factor must be >= 1, not {replication_factor}")

        def fill(body: Any) -> None:
            spec = body.init("createTopic")
            spec.name = name
            spec.partitions = partitions
            spec.replicationFactor = replication_factor
            spec.retentionMs = retention_ms or 0
            spec.retentionBytes = retention_bytes or 0
            spec.segmentBytes = segment_bytes or 0
            spec.segmentMs = segment_ms or 0
            spec.partitioning = partitioning
            spec.autoSplitAbove = auto_split_above
            spec.autoMergeBelow = auto_merge_below
            spec.autoWindowMs = auto_window_ms
            spec.maxPartitions = max_partitions

        reply = await self._call(fill)
        await self.cluster.refresh_metadata()
        if reply.body.which() == "topic":
            return topic_from_reader(reply.body.topic)
        return await self.describe_topic(name)

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and its data; UnknownTopicError if there is none by that name."""

        def fill(body: Any) -> None:
            body.deleteTopic = name

        await self._call(fill)
        await self.cluster.refresh_metadata()

    async def add_partitions(self, name: str, total: int) -> TopicDescription:
        """Grow a topic to ``total`` partitions (Kafka's CreatePartitions). Keys hash over the
        new count from then on; records already written stay where they are."""

        def fill(body: Any) -> None:
            request = body.init("addPartitions")
            request.name = name
            request.total = total

        reply = await self._call(fill)
        await self.cluster.refresh_metadata()
        return topic_from_reader(reply.body.topic)

    async def split_partition(
        self, name: str, partition: int, at: int | None = None
    ) -> TopicDescription:
        """Split an active partition of a range topic at key hash ``at`` (default: the middle
        of its range). The partition is sealed and two new partitions take its halves; the
        answer comes once that is done (or after 20 s with the split still under way, as the
        description's ``operation`` shows). Sent once: a split is not retried blindly."""

        def fill(body: Any) -> None:
            request = body.init("splitPartition")
            request.name = name
            request.partition = partition
            request.at = -1 if at is None else at

        return await self._operate(fill)

    async def merge_partitions(self, name: str, first: int, second: int) -> TopicDescription:
        """Merge two active partitions with adjacent ranges: both are sealed and one new
        partition takes their union. Answered like ``split_partition``."""

        def fill(body: Any) -> None:
            request = body.init("mergePartitions")
            request.name = name
            request.first = first
            request.second = second

        return await self._operate(fill)

    async def _operate(self, fill: Any) -> TopicDescription:
        connection = await self.cluster.any_connection()
        reply, _ = await connection.request(fill, timeout=self.request_timeout)
        await self.cluster.refresh_metadata()
        return topic_from_reader(reply.body.topic)

    async def alter_topic(
        self,
        name: str,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        segment_bytes: int | None = None,
        segment_ms: int | None = None,
        auto_split_above: int | None = None,
        auto_merge_below: int | None = None,
        auto_window_ms: int | None = None,
        max_partitions: int | None = None,
    ) -> TopicDescription:
        """Change log settings at run time; None keeps a setting, -1 removes a retention
        limit. Every replica applies the change when the metadata command commits. A range
        topic's automatic policy changes the same way (0 turns a threshold off)."""

        def fill(body: Any) -> None:
            request = body.init("alterTopic")
            request.name = name
            for field, value in (
                ("retentionMs", retention_ms),
                ("retentionBytes", retention_bytes),
                ("segmentBytes", segment_bytes),
                ("segmentMs", segment_ms),
                ("autoSplitAbove", auto_split_above),
                ("autoMergeBelow", auto_merge_below),
                ("autoWindowMs", auto_window_ms),
                ("maxPartitions", max_partitions),
            ):
                if value is not None:
                    setattr(request, field, value)

        reply = await self._call(fill)
        await self.cluster.refresh_metadata()
        return topic_from_reader(reply.body.topic)

    async def list_topics(self) -> list[str]:
        metadata = await self.cluster.refresh_metadata()
        return sorted(metadata.topics)

    async def describe_topic(self, name: str) -> TopicDescription:
        metadata = await self.cluster.refresh_metadata()
        description = metadata.topics.get(name)
        if description is None:
            raise UnknownTopicError(f"topic {name!r} does not exist")
        return description

    async def list_offsets(
        self, tps: Sequence[TopicPartition], timestamp: int
    ) -> dict[TopicPartition, int]:
        """-2 earliest, -1 latest (high watermark), else first offset at/after ms (-1: none)."""
        for tp in tps:
            await self.cluster.wait_for_topic(tp.topic, 0)
        return await list_offsets(self.cluster, [TopicPartition(*tp) for tp in tps], timestamp)

    async def drain_node(self, node_id: int) -> None:
        """Decommission a node: every replica it holds moves elsewhere (watch cluster_status)."""

        def fill(body: Any) -> None:
            body.drainNode = node_id

        await self._call(fill)

    async def undrain_node(self, node_id: int) -> None:
        """Undo ``drain_node``: the node takes replicas again as the rebalancer evens out."""

        def fill(body: Any) -> None:
            body.undrainNode = node_id

        await self._call(fill)

    async def cluster_status(self) -> ClusterStatus:
        def fill(body: Any) -> None:
            body.clusterStatus = None

        reply = await self._call(fill)
        return status_from_reader(reply.body.clusterStatus)

    async def cluster_health(self) -> ClusterHealth:
        """Whether every node is up, every partition led and every replica in sync and
        serving, in counts: cheap enough to poll while a rolling restart waits for it."""

        def fill(body: Any) -> None:
            body.clusterHealth = None

        reply = await self._call(fill)
        return health_from_reader(reply.body.clusterHealth)

    # consumer groups -------------------------------------------------------------------
    @property
    def groups(self) -> GroupClient:
        """Low-level group calls (heartbeat, fetch_offsets, ...) over this admin's cluster."""
        return GroupClient(self.cluster, timeout=self.request_timeout)

    async def list_groups(self) -> list[GroupSummary]:
        """Every group of the cluster (each node is asked for the groups it coordinates)."""
        return await self.groups.list_groups()

    async def describe_group(self, group: str) -> GroupDescription:
        """State, members and their assignment, committed offsets, and per-partition lag
        (end offset - committed) of every partition the group reads or has committed."""
        description = await self.groups.describe_group(group)
        owners: dict[TopicPartition, str] = {}
        for member in description.members:
            for tp in (*member.revoking, *member.assigned):
                owners[tp] = member.member_id
        committed = {TopicPartition(o.topic, o.partition): o.offset for o in description.offsets}
        metadata = await self.cluster.refresh_metadata()
        topics = {t for m in description.members for t in m.topics} | {tp.topic for tp in committed}
        tps = sorted(
            {
                TopicPartition(topic, p.partition)
                for topic in topics
                if topic in metadata.topics and topic != OFFSETS_TOPIC
                for p in metadata.topics[topic].partitions
            }
            | set(committed)
            | set(owners)
        )
        known = [tp for tp in tps if tp.topic in metadata.topics]
        ends = await list_offsets(self.cluster, known, LATEST) if known else {}
        rows = []
        for tp in tps:
            end, offset = ends.get(tp), committed.get(tp)
            lag = max(end - offset, 0) if end is not None and offset is not None else None
            rows.append(PartitionLag(tp.topic, tp.partition, owners.get(tp), offset, end, lag))
        return dataclasses.replace(description, partitions=tuple(rows))

    # share groups (queues) -------------------------------------------------------------
    async def describe_queue(self, group: str, topic: str) -> QueueDescription:
        """Share group ``group`` on each partition of ``topic``: start offset, available,
        acquired, delayed, being dead-lettered, age of the oldest record not done; the group's
        settings; and how many records its dead-letter topic holds."""
        config = await self.describe_queue_config(group)
        return await describe_queue(self.cluster, group, topic, config)

    async def describe_queue_config(self, group: str) -> QueueConfig:
        """The settings share group ``group`` runs with (defaults where none is set)."""
        reply = await self._call(lambda body: share_wire.describe_queue_config(body, group))
        return config_from_reader(reply.body.queueConfig)

    async def alter_queue_config(
        self,
        group: str,
        *,
        lock_ms: int | _Unchanged | None = UNCHANGED,
        max_deliveries: int | _Unchanged | None = UNCHANGED,
        dead_letter_topic: str | _Unchanged | None = UNCHANGED,
    ) -> QueueConfig:
        """Change share group ``group``'s settings, stored cluster-wide and applied by every
        leader of a partition the group reads: ``lock_ms`` for acquisitions that do not ask
        for their own lock (locks already held keep theirs), ``max_deliveries`` before a
        message is dead-lettered, the ``dead_letter_topic`` (created on first use). A setting
        left out stays as it is; ``None`` resets it to the default (30 s, 5, ``<group>.dlq``).
        A bad name or value raises ``InvalidConfigError`` and changes nothing. Returns the
        settings now in force."""
        given = {
            "lock_ms": lock_ms,
            "max_deliveries": max_deliveries,
            "dead_letter_topic": dead_letter_topic,
        }
        changes = {n: str(v) for n, v in given.items() if v is not None and v is not UNCHANGED}
        reset = [name for name, value in given.items() if value is None]
        reply = await self._call(
            lambda body: share_wire.alter_queue_config(body, group, changes, reset)
        )
        return config_from_reader(reply.body.queueConfig)

    async def reset_queue_config(self, group: str) -> QueueConfig:
        """Every setting of share group ``group`` back to its default."""
        return await self.alter_queue_config(
            group, lock_ms=None, max_deliveries=None, dead_letter_topic=None
        )

    async def delete_group(self, group: str) -> None:
        """Delete a group with no members, offsets included (GroupNotEmptyError otherwise)."""
        await self.groups.delete_group(group)

    async def fetch_offsets(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        return await self.groups.fetch_offsets(group)

    async def commit_offsets(
        self, group: str, offsets: Mapping[TopicPartition, int | tuple[int, str]]
    ) -> None:
        """Commit from outside the group (tools, Spark): only while it has no members."""
        await self.groups.commit(
            group, {TopicPartition(*tp): _offset(v) for tp, v in offsets.items()}
        )

    async def reset_offsets(
        self,
        group: str,
        topic: str,
        *,
        to: str | int = "earliest",
        timestamp_ms: int | None = None,
        partitions: Sequence[int] | None = None,
        dry_run: bool = False,
    ) -> dict[TopicPartition, int]:
        """Set the group's committed offsets of ``topic`` to ``"earliest"``, ``"latest"``, an
        offset (clamped to each partition's [start, end]) or, with ``timestamp_ms``, the first
        batch at or after that time (end if none). Only while the group has no members
        (GroupNotEmptyError); ``dry_run`` returns the plan without committing it."""
        description = await self.describe_topic(topic)
        numbers = [p.partition for p in description.partitions]
        for number in partitions or []:
            if number not in numbers:
                raise InvalidRequestError(f"topic {topic!r} has no partition {number}")
        tps = [TopicPartition(topic, p) for p in (partitions or numbers)]
        if not dry_run:
            current = await self.groups.describe_group(group)
            if current.members:
                raise GroupNotEmptyError(
                    f"group {group} has {len(current.members)} members; stop them first"
                )
        if timestamp_ms is not None:
            found = await list_offsets(self.cluster, tps, timestamp_ms)
            missing = [tp for tp, offset in found.items() if offset < 0]
            if missing:
                found.update(await list_offsets(self.cluster, missing, LATEST))
            plan = found
        elif to in ("earliest", "latest"):
            plan = await list_offsets(self.cluster, tps, EARLIEST if to == "earliest" else LATEST)
        elif isinstance(to, int) and not isinstance(to, bool):
            starts = await list_offsets(self.cluster, tps, EARLIEST)
            ends = await list_offsets(self.cluster, tps, LATEST)
            plan = {tp: min(max(to, starts[tp]), ends[tp]) for tp in tps}
        else:
            raise InvalidRequestError(f"reset to {to!r}: expected earliest, latest or an offset")
        if not dry_run:
            await self.groups.commit(group, {tp: OffsetAndMetadata(o) for tp, o in plan.items()})
        return plan


def _offset(value: int | tuple[int, str]) -> OffsetAndMetadata:
    if isinstance(value, int):
        return OffsetAndMetadata(value)
    return OffsetAndMetadata(*value)
