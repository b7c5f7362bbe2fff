"""A deliberately simple reference model of ``SharePartition``: a dict offset -> state, every
operation a plain loop over offsets (no heaps, no cursor, no records). Model-based tests drive
it side by side with the real state machine and compare what a driver or member observes."""

from __future__ import annotations

from dataclasses import dataclass

from laminar.errors import InvalidRequestError, ReceiptExpiredError
from laminar.queues.partition import ShareConfig

AVAIL, HELD, ACKED, ARCHIVING, ARCHIVED = "avail", "held", "acked", "archiving", "archived"


@dataclass
class Entry:
    state: str = AVAIL
    count: int = 0
    member: str = ""
    lock_ms: int = 0  # the durable lock duration (restarted at a failover)
    deadline: int = 0
    due: int = 0
    reason: str = ""


class ShareModel:
    def __init__(self, config: ShareConfig, start: int = 0) -> None:
        self.cfg = config
        self.start = start
        self.end = start
        self.entries: dict[int, Entry] = {}  # absent and >= start: fresh
        self.handed: set[int] = set()  # dead letters handed out by this instance

    def get(self, o: int) -> Entry:
        return self.entries.get(o) or Entry()

    def window_end(self) -> int:
        return self.start + self.cfg.max_in_flight

    def _advance(self) -> None:
        while self.get(self.start).state in (ACKED, ARCHIVED):
            self.entries.pop(self.start, None)
            self.start += 1

    def _check_range(self, first: int, end: int) -> range:
        if first > end or end > self.window_end():
            raise InvalidRequestError("range")
        return range(max(first, self.start), end)

    def end_offset(self, end: int) -> None:
        self.end = max(self.end, min(end, self.window_end()))

    def skip(self, first: int, end: int) -> None:
        for o in self._check_range(first, end):
            if self.get(o).state in (AVAIL, HELD):
                self.entries[o] = Entry(ACKED, self.get(o).count)
        self._advance()

    def defer(self, first: int, end: int, until: int) -> None:
        for o in self._check_range(first, end):
            e = self.get(o)
            if e.state == AVAIL and e.count == 0:
                self.entries[o] = Entry(AVAIL, 0, due=until)

    def advance_start(self, offset: int) -> None:
        if offset > self.start:
            self.entries = {o: e for o, e in self.entries.items() if o >= offset}
            self.handed = {o for o in self.handed if o >= offset}
            self.start = offset
            self._advance()

    def _come_back(self, o: int, due: int) -> None:
        e = self.entries[o]
        if e.count >= self.cfg.max_deliveries:
            self.entries[o] = Entry(ARCHIVING, e.count, reason="max deliveries")
        else:
            self.entries[o] = Entry(AVAIL, e.count, due=due)

    def tick(self, now: int) -> None:
        for o in sorted(self.entries):
            e = self.entries[o]
            if e.state == HELD and e.deadline <= now:
                self._come_back(o, 0)

    def acquire(
        self, member: str, n: int, now: int, lock_ms: int | None = None
    ) -> list[tuple[int, int, int]]:
        lock = self.cfg.lock_ms if lock_ms is None else lock_ms
        self.tick(now)
        out = []
        for o in range(self.start, min(self.end, self.window_end())):
            if len(out) == n:
                break
            e = self.get(o)
            if e.state == AVAIL and e.due <= now:
                self.entries[o] = Entry(HELD, e.count + 1, member, lock, now + lock)
                out.append((o, e.count + 1, now + lock))
        return out

    def acknowledge(
        self, items: list[tuple[str, int, int, str, int]], now: int
    ) -> list[type | None]:
        """items: (member, offset, count, kind, ms); results: None or the error class."""
        self.tick(now)
        results: list[type | None] = []
        for member, o, count, kind, ms in items:
            e = self.get(o)
            if o < self.start or e.state != HELD or e.member != member or e.count != count:
                results.append(ReceiptExpiredError)
                continue
            if kind == "ack":
                self.entries[o] = Entry(ACKED, e.count)
            elif kind == "reject":
                self.entries[o] = Entry(ARCHIVING, e.count, reason="rejected")
            elif kind == "release":
                if ms < 0:
                    results.append(InvalidRequestError)
                    continue
                self._come_back(o, now + ms if ms > 0 else 0)
            elif kind == "extend":
                if not 0 < ms <= self.cfg.max_lock_ms:
                    results.append(InvalidRequestError)
                    continue
                e.lock_ms, e.deadline = ms, now + ms
            else:
                results.append(InvalidRequestError)
                continue
            results.append(None)
        self._advance()
        return results

    def member_gone(self, member: str, now: int) -> None:
        self.tick(now)
        for o in sorted(self.entries):
            e = self.entries[o]
            if e.state == HELD and e.member == member:
                self._come_back(o, 0)

    def take_dead_letters(self, limit: int | None) -> list[tuple[int, int, str]]:
        out = []
        for o in sorted(self.entries):
            e = self.entries[o]
            if e.state == ARCHIVING and o not in self.handed:
                if limit is not None and len(out) == limit:
                    break
                self.handed.add(o)
                out.append((o, e.count, e.reason))
        return out

    def dead_letters_failed(self, offsets: list[int]) -> None:
        self.handed.difference_update(offsets)

    def dead_letters_copied(self, offsets: list[int]) -> None:
        for o in offsets:
            e = self.get(o)
            if o >= self.start and e.state == ARCHIVING:
                self.entries[o] = Entry(ARCHIVED, e.count, reason=e.reason)
                self.handed.discard(o)
        self._advance()

    def failover(self, now: int) -> None:
        """A new instance from the durable state: locks restart now, end and hand-outs reset."""
        for e in self.entries.values():
            if e.state == HELD:
                e.deadline = now + e.lock_ms
        self.end = self.start
        self.handed = set()

    def observable(self) -> dict[int, tuple]:
        """Per tracked offset: (state, delivery count, member, lock ms, due, reason), fresh
        offsets left out: what the durable state must say."""
        out = {}
        for o, e in self.entries.items():
            if o >= self.start and not (e.state == AVAIL and e.count == 0 and e.due == 0):
                out[o] = (e.state, e.count, e.member, e.lock_ms, e.due, e.reason)
        return out
