"""Key-range fields of the client protocol's metadata and status replies."""

from __future__ import annotations

from typing import Any


def fill_range(slot: Any, assignment: Any) -> None:
    """A range partition's range, state, lineage and seal into a ``PartitionInfo``."""
    slot.rangeStart = assignment.range_start
    slot.rangeEnd = assignment.range_end
    slot.state = assignment.state
    slot.parents = assignment.parents
    slot.sealEnd = assignment.seal_end


def fill_operation(slot: Any, topic: str, operation: dict[str, Any]) -> None:
    """An open split or merge into a ``TopicOperation``."""
    slot.topic = topic
    slot.kind = operation["kind"]
    slot.parents = operation["parents"]
    slot.children = operation["children"]
