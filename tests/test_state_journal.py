"""The node-wide journal of Raft hard states: buffered writes reach the file in one system call
at ``sync``, replay restores the newest state of each replica, and a torn tail is cut."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from laminar.node.state_journal import JOURNAL_FILE, StateJournal
from laminar.raft import ConfState, HardState

CONF = ConfState(voters=(1, 2, 3))


def replica_dirs(tmp_path: Path, count: int) -> list[Path]:
    dirs = [tmp_path / f"topic-{n}" for n in range(count)]
    for directory in dirs:
        directory.mkdir()
    return dirs


def test_writes_reach_the_file_in_one_call_at_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = StateJournal(tmp_path / JOURNAL_FILE)
    journal.open()
    dirs = replica_dirs(tmp_path, 1000)
    for term, directory in enumerate(dirs):
        journal.write(directory, HardState(term=term, vote=2, commit=-1), CONF)
    assert journal.path.stat().st_size == 0  # buffered until the pass syncs
    calls = []
    real_write = os.write

    def counting_write(fd: int, data: bytes) -> int:
        calls.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    journal.sync()
    monkeypatch.undo()
    assert len(calls) == 1 and calls[0] == journal.path.stat().st_size
    journal.close()

    again = StateJournal(tmp_path / JOURNAL_FILE)
    for term, directory in enumerate(dirs):
        hard, conf = again.load(directory)
        assert hard == HardState(term=term, vote=2, commit=-1) and conf == CONF
    again.close()


def test_newest_state_wins_close_keeps_the_buffer_and_a_torn_tail_is_cut(tmp_path: Path) -> None:
    (directory,) = replica_dirs(tmp_path, 1)
    journal = StateJournal(tmp_path / JOURNAL_FILE)
    journal.write(directory, HardState(term=1, vote=1, commit=-1), CONF)
    journal.sync()
    journal.write(directory, HardState(term=2, vote=3, commit=-1), CONF)
    journal.close()  # (a clean stop writes what is buffered)
    size = journal.path.stat().st_size
    with journal.path.open("ab") as f:
        f.write(b"\x40\x00\x00\x00torn")  # a record header promising more than follows
    again = StateJournal(tmp_path / JOURNAL_FILE)
    assert again.load(directory)[0] == HardState(term=2, vote=3, commit=-1)
    assert journal.path.stat().st_size == size
    again.close()


def test_compaction_keeps_every_live_state_including_buffered_ones(tmp_path: Path) -> None:
    dirs = replica_dirs(tmp_path, 3)
    journal = StateJournal(tmp_path / JOURNAL_FILE)
    for term in range(4200):  # compacted at the 41st sync: many more records than live entries
        journal.write(dirs[term % 3], HardState(term=term, vote=1, commit=-1), CONF)
        if term % 100 == 99:
            journal.sync()
    journal.sync()
    journal.close()
    again = StateJournal(tmp_path / JOURNAL_FILE)
    assert [again.load(d)[0].term for d in dirs] == [4197, 4198, 4199]  # type: ignore[union-attr]
    again.close()
    assert journal.path.stat().st_size < 103 * 200  # 3 records at compaction, 100 since


def test_compaction_after_a_reopen_keeps_replayed_states_and_drops_forgotten_ones(
    tmp_path: Path,
) -> None:
    # A compaction writes each live state's record as it was last written or replayed: the
    # states only replayed from the file must survive it byte for byte, forgotten ones not.
    dirs = replica_dirs(tmp_path, 5)
    journal = StateJournal(tmp_path / JOURNAL_FILE)
    for n, directory in enumerate(dirs):
        journal.write(directory, HardState(term=10 + n, vote=n, commit=-1), CONF)
    journal.forget(dirs[4].name)
    journal.sync()
    journal.close()
    reopened = StateJournal(tmp_path / JOURNAL_FILE)
    reopened.open()
    for term in range(4200):  # only dirs[0] changes: compacted along the way
        reopened.write(dirs[0], HardState(term=100 + term, vote=1, commit=-1), CONF)
        if term % 100 == 99:
            reopened.sync()
    reopened.close()
    assert reopened.path.stat().st_size < 104 * 200  # 4 records at compaction, 100 since
    again = StateJournal(tmp_path / JOURNAL_FILE)
    assert again.load(dirs[0])[0] == HardState(term=4299, vote=1, commit=-1)
    for n in (1, 2, 3):
        assert again.load(dirs[n]) == (HardState(term=10 + n, vote=n, commit=-1), CONF)
    assert again.load(dirs[4]) == (None, None)  # forgotten (no state file either)
    again.close()


def test_writes_do_not_wait_for_a_sync_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The flush thread's fdatasync of the journal must not hold up the event loop's writes
    # and forgets (a big topic's new replicas each forget a stale state); the state written
    # meanwhile is durable with the next sync.
    journal = StateJournal(tmp_path / JOURNAL_FILE)
    journal.open()
    first, second = replica_dirs(tmp_path, 2)
    journal.write(first, HardState(term=1, vote=2, commit=-1), CONF)
    in_sync, release = threading.Event(), threading.Event()
    real_fdatasync = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        in_sync.set()
        assert release.wait(10)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    syncing = threading.Thread(target=journal.sync)
    syncing.start()
    assert in_sync.wait(10)
    started = time.monotonic()
    journal.write(second, HardState(term=7, vote=3, commit=-1), CONF)
    journal.forget("gone")
    assert time.monotonic() - started < 1
    release.set()
    syncing.join(10)
    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    journal.sync()
    journal.close()
    reopened = StateJournal(tmp_path / JOURNAL_FILE)
    assert reopened.load(first)[0] == HardState(term=1, vote=2, commit=-1)
    assert reopened.load(second)[0] == HardState(term=7, vote=3, commit=-1)
