"""Sparse per-segment indexes: the offset index (.index) and the time index (.timeindex).

Offset index entry (24 bytes, little-endian): relative offset u32, file position u32, term i64,
running max timestamp i64 (max over the segment's batches up to and including this one).
An entry is written for the first batch of a segment, for every batch whose term differs from the
previous batch, and whenever ``interval`` bytes have passed since the previous entry. So every
batch between two entries has the entry's term, which lets the log know every term change
without reading data files.

Time index entry (16 bytes): timestamp i64, relative offset u32, file position u32, with strictly
increasing timestamps. It is written next to an offset-index entry whose running max grew, plus a
final entry with the segment's max timestamp when the segment is sealed; its last entry is the
segment's max timestamp, which retention relies on after a restart.
"""

from __future__ import annotations

import struct
import sys
from array import array
from operator import le, lt

OFFSET_ENTRY = struct.Struct("<IIqq")
TIME_ENTRY = struct.Struct("<qII")
NO_TIMESTAMP = -(1 << 63) - 1  # below every int64 timestamp


class OffsetIndex:
    """In-memory columns of a segment's offset index (absolute offsets).

    Columns are int64 arrays (8 bytes an entry, not a Python int object each): a broker keeps
    the indexes of every segment of every partition in memory.
    """

    __slots__ = ("base", "max_ts", "offsets", "positions", "terms")

    def __init__(self, base: int) -> None:
        self.base = base
        self.offsets = array("q")
        self.positions = array("q")
        self.terms = array("q")
        self.max_ts = array("q")

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, position: int, term: int, max_ts: int) -> bytes:
        """Record an entry; returns its bytes for the index file."""
        self.offsets.append(offset)
        self.positions.append(position)
        self.terms.append(term)
        self.max_ts.append(max_ts)
        return OFFSET_ENTRY.pack(offset - self.base, position, term, max_ts)

    def keep(self, count: int) -> None:
        del self.offsets[count:], self.positions[count:], self.terms[count:]
        del self.max_ts[count:]

    def to_bytes(self) -> bytes:
        pack = OFFSET_ENTRY.pack
        base = self.base
        return b"".join(
            pack(o - base, p, t, m)
            for o, p, t, m in zip(
                self.offsets, self.positions, self.terms, self.max_ts, strict=True
            )
        )

    @classmethod
    def parse(cls, base: int, data: bytes, data_size: int) -> tuple[OffsetIndex, bool]:
        """Longest valid prefix of an index file; the flag says whether the whole file was valid.

        Valid means: starts at (0, 0), offsets and positions strictly increase, positions lie
        inside the data file, running max never decreases.
        """
        whole = cls._parse_whole(base, data, data_size)
        if whole is not None:
            return whole, True
        index = cls(base)
        usable = len(data) - len(data) % OFFSET_ENTRY.size
        last_rel = last_pos = -1
        last_max = NO_TIMESTAMP
        offsets, positions, terms, maxes = index.offsets, index.positions, index.terms, index.max_ts
        for rel, pos, term, mx in OFFSET_ENTRY.iter_unpack(memoryview(data)[:usable]):
            ok = rel > last_rel and pos > last_pos and pos < data_size and mx >= last_max
            if not offsets:
                ok = rel == 0 and pos == 0 and data_size > 0
            if not ok:
                break
            offsets.append(base + rel)
            positions.append(pos)
            terms.append(term)
            maxes.append(mx)
            last_rel, last_pos, last_max = rel, pos, mx
        return index, False

    @classmethod
    def _parse_whole(cls, base: int, data: bytes, data_size: int) -> OffsetIndex | None:
        """Fast path (C-level list operations, no per-entry Python) for an intact file."""
        if not data or len(data) % OFFSET_ENTRY.size or data_size <= 0:
            return None
        words = array("I")
        words.frombytes(data)
        longs = array("q")
        longs.frombytes(data)
        if sys.byteorder != "little":  # pragma: no cover - the file format is little-endian
            words.byteswap()
            longs.byteswap()
        rel = words[0::6]
        pos = words[1::6]
        maxes = longs[2::3]
        if rel[0] != 0 or pos[0] != 0 or pos[-1] >= data_size:
            return None
        if not (_increasing(rel) and _increasing(pos) and _non_decreasing(maxes)):
            return None
        index = cls(base)
        index.offsets = array("q", map(base.__add__, rel))
        index.positions = array("q", pos)
        index.terms = longs[1::3]
        index.max_ts = maxes
        return index


def _increasing(a: array) -> bool:  # type: ignore[type-arg]
    return all(map(lt, a[:-1], a[1:]))


def _non_decreasing(a: array) -> bool:  # type: ignore[type-arg]
    return all(map(le, a[:-1], a[1:]))


class TimeIndex:
    """In-memory columns of a segment's time index."""

    __slots__ = ("base", "offsets", "positions", "timestamps")

    def __init__(self, base: int) -> None:
        self.base = base
        self.timestamps: list[int] = []
        self.offsets: list[int] = []
        self.positions: list[int] = []

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def last_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else NO_TIMESTAMP

    def add(self, timestamp: int, offset: int, position: int) -> bytes:
        self.timestamps.append(timestamp)
        self.offsets.append(offset)
        self.positions.append(position)
        return TIME_ENTRY.pack(timestamp, offset - self.base, position)

    def to_bytes(self) -> bytes:
        pack = TIME_ENTRY.pack
        base = self.base
        return b"".join(
            pack(t, o - base, p)
            for t, o, p in zip(self.timestamps, self.offsets, self.positions, strict=True)
        )

    @classmethod
    def parse(cls, base: int, data: bytes, data_size: int) -> TimeIndex | None:
        """The whole time index, or None if it is damaged in any way."""
        if not data or len(data) % TIME_ENTRY.size:
            return None
        index = cls(base)
        last_ts = NO_TIMESTAMP
        last_rel = last_pos = -1
        for ts, rel, pos in TIME_ENTRY.iter_unpack(data):
            if ts <= last_ts or rel < last_rel or pos < last_pos or pos >= data_size:
                return None
            index.timestamps.append(ts)
            index.offsets.append(base + rel)
            index.positions.append(pos)
            last_ts, last_rel, last_pos = ts, rel, pos
        return index
