"""``Admin.describe_queue``: ask each partition's leader for the share group's state there;
and the reading of a group's settings (``Admin.describe_queue_config``)."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from laminar.client.cluster import Cluster
from laminar.client.consumer import fetch_partition
from laminar.client.offsets import list_offsets, target_node
from laminar.client.queue_types import QueueConfig, QueueDescription, QueuePartitionStatus
from laminar.client.retry import retrying
from laminar.client.share_wire import describe_queue as describe_request
from laminar.client.types import TopicPartition
from laminar.errors import LaminarError, NotLeaderError
from laminar.protocol import EARLIEST, LATEST, read_error
from laminar.segment.batch import is_control, iter_batches

COUNT_FETCH_BYTES = 1 << 20
COUNT_SCAN_BYTES = 64 << 20


def config_from_reader(reader: Any) -> QueueConfig:
    """A QueueConfig reply (laminar/queues/config_wire.py) as a ``QueueConfig``."""
    values = {entry.name: entry.value for entry in reader.entries}
    return QueueConfig(
        group=reader.group,
        lock_ms=int(values["lock_ms"]),
        max_deliveries=int(values["max_deliveries"]),
        dead_letter_topic=values["dead_letter_topic"],
        overridden=tuple(entry.name for entry in reader.entries if not entry.isDefault),
    )


async def describe_queue(
    cluster: Cluster, group: str, topic: str, config: QueueConfig
) -> QueueDescription:
    description = await cluster.wait_for_topic(topic, 5.0)
    tps = [TopicPartition(topic, p.partition) for p in description.partitions]
    rows: dict[TopicPartition, QueuePartitionStatus] = {}

    async def ask(node: int, wanted: list[TopicPartition]) -> None:
        connection = await cluster.connection(node)
        answer = await describe_request(connection, group, wanted, cluster.request_timeout)
        first_error: LaminarError | None = None
        for p in answer.partitions:
            tp = TopicPartition(p.topic, p.partition)
            error = read_error(p.error)
            if error is not None:
                if isinstance(error, NotLeaderError):
                    cluster.note_leader(tp, error.leader_id, error.leader_address)
                first_error = first_error or error
                continue
            rows[tp] = QueuePartitionStatus(
                tp.topic,
                tp.partition,
                p.start,
                p.end,
                p.available,
                p.acquired,
                p.delayed,
                p.deadLettering,
                p.oldestUnackedMs,
            )
        if first_error is not None:
            raise first_error

    async def attempt() -> None:
        by_node: dict[int, list[TopicPartition]] = defaultdict(list)
        for tp in tps:
            if tp not in rows:
                by_node[target_node(cluster, tp)].append(tp)
        await asyncio.gather(*(ask(node, wanted) for node, wanted in by_node.items()))

    await retrying(cluster, attempt)
    dlq = config.dead_letter_topic
    dead_lettered = 0
    if dlq not in cluster.metadata.topics:  # created by the first dead letter: maybe since
        await cluster.refresh_metadata()
    if dlq in cluster.metadata.topics:
        for number in cluster.partitions_for(dlq):
            dead_lettered += await count_records(cluster, TopicPartition(dlq, number))
    partitions = tuple(rows[tp] for tp in tps)
    return QueueDescription(group, topic, partitions, dlq, dead_lettered, config)


async def count_records(cluster: Cluster, tp: TopicPartition) -> int:
    """Data records retained in ``tp``: its offsets minus those of control batches (a Raft
    no-op per leader election takes one). Only batch headers are looked at; past
    ``COUNT_SCAN_BYTES`` the rest of the offsets are counted as records."""
    start = (await list_offsets(cluster, [tp], EARLIEST))[tp]
    end = (await list_offsets(cluster, [tp], LATEST))[tp]
    count, offset, scanned = 0, start, 0

    async def read() -> tuple[memoryview, int, int] | None:
        connection = await cluster.connection(target_node(cluster, tp))
        return await fetch_partition(
            connection, tp, offset, COUNT_FETCH_BYTES, 0, cluster.request_timeout
        )

    while offset < end and scanned < COUNT_SCAN_BYTES:
        got = await retrying(cluster, read)
        if got is None or not len(got[0]):
            break
        data = got[0]
        scanned += len(data)
        for _position, header in iter_batches(data):
            last = header.base_offset + header.last_offset_delta
            if last >= offset and not is_control(header):
                count += last + 1 - max(header.base_offset, offset)
            offset = max(offset, last + 1)
    return count + max(end - offset, 0)
