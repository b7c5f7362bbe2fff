"""The log the core reads: a protocol the partition log implements, and an in-memory version.

Positions are partition offsets; one entry occupies [index, last]. The core never writes
storage: the driver applies ``Ready`` to it (append/truncate/reset) and compacts it.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import attrgetter
from typing import Protocol

from laminar.raft.types import Entry, EntryKind

_LAST = attrgetter("last")
_INDEX = attrgetter("index")
_DATA = attrgetter("data")


class CompactedError(LookupError):
    """The requested offset is below the log's start (retention removed it)."""


class UnavailableError(LookupError):
    """The requested offset is above the log's last offset."""


_NO_LIMIT = 1 << 62
"""A byte limit that never binds (``entries`` of a whole range)."""


class Storage(Protocol):
    def first_index(self) -> int: ...

    def last_index(self) -> int: ...

    def term(self, index: int) -> int: ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]: ...

    def config_entries(self, lo: int, hi: int) -> list[Entry]:
        """The CONFIG entries among [lo, hi): what a restart scans its log for, without
        reading the rest (a partition's records)."""
        ...

    def append(self, entries: list[Entry]) -> None: ...

    def truncate(self, index: int) -> None: ...

    def reset(self, start: int, prev_term: int) -> None: ...


def entry_size(e: Entry) -> int:
    return len(e.data) + 32


def entries_size(ents: list[Entry]) -> int:
    """Bytes ``ents`` count for flow control (payload plus a fixed per-entry overhead)."""
    return sum(map(len, map(_DATA, ents))) + 32 * len(ents)


def take_entries(ents: list[Entry], i: int, hi: int, max_bytes: int) -> list[Entry]:
    """Entries from position ``i`` of ``ents`` while index < hi and within max_bytes (>= 1)."""
    n = len(ents)
    if i >= n:
        return []
    j = n
    if ents[-1].index >= hi:
        j = bisect_left(ents, hi, lo=i, key=_INDEX)
    cand = ents[i:j]
    # Fast path (C-level): the whole candidate range fits.
    if sum(map(len, map(_DATA, cand))) + 32 * len(cand) <= max_bytes:
        return cand
    size = 0
    k = 0
    for e in cand:
        size += len(e.data) + 32
        if size > max_bytes and k:
            break
        k += 1
    return cand[:k]


class MemoryStorage:
    """A list-backed ``Storage`` for tests, the simulator and the benchmark.

    ``_lasts`` mirrors each entry's last offset so lookups bisect a plain int list."""

    __slots__ = ("_ents", "_lasts", "_prev_term", "_start")

    def __init__(self, start: int = 0, prev_term: int = 0) -> None:
        self._ents: list[Entry] = []
        self._lasts: list[int] = []
        self._start = start
        self._prev_term = prev_term

    def first_index(self) -> int:
        return self._start

    def last_index(self) -> int:
        lasts = self._lasts
        return lasts[-1] if lasts else self._start - 1

    def _pos(self, index: int) -> int:
        return bisect_left(self._lasts, index)

    def term(self, index: int) -> int:
        start = self._start
        if index == start - 1:
            return self._prev_term
        if index < start:
            raise CompactedError(index)
        lasts = self._lasts
        if not lasts or index > lasts[-1]:
            raise UnavailableError(index)
        return self._ents[bisect_left(lasts, index)].term

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < self._start:
            raise CompactedError(lo)
        if lo > self.last_index():
            raise UnavailableError(lo)
        return take_entries(self._ents, self._pos(lo), hi, max_bytes)

    def config_entries(self, lo: int, hi: int) -> list[Entry]:
        if lo > self.last_index():
            return []
        return [e for e in self.entries(lo, hi, _NO_LIMIT) if e.kind == EntryKind.CONFIG]

    def append(self, entries: list[Entry]) -> None:
        if not entries:
            return
        first = entries[0].index
        if first <= self.last_index():
            self.truncate(first)
        if first != self.last_index() + 1:
            raise ValueError(f"append at {first} leaves a gap after {self.last_index()}")
        self._ents.extend(entries)
        self._lasts.extend(map(_LAST, entries))

    def truncate(self, index: int) -> None:
        if index <= self._start:
            self._ents.clear()
            self._lasts.clear()
            return
        if index > self.last_index():
            return
        p = self._pos(index)
        if self._ents[p].index != index:
            raise ValueError(f"truncate at {index} splits an entry")
        del self._ents[p:]
        del self._lasts[p:]

    def reset(self, start: int, prev_term: int) -> None:
        self._ents = []
        self._lasts = []
        self._start = start
        self._prev_term = prev_term

    def compact(self, index: int) -> None:
        """Drop whole entries that end at or below ``index`` (retention)."""
        if index < self._start or not self._ents:
            return
        p = bisect_left(self._lasts, index)
        if p < len(self._ents) and self._lasts[p] == index:
            p += 1
        if p == 0:
            return
        self._prev_term = self._ents[p - 1].term
        self._start = self._lasts[p - 1] + 1
        del self._ents[:p]
        del self._lasts[:p]

    def copy(self) -> MemoryStorage:
        """A snapshot sharing the (immutable) entries: what a crash leaves on disk."""
        c = MemoryStorage(self._start, self._prev_term)
        c._ents = list(self._ents)
        c._lasts = list(self._lasts)
        return c

    def all_entries(self) -> list[Entry]:
        return list(self._ents)
