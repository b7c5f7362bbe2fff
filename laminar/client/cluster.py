"""What a client knows about the cluster: one connection per node and a metadata cache.

Producer, Consumer and Admin each own one Cluster. Metadata refreshes are single-flight:
callers that ask while one runs share its result, so a burst of NotLeader replies costs one
metadata request, not one per partition.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from ssl import SSLContext
from typing import Any

from laminar.client.connection import Connection, Credentials
from laminar.client.descriptions import ClusterMetadata, TopicDescription, metadata_from_reader
from laminar.client.log import get_logger
from laminar.client.types import DEFAULT_BOOTSTRAP, TopicPartition, parse_bootstrap
from laminar.errors import (
    AuthenticationError,
    AuthorizationError,
    LaminarError,
    UnknownPartitionError,
    UnknownTopicError,
)

log = get_logger(__name__)


class Cluster:
    """Connection pool keyed by node address plus the latest metadata answer."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        request_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        ssl: SSLContext | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.credentials = credentials
        """Every connection authenticates with these (None: the cluster is open)."""
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.ssl = ssl
        """TLS for every connection (None: plain TCP)."""
        self.metadata = ClusterMetadata(brokers={}, topics={}, metadata_leader=0)
        self._connections: dict[str, Connection] = {}
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._refresh: asyncio.Task[ClusterMetadata] | None = None
        self._leader_hints: dict[TopicPartition, int] = {}
        self._closed = False
        self._closing: list[Connection] = []

    @classmethod
    async def connect(
        cls, bootstrap: str | Sequence[str] = DEFAULT_BOOTSTRAP, **options: Any
    ) -> Cluster:
        """Create a Cluster and load metadata from the first bootstrap node that answers."""
        cluster = cls(bootstrap, **options)
        try:
            await cluster.refresh_metadata()
        except BaseException:
            cluster.close()
            raise
        return cluster

    # connections -------------------------------------------------------------------------
    async def connection_to(self, address: str) -> Connection:
        """The pooled connection to ``address``, opened if needed (one dial at a time)."""
        if self._closed:
            raise ConnectionError("client is closed")
        connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            return connection
        pending = self._connecting.get(address)
        if pending is None:
            pending = asyncio.ensure_future(
                Connection.open(
                    address,
                    timeout=self.connect_timeout,
                    ssl=self.ssl,
                    credentials=self.credentials,
                )
            )
            self._connecting[address] = pending
            try:
                connection = await asyncio.shield(pending)
            finally:
                self._connecting.pop(address, None)
            if self._closed:
                connection.close()
                raise ConnectionError("client is closed")
            self._connections[address] = connection
            return connection
        return await asyncio.shield(pending)

    async def connection(self, node_id: int) -> Connection:
        address = self.metadata.brokers.get(node_id)
        if address is None:
            raise ConnectionError(f"node {node_id} is not in the cluster metadata")
        return await self.connection_to(address)

    async def any_connection(self) -> Connection:
        """A live connection to some node: known brokers first, then the bootstrap list."""
        errors: list[str] = []
        for address in self._candidates():
            try:
                return await self.connection_to(address)
            except ConnectionError as exc:
                errors.append(str(exc))
        raise ConnectionError(
            f"cannot reach any node of {','.join(self.bootstrap)} ({'; '.join(errors)})"
        )

    def _candidates(self) -> list[str]:
        live = [a for a, c in self._connections.items() if not c.closed]
        brokers = list(self.metadata.brokers.values())
        random.shuffle(brokers)
        seen: dict[str, None] = {}
        for address in [*live, *brokers, *self.bootstrap]:
            seen.setdefault(address, None)
        return list(seen)

    def drop_connection(self, address: str) -> None:
        """Forget a connection that failed so the next use dials again."""
        connection = self._connections.pop(address, None)
        if connection is not None:
            connection.close()

    def drop_node_connection(self, node_id: int) -> None:
        address = self.metadata.brokers.get(node_id)
        if address is not None:
            self.drop_connection(address)

    # metadata ----------------------------------------------------------------------------
    async def refresh_metadata(self, topics: Sequence[str] | None = None) -> ClusterMetadata:
        """Ask any node for metadata (every topic); concurrent callers share one request."""
        del topics  # the cache always holds every topic, so one answer serves all callers
        return await asyncio.shield(self.refresh_soon())

    def refresh_soon(self) -> asyncio.Future[ClusterMetadata]:
        """Start a metadata refresh in the background, or join the one running.

        For callers that must not wait (the producer's sender, the consumer's fetch loop); a
        failure surfaces to whoever awaits the future.
        """
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._fetch_metadata())
            self._refresh.add_done_callback(_retrieve_failure)
        return self._refresh

    async def _fetch_metadata(self) -> ClusterMetadata:
        last_error: BaseException | None = None
        for address in self._candidates():
            try:
                connection = await self.connection_to(address)
                reply, _ = await connection.request(
                    lambda body: body.init("metadata"), timeout=self.request_timeout
                )
            except (ConnectionError, LaminarError) as exc:
                if isinstance(exc, AuthenticationError | AuthorizationError):
                    raise  # another node would refuse the same credentials
                last_error = exc
                if isinstance(exc, ConnectionError):
                    self.drop_connection(address)
                continue
            self.metadata = metadata_from_reader(reply.body.metadata)
            self._leader_hints.clear()
            return self.metadata
        raise ConnectionError(
            f"cannot reach any node of {','.join(self.bootstrap)}"
            + (f" (last error: {last_error})" if last_error else "")
        )

    def topic(self, topic: str) -> TopicDescription:
        description = self.metadata.topics.get(topic)
        if description is None:
            raise UnknownTopicError(f"topic {topic!r} does not exist")
        return description

    def partitions_for(self, topic: str) -> list[int]:
        """Partition numbers of ``topic`` from the cache; UnknownTopicError if not there."""
        return [p.partition for p in self.topic(topic).partitions]

    async def wait_for_topic(self, topic: str, timeout: float) -> TopicDescription:
        """Refresh until ``topic`` appears (metadata lags a create briefly) or time runs out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.05
        while True:
            if topic in self.metadata.topics:
                return self.metadata.topics[topic]
            await self.refresh_metadata()
            if topic in self.metadata.topics:
                return self.metadata.topics[topic]
            if loop.time() + delay > deadline:
                raise UnknownTopicError(f"topic {topic!r} does not exist")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def leader_for(self, tp: TopicPartition) -> int:
        """Leader node id of ``tp`` (0 when none is known right now)."""
        hint = self._leader_hints.get(tp)
        if hint:
            return hint
        description = self.topic(tp.topic)
        partition = description.partition(tp.partition)
        if partition is None:
            raise UnknownPartitionError(
                f"topic {tp.topic!r} has no partition {tp.partition} "
                f"(it has {len(description.partitions)})"
            )
        return partition.leader

    def replicas_for(self, tp: TopicPartition) -> tuple[int, ...]:
        partition = self.topic(tp.topic).partition(tp.partition)
        if partition is None:
            raise UnknownPartitionError(f"topic {tp.topic!r} has no partition {tp.partition}")
        return partition.replicas

    def note_leader(self, tp: TopicPartition, leader_id: int, leader_address: str) -> bool:
        """Record a NotLeader hint; True when it names a node we can go to right away."""
        if not leader_id:
            self._leader_hints.pop(tp, None)
            return False
        if leader_address and leader_id not in self.metadata.brokers:
            self.metadata.brokers[leader_id] = leader_address
        if leader_id not in self.metadata.brokers:
            return False
        self._leader_hints[tp] = leader_id
        return True

    def close(self) -> None:
        self._closed = True
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
        for connection in self._connections.values():
            connection.close()
        self._closing = list(self._connections.values())
        self._connections.clear()

    async def wait_closed(self) -> None:
        """Wait until what close() left in socket buffers is written (acks=none needs it)."""
        await asyncio.gather(*(c.wait_closed() for c in self._closing))


def _retrieve_failure(future: asyncio.Future[ClusterMetadata]) -> None:
    """Background refreshes may fail unobserved; the next request reports what is wrong."""
    if not future.cancelled():
        future.exception()
