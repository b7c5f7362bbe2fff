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
class QueueConfig:
    """A share group's settings as it runs with them (``Admin.describe_queue_config``):
    ``lock_ms`` for acquisitions that do not ask for their own, ``max_deliveries`` before a
    message is dead-lettered, and the ``dead_letter_topic``. ``overridden`` names the settings
    set for the group; the others are the defaults (30 s, 5, ``<group>.dlq``)."""

    group: str
    lock_ms: int
    max_deliveries: int
    dead_letter_topic: str
    overridden: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class QueueDescription:
    """``dead_lettered``: records in the group's dead-letter topic (0 while the topic does not
    exist); ``config``: the group's settings."""

    group: str
    topic: str
    partitions: tuple[QueuePartitionStatus, ...]
    dead_letter_topic: str
    dead_lettered: int
    config: QueueConfig
