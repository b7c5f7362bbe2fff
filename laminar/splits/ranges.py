"""The range map of a key-range topic: contiguous hash ranges, one per active partition.

A key's hash is ``crc32c(key)``, the hash the producer already uses for hash-partitioned
topics (stable across processes, machines and Python versions), so the key-hash space is
``[0, 2**32)``. A range is ``(start, end)`` with ``start`` inclusive and ``end`` exclusive;
the active ranges of a topic tile the space exactly: sorted by start, the first starts at 0,
each starts where the previous ends, the last ends at ``HASH_SPACE``. Sealed partitions keep
the range they had (for the lineage), but only active ones are in the map.

Everything here is pure: the metadata state machine, the node and the client call the same
functions, so they cannot disagree about which partition owns a key.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence

import crc32c

from laminar.errors import InvalidRequestError

HASH_SPACE = 1 << 32
"""Key hashes are 32-bit (crc32c)."""

Range = tuple[int, int]


def key_hash(key: bytes) -> int:
    """Where a key lies in the hash space."""
    return crc32c.crc32c(key)


def initial_ranges(count: int) -> list[Range]:
    """``count`` equal contiguous ranges covering the space (the last takes the remainder)."""
    if count < 1:
        raise InvalidRequestError("a range-partitioned topic needs at least one partition")
    if count > HASH_SPACE:
        raise InvalidRequestError(f"at most {HASH_SPACE} ranges")
    step = HASH_SPACE // count
    return [(i * step, HASH_SPACE if i == count - 1 else (i + 1) * step) for i in range(count)]


def split_range(bounds: Range, at: int | None = None) -> tuple[Range, Range]:
    """Two halves of ``bounds`` split at ``at`` (default: the middle); each half non-empty."""
    start, end = bounds
    if end - start < 2:
        raise InvalidRequestError(f"range [{start}, {end}) is too small to split")
    point = (start + end) // 2 if at is None else at
    if not start < point < end:
        raise InvalidRequestError(
            f"split point {point} is not inside the partition's range [{start}, {end})"
        )
    return (start, point), (point, end)


def merge_ranges(first: Range, second: Range) -> Range:
    """The union of two adjacent ranges (in either order); InvalidRequestError otherwise."""
    low, high = sorted((first, second))
    if low[1] != high[0]:
        raise InvalidRequestError(
            f"ranges [{low[0]}, {low[1]}) and [{high[0]}, {high[1]}) are not adjacent"
        )
    return low[0], high[1]


class RangeMap:
    """Active partitions by range, for routing: ``owner(hash)`` is a bisect."""

    __slots__ = ("_partitions", "_starts")

    def __init__(self, active: Iterable[tuple[int, Range]]) -> None:
        ordered = sorted(active, key=lambda item: item[1][0])
        check_tiling([bounds for _p, bounds in ordered])
        self._starts = [bounds[0] for _p, bounds in ordered]
        self._partitions = [partition for partition, _b in ordered]

    def owner(self, hash_value: int) -> int:
        """The active partition whose range holds ``hash_value``."""
        return self._partitions[bisect_right(self._starts, hash_value) - 1]

    def owner_of_key(self, key: bytes) -> int:
        return self.owner(key_hash(key))

    @property
    def partitions(self) -> list[int]:
        """Active partitions in range order."""
        return list(self._partitions)


def check_tiling(ranges: Sequence[Range]) -> None:
    """ValueError unless ``ranges`` (sorted by start) tile ``[0, HASH_SPACE)`` exactly."""
    if not ranges:
        raise ValueError("no active ranges")
    expected = 0
    for start, end in ranges:
        if start != expected or end <= start:
            raise ValueError(f"range [{start}, {end}) does not continue at {expected}")
        expected = end
    if expected != HASH_SPACE:
        raise ValueError(f"the ranges end at {expected}, not {HASH_SPACE}")
