"""The two share-group requests as the client sends them: shareFetch and describeQueue.

Both go to the leader of the partitions they name (the caller groups partitions by leader).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from laminar.client.connection import Connection, Reply
from laminar.client.types import TopicPartition


class WireAck(NamedTuple):
    """One settlement as it goes on the wire (the receipt is this member's delivery)."""

    topic: str
    partition: int
    offset: int
    delivery_count: int
    action: int  # 0 ack, 1 release, 2 reject, 3 extend
    ms: int


async def share_fetch(
    connection: Connection,
    group: str,
    member_id: str,
    tps: Sequence[TopicPartition],
    *,
    max_records: int,
    lock_ms: int,
    max_wait_ms: int,
    acks: Sequence[WireAck],
    from_earliest: bool,
    timeout: float,
) -> Reply:
    """Settle ``acks`` (results in request order), then acquire up to ``max_records`` from
    ``tps``, long-polling up to ``max_wait_ms`` while none is available."""

    def fill(body: Any) -> None:
        request = body.init("shareFetch")
        request.group = group
        request.memberId = member_id
        parts = request.init("partitions", len(tps))
        for part, tp in zip(parts, tps, strict=True):
            part.topic, part.partition = tp.topic, tp.partition
        request.maxRecords = max_records
        request.lockMs = lock_ms
        request.maxWaitMs = max_wait_ms
        request.fromEarliest = from_earliest
        slots = request.init("acks", len(acks))
        for slot, ack in zip(slots, acks, strict=True):
            slot.topic, slot.partition, slot.offset = ack.topic, ack.partition, ack.offset
            slot.deliveryCount, slot.action, slot.ms = ack.delivery_count, ack.action, ack.ms

    return await connection.request(fill, timeout=timeout)


async def describe_queue(
    connection: Connection, group: str, tps: Sequence[TopicPartition], timeout: float
) -> Any:
    """The node's QueueDescription reader for ``tps`` (partitions it leads)."""

    def fill(body: Any) -> None:
        request = body.init("describeQueue")
        request.group = group
        parts = request.init("partitions", len(tps))
        for part, tp in zip(parts, tps, strict=True):
            part.topic, part.partition = tp.topic, tp.partition

    reply, _ = await connection.request(fill, timeout=timeout)
    return reply.body.queue
