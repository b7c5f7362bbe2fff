"""Key-range lineage for consumer groups: which partitions a group may be given now.

A split or merge seals its parents and gives their ranges to children (``laminar.splits``). For
a group to read each key in order, a child goes to a member only once the group has committed
every parent to its seal end (its records were processed), as KIP-848 proposes and Kinesis does
with shard lineage; a sealed partition committed to its end is given to nobody any more, and a
pending child (its split still finishing) neither. Pure functions: the coordinator calls them
with the lineage from the metadata and the group's committed offsets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class RangePartition:
    """What the lineage rule needs of one partition of a key-range topic."""

    state: str
    parents: tuple[int, ...]
    seal_end: int


Lineage = Mapping[str, Mapping[int, RangePartition]]
"""Range topic -> partition -> its lineage facts (hash topics are absent)."""


def lineage_of(topics: Mapping[str, Any]) -> dict[str, dict[int, RangePartition]]:
    """The lineage of every key-range topic in the metadata (``MetadataState.topics``)."""
    return {
        name: {
            index: RangePartition(a.state, tuple(a.parents), a.seal_end)
            for index, a in enumerate(topic.partitions)
        }
        for name, topic in topics.items()
        if topic.settings.partitioning == "range"
    }


def finished(info: RangePartition, committed: int | None) -> bool:
    return info.state == "sealed" and committed is not None and committed >= info.seal_end


def blocked(
    lineage: Lineage, topics: frozenset[str] | set[str], offsets: Mapping[TopicPartition, Any]
) -> frozenset[TopicPartition]:
    """Partitions of ``topics`` a group with committed ``offsets`` (tp -> value with an
    ``offset``) may not be given now."""
    out: set[TopicPartition] = set()
    for topic in topics:
        partitions = lineage.get(topic)
        if not partitions:
            continue

        def committed(partition: int, topic: str = topic) -> int | None:
            value = offsets.get((topic, partition))
            return None if value is None else value.offset

        for index, info in partitions.items():
            if (
                info.state == "pending"
                or finished(info, committed(index))
                or any(
                    not finished(partitions[p], committed(p))
                    for p in info.parents
                    if p in partitions
                )
            ):
                out.add((topic, index))
    return frozenset(out)


def starts(
    lineage: Lineage, before: frozenset[TopicPartition], after: frozenset[TopicPartition]
) -> list[TopicPartition]:
    """Children that became assignable (blocked before, not now): they start at offset 0."""
    return sorted(
        tp
        for tp in before - after
        if tp[0] in lineage and tp[1] in lineage[tp[0]] and lineage[tp[0]][tp[1]].parents
    )
