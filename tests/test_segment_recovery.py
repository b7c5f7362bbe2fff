"""Recovery on open: torn and corrupt active tails are cut, sealed damage is reported,
index files are rebuilt, interrupted expiry finishes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from laminar.errors import CorruptLogError
from laminar.segment import LogConfig, PartitionLog, build_batch
from laminar.segment.meta import write_start

CFG = LogConfig(segment_bytes=4000, index_interval_bytes=600)
NOW = 1_800_000_000_000


def fill(path: Path, n: int = 40, cfg: LogConfig = CFG) -> list[bytes]:
    """n one-record batches of ~330 bytes; returns the stored (stamped) batches."""
    with PartitionLog.open(path, cfg) as log:
        for i in range(n):
            log.append(
                build_batch([(b"k", bytes([i]) * 250, (), NOW + i)]), term=1 + i // 15, now_ms=NOW
            )
        log.flush()
        return [bytes(v) for v in log.batches(0, n, 1 << 30)]


def contents(log: PartitionLog) -> list[bytes]:
    if log.end_offset == log.start_offset:
        return []
    return [bytes(v) for v in log.batches(log.start_offset, log.end_offset, 1 << 30)]


def segs(path: Path) -> list[Path]:
    return sorted(path.glob("*.log"))


def test_clean_reopen_is_identical(tmp_path: Path) -> None:
    stored = fill(tmp_path)
    index_bytes = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with PartitionLog.open(tmp_path, CFG) as log:
        assert contents(log) == stored
        assert log.durable_offset == log.end_offset == 40
        assert log.verify() == 40
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == index_bytes


@pytest.mark.parametrize("same_boot", [False, True])
@pytest.mark.parametrize("cut", [1, 67, 68, 200])
def test_torn_active_tail_is_cut(tmp_path: Path, cut: int, same_boot: bool) -> None:
    """A write cut short by the writer's death (same boot) or a power cut: either way the
    file ends inside the last batch, which the header walk finds as the crc check does."""
    stored = fill(tmp_path)
    last = segs(tmp_path)[-1]
    size = last.stat().st_size
    with open(last, "r+b") as f:  # the last batch is only partly on disk
        f.truncate(size - len(stored[-1]) + cut)
    (tmp_path / last.name.replace(".log", ".index")).write_bytes(b"")  # (walk it all)
    with PartitionLog.open(tmp_path, CFG, same_boot=same_boot) as log:
        assert log.end_offset == 39
        assert contents(log) == stored[:-1]
        assert last.stat().st_size == size - len(stored[-1])
        assert log.append(build_batch([(None, b"again", (), NOW)]), term=3) == (39, 39)
        assert log.verify() == 40


def test_zero_filled_tail_is_cut(tmp_path: Path) -> None:
    stored = fill(tmp_path)
    last = segs(tmp_path)[-1]
    with open(last, "ab") as f:
        f.write(bytes(5000))
    with PartitionLog.open(tmp_path, CFG) as log:
        assert contents(log) == stored


@pytest.mark.parametrize("where", [20, 30, 100, -1])
def test_bit_flip_in_active_tail_is_cut(tmp_path: Path, where: int) -> None:
    stored = fill(tmp_path)
    last = segs(tmp_path)[-1]
    size = last.stat().st_size
    pos = size - len(stored[-1]) + (where if where >= 0 else len(stored[-1]) - 1)
    with open(last, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x10]))
    with PartitionLog.open(tmp_path, CFG) as log:
        assert contents(log) == stored[:-1]
        assert log.verify() == 39


def test_on_the_same_boot_the_tail_is_walked_and_checked_when_first_read(
    tmp_path: Path,
) -> None:
    """Same boot: the page cache holds the tail as written, so opening reads only its batch
    headers (at 10,000 partitions and 10 GiB, reading every byte was the whole restart). A
    damaged byte there (no process wrote it) is met by the first read, as in a sealed
    segment, and never served."""
    stored = fill(tmp_path)
    last = segs(tmp_path)[-1]
    first_in_active = int(last.stem)
    (tmp_path / last.name.replace(".log", ".index")).write_bytes(b"")  # (lost in the kill)
    with open(last, "r+b") as f:  # a record byte of the active segment's second batch
        f.seek(len(stored[first_in_active]) + 100)
        b = f.read(1)
        f.seek(len(stored[first_in_active]) + 100)
        f.write(bytes([b[0] ^ 1]))
    other_boot = tmp_path.parent / "other-boot"
    shutil.copytree(tmp_path, other_boot)
    with PartitionLog.open(tmp_path, CFG, same_boot=True) as log:
        assert log.end_offset == 40  # (not read, so not cut)
        good = log.batches(0, first_in_active + 1, 1 << 30)
        assert [bytes(v) for v in good] == stored[: first_in_active + 1]
        with pytest.raises(CorruptLogError, match="crc32c"):
            log.batches(first_in_active, 40, 1 << 30)
    with PartitionLog.open(other_boot, CFG) as log:  # another boot: checked and cut at open
        assert contents(log) == stored[: first_in_active + 1]


def test_corruption_before_later_good_batches_cuts_from_there(tmp_path: Path) -> None:
    stored = fill(tmp_path)
    last = segs(tmp_path)[-1]
    with PartitionLog.open(tmp_path, CFG) as log:
        in_active = log.end_offset - int(last.stem)
    # flip a byte in the first batch of the active segment; the index entry at position 0 is
    # kept but the batch fails its crc, so everything from there on is dropped (and logged)
    (tmp_path / last.name.replace(".log", ".index")).write_bytes(b"")
    with open(last, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    with PartitionLog.open(tmp_path, CFG) as log:
        assert contents(log) == stored[: 40 - in_active]


def test_bit_flip_in_sealed_segment_is_reported(tmp_path: Path) -> None:
    fill(tmp_path)
    first = segs(tmp_path)[0]
    with open(first, "r+b") as f:
        f.seek(500)
        b = f.read(1)
        f.seek(500)
        f.write(bytes([b[0] ^ 0x01]))
    with PartitionLog.open(tmp_path, CFG) as log:  # trusted through its index: opens fast
        with pytest.raises(CorruptLogError, match=rf"{first.name}.*position 328"):
            log.verify()
        with pytest.raises(CorruptLogError, match=first.name):
            log.batches(0, 5, 1 << 20)  # replication reads check crcs
        assert log.end_offset == 40
    (tmp_path / first.name.replace(".log", ".index")).unlink()
    with pytest.raises(CorruptLogError, match=rf"{first.name}.*position 328"):
        PartitionLog.open(tmp_path, CFG)


@pytest.mark.parametrize(
    ("at", "why"), [(500, "crc32c"), (328 + 7, "base offset"), (328 + 10, "stamped term")]
)
def test_consumer_reads_check_a_sealed_segment_once(tmp_path: Path, at: int, why: str) -> None:
    """A sealed segment opened through its index was never read by this process: fetches
    check its batches (crc, and the offsets and terms the crc does not cover) before serving
    them; replication reads and verify() check the stamped terms too."""
    stored = fill(tmp_path)
    first = segs(tmp_path)[0]
    with open(first, "r+b") as f:  # the second batch (position 328) is damaged
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))
    with PartitionLog.open(tmp_path, CFG) as log:
        with log.read(0, 300) as good:  # the batch before the damage is served
            assert good.tobytes() == stored[0]
        with pytest.raises(CorruptLogError, match=rf"{first.name}.*position 328.*{why}"):
            log.read(0, 1 << 20)
        with pytest.raises(CorruptLogError, match=first.name):
            log.read(1, 1 << 20)
        with pytest.raises(CorruptLogError, match=first.name):
            log.batches(0, 5, 1 << 20)
        with pytest.raises(CorruptLogError, match=first.name):
            log.verify()
        second = log._segment_for(20)
        with log.read(second.base, 1 << 20) as rest:  # another segment: served, checked once
            assert rest.tobytes().startswith(stored[second.base])
        assert second.unchecked_from == second.size


def test_truncated_sealed_segment_is_reported(tmp_path: Path) -> None:
    fill(tmp_path)
    second = segs(tmp_path)[1]
    with open(second, "r+b") as f:
        f.truncate(second.stat().st_size - 100)
    with pytest.raises(CorruptLogError, match=second.name):
        PartitionLog.open(tmp_path, CFG)


def test_missing_sealed_segment_is_reported(tmp_path: Path) -> None:
    fill(tmp_path)
    for p in tmp_path.glob(segs(tmp_path)[0].stem + ".*"):
        p.unlink()
    with pytest.raises(CorruptLogError, match="first segment starts at"):
        PartitionLog.open(tmp_path, CFG)


@pytest.mark.parametrize("damage", ["delete", "garbage", "truncate", "zeros"])
def test_index_files_are_rebuilt(tmp_path: Path, damage: str) -> None:
    stored = fill(tmp_path)
    originals = {p.name: p.read_bytes() for p in tmp_path.glob("*index")}
    for p in tmp_path.glob("*index"):
        if damage == "delete":
            p.unlink()
        elif damage == "garbage":
            p.write_bytes(os.urandom(len(originals[p.name]) + 5))
        elif damage == "truncate":
            p.write_bytes(originals[p.name][:-7])
        else:
            p.write_bytes(bytes(len(originals[p.name])))
    with PartitionLog.open(tmp_path, CFG) as log:
        assert contents(log) == stored
        assert [log.term_at(o) for o in range(40)] == [1 + i // 15 for i in range(40)]
        assert log.offset_for_timestamp(NOW + 17) == 17
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*index")} == originals


def test_index_entries_lost_in_a_kill_are_buffered_again_not_rewritten(tmp_path: Path) -> None:
    # A killed process loses the active segment's buffered index entries (written at a
    # threshold, seal or close). Reopening buffers them again instead of rewriting both
    # files: at 10,000 replicas the rewrites (each close after a truncating write starts
    # the file's writeback) were about a sixth of a restart's opening.
    stored = fill(tmp_path)
    active = segs(tmp_path)[-1].stem
    files = sorted(tmp_path.glob(f"{active}.*index"))
    originals = {p.name: p.read_bytes() for p in files}
    assert len(files) == 2 and all(originals.values())
    for p in files:
        p.write_bytes(b"")
    with PartitionLog.open(tmp_path, CFG) as log:
        assert all(p.read_bytes() == b"" for p in files)  # nothing written at open
        assert contents(log) == stored
        assert [log.term_at(o) for o in range(40)] == [1 + i // 15 for i in range(40)]
        assert log.offset_for_timestamp(NOW + 39) == 39
    assert {p.name: p.read_bytes() for p in files} == originals  # written at close


def test_index_entries_beyond_data_are_dropped(tmp_path: Path) -> None:
    stored = fill(tmp_path)
    last = segs(tmp_path)[-1]
    with PartitionLog.open(tmp_path, CFG) as log:
        base = int(last.stem)
        keep = log.batch_bounds(base + 2)[0]
        cut = sum(len(b) for b in stored[base:keep])
    with open(last, "r+b") as f:  # data lost after the index was written
        f.truncate(cut)
    with PartitionLog.open(tmp_path, CFG) as log:
        assert contents(log) == stored[:keep]
        assert log.verify() == keep


def test_interrupted_expiry_and_stray_files_are_cleaned(tmp_path: Path) -> None:
    stored = fill(tmp_path)
    names = segs(tmp_path)
    new_start = int(names[2].stem)
    write_start(tmp_path, new_start, 1)  # crash after the marker, before the deletions
    (tmp_path / "99999999999999999999.index").write_bytes(b"orphan")
    (tmp_path / "start.meta.tmp").write_bytes(b"half")
    with PartitionLog.open(tmp_path, CFG) as log:
        assert log.start_offset == new_start
        assert log.term_at(new_start - 1) == 1
        assert contents(log) == stored[new_start:]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert names[0].name not in left and names[1].name not in left
    assert "99999999999999999999.index" not in left and "start.meta.tmp" not in left


def test_corrupt_start_marker_is_reported(tmp_path: Path) -> None:
    fill(tmp_path, 5)
    write_start(tmp_path, 0, 0)
    data = bytearray((tmp_path / "start.meta").read_bytes())
    data[10] ^= 1
    (tmp_path / "start.meta").write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=r"start\.meta"):
        PartitionLog.open(tmp_path, CFG)


def test_sealed_segment_count_does_not_scan_data(tmp_path: Path) -> None:
    """Sealed data files are not read on open: a flip deep inside one goes unnoticed until
    verify(), which proves open used the index (and stays fast on big logs)."""
    fill(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path, copy, ignore=shutil.ignore_patterns("copy"))
    first = segs(copy)[0]
    with open(first, "r+b") as f:
        f.seek(800)
        f.write(b"\xff")
    with PartitionLog.open(copy, CFG) as log:
        assert log.end_offset == 40
        with pytest.raises(CorruptLogError):
            log.verify()


@pytest.mark.parametrize("entries", [1, 3, 100])
def test_sealed_index_that_lost_its_tail_still_works(tmp_path: Path, entries: int) -> None:
    """Sealing does not fsync index files: after a power cut an index may miss its last
    entries (whole ones). The log must still open and answer correctly."""
    stored = fill(tmp_path)
    for p in sorted(tmp_path.glob("*.index"))[:-1]:
        data = p.read_bytes()
        p.write_bytes(data[: max(0, len(data) - 24 * entries)])
    with PartitionLog.open(tmp_path, CFG) as log:
        assert contents(log) == stored
        assert [log.term_at(o) for o in range(40)] == [1 + i // 15 for i in range(40)]
        assert [log.batch_bounds(o)[0] for o in range(40)] == list(range(40))
        assert log.offset_for_timestamp(NOW + 23) == 23
        assert log.verify() == 40


def test_after_one_syncfs_a_reopen_needs_no_fdatasync_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart syncs the filesystem once (filesystem_syncer) and opens its logs ``synced``:
    the tail a crashed process left in the page cache is then durable without one fdatasync
    per log; without ``synced`` the open still makes that tail durable itself."""
    from laminar.segment.fileio import filesystem_syncer

    log = PartitionLog.open(tmp_path, CFG)
    log.append(build_batch([(b"k", b"unsynced", (), NOW)]), term=1, now_ms=NOW)
    stored = contents(log)  # written, never flushed: as a SIGKILLed process leaves it
    log.close()
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    with PartitionLog.open(tmp_path, CFG) as reopened:
        assert contents(reopened) == stored
    assert synced, "an open on its own must fdatasync the recovered tail"
    synced.clear()
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs = filesystem_syncer(directory)
        assert syncfs is not None, "syncfs(2) is missing on this Linux"
        syncfs()
    finally:
        os.close(directory)
    with PartitionLog.open(tmp_path, CFG, synced=True) as reopened:
        assert contents(reopened) == stored and reopened.durable_offset == 1
    assert not synced
