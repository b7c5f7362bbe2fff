"""The share-group requests as the client sends them: shareFetch and describeQueue go to the
leader of the partitions they name (the caller groups partitions by leader); alterQueueConfig
and describeQueueConfig to any node (settings are cluster metadata).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from laminar.client.connection import Connection, Reply
from laminar.client.types import TopicPartition
from laminar.errors import LaminarError
from laminar.protocol import read_error


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
        request.acquiredRuns = True
        if acks:
            runs = ack_runs(acks)
            slots = request.init("ackRuns", len(runs))
            for slot, (ack, count) in zip(slots, runs, strict=True):
                slot.topic, slot.partition, slot.offset = ack.topic, ack.partition, ack.offset
                slot.count, slot.deliveryCount = count, ack.delivery_count
                slot.action, slot.ms = ack.action, ack.ms

    return await connection.request(fill, timeout=timeout)


def ack_runs(acks: Sequence[WireAck]) -> list[tuple[WireAck, int]]:
    """``acks`` as runs (first ack, count): neighbours in the list that settle consecutive
    offsets of one partition alike become one run (the request order is kept)."""
    runs: list[tuple[WireAck, int]] = []
    first: WireAck | None = None
    count = 0
    for ack in acks:
        if (
            first is not None
            and ack.offset == first.offset + count
            and ack.partition == first.partition
            and ack.delivery_count == first.delivery_count
            and ack.action == first.action
            and ack.ms == first.ms
            and ack.topic == first.topic
        ):
            count += 1
            continue
        if first is not None:
            runs.append((first, count))
        first, count = ack, 1
    if first is not None:
        runs.append((first, count))
    return runs


def ack_errors(body: Any, acks: Sequence[WireAck]) -> list[LaminarError | None]:
    """The result of each of ``acks`` (as sent by ``share_fetch``) from a ShareFetchResponse."""
    runs = ack_runs(acks)
    results = body.ackRunResults
    if len(results) != len(runs):
        raise LaminarError("share fetch reply has the wrong number of results")
    out: list[LaminarError | None] = []
    for (first, count), result in zip(runs, results, strict=True):
        error = read_error(result.error)
        if error is not None:
            out += [error] * count
            continue
        failed = result.failed
        if not len(failed):
            out += [None] * count
            continue
        mine: list[LaminarError | None] = [None] * count
        for f in failed:
            i = f.offset - first.offset
            if 0 <= i < count:
                mine[i] = read_error(f.error)
        out += mine
    return out


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


def alter_queue_config(
    body: Any, group: str, changes: dict[str, str], reset: Sequence[str]
) -> None:
    """Fill ``body`` with an alterQueueConfig request (values as decimal text)."""
    request = body.init("alterQueueConfig")
    request.group = group
    for slot, (name, value) in zip(
        request.init("entries", len(changes)), changes.items(), strict=True
    ):
        slot.name, slot.value = name, value
    request.reset = list(reset)


def describe_queue_config(body: Any, group: str) -> None:
    body.describeQueueConfig = group
