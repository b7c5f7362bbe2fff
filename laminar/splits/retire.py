"""When a sealed partition may retire: the metadata leader's decision, sans-I/O.

A sealed partition (``ops.py``) stays readable until retention has removed its records. Its
seal batch ends a segment (``LogStorage`` rolls right after it), so retention can delete every
segment of it; the log then starts at or past its ``seal_end``. Each node reports the log
start of the sealed replicas it hosts (``split_starts`` peer call, as ``split_load`` reports
load); once *every* replica of a partition starts at or past its seal end, nothing of it can
be read anywhere, and the leader proposes ``retire_partition`` (``ops.retire``). A partition
whose own parents are not retired yet waits for them (their records are older; its children
must not become parentless before readers finished those). No state is kept here: the
reports are facts read afresh each round, and the command is idempotent, so a new metadata
leader simply decides again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from laminar.splits.ops import RANGE, SEALED

Report = tuple[int, int, int]
"""(topic id, partition, node) of one replica."""


def sealed_replicas(topics: Iterable[Any], node: int) -> list[tuple[str, int, int]]:
    """(topic name, topic id, partition) of the sealed partitions ``node`` holds a replica of."""
    return [
        (topic.name, topic.topic_id, index)
        for topic in topics
        if topic.settings.partitioning == RANGE
        for index, assignment in enumerate(topic.partitions)
        if assignment.state == SEALED and node in assignment.replicas
    ]


def retention_upto(replica: Any, topics: Mapping[str, Any]) -> int:
    """How far retention may delete in ``replica``'s log: up to its high watermark, but not
    the seal before the metadata shows the partition sealed. Until ``finish_op`` commits, the
    seal in the log is what refuses writes (``PartitionIO.append``); a log reopened without it
    would take writes past the end the split driver was told."""
    upto: int = replica.high_watermark
    seal = replica.storage.seal_offset
    if seal is None:
        return upto
    topic = topics.get(replica.topic)
    partitions = topic.partitions if topic is not None else []
    if replica.partition < len(partitions) and partitions[replica.partition].state == SEALED:
        return upto
    return min(upto, seal)


def retirable(topics: Iterable[Any], starts: Mapping[Report, int]) -> list[tuple[int, int]]:
    """(topic id, partition) of every sealed partition that may retire now: no move under
    way, no parent left, and each of its replicas reported a log start at or past its seal
    end (a replica that did not report holds it back)."""
    out = []
    for topic in topics:
        if topic.settings.partitioning != RANGE:
            continue
        for index, a in enumerate(topic.partitions):
            if a.state != SEALED or a.moving or a.parents or not a.replicas or a.seal_end < 0:
                continue
            if all(starts.get((topic.topic_id, index, n), -1) >= a.seal_end for n in a.replicas):
                out.append((topic.topic_id, index))
    return out


def retire_command(topic_id: int, partition: int) -> dict[str, Any]:
    """The metadata command. It is idempotent by itself (retiring a retired partition changes
    nothing), so each round's proposal gets a fresh request id: a refusal (a move started
    meanwhile) is not remembered against a later, valid attempt."""
    return {"op": "retire_partition", "topic_id": topic_id, "partition": partition}
