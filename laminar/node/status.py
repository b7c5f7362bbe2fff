"""What `laminar cluster status` shows: each leader's view of its partitions, and every node's
replicas that are not serving (offline after a fault, or lost state and awaiting re-admission),
gathered."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from laminar.node.metadata import METADATA_GROUP, Topic, group_id

if TYPE_CHECKING:
    from laminar.node.node import Node


def local_status(node: Node) -> dict[str, list[dict[str, Any]]]:
    """This node's part of the cluster status (the peer "status" call answers with it)."""
    return {
        "partitions": led_partitions(node),
        "faults": replica_faults(node),
        "metadata_log": metadata_log(node),
    }


def metadata_log(node: Node) -> list[dict[str, Any]]:
    """This node's metadata log: where it starts (a checkpoint, once cut) and ends."""
    replica = node.metadata
    if replica is None or replica.closed:
        return []
    service = node.metadata_service
    return [
        {
            "node_id": node.node_id,
            "start_offset": replica.log.start_offset,
            "end_offset": replica.log.end_offset,
            "checkpoint": service.checkpoint_index,
            "applied": service.applied,
            "size_bytes": replica.log.size_bytes,
        }
    ]


_LOG_FIELDS = ("node_id", "start_offset", "end_offset", "checkpoint", "applied", "size_bytes")


def _log_row(row: Any) -> bool:
    return isinstance(row, dict) and all(type(row.get(f)) is int for f in _LOG_FIELDS)


def fill_metadata_log(slot: Any, row: dict[str, Any]) -> None:
    """A MetadataLogStatus from a ``metadata_log`` row (checked by ``cluster_view``)."""
    slot.nodeId = int(row["node_id"])
    slot.startOffset = int(row["start_offset"])
    slot.endOffset = int(row["end_offset"])
    slot.checkpoint = int(row["checkpoint"])
    slot.applied = int(row["applied"])
    slot.sizeBytes = max(0, int(row["size_bytes"]))


def fill_fault(slot: Any, row: dict[str, Any]) -> None:
    """A ReplicaFault from a ``replica_faults`` row."""
    slot.topic = row["topic"]
    slot.partition = row["partition"]
    slot.nodeId = row["node_id"]
    slot.state = row["state"]
    slot.error = row["error"]


LOST_STATE = "lost state: re-admitting (not voting)"


def replica_faults(node: Node) -> list[dict[str, Any]]:
    """Replicas of this node that are offline after a fault, or hosted but lost their state
    and not yet re-admitted by their group (amnesia.py: they grant no vote meanwhile)."""
    out = [
        {
            "topic": fault.topic,
            "partition": fault.partition,
            "node_id": node.node_id,
            "state": fault.state,
            "error": fault.error,
        }
        for fault in node.repair.faults.values()
    ]
    for group in sorted(node.amnesia.gated):
        replica = node.runtime.replicas.get(group)
        if replica is not None:
            out.append(
                {
                    "topic": replica.topic,
                    "partition": replica.partition,
                    "node_id": node.node_id,
                    "state": LOST_STATE,
                    "error": f"incident {node.amnesia.incident(group)}",
                }
            )
    return out


def led_partitions(node: Node) -> list[dict[str, Any]]:
    """Status of every partition this node leads (leaders know their followers' lag). Read
    from the Raft cores directly: at 10,000 partitions every status call passes over all of
    them on every node."""
    me = node.node_id
    out = []
    for replica in node.runtime.replicas.values():
        if replica.group == METADATA_GROUP or not replica.is_leader:
            continue
        raft = replica.raft
        matches = raft.matches()
        last = replica.log.end_offset - 1
        conf = raft.conf
        replicas = []
        for node_id in (*conf.voters, *conf.learners):
            match = last if node_id == me else matches.get(node_id, -1)
            replicas.append({"node_id": node_id, "match": match, "lag": last - match})
        out.append(
            {
                "topic": replica.topic,
                "partition": replica.partition,
                "leader": me,
                "term": raft.term,
                "start_offset": replica.log.start_offset,
                "high_watermark": replica.high_watermark,
                "end_offset": last + 1,
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
    if not assignment.target_ready:
        return "waiting for target"
    return "adding target"


async def cluster_view(node: Node) -> dict[str, list[dict[str, Any]]]:
    """Gather every leader's view of its partitions, and every node's replica faults, from all
    connected nodes."""
    peers = [n for n in node.live_nodes() if n != node.node_id]
    results = await asyncio.gather(
        *(node.calls.call(n, "status", None, timeout=2.0) for n in peers),
        return_exceptions=True,
    )
    view = local_status(node)
    for result in results:
        if isinstance(result, dict):
            for key, rows in view.items():
                rows.extend(result.get(key, []))
    view["partitions"].sort(key=lambda p: (p["topic"], p["partition"]))
    view["faults"].sort(key=lambda f: (f["topic"], f["partition"], f["node_id"]))
    view["metadata_log"] = [m for m in view["metadata_log"] if _log_row(m)]
    view["metadata_log"].sort(key=lambda m: m["node_id"])
    return view
