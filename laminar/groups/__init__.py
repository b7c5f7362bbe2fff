"""Consumer groups: the sans-I/O group coordinator, its durable records and its assignor.

Nothing in this package does I/O, reads a clock or draws randomness: the node feeds it requests,
the time and topic metadata, appends the records it emits to the group's internal partition and
releases each reply once the records before it are durable (see ``coordinator``).
"""

from laminar.groups.assignor import AssignorMember, assign
from laminar.groups.classic import ClassicConfig, ClassicGroups
from laminar.groups.coordinator import (
    Coordinator,
    CoordinatorConfig,
    HeartbeatResponse,
    Reply,
)
from laminar.groups.records import Record, compact, replay

__all__ = [
    "AssignorMember",
    "ClassicConfig",
    "ClassicGroups",
    "Coordinator",
    "CoordinatorConfig",
    "HeartbeatResponse",
    "Record",
    "Reply",
    "assign",
    "compact",
    "replay",
]
