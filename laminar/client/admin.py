"""Cluster administration: topics, offsets and the cluster's health in one call each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from laminar.client.cluster import Cluster
from laminar.client.descriptions import (
    ClusterStatus,
    TopicDescription,
    status_from_reader,
    topic_from_reader,
)
from laminar.client.offsets import list_offsets
from laminar.client.retry import retrying
from laminar.client.types import DEFAULT_BOOTSTRAP, TopicPartition
from laminar.errors import (
    InvalidRequestError,
    NotLeaderError,
    RequestTimeoutError,
    UnknownTopicError,
)


def _transient(error: BaseException) -> bool:
    """Admin answers about topics are final (the node asks the metadata leader); only
    transport trouble and leader changes are worth another try."""
    return isinstance(error, ConnectionError | OSError | RequestTimeoutError | NotLeaderError)


class Admin:
    """Topic management and cluster status; any node answers (writes are forwarded)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        request_timeout_ms: int = 30_000,
    ) -> None:
        self.bootstrap = bootstrap
        self.request_timeout = request_timeout_ms / 1000
        self._cluster: Cluster | None = None

    async def start(self) -> None:
        if self._cluster is None:
            self._cluster = await Cluster.connect(
                self.bootstrap, request_timeout=self.request_timeout
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
            reply, _ = await connection.request(fill, timeout=self.request_timeout)
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
    ) -> TopicDescription:
        """Create a topic; TopicExistsError if it exists, NotEnoughReplicasError if too few nodes.

        ``retention_ms=-1`` keeps data forever; None leaves a setting at the node default.
        """
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

    async def cluster_status(self) -> ClusterStatus:
        def fill(body: Any) -> None:
            body.clusterStatus = None

        reply = await self._call(fill)
        return status_from_reader(reply.body.clusterStatus)
