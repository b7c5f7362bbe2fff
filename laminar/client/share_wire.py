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


class AckRun(NamedTuple):
    """``count`` settlements of consecutive offsets of one partition from ``offset``, with one
    receipt delivery count, action and ms, as they go on the wire (a ShareAckRun)."""

    topic: str
    partition: int
    offset: int
    count: int
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
    acks: Sequence[AckRun],
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
            slots = request.init("ackRuns", len(acks))
            for slot, run in zip(slots, acks, strict=True):
                slot.topic, slot.partition, slot.offset = run.topic, run.partition, run.offset
                slot.count, slot.deliveryCount = run.count, run.delivery_count
                slot.action, slot.ms = run.action, run.ms

    return await connection.request(fill, timeout=timeout)


def ack_errors(body: Any, runs: Sequence[AckRun]) -> list[list[LaminarError | None] | None]:
    """Per run of ``runs`` (as sent by ``share_fetch``), from a ShareFetchResponse: None when
    all of it was settled, else the result of each of its settlements."""
    results = body.ackRunResults
    if len(results) != len(runs):
        raise LaminarError("share fetch reply has the wrong number of results")
    out: list[list[LaminarError | None] | None] = []
    for run, result in zip(runs, results, strict=True):
        error = read_error(result.error)
        if error is not None:
            out.append([error] * run.count)
            continue
        failed = result.failed
        if not len(failed):
            out.append(None)
            continue
        mine: list[LaminarError | None] = [None] * run.count
        for f in failed:
            i = f.offset - run.offset
            if 0 <= i < run.count:
                mine[i] = read_error(f.error)
        out.append(mine)
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
