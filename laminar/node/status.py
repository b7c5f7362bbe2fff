"""What `laminar cluster status` shows: each leader's view of its partitions, gathered."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from laminar.node.metadata import METADATA_GROUP, Topic, group_id

if TYPE_CHECKING:
    from laminar.node.node import Node


def local_status(node: Node) -> list[dict[str, Any]]:
    """Status of every partition this node leads (leaders know their followers' lag)."""
    out = []
    for replica in node.runtime.replicas.values():
        if replica.group == METADATA_GROUP or not replica.is_leader:
            continue
        status = replica.raft.status()
        end = replica.log.end_offset
        replicas = []
        for node_id in (*replica.raft.conf.voters, *replica.raft.conf.learners):
            if node_id == node.node_id:
                match = end - 1
            else:
                progress = status.progress.get(node_id)
                match = progress.match if progress is not None else -1
            replicas.append({"node_id": node_id, "match": match, "lag": end - 1 - match})
        out.append(
            {
                "topic": replica.topic,
                "partition": replica.partition,
                "leader": node.node_id,
                "term": replica.raft.term,
                "start_offset": replica.log.start_offset,
                "high_watermark": replica.high_watermark,
                "end_offset": end,
                "replicas": replicas,
            }
        )
    return out


def move_stage(node: Node, topic: Topic, partition: int) -> str:
    """Where a move stands, as far as this node can tell."""
    replica = node.runtime.replicas.get(group_id(topic.topic_id, partition))
    assignment = topic.partitions[partition]
    if replica is None or not replica.is_leader:
        return "in progress"
    conf = replica.raft.conf
    if assignment.adding in conf.learners:
        return "target catching up"
    if assignment.adding in conf.voters and assignment.removing in conf.voters:
        return "removing source"
    if assignment.adding in conf.voters:
        return "finishing"
    return "adding target"


async def cluster_partitions(node: Node) -> list[dict[str, Any]]:
    """Gather every leader's view of its partitions from all connected nodes."""
    peers = [n for n in node.live_nodes() if n != node.node_id]
    results = await asyncio.gather(
        *(node.calls.call(n, "status", None, timeout=2.0) for n in peers),
        return_exceptions=True,
    )
    partitions = local_status(node)
    for result in results:
        if isinstance(result, list):
            partitions.extend(result)
    partitions.sort(key=lambda p: (p["topic"], p["partition"]))
    return partitions
