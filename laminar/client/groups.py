"""Consumer-group requests: find the group's coordinator and make one typed call each.

The coordinator of group ``g`` is the leader of partition ``crc32c(g) % N`` of the internal
topic ``__consumer_offsets``. Until that topic exists any node takes the request, creates the
topic and answers NotLeader, so a metadata refresh and another try reach the coordinator.
NotLeader naming the shard's leader is followed at once; other retriable errors (timeouts,
a coordinator rebuilding its state, connection loss) wait, refresh metadata and try again
until the deadline. Membership errors (unknown member, fenced, stale epoch) are raised: only
the caller knows what they mean for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import crc32c

from laminar.client.cluster import Cluster
from laminar.client.connection import Connection
from laminar.client.group_types import (
    CommittedOffset,
    GroupDescription,
    GroupSummary,
    HeartbeatReply,
    OffsetAndMetadata,
    committed_from_reader,
    description_from_reader,
    heartbeat_from_reader,
    summaries_from_reader,
)
from laminar.client.log import get_logger
from laminar.client.types import TopicPartition
from laminar.errors import (
    LaminarError,
    NotCoordinatorError,
    NotEnoughReplicasError,
    NotLeaderError,
    RequestTimeoutError,
)

log = get_logger(__name__)

OFFSETS_TOPIC = "__consumer_offsets"
T = TypeVar("T")

RETRY_BACKOFF = 0.05
MAX_BACKOFF = 1.0
MAX_HOPS = 3


def coordinator_shard(group: str, shards: int) -> int:
    """The partition of ``__consumer_offsets`` whose leader coordinates ``group``."""
    return crc32c.crc32c(group.encode()) % shards


def is_retriable_group_error(error: BaseException) -> bool:
    return isinstance(
        error,
        NotLeaderError
        | NotCoordinatorError
        | RequestTimeoutError
        | NotEnoughReplicasError
        | ConnectionError
        | OSError,
    )


def _fill_partitions(builder: Any, name: str, tps: Iterable[TopicPartition]) -> None:
    items = sorted(tps)
    slots = builder.init(name, len(items))
    for slot, (topic, partition) in zip(slots, items, strict=True):
        slot.topic = topic
        slot.partition = partition


class GroupClient:
    """Typed calls for every group request over one Cluster (shared with its owner)."""

    def __init__(self, cluster: Cluster, *, timeout: float | None = None) -> None:
        self.cluster = cluster
        self.timeout = cluster.request_timeout if timeout is None else timeout

    # routing -----------------------------------------------------------------------------
    def coordinator_partition(self, group: str) -> TopicPartition | None:
        """The shard of ``group`` if the internal topic is known, else None."""
        description = self.cluster.metadata.topics.get(OFFSETS_TOPIC)
        if description is None or not description.partitions:
            return None
        return TopicPartition(OFFSETS_TOPIC, coordinator_shard(group, len(description.partitions)))

    async def _coordinator_connection(self, group: str) -> tuple[Connection, TopicPartition | None]:
        tp = self.coordinator_partition(group)
        leader = self.cluster.leader_for(tp) if tp is not None else 0
        if leader:
            return await self.cluster.connection(leader), tp
        return await self.cluster.any_connection(), tp

    async def _call(
        self,
        group: str,
        fill: Callable[[Any], None],
        convert: Callable[[Any], T],
        *,
        timeout: float | None = None,
    ) -> T:
        """Send to ``group``'s coordinator, retrying until ``timeout``."""
        loop = asyncio.get_running_loop()
        budget = self.timeout if timeout is None else timeout
        deadline = loop.time() + budget
        delay = RETRY_BACKOFF
        hops = 0  # NotLeader hints followed without a pause (bounded: hints can be stale)
        while True:
            tp: TopicPartition | None = None
            address = ""
            try:
                target, tp = await self._coordinator_connection(group)
                address = target.address
                remaining = max(deadline - loop.time(), 0.05)
                reply, _ = await target.request(fill, timeout=min(remaining, self.timeout))
                return convert(reply.body)
            except (ConnectionError, OSError, LaminarError) as exc:
                if not is_retriable_group_error(exc) or loop.time() >= deadline:
                    raise
                if isinstance(exc, ConnectionError | OSError) and address:
                    self.cluster.drop_connection(address)
                log.debug("group request retry", group=group, error=str(exc))
                if (
                    isinstance(exc, NotLeaderError)
                    and tp is not None
                    and self.cluster.note_leader(tp, exc.leader_id, exc.leader_address)
                    and self.cluster.leader_for(tp) != _node_of(self.cluster, address)
                    and hops < MAX_HOPS
                ):
                    hops += 1
                    continue  # told where the coordinator is: go there now
                hops = 0
                await asyncio.sleep(min(delay, max(deadline - loop.time(), 0)))
                delay = min(delay * 2, MAX_BACKOFF)
                try:
                    await self.cluster.refresh_metadata()
                except (ConnectionError, LaminarError) as refresh_error:
                    log.debug("metadata refresh failed", error=str(refresh_error))

    # requests ----------------------------------------------------------------------------
    async def heartbeat(
        self,
        group: str,
        member_id: str,
        member_epoch: int,
        *,
        topics: Iterable[str],
        owned: Iterable[TopicPartition],
        rebalance_timeout_ms: int,
        instance_id: str | None = None,
        rack: str | None = None,
        timeout: float | None = None,
    ) -> HeartbeatReply:
        """Join (epoch 0) or heartbeat; the reply says what the member may own now."""
        subscribed = sorted(set(topics))
        owned = list(owned)

        def fill(body: Any) -> None:
            request = body.init("groupHeartbeat")
            request.group = group
            request.memberId = member_id
            request.memberEpoch = member_epoch
            request.instanceId = instance_id or ""
            request.rack = rack or ""
            request.rebalanceTimeoutMs = rebalance_timeout_ms
            request.topics = subscribed
            _fill_partitions(request, "owned", owned)

        return await self._call(
            group, fill, lambda b: heartbeat_from_reader(b.groupHeartbeat), timeout=timeout
        )

    async def leave(
        self,
        group: str,
        member_id: str,
        member_epoch: int,
        *,
        keep_assignment: bool = False,
        timeout: float | None = None,
    ) -> None:
        def fill(body: Any) -> None:
            request = body.init("leaveGroup")
            request.group = group
            request.memberId = member_id
            request.memberEpoch = member_epoch
            request.keepAssignment = keep_assignment

        await self._call(group, fill, lambda _b: None, timeout=timeout)

    async def commit(
        self,
        group: str,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int],
        *,
        member_id: str = "",
        member_epoch: int = -1,
        timeout: float | None = None,
    ) -> None:
        """Store committed offsets (all or none), acknowledged once replicated. Without a
        member id it commits from outside the group (only while the group has no members)."""
        items = sorted((TopicPartition(*tp), _as_offset(v)) for tp, v in offsets.items())

        def fill(body: Any) -> None:
            request = body.init("commitOffsets")
            request.group = group
            request.memberId = member_id
            request.memberEpoch = member_epoch
            slots = request.init("offsets", len(items))
            for slot, (tp, value) in zip(slots, items, strict=True):
                slot.topic = tp.topic
                slot.partition = tp.partition
                slot.offset = value.offset
                slot.metadata = value.metadata

        await self._call(group, fill, lambda _b: None, timeout=timeout)

    async def fetch_offsets(
        self,
        group: str,
        partitions: Iterable[TopicPartition] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets of ``group`` (all, or those of ``partitions`` that have one)."""
        wanted = list(partitions) if partitions is not None else []
        if partitions is not None and not wanted:
            return {}

        def fill(body: Any) -> None:
            request = body.init("fetchOffsets")
            request.group = group
            _fill_partitions(request, "partitions", wanted)

        rows = await self._call(
            group, fill, lambda b: committed_from_reader(b.offsets.offsets), timeout=timeout
        )
        return {TopicPartition(o.topic, o.partition): o for o in rows}

    async def describe_group(self, group: str, *, timeout: float | None = None) -> GroupDescription:
        def fill(body: Any) -> None:
            body.describeGroup = group

        return await self._call(
            group, fill, lambda b: description_from_reader(b.group), timeout=timeout
        )

    async def delete_group(self, group: str, *, timeout: float | None = None) -> None:
        """Delete a group with no members and its offsets (GroupNotEmptyError otherwise)."""

        def fill(body: Any) -> None:
            body.deleteGroup = group

        await self._call(group, fill, lambda _b: None, timeout=timeout)

    async def list_groups(self, *, timeout: float | None = None) -> list[GroupSummary]:
        """Every node answers the groups it coordinates: ask them all and merge."""
        metadata = await self.cluster.refresh_metadata()

        def fill(body: Any) -> None:
            body.listGroups = None

        budget = self.timeout if timeout is None else timeout

        async def ask(address: str) -> list[GroupSummary]:
            # One try each: a node that cannot be reached coordinates nothing (its shards'
            # leadership moves to live nodes, which then list those groups).
            try:
                connection = await self.cluster.connection_to(address)
                reply, _ = await connection.request(fill, timeout=budget)
            except (ConnectionError, OSError, RequestTimeoutError) as exc:
                log.debug("list groups: node unreachable", address=address, error=str(exc))
                self.cluster.drop_connection(address)
                return []
            return summaries_from_reader(reply.body.groups)

        answers = await asyncio.gather(*(ask(a) for a in sorted(set(metadata.brokers.values()))))
        merged: dict[str, GroupSummary] = {}
        for answer in answers:
            for summary in answer:
                merged.setdefault(summary.group, summary)
        return [merged[name] for name in sorted(merged)]


def _as_offset(value: OffsetAndMetadata | int | tuple[int, str]) -> OffsetAndMetadata:
    if isinstance(value, int):
        return OffsetAndMetadata(value, "")
    offset, metadata = value
    return OffsetAndMetadata(offset, metadata)


def _node_of(cluster: Cluster, address: str) -> int:
    for node_id, known in cluster.metadata.brokers.items():
        if known == address:
            return node_id
    return 0
