"""The default assignor: sticky, balanced, deterministic, optionally rack-aware.

A pure function from (members, partitions per topic, current target assignment) to a new target
assignment. It runs in three passes:

1. **Keep**: every partition stays with its current member if that member still exists, still
   subscribes to its topic and the partition still exists (a partition claimed twice stays with
   the smallest member id). This is what makes moves incremental: the coordinator only revokes
   what the new target takes away.
2. **Place**: each partition nobody keeps goes to the eligible member (subscribed to its topic)
   with the fewest partitions; ties prefer a member whose rack holds a replica of the partition,
   then the smallest member id.
3. **Balance**: while some member has at least two partitions more than an eligible member,
   move one partition from the most loaded to the least loaded. Every move lowers the sum of
   squared counts, so the loop ends; when it ends, two members with the same subscriptions differ
   by at most one partition (any partition of one could move to the other). Only surplus moves,
   so movement is minimal for members that share subscriptions.

Every choice is made over sorted keys, so the output depends only on the input's contents, never
on dict or set iteration order. Rack preference only breaks ties between equally loaded members,
so it never costs balance or stickiness.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TopicPartition = tuple[str, int]
Assignment = dict[str, frozenset[TopicPartition]]


@dataclass(frozen=True, slots=True)
class AssignorMember:
    """What the assignor knows of a member: its id, the topics it reads and its rack."""

    member_id: str
    topics: frozenset[str]
    rack: str | None = None


def _rack_match(member: AssignorMember, tp: TopicPartition, racks: Mapping) -> bool:
    return member.rack is not None and member.rack in racks.get(tp, ())


def assign(
    members: list[AssignorMember] | tuple[AssignorMember, ...],
    partitions: Mapping[str, int],
    current: Mapping[str, frozenset[TopicPartition]] | None = None,
    replica_racks: Mapping[TopicPartition, frozenset[str]] | None = None,
    excluded: frozenset[TopicPartition] = frozenset(),
) -> Assignment:
    """The new target assignment: member id -> the partitions it should own.

    ``partitions`` maps each existing topic to its partition count; ``current`` is the previous
    target (members absent from ``members`` are ignored); ``replica_racks`` optionally maps a
    partition to the racks that hold its replicas; ``excluded`` partitions are given to nobody
    (key-range lineage: ``groups/lineage.py``). Every member appears in the result.
    """
    current = current or {}
    racks = replica_racks or {}
    by_id = {m.member_id: m for m in members}
    if len(by_id) != len(members):
        raise ValueError("duplicate member ids")
    ids = sorted(by_id)
    owned: dict[str, set[TopicPartition]] = {mid: set() for mid in ids}
    taken: set[TopicPartition] = set(excluded)

    # 1. Keep what is still valid, in member-id order so a double claim resolves the same way.
    for mid in ids:
        member = by_id[mid]
        for tp in sorted(current.get(mid, ())):
            topic, index = tp
            if topic in member.topics and 0 <= index < partitions.get(topic, 0) and tp not in taken:
                owned[mid].add(tp)
                taken.add(tp)

    # 2. Place every unowned partition on the least loaded eligible member.
    subscribers: dict[str, list[str]] = {}
    for topic in sorted(partitions):
        subscribers[topic] = [mid for mid in ids if topic in by_id[mid].topics]
    for topic in sorted(partitions):
        eligible = subscribers[topic]
        if not eligible:
            continue
        for index in range(partitions[topic]):
            tp = (topic, index)
            if tp in taken:
                continue
            best = min(
                eligible,
                key=lambda mid, tp=tp: (
                    len(owned[mid]),
                    not _rack_match(by_id[mid], tp, racks),
                    mid,
                ),
            )
            owned[best].add(tp)
            taken.add(tp)

    # 3. Move surplus from the most to the least loaded eligible member until balanced.
    while _move_one(ids, by_id, owned, racks):
        pass
    return {mid: frozenset(owned[mid]) for mid in ids}


def _move_one(
    ids: list[str],
    by_id: dict[str, AssignorMember],
    owned: dict[str, set[TopicPartition]],
    racks: Mapping,
) -> bool:
    donors = sorted(ids, key=lambda mid: (-len(owned[mid]), mid))
    receivers = sorted(ids, key=lambda mid: (len(owned[mid]), mid))
    for donor in donors:
        donor_count = len(owned[donor])
        for receiver in receivers:
            if len(owned[receiver]) > donor_count - 2:
                break
            topics = by_id[receiver].topics
            movable = [tp for tp in owned[donor] if tp[0] in topics]
            if not movable:
                continue
            # Prefer a partition with a replica in the receiver's rack, then the highest one
            # (so the low partitions of a topic tend to stay put).
            tp = max(movable, key=lambda tp: (_rack_match(by_id[receiver], tp, racks), tp))
            owned[donor].remove(tp)
            owned[receiver].add(tp)
            return True
    return False
