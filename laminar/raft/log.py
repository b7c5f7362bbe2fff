"""The core's view of its log: durable storage below, not-yet-handed-out entries above.

Entries the core appended but the driver has not yet written live in ``unstable``; a pending
log reset (snapshot-install equivalent) hides storage entirely until the driver applies it.
"""

from __future__ import annotations

from bisect import bisect_left
from operator import attrgetter

from laminar.raft.storage import (
    _NO_LIMIT,
    CompactedError,
    Storage,
    UnavailableError,
    take_entries,
)
from laminar.raft.types import Entry

_LAST = attrgetter("last")


class RaftLog:
    __slots__ = ("snap", "storage", "unstable")

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.unstable: list[Entry] = []
        self.snap: tuple[int, int] | None = None

    def first_index(self) -> int:
        snap = self.snap
        return snap[0] if snap is not None else self.storage.first_index()

    def last_index(self) -> int:
        u = self.unstable
        if u:
            return u[-1].last
        snap = self.snap
        if snap is not None:
            return snap[0] - 1
        return self.storage.last_index()

    def _upos(self, index: int) -> int:
        u = self.unstable
        p = index - u[0].index
        if 0 <= p < len(u):
            e = u[p]
            if e.index == index and e.last == index:
                return p
        return bisect_left(u, index, key=_LAST)

    def term(self, index: int) -> int:
        u = self.unstable
        if u and index >= u[0].index:
            if index > u[-1].last:
                raise UnavailableError(index)
            return u[self._upos(index)].term
        snap = self.snap
        if snap is not None:
            if index == snap[0] - 1:
                return snap[1]
            if index < snap[0] - 1:
                raise CompactedError(index)
            raise UnavailableError(index)
        return self.storage.term(index)

    def last_term(self) -> int:
        return self.term(self.last_index())

    def match_term(self, index: int, term: int) -> bool:
        try:
            return self.term(index) == term
        except (CompactedError, UnavailableError):
            return False

    def entries(self, lo: int, hi: int, max_bytes: int = _NO_LIMIT) -> list[Entry]:
        """Entries covering [lo, hi): at least one, then up to ``max_bytes``."""
        u = self.unstable
        if u and lo >= u[0].index:
            if lo > u[-1].last:
                raise UnavailableError(lo)
            return take_entries(u, self._upos(lo), hi, max_bytes)
        snap = self.snap
        if snap is not None:
            raise CompactedError(lo) if lo < snap[0] else UnavailableError(lo)
        if not u:
            return self.storage.entries(lo, hi, max_bytes)
        uoff = u[0].index
        ents = self.storage.entries(lo, min(hi, uoff), max_bytes)
        if hi > uoff and ents and ents[-1].last + 1 == uoff:
            used = sum(len(e.data) + 32 for e in ents)
            if used < max_bytes:
                more = take_entries(u, 0, hi, max_bytes - used)
                if more and used + sum(len(e.data) + 32 for e in more) <= max_bytes:
                    ents = ents + more
        return ents

    def entry_start(self, index: int) -> int:
        """Offset where the entry containing ``index`` begins."""
        return self.entries(index, index + 1, 0)[0].index

    def append(self, ents: list[Entry]) -> None:
        """Append ``ents``; entries at or above ents[0].index are replaced (truncation)."""
        first = ents[0].index
        u = self.unstable
        if u:
            if first == u[-1].last + 1:
                u.extend(ents)
                return
            if first > u[0].index:
                del u[self._upos(first) :]
                u.extend(ents)
                return
        self.unstable = list(ents)

    def reset(self, start: int, prev_term: int) -> None:
        self.snap = (start, prev_term)
        self.unstable = []

    def stable(self, handed: list[Entry], count: int, snap: tuple[int, int] | None) -> None:
        """The driver wrote what ``ready`` handed out; forget it from memory."""
        if snap is not None and self.snap is snap:
            self.snap = None
        if count and self.unstable is handed:
            if len(handed) == count:
                self.unstable = []
            else:
                self.unstable = handed[count:]

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """Largest offset <= index whose term is <= ``term`` (terms grow along the log)."""
        lo = self.first_index() - 1
        if index < lo:
            return index
        try:
            if self.term(index) <= term:
                return index
        except UnavailableError:
            index = self.last_index()
            if self.term(index) <= term:
                return index
        hi = index  # term(hi) > term
        if self.term(lo) > term:
            return lo
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.term(mid) <= term:
                lo = mid
            else:
                hi = mid
        return lo
