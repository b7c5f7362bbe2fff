"""Split and merge as metadata commands: the part the metadata state machine applies.

An operation is two commands around a seal, so a crash anywhere leaves either nothing or an
operation that the split driver (``driver.py``, run on the metadata leader) finishes:

1. ``begin_split`` / ``begin_merge``: checked against the state as of its place in the log;
   creates the children (new partition numbers appended to the topic, state ``pending``,
   their ranges and parents set) and records the open operation on the topic. Producers do not
   route to pending partitions; parents stay active and take writes.
2. The driver asks each parent's leader to *seal* it: a seal control batch is committed
   through the parent's own Raft group, after which the parent accepts no record
   (``seal.py``). The seal's offset + 1 is the parent's end.
3. ``finish_op`` (with each parent's end): parents become ``sealed``, children ``active``, the
   operation closes. The range map now routes the parents' ranges to the children.

``begin_*`` is the commit point: once it is in the metadata, the operation is completed (a seal
needs only the parent's group to have a leader, which any write to it needs too). It is never
half-done: the map changes only in ``finish_op``, atomically, and only once every parent is
sealed, so a key's range has exactly one active partition at every point of the log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from laminar.errors import InvalidRequestError
from laminar.splits.ranges import HASH_SPACE, merge_ranges, split_range

ACTIVE, PENDING, SEALED = "active", "pending", "sealed"
RANGE = "range"


def check_range_topic(topic: Any) -> None:
    if topic.settings.partitioning != RANGE:
        raise InvalidRequestError(
            f"topic {topic.name!r} is hash-partitioned; only topics created with "
            "--partitioning range split and merge"
        )
    if topic.operation is not None:
        raise InvalidRequestError(
            f"topic {topic.name!r} has a {topic.operation['kind']} in progress; try again"
        )


def _active(topic: Any, partition: Any) -> Any:
    if type(partition) is not int or not 0 <= partition < len(topic.partitions):
        raise InvalidRequestError(f"topic {topic.name!r} has no partition {partition}")
    assignment = topic.partitions[partition]
    if assignment.state != ACTIVE:
        raise InvalidRequestError(
            f"partition {partition} of {topic.name!r} is {assignment.state}, not active"
        )
    return assignment


def plan_children(topic: Any, command: dict[str, Any]) -> tuple[list[int], list[tuple[int, int]]]:
    """Parents and the children's ranges a begin command asks for (checked, nothing changed)."""
    check_range_topic(topic)
    if command["op"] == "begin_split":
        parent = _active(topic, command["partition"])
        at = command.get("at")
        if at is not None and (type(at) is not int or not 0 <= at < HASH_SPACE):
            raise InvalidRequestError(f"split point must be in [0, {HASH_SPACE}), not {at!r}")
        low, high = split_range((parent.range_start, parent.range_end), at)
        return [command["partition"]], [low, high]
    parents = command["partitions"]
    if not isinstance(parents, list) or len(parents) != 2 or parents[0] == parents[1]:
        raise InvalidRequestError("a merge takes two different partitions")
    first, second = (_active(topic, p) for p in parents)
    union = merge_ranges(
        (first.range_start, first.range_end), (second.range_start, second.range_end)
    )
    return sorted(parents), [union]


def begin(topic: Any, command: dict[str, Any], new_assignment: Callable[[list[int]], Any]) -> Any:
    """Apply ``begin_split`` / ``begin_merge`` (placement in ``command['replicas']``)."""
    parents, ranges = plan_children(topic, command)
    if command["from"] != len(topic.partitions):
        raise InvalidRequestError(
            f"topic {topic.name!r} has {len(topic.partitions)} partitions now; try again"
        )
    replicas = command["replicas"]
    if len(replicas) != len(ranges):
        raise InvalidRequestError("one replica set per child")
    children = list(range(len(topic.partitions), len(topic.partitions) + len(ranges)))
    for placed, (start, end) in zip(replicas, ranges, strict=True):
        child = new_assignment(list(placed))
        child.range_start, child.range_end = start, end
        child.state = PENDING
        child.parents = list(parents)
        topic.partitions.append(child)
    topic.settings.partitions = len(topic.partitions)
    topic.operation = {
        "id": str(command.get("request_id") or ""),
        "kind": "split" if command["op"] == "begin_split" else "merge",
        "parents": parents,
        "children": children,
    }
    return topic


def finish(topic: Any, command: dict[str, Any]) -> Any:
    """Apply ``finish_op``: every parent sealed at its end, the children active."""
    operation = topic.operation
    if operation is None or operation["id"] != command["op_id"]:
        return None  # finished already (a retried finish), or another operation
    ends = {int(p): int(end) for p, end in command["ends"].items()}
    if sorted(ends) != sorted(operation["parents"]):
        raise InvalidRequestError("finish_op names every parent's end")
    for parent in operation["parents"]:
        assignment = topic.partitions[parent]
        assignment.state = SEALED
        assignment.seal_end = ends[parent]
    for child in operation["children"]:
        topic.partitions[child].state = ACTIVE
    topic.operation = None
    return topic
