"""Pure planning logic: offset JSON, read limits, data-loss checks, input partitions.

No I/O here, so every rule (proportional rate limits, splitting, what counts as data loss) is
unit-testable without a cluster or a Spark session.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from laminar.client.log import get_logger

log = get_logger(__name__)

TopicPartitionKey = tuple[str, int]
Offsets = dict[TopicPartitionKey, int]
"""(topic, partition) -> next offset to read (exclusive end of what was read)."""


class DataLossError(RuntimeError):
    """Offsets the query has not read yet are gone (retention) and failOnDataLoss is true."""


def to_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """Offsets as Spark's JSON dict: topics and partitions as string keys, sorted.

    Spark compares offsets as JSON text, so the same offsets must always serialize the same.
    """
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in offsets.items():
        nested.setdefault(topic, {})[str(partition)] = offset
    return {t: {p: nested[t][p] for p in sorted(nested[t])} for t in sorted(nested)}


def from_json(data: Mapping[str, Mapping[str, int]] | None) -> Offsets:
    if not data:
        return {}
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in data.items()
        for partition, offset in partitions.items()
    }


def data_loss_message(topic: str, partition: int, missing_from: int, missing_to: int) -> str:
    return (
        f"laminar source: data loss in topic {topic!r} partition {partition}: offsets "
        f"[{missing_from}, {missing_to}) were deleted (retention) before the query read them; "
        f"the log now starts at {missing_to}. Set failOnDataLoss=false to skip missing "
        f"offsets and continue."
    )


def check_start(tp: TopicPartitionKey, start: int, log_start: int, fail_on_data_loss: bool) -> int:
    """Where reading of ``tp`` really starts: ``start``, or the log start if data is gone."""
    if start >= log_start:
        return start
    message = data_loss_message(tp[0], tp[1], start, log_start)
    if fail_on_data_loss:
        raise DataLossError(message)
    log.warning(
        "skipping deleted offsets", topic=tp[0], partition=tp[1], start=start, log_start=log_start
    )
    return log_start


@dataclass(frozen=True, slots=True)
class Lineage:
    """A partition of a key-range topic, as planning needs it (``laminar.splits``)."""

    state: str
    parents: tuple[int, ...]
    seal_end: int


def hold_children(
    base: Mapping[TopicPartitionKey, int],
    latest: Offsets,
    lineage: Mapping[TopicPartitionKey, Lineage],
) -> Offsets:
    """Key-range topics: a child's offsets are planned only in a micro-batch after every
    parent's range was finished (the batch starts at or past the parent's seal end), so each
    key's records reach the sink in the order they were written; pending partitions (a split
    still finishing) are not planned. Partitions of a parent not read by the query do not hold
    its children back."""
    out = dict(latest)
    for tp, facts in lineage.items():
        if tp not in out:
            continue
        waiting = facts.state == "pending" or any(
            (tp[0], parent) in base and base[(tp[0], parent)] < lineage[(tp[0], parent)].seal_end
            for parent in facts.parents
            if (tp[0], parent) in lineage
        )
        if waiting:
            out[tp] = base.get(tp, out[tp])
    return out


def rate_limit(start: Offsets, latest: Offsets, max_offsets: int) -> Offsets:
    """End offsets reading at most ``max_offsets`` in total, shared in proportion to lag.

    Largest-remainder rounding makes the shares sum to exactly min(max_offsets, total lag), so
    a capped micro-batch never exceeds the cap and always makes progress while there is lag.
    """
    lags = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(lags.values())
    if total <= max_offsets:
        return dict(latest)
    shares = {tp: max_offsets * lag / total for tp, lag in lags.items()}
    taken = {tp: math.floor(share) for tp, share in shares.items()}
    left = max_offsets - sum(taken.values())
    by_remainder = sorted(lags, key=lambda tp: (-(shares[tp] - taken[tp]), tp))
    for tp in by_remainder[:left]:
        taken[tp] += 1
    return {tp: start.get(tp, latest[tp]) + min(taken[tp], lags[tp]) for tp in latest}


@dataclass(frozen=True, slots=True)
class Replica:
    node_id: int
    address: str


class LaminarInputPartition(InputPartition):
    """One Spark task: offsets [start, end) of one partition, plus where its replicas live."""

    def __init__(
        self,
        index: int,
        topic: str,
        partition: int,
        start: int,
        end: int,
        replicas: tuple[Replica, ...],
    ) -> None:
        super().__init__(index)
        self.index = index
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.replicas = replicas

    def __repr__(self) -> str:
        return (
            f"LaminarInputPartition({self.topic}/{self.partition} [{self.start}, {self.end}) "
            f"replicas={[r.node_id for r in self.replicas]})"
        )


def split_ranges(
    ranges: Mapping[TopicPartitionKey, tuple[int, int]],
    max_records: int,
    min_partitions: int | None,
) -> list[tuple[TopicPartitionKey, int, int]]:
    """Cut each (start, end) range into pieces of at most ``max_records`` offsets, and into
    enough pieces overall (in proportion to size) to reach ``min_partitions``."""
    total = sum(max(0, end - start) for start, end in ranges.values())
    pieces: list[tuple[TopicPartitionKey, int, int]] = []
    for tp in sorted(ranges):
        start, end = ranges[tp]
        size = end - start
        if size <= 0:
            continue
        count = math.ceil(size / max_records)
        if min_partitions and total:
            count = max(count, math.ceil(min_partitions * size / total))
        count = min(count, size)
        for i in range(count):
            lo = start + size * i // count
            hi = start + size * (i + 1) // count
            pieces.append((tp, lo, hi))
    return pieces
