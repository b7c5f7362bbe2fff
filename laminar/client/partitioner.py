"""Choosing a partition for a record.

Keyed records go to ``crc32c(key) % partitions``: stable across processes, machines and Python
versions (unlike ``hash()``), so one key always lands in one partition and stays ordered.
Unkeyed records stick to one partition until its batch is closed, then move on (Kafka's sticky
partitioner): batches fill up instead of spreading a trickle of records over every partition.
They move to a partition with nothing in flight or queued when there is one (as Kafka's
adaptive partitioning favours short queues), when their batch closes and when the sticky one
has a batch in flight: a partial batch does not join batches in flight (only full ones are
pipelined), so a record sent to a busy one waits an acknowledgement round trip to leave.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import crc32c

from laminar.splits.ranges import RangeMap

Partitioner = Callable[[str, bytes | None, int], int]
"""A user partitioner: (topic, key, partition count) -> partition number."""


def key_partition(key: bytes, num_partitions: int) -> int:
    return crc32c.crc32c(key) % num_partitions


class DefaultPartitioner:
    """Hash of the key, else a sticky partition per topic that moves when a batch closes."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._sticky: dict[str, int] = {}

    def __call__(self, topic: str, key: bytes | None, num_partitions: int) -> int:
        if key is not None:
            return key_partition(key, num_partitions)
        sticky = self._sticky.get(topic)
        if sticky is None or sticky >= num_partitions:
            sticky = self._rng.randrange(num_partitions)
            self._sticky[topic] = sticky
        return sticky

    def avoid_busy(
        self, topic: str, partition: int, num_partitions: int, busy: Callable[[int], bool]
    ) -> int:
        """The sticky ``partition`` has a batch in flight: move to a random partition that is
        not ``busy`` if there is one (and stick to it); returns the partition to use."""
        idle = [p for p in range(num_partitions) if p != partition and not busy(p)]
        if not idle:
            return partition
        choice = idle[self._rng.randrange(len(idle))]
        self._sticky[topic] = choice
        return choice

    def batch_closed(
        self,
        topic: str,
        partition: int,
        num_partitions: int,
        busy: Callable[[int], bool] | None = None,
    ) -> None:
        """Move the topic's sticky partition elsewhere once its current batch is closed: to a
        random partition that is not ``busy`` (a batch in flight or queued), else to any."""
        if self._sticky.get(topic) != partition or num_partitions <= 1:
            return
        if busy is not None:
            idle = [p for p in range(num_partitions) if p != partition and not busy(p)]
            if idle:
                self._sticky[topic] = idle[self._rng.randrange(len(idle))]
                return
        choice = self._rng.randrange(num_partitions - 1)
        self._sticky[topic] = choice if choice < partition else choice + 1


class Router:
    """Routes the records of a key-range topic (``laminar.splits``): a keyed record to the
    active partition whose range holds ``crc32c(key)``, an unkeyed one to one of the active
    partitions, chosen by the producer's partitioner as if they were the topic's only ones.
    A user partitioner does not route keyed records of such topics: the range map does."""

    __slots__ = ("_map", "active")

    def __init__(self, description: Any) -> None:
        self._map = RangeMap(
            (p.partition, (p.range_start, p.range_end))
            for p in description.partitions
            if p.state == "active"
        )
        self.active = self._map.partitions
        """Active partitions, in range order."""

    def pick(self, key: bytes | None, partitioner: Partitioner, topic: str) -> int:
        if key is not None:
            return self._map.owner(crc32c.crc32c(key))
        active = self.active
        return active[partitioner(topic, None, len(active)) % len(active)]
