"""ListOffsets: earliest, latest (high watermark) or first offset at a timestamp, per partition.

Shared by Consumer (seeks) and Admin. Each query goes to the partition's leader; queries for
partitions led by one node share one request.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from laminar.client.cluster import Cluster
from laminar.client.retry import retrying
from laminar.client.types import TopicPartition
from laminar.errors import LaminarError, PartitionRetiredError
from laminar.protocol import read_error


def target_node(cluster: Cluster, tp: TopicPartition) -> int:
    """The leader of ``tp``, else one of its replicas (they answer up to their commit)."""
    leader = cluster.leader_for(tp)
    if leader:
        return leader
    replicas = cluster.replicas_for(tp)
    if replicas:
        return replicas[0]
    if any(
        p.partition == tp.partition and p.state == "retired"
        for p in cluster.topic(tp.topic).partitions
    ):
        raise PartitionRetiredError(
            f"{tp.topic}/{tp.partition} was retired: retention removed all its records"
        )
    raise ConnectionError(f"{tp.topic}/{tp.partition} has no replica known yet")


async def list_offsets(
    cluster: Cluster, tps: Sequence[TopicPartition], timestamp: int
) -> dict[TopicPartition, int]:
    """Offset per partition for ``timestamp`` (-2 earliest, -1 latest, else ms; -1 = none)."""
    answers: dict[TopicPartition, int] = {}

    async def attempt() -> dict[TopicPartition, int]:
        by_node: dict[int, list[TopicPartition]] = defaultdict(list)
        for tp in tps:
            if tp not in answers:
                by_node[target_node(cluster, tp)].append(tp)
        await asyncio.gather(
            *(_ask(cluster, node, group, timestamp, answers) for node, group in by_node.items())
        )
        return answers

    await retrying(cluster, attempt)
    missing = [tp for tp in tps if tp not in answers]
    if missing:
        raise LaminarError(f"no offset answer for {', '.join(map(str, missing))}")
    return {tp: answers[tp] for tp in tps}


async def _ask(
    cluster: Cluster,
    node_id: int,
    tps: list[TopicPartition],
    timestamp: int,
    answers: dict[TopicPartition, int],
) -> None:
    def fill(body: Any) -> None:
        queries = body.init("listOffsets").init("queries", len(tps))
        for query, tp in zip(queries, tps, strict=True):
            query.topic = tp.topic
            query.partition = tp.partition
            query.timestamp = timestamp

    connection = await cluster.connection(node_id)
    reply, _ = await connection.request(fill, timeout=cluster.request_timeout)
    first_error = None
    for answer in reply.body.listOffsets.answers:
        tp = TopicPartition(answer.topic, answer.partition)
        error = read_error(answer.error)
        if error is None:
            answers[tp] = answer.offset
        elif first_error is None:
            first_error = error
    if first_error is not None:
        raise first_error
