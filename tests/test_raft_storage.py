"""The storage protocol as MemoryStorage implements it, and the core's log view over it."""

from __future__ import annotations

import pytest

from laminar.raft import CompactedError, Entry, EntryKind, MemoryStorage, UnavailableError
from laminar.raft.log import RaftLog

N = EntryKind.NORMAL


def batch(term: int, index: int, count: int, data: bytes = b"d") -> Entry:
    return Entry(term, index, index + count - 1, N, data)


def multi() -> MemoryStorage:
    st = MemoryStorage()
    st.append([batch(1, 0, 3), batch(1, 3, 1), batch(2, 4, 5)])
    return st


def test_terms_of_multi_offset_entries() -> None:
    st = multi()
    assert (st.first_index(), st.last_index()) == (0, 8)
    assert [st.term(i) for i in range(9)] == [1, 1, 1, 1, 2, 2, 2, 2, 2]
    assert st.term(-1) == 0
    with pytest.raises(UnavailableError):
        st.term(9)


def test_entries_cover_the_range_and_respect_max_bytes() -> None:
    st = multi()
    assert [e.index for e in st.entries(1, 9, 1 << 20)] == [0, 3, 4]
    assert [e.index for e in st.entries(3, 4, 1 << 20)] == [3]
    assert [e.index for e in st.entries(0, 9, 0)] == [0]  # always at least one
    assert [e.index for e in st.entries(0, 9, 70)] == [0, 3]


def test_truncate_append_reset_compact() -> None:
    st = multi()
    st.truncate(4)
    assert st.last_index() == 3
    with pytest.raises(ValueError):
        st.truncate(1)  # inside an entry
    st.append([batch(3, 4, 2)])
    assert st.term(5) == 3
    st.append([batch(4, 3, 1)])  # overwrite from 3
    assert st.last_index() == 3 and st.term(3) == 4
    st.compact(2)
    assert st.first_index() == 3 and st.term(2) == 1
    with pytest.raises(CompactedError):
        st.term(1)
    with pytest.raises(CompactedError):
        st.entries(2, 4, 100)
    st.reset(100, 7)
    assert (st.first_index(), st.last_index(), st.term(99)) == (100, 99, 7)
    with pytest.raises(ValueError):
        st.append([batch(7, 105, 1)])  # gap


def test_log_view_layers_unstable_entries_over_storage() -> None:
    st = multi()
    log = RaftLog(st)
    log.append([batch(3, 4, 2), batch(3, 6, 1)])  # replaces 4.. (storage still has them)
    assert log.last_index() == 6
    assert log.term(3) == 1 and log.term(5) == 3
    assert [e.index for e in log.entries(1, 7)] == [0, 3, 4, 6]
    assert [e.index for e in log.entries(5, 7)] == [4, 6]
    assert log.find_conflict_by_term(6, 2) == 3
    assert log.find_conflict_by_term(6, 0) == -1
    handed = log.unstable
    st.append(handed)
    log.stable(handed, len(handed), None)
    assert log.unstable == [] and log.last_index() == 6 and log.term(6) == 3


def test_log_view_pending_reset_hides_storage() -> None:
    log = RaftLog(multi())
    log.reset(50, 4)
    assert (log.first_index(), log.last_index(), log.term(49)) == (50, 49, 4)
    with pytest.raises(CompactedError):
        log.term(3)
    log.append([batch(5, 50, 1)])
    assert log.last_index() == 50 and log.term(50) == 5
