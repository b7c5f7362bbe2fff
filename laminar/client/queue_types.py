"""What ``Admin.describe_queue`` answers: a share group's state on each partition of a topic."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueuePartitionStatus:
    """One partition as the share group sees it (from the partition's leader).

    ``start``: every offset below is done (acked, skipped or dead-lettered); ``end``: the
    partition's end as far as the group has looked; ``oldest_unacked_ms``: age of the oldest
    record not done (0: none).
    """

    topic: str
    partition: int
    start: int
    end: int
    available: int
    acquired: int
    delayed: int
    dead_lettering: int
    oldest_unacked_ms: int


@dataclass(frozen=True, slots=True)
class QueueDescription:
    """``dead_lettered``: records in the group's dead-letter topic (its end offset; 0 while
    the topic does not exist)."""

    group: str
    topic: str
    partitions: tuple[QueuePartitionStatus, ...]
    dead_letter_topic: str
    dead_lettered: int
