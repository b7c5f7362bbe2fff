"""``Producer.send_many``: many records in one call, cut straight into batches.

The per-record ``send`` pays a coroutine call, checks, a partitioner call and a delivery handle
for every record. A bulk call pays those once per call (per key only for keyed records): records
are grouped per partition here, handed to the accumulator as slices that fill whole batches, and
delivery is tracked per batch slice (``BulkDelivery``), not per record.

``plan`` is pure (no I/O, no clock): which records go to which partition, in input order.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections.abc import Callable, Generator, Sequence
from itertools import accumulate, repeat
from operator import add
from typing import Any

from laminar.client.accumulator import RECORD_OVERHEAD, ProducerBatch, RecordTuple, record_size
from laminar.client.types import Headers, RecordMetadata

Segment = tuple[ProducerBatch, int, int, int]
"""(batch, index of the first record in the batch, record count, index of it in the call)."""


def plan(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    headers: Headers,
    timestamp_ms: int,
    partitions: int,
    choose: Callable[[bytes | None], int] | None,
    sticky: int,
    chunk_bytes: int,
) -> dict[int, tuple[list[int], list[RecordTuple], list[int]]]:
    """Group the records per partition: partition -> (input indexes, records, cumulative
    sizes), each in input order.

    ``choose(key)`` picks the partition of a keyed record. Unkeyed records (no ``choose``) go
    in ``chunk_bytes`` runs to ``sticky``, ``sticky + 1``, ... (Kafka's sticky partitioning
    at batch granularity: whole batches, spread over the partitions)."""
    out: dict[int, tuple[list[int], list[RecordTuple], list[int]]] = {}
    count = len(values)
    if keys is not None and len(keys) != count:
        raise ValueError(f"{len(keys)} keys for {count} values")
    sizes = _sizes(values, keys, headers)
    cumulative = list(accumulate(sizes))
    if choose is None:
        start = 0
        partition = sticky % partitions
        while start < count:
            before = cumulative[start - 1] if start else 0
            end = max(start + 1, bisect_right(cumulative, before + chunk_bytes, start, count))
            positions, records, totals = _entry(out, partition)
            positions.extend(range(start, end))
            records.extend(
                zip(
                    repeat(None) if keys is None else keys[start:end],
                    values[start:end],
                    repeat(headers),
                    repeat(timestamp_ms),
                )
            )
            shift = (totals[-1] if totals else 0) - before  # onto this partition's total
            totals.extend(map(add, cumulative[start:end], repeat(shift)))
            partition = (partition + 1) % partitions
            start = end
        return out
    assert keys is not None, "a partitioner chooses by key"
    by_partition: dict[int, list[int]] = {}
    for index, key in enumerate(keys):
        by_partition.setdefault(choose(key), []).append(index)
    for partition, indexes in by_partition.items():
        positions, records, totals = _entry(out, partition)
        positions.extend(indexes)
        records.extend([(keys[i], values[i], headers, timestamp_ms) for i in indexes])
        total = totals[-1] if totals else 0  # onto this partition's total
        totals.extend(map(total.__add__, accumulate([sizes[i] for i in indexes])))
    return out


def _sizes(
    values: Sequence[bytes | None], keys: Sequence[bytes | None] | None, headers: Headers
) -> list[int]:
    """Each record's size estimate (``record_size``); the common shape (no keys, no headers,
    no null values) is computed in C."""
    if keys is None:
        if not headers and values.count(None) == 0:
            return list(map(RECORD_OVERHEAD.__add__, map(len, values)))  # type: ignore[arg-type]
        return [record_size(None, v, headers) for v in values]
    return [record_size(k, v, headers) for k, v in zip(keys, values, strict=True)]


def _entry(
    out: dict[int, tuple[list[int], list[RecordTuple], list[int]]], partition: int
) -> tuple[list[int], list[RecordTuple], list[int]]:
    entry = out.get(partition)
    if entry is None:
        entry = out[partition] = ([], [], [])
    return entry


class BulkDelivery:
    """The outcome of one ``send_many``: awaiting it waits until every record is acknowledged
    or failed for good, and raises the first failure (as ``asyncio.gather`` does); the
    records of other batches may still have been written (each batch succeeds or fails as
    a whole, and a partition's batches stay in order).

    ``results()`` then gives one RecordMetadata or exception per record, in input order;
    ``metadata()`` the RecordMetadata of every record, raising the first failure."""

    __slots__ = ("_count", "_groups", "_topic")

    def __init__(self, topic: str, count: int) -> None:
        self._topic = topic
        self._count = count
        # per partition: (input indexes in order, [(batch, first index in batch, count)])
        self._groups: list[tuple[list[int], list[tuple[ProducerBatch, int, int]]]] = []

    def add(self, positions: list[int], segments: list[tuple[ProducerBatch, int, int]]) -> None:
        """The records at input ``positions`` (in order) went into these batch slices."""
        self._groups.append((positions, segments))

    def _batches(self) -> list[ProducerBatch]:
        return [batch for _, segments in self._groups for batch, _, _ in segments]

    def __len__(self) -> int:
        return self._count

    def done(self) -> bool:
        return all(batch.finished for batch in self._batches())

    def exception(self) -> BaseException | None:
        """The first failure (None if every record was acknowledged); only once done."""
        if not self.done():
            raise asyncio.InvalidStateError("not every record is settled yet")
        for _, segments in self._groups:
            for batch, first, count in segments:
                if batch.forwards is not None:  # re-sent elsewhere after a split's seal
                    for handle in batch.forwards[first : first + count]:
                        error = handle.exception()
                        if error is not None:
                            return error
                elif batch.error is not None:
                    return batch.error
        return None

    def __await__(self) -> Generator[Any, None, None]:
        for batch in self._batches():
            if not batch.finished:
                # shield: one caller giving up (a timeout) must not cancel the batch's future
                yield from asyncio.shield(batch.done).__await__()
        error = self.exception()
        if error is not None:
            raise error

    def results(self) -> list[RecordMetadata | BaseException]:
        """Per record, in input order: its RecordMetadata, or the error its batch failed with."""
        if not self.done():
            raise asyncio.InvalidStateError("not every record is settled yet")
        out: list[RecordMetadata | BaseException] = [None] * self._count  # type: ignore[list-item]
        topic = self._topic
        for positions, segments in self._groups:
            taken = 0
            for batch, first, count in segments:
                error = batch.error
                partition = batch.tp.partition
                base = batch.base_offset
                records = batch.records
                forwards = batch.forwards
                for j in range(count):
                    position = positions[taken + j]
                    if forwards is not None:  # re-sent elsewhere after a split's seal
                        handle = forwards[first + j]
                        out[position] = handle.exception() or handle.result()
                    elif error is not None:
                        out[position] = error
                    else:
                        offset = base + first + j if base >= 0 else -1
                        out[position] = RecordMetadata(
                            topic, partition, offset, records[first + j][3]
                        )
                taken += count
        return out

    def metadata(self) -> list[RecordMetadata]:
        """Every record's RecordMetadata in input order; raises the first failure."""
        error = self.exception()
        if error is not None:
            raise error
        return self.results()  # type: ignore[return-value]
