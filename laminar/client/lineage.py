"""Reading a key-range topic in per-key order: a partition is read only after its parents.

A split or merge seals its parents at an offset and the children take their ranges over from
then on, so every record of a key lies in the parent below its seal or in a child. Reading a
child only once every parent (that this consumer reads) was read to its seal end, and its
records were handed out, keeps each key's records in the order they were written. This is
KIP-848's idea for consumer groups and Kinesis' rule for shard lineage, for the native
``Consumer`` (``consumer.py`` calls this; no I/O here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from laminar.client.descriptions import ClusterMetadata
from laminar.client.types import TopicPartition

REFRESH_EVERY = 0.5
"""Seconds between metadata refreshes while reading key-range topics."""


class Lineage:
    """Which partitions of key-range topics the consumer may fetch now."""

    def __init__(self, metadata: Callable[[], ClusterMetadata]) -> None:
        self._metadata = metadata
        self.topics: set[str] = set()
        """Key-range topics read (gated); refreshed periodically."""
        self._followed: set[str] = set()
        """Of those, the ones read whole (``subscribe``): new partitions join the assignment."""
        self._refreshed = 0.0

    def gate(self, topic: str) -> None:
        self.topics.add(topic)

    def follow(self, topic: str) -> None:
        self.topics.add(topic)
        self._followed.add(topic)

    def refresh_due(self, now: float) -> bool:
        if now - self._refreshed < REFRESH_EVERY:
            return False
        self._refreshed = now
        return True

    def new_partitions(
        self, metadata: ClusterMetadata, assigned: Iterable[TopicPartition]
    ) -> list[TopicPartition]:
        """Partitions of followed topics that appeared since they were assigned."""
        have = set(assigned)
        out = []
        for topic in self._followed:
            description = metadata.topics.get(topic)
            if description is None:
                continue
            for partition in description.partitions:
                tp = TopicPartition(topic, partition.partition)
                if tp not in have and partition.state != "pending":
                    out.append(tp)
        return out

    def readable(self, tp: TopicPartition, position: Callable[[TopicPartition], int]) -> bool:
        """Whether to fetch ``tp`` now: not a pending child, not a sealed partition already
        read to its end, and every assigned parent read to its seal end (``position`` of a
        partition counts its records still buffered as unread)."""
        description = self._metadata().topics.get(tp.topic)
        if tp.topic not in self.topics or description is None:
            return True
        partitions = description.partitions
        if tp.partition >= len(partitions):
            return True
        info = partitions[tp.partition]
        if info.state == "pending":
            return False
        if info.state == "sealed" and _at(position, tp) >= info.seal_end:
            return False  # read to its end
        for parent in info.parents:
            parent_tp = TopicPartition(tp.topic, parent)
            read_to = _at(position, parent_tp)
            if read_to < 0:
                continue  # not read by this consumer: nothing to wait for
            parent_info = partitions[parent]
            if parent_info.state != "sealed" or read_to < parent_info.seal_end:
                return False
        return True


def _at(position: Callable[[TopicPartition], int], tp: TopicPartition) -> int:
    try:
        return position(tp)
    except ValueError:  # not assigned
        return -1
