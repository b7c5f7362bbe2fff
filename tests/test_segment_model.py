"""Property-based test: random operation sequences against a simple in-memory model."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from laminar.errors import CorruptBatchError, InvalidRequestError, OffsetOutOfRangeError
from laminar.segment import LogConfig, PartitionLog, build_batch, verify_batch
from laminar.segment.batch import iter_batches, stamp

CFG = LogConfig(segment_bytes=1500, index_interval_bytes=250, retention_ms=1000, segment_ms=1000)


@dataclass
class Entry:
    base: int
    last: int
    term: int
    max_ts: int
    data: bytes  # as stored (stamped)


class LogModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="laminar-model-"))
        self.log = PartitionLog.open(self.dir, CFG)
        self.entries: list[Entry] = []
        self.start = 0
        self.prev_term = 0
        self.term = 1
        self.clock = 10_000  # wall clock passed to append (time-based rolling)

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def end(self) -> int:
        return self.entries[-1].last + 1 if self.entries else self.start

    def _stored(self, raw: bytes, base: int, term: int) -> bytes:
        buf = bytearray(raw)
        stamp(buf, base, term)
        return bytes(buf)

    @rule(
        sizes=st.lists(st.integers(0, 400), min_size=1, max_size=4),
        ts=st.lists(st.integers(0, 5000), min_size=4, max_size=4),
    )
    def append(self, sizes: list[int], ts: list[int]) -> None:
        recs = [(None, bytes([i]) * s, (), ts[i]) for i, s in enumerate(sizes)]
        raw = build_batch(recs)
        base, last = self.log.append(raw, term=self.term, now_ms=self.clock)
        assert (base, last) == (self.end, self.end + len(sizes) - 1)
        mx = max(ts[: len(sizes)])
        self.entries.append(Entry(base, last, self.term, mx, self._stored(raw, base, self.term)))

    @rule(n=st.integers(1, 3))
    def append_stamped(self, n: int) -> None:
        raw = bytearray(build_batch([(b"f", b"x" * 50, (), 100)] * n))
        stamp(raw, self.end, self.term)
        base, last = self.log.append_stamped(raw, now_ms=self.clock)
        assert base == self.end
        self.entries.append(Entry(base, last, self.term, 100, bytes(raw)))

    @rule(cut=st.integers(1, 60))
    def append_bad(self, cut: int) -> None:
        raw = build_batch([(None, b"y" * 60, (), 1)])
        with pytest.raises(CorruptBatchError):
            self.log.append(raw[:-cut], term=self.term)
        bad = bytearray(raw)
        stamp(bad, self.end + 1, self.term)
        with pytest.raises(InvalidRequestError):
            self.log.append_stamped(bad)

    @rule(ms=st.integers(1, 1500))
    def advance_clock(self, ms: int) -> None:
        self.clock += ms

    @rule()
    def bump_term(self) -> None:
        self.term += 1

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def flush(self) -> None:
        assert self.log.flush() == self.end
        assert self.log.durable_offset == self.end

    @rule(data=st.data())
    def read(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.start, self.end))
        max_bytes = data.draw(st.integers(1, 3000))
        upto = data.draw(st.one_of(st.none(), st.integers(self.start, self.end + 2)))
        s = self.log.read(offset, max_bytes, upto=upto)
        got = s.tobytes()
        limit = self.end if upto is None else min(upto, self.end)
        if offset == self.end:
            assert got == b""
            return
        i = next(k for k, e in enumerate(self.entries) if e.last >= offset)
        if self.entries[i].last >= limit:
            assert got == b"" and s.next_offset == offset
            return
        parts = [got[p : p + h.batch_length] for p, h in iter_batches(got)]
        assert parts, "at least one batch"
        assert parts == [e.data for e in self.entries[i : i + len(parts)]]
        assert len(got) <= max_bytes or len(parts) == 1
        assert self.entries[i + len(parts) - 1].last < limit
        assert s.base_offset == self.entries[i].base
        assert s.next_offset == self.entries[i + len(parts) - 1].last + 1
        j = i + len(parts)
        if j < len(self.entries):  # maximal: the next batch was left out for a reason
            nxt = self.entries[j]
            bases = {int(p.stem) for p in self.dir.glob("*.log")}
            assert nxt.last >= limit or len(got) + len(nxt.data) > max_bytes or nxt.base in bases

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def batches(self, data: st.DataObject) -> None:
        start = data.draw(st.integers(self.start, self.end - 1))
        end = data.draw(st.integers(start + 1, self.end))
        max_bytes = data.draw(st.integers(1, 5000))
        views = self.log.batches(start, end, max_bytes)
        i = next(k for k, e in enumerate(self.entries) if e.last >= start)
        assert [bytes(v) for v in views] == [e.data for e in self.entries[i : i + len(views)]]
        assert views and verify_batch(views[-1]).base_offset < end
        total = sum(len(v) for v in views)
        if len(views) > 1:
            assert total <= max_bytes
        j = i + len(views)
        if j < len(self.entries) and self.entries[j].base < end:
            assert total + len(self.entries[j].data) > max_bytes

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        k = data.draw(st.integers(0, len(self.entries) - 1))
        e = self.entries[k]
        if e.last > e.base:
            with pytest.raises(InvalidRequestError):
                self.log.truncate(e.base + 1)
        self.log.truncate(e.base)
        del self.entries[k:]

    @rule(gap=st.integers(0, 5), prev=st.integers(0, 9))
    def reset(self, gap: int, prev: int) -> None:
        new_start = self.end + gap
        self.log.reset(new_start, prev)
        self.entries.clear()
        self.start, self.prev_term = new_start, prev

    @rule(now=st.integers(0, 7000), use_upto=st.booleans())
    def expire(self, now: int, use_upto: bool) -> None:
        upto = (self.start + self.end) // 2 if use_upto else None
        self.log.expire(now, upto=upto)
        new_start = self.log.start_offset
        assert new_start >= self.start
        if new_start != self.start:
            dropped = [e for e in self.entries if e.base < new_start]
            assert dropped and dropped[-1].last + 1 == new_start
            assert all(e.max_ts < now - CFG.retention_ms for e in dropped)
            if upto is not None:
                assert new_start <= upto
            self.prev_term = dropped[-1].term
            self.entries = self.entries[len(dropped) :]
            self.start = new_start

    @rule()
    def reopen(self) -> None:
        self.log.close()
        self.log = PartitionLog.open(self.dir, CFG)

    @rule(ts=st.integers(0, 5100))
    def offset_for_timestamp(self, ts: int) -> None:
        want = next((e.base for e in self.entries if e.max_ts >= ts), None)
        assert self.log.offset_for_timestamp(ts) == want

    @invariant()
    def bounds_and_terms(self) -> None:
        log = self.log
        assert (log.start_offset, log.end_offset) == (self.start, self.end)
        assert log.durable_offset <= log.end_offset
        assert log.term_at(self.start - 1) == self.prev_term
        for e in self.entries[-3:] + self.entries[:2]:
            assert log.term_at(e.base) == e.term == log.term_at(e.last)
            assert log.batch_bounds(e.last) == (e.base, e.last)
        with pytest.raises(OffsetOutOfRangeError):
            log.term_at(self.end)


LogModel.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_segment_model = LogModel.TestCase
