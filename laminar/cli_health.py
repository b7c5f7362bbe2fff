"""The top of `laminar cluster status`: partitions that need an operator's eye first.

A partition is *leaderless* when no live node reports leading it (the status lists only
partitions whose leader answered); it is *under-replicated* when one of its replicas is on a
node the gossip does not call alive, is not serving (a storage fault, lost state), or is
unknown to its leader, or when it has fewer replicas than its topic's replication factor.
Lag alone does not count: under load a healthy follower is always a little behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from laminar.client.descriptions import ClusterStatus, PartitionStatus, TopicDescription


@dataclass(slots=True, frozen=True)
class UnderReplicated:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    out_of_sync: tuple[tuple[int, str], ...]
    """(node, why) for each replica not in sync."""


@dataclass(slots=True, frozen=True)
class Leaderless:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    recorded_leader: int


def under_replicated(
    status: ClusterStatus, topics: Sequence[TopicDescription] = ()
) -> list[UnderReplicated]:
    states = {m.node_id: m.state for m in status.members}
    faults = {(f.topic, f.partition, f.node_id): f.state for f in status.faults}
    factor = {t.name: t.replication_factor for t in topics}
    out = []
    for part in status.partitions:
        why: list[tuple[int, str]] = []
        for replica in part.replicas:
            state = states.get(replica.node_id, "unknown")
            fault = faults.get((part.topic, part.partition, replica.node_id))
            if fault is not None:
                why.append((replica.node_id, fault))
            elif not state.startswith("alive"):
                why.append((replica.node_id, state))
            elif replica.match_offset < 0 and part.end_offset > 0:
                why.append((replica.node_id, "no progress known"))
        missing = factor.get(part.topic, 0) - len(part.replicas)
        if missing > 0:
            why.append((0, f"{missing} replica(s) short of the replication factor"))
        if why:
            out.append(_under(part, tuple(why)))
    return out


def _under(part: PartitionStatus, why: tuple[tuple[int, str], ...]) -> UnderReplicated:
    replicas = tuple(r.node_id for r in part.replicas)
    return UnderReplicated(part.topic, part.partition, part.leader, replicas, why)


def leaderless(status: ClusterStatus, topics: Sequence[TopicDescription]) -> list[Leaderless]:
    led = {(p.topic, p.partition) for p in status.partitions if p.leader}
    return [
        Leaderless(topic.name, part.partition, part.replicas, part.leader)
        for topic in sorted(topics, key=lambda t: t.name)
        for part in topic.partitions
        if (topic.name, part.partition) not in led
    ]


def render_health(
    status: ClusterStatus,
    topics: Sequence[TopicDescription],
    render_table: Callable[[list[list[str]]], str],
) -> list[str]:
    """Lines for the top of the status: a summary, then the two lists when not empty
    (``render_table`` is the CLI's, so everything keeps one look)."""
    under = under_replicated(status, topics)
    without = leaderless(status, topics) if topics else []
    summary = f"under-replicated partitions: {len(under)}"
    summary += f", leaderless partitions: {len(without)}" if topics else ""
    lines = [summary]
    if without:
        rows = [["TOPIC", "PART", "REPLICAS", "LAST LEADER"]]
        rows += [
            [
                p.topic,
                str(p.partition),
                ",".join(map(str, p.replicas)),
                str(p.recorded_leader or "none"),
            ]
            for p in without
        ]
        lines += ["", f"leaderless partitions ({len(without)})", render_table(rows)]
    if under:
        rows = [["TOPIC", "PART", "LEADER", "REPLICAS", "NOT IN SYNC"]]
        rows += [
            [
                p.topic,
                str(p.partition),
                str(p.leader),
                ",".join(map(str, p.replicas)),
                "; ".join(f"{n}: {why}" if n else why for n, why in p.out_of_sync),
            ]
            for p in under
        ]
        lines += ["", f"under-replicated partitions ({len(under)})", render_table(rows)]
    return [*lines, ""]
