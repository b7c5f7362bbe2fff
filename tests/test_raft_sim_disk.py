"""The simulated disk behind the Raft simulation: what survives a power loss, and recovery."""

from __future__ import annotations

import random

from laminar.raft import ConfState, Entry, EntryKind, HardState
from tests.raft_sim_disk import SimDisk, encode_record, recover_records

CONF = ConfState((1, 2, 3))


def _ents(first: int, n: int, term: int = 1) -> list[Entry]:
    return [Entry(term, i, i, EntryKind.NORMAL, b"x%d" % i) for i in range(first, first + n)]


def _keys(ents: list[Entry]) -> list[tuple[int, int, bytes]]:
    return [(e.index, e.term, bytes(e.data)) for e in ents]


def test_recovery_cuts_a_record_torn_at_any_byte() -> None:
    ents = [*_ents(0, 2), Entry(1, 2, 4, EntryKind.NORMAL, b"three records")]
    whole = b"".join(encode_record(e) for e in ents)
    last = encode_record(ents[-1])
    for cut in range(1, len(last)):
        got, torn = recover_records(whole[: len(whole) - cut])
        assert torn and _keys(got) == _keys(ents[:2])
    got, torn = recover_records(whole)
    assert not torn and _keys(got) == _keys(ents)


def test_recovery_stops_at_a_corrupt_record() -> None:
    ents = _ents(0, 3)
    buf = bytearray(b"".join(encode_record(e) for e in ents))
    buf[len(encode_record(ents[0])) + 5] ^= 0x40  # a flipped bit in the second record
    got, torn = recover_records(bytes(buf))
    assert torn and _keys(got) == _keys(ents[:1])


def test_a_crash_keeps_the_synced_log_and_a_prefix_of_later_writes() -> None:
    first, second, third = _ents(0, 3), _ents(3, 2), _ents(4, 3, term=2)
    before = _keys(first + second)  # then offset 4 is overwritten (a follower's truncation)
    after_all = _keys(first + second[:1] + third)
    # Every state the log passed through, write by write.
    history = [before[:3], before[:4], before, before[:4]]
    history += [after_all[:5], after_all[:6], after_all]
    outcomes = set()
    for seed in range(200):
        disk = SimDisk(CONF)
        disk.append(first)
        disk.fsync()
        disk.append(second)
        disk.append(third)
        assert _keys(disk.written.all_entries()) == after_all
        report = disk.crash(random.Random(seed))
        after = _keys(disk.written.all_entries())
        assert after in history, (seed, after)  # synced entries never lost; then a prefix
        outcomes.add((history.index(after), report.torn))
    # Every cut point shows up, torn or not.
    assert {n for n, _ in outcomes} == {history.index(h) for h in history}
    assert any(torn for _, torn in outcomes)


def test_fsync_makes_everything_written_survive() -> None:
    for seed in range(50):
        disk = SimDisk(CONF)
        disk.append(_ents(0, 4))
        disk.compact(1)
        disk.save_state(HardState(3, 2, 1), None)
        disk.fsync()
        disk.crash(random.Random(seed))
        assert _keys(disk.written.all_entries()) == _keys(_ents(2, 2))
        assert (disk.hs.term, disk.hs.vote) == (3, 2)


def test_state_file_survives_or_not_independently_of_the_log() -> None:
    seen = set()
    for seed in range(200):
        disk = SimDisk(CONF)
        disk.append(_ents(0, 2))
        disk.save_state(HardState(5, 1, 0), ConfState((1, 2, 3, 4), (), 1))
        report = disk.crash(random.Random(seed))
        term = disk.hs.term
        assert term in (0, 5)
        assert (term == 5) == report.state_survived == (disk.conf.voters == (1, 2, 3, 4))
        assert report.state_lost == (term == 0)
        seen.add((term, disk.written.last_index()))
    assert seen == {(t, last) for t in (0, 5) for last in (-1, 0, 1)}


def test_a_commit_change_alone_does_not_rewrite_the_state_file() -> None:
    disk = SimDisk(CONF)
    disk.save_state(HardState(2, 1, 0), None)
    disk.fsync()
    assert not disk.dirty()
    disk.save_state(HardState(2, 1, 7), None)  # only the commit moved: not written
    assert not disk.dirty()
    disk.save_state(HardState(3, 0, 7), None)  # a new term is written, with the newest commit
    assert disk.dirty() and disk.hs == HardState(3, 0, 7)
