"""Opening a replica walks its log's tail once (``PartitionLog.read_tail``: headers, and the
bytes of control batches only) and shares it with the producer table, the seal lookup and the
Raft core's configuration scan. Each must find exactly what it finds reading the log itself,
also where the tail does not reach: these tests reopen real logs and compare both ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar.errors import CorruptLogError
from laminar.node import producers
from laminar.node.log_storage import LogStorage, batch_to_entry
from laminar.node.producers import ProducerTable
from laminar.raft import ConfState, Entry, EntryKind, HardState, RaftNode, encode_conf
from laminar.segment.batch import build_batch, is_control, read_header
from laminar.segment.log import LogConfig, PartitionLog
from laminar.splits.seal import find_seal, seal_batch


def _record(key: bytes, size: int = 40, count: int = 1, **producer: int) -> memoryview:
    records = [(key, b"v" * size, (), 1_000 + i) for i in range(count)]
    return memoryview(build_batch(records, **producer))


def _producer_state(table: ProducerTable) -> dict[int, list[tuple[int, int, int, int]]]:
    return {
        pid: [(w.base_sequence, w.base_offset, w.last_offset, w.producer_epoch) for w in ws]
        for pid, ws in table._producers.items()
    }


def _old_way(log: PartitionLog) -> tuple[dict[int, list[tuple[int, int, int, int]]], int | None]:
    """What opening found before the shared tail: every reader reads the log itself."""
    table = ProducerTable()
    table.rebuild(log)
    return _producer_state(table), find_seal(log)


def _append(storage: LogStorage, term: int, kind: EntryKind, data: bytes | memoryview) -> int:
    index = storage.log.end_offset
    last = index + (read_header(data).last_offset_delta if kind == EntryKind.NORMAL else 0)
    storage.append([Entry(term, index, last, kind, data)])
    return index


def _assert_same_as_old_way(path: Path, config: LogConfig, roll_at_control: bool = False) -> None:
    with PartitionLog.open(path, config) as log:
        expected = _old_way(log)
    storage = LogStorage(PartitionLog.open(path, config), roll_at_control)
    try:
        assert _producer_state(storage.producers) == expected[0]
        assert storage.seal_offset == (None if roll_at_control else expected[1])
    finally:
        storage.log.close()


def test_seal_under_noops_in_the_tail_and_behind_a_roll(tmp_path: Path) -> None:
    """The seal rolls its segment, so the no-ops after it sit in the next one: the walk back
    leaves the tail for the sealed segment. Without the roll it stays in the tail."""
    config = LogConfig(segment_bytes=1 << 20)
    storage = LogStorage(PartitionLog.open(tmp_path / "log", config))
    for i in range(5):
        _append(storage, 1, EntryKind.NORMAL, _record(b"k%d" % i))
    seal_at = _append(storage, 1, EntryKind.NORMAL, memoryview(seal_batch("op-1", 5)))
    assert storage.seal_offset == seal_at and storage.log.segment_count == 2
    for term in range(2, 6):
        _append(storage, term, EntryKind.NOOP, b"")
    storage.log.close()
    with PartitionLog.open(tmp_path / "log", config) as log:
        tail = log.read_tail(0)
        assert tail.start == 0 and tail.end == log.end_offset
        assert find_seal(log, tail) == find_seal(log) == seal_at
        later = log.read_tail(seal_at + 1)  # the no-ops only: the walk back leaves it
        assert later.start == seal_at + 1 and find_seal(log, later) == seal_at
    _assert_same_as_old_way(tmp_path / "log", config)

    # a seal inside the active segment, under no-ops and a configuration change
    other = tmp_path / "other"
    storage = LogStorage(PartitionLog.open(other, config))
    _append(storage, 1, EntryKind.NORMAL, _record(b"a"))
    seal = seal_batch("op-2", 5)
    index = storage.log.end_offset
    storage.log.append(seal, term=1)  # as a follower stores it before the roll
    for term in range(2, 5):
        _append(storage, term, EntryKind.NOOP, b"")
    _append(storage, 5, EntryKind.CONFIG, encode_conf(ConfState(voters=(1, 2, 3))))
    storage.log.close()
    with PartitionLog.open(other, config) as log:
        tail = log.read_tail(0)
        assert tail.start == 0
        assert find_seal(log, tail) == find_seal(log) == index
        # a tail that starts later: the walk goes on in the log itself
        short = log.read_tail(log.end_offset - 2)
        assert short.start > 0 and find_seal(log, short) == index
    _assert_same_as_old_way(other, config)


def test_seal_walk_stops_at_a_record_batch_and_at_the_scan_limit(tmp_path: Path) -> None:
    config = LogConfig()
    storage = LogStorage(PartitionLog.open(tmp_path / "log", config))
    _append(storage, 1, EntryKind.NORMAL, memoryview(seal_batch("op", 5)))
    _append(storage, 1, EntryKind.NORMAL, _record(b"after"))  # (a record: no seal found)
    for term in range(2, 4):
        _append(storage, term, EntryKind.NOOP, b"")
    storage.log.close()
    _assert_same_as_old_way(tmp_path / "log", config)


def test_producer_sequences_spanning_segments_and_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Idempotent batches of several producers over several segments, no-ops between: the
    table rebuilt from the tail (and what lies before it) equals the one read from the log,
    for windows that start in a sealed segment, in the tail, or at the log's start."""
    config = LogConfig(segment_bytes=2048)
    storage = LogStorage(PartitionLog.open(tmp_path / "log", config))
    sequences = {7: 0, 8: 0, 9: 0}
    term = 1
    for i in range(60):
        pid = 7 + i % 3
        count = 1 + i % 4
        data = _record(
            b"p", 30, count, producer_id=pid, producer_epoch=0, base_sequence=sequences[pid]
        )
        sequences[pid] += count
        _append(storage, term, EntryKind.NORMAL, data)
        if i % 9 == 8:
            term += 1
            _append(storage, term, EntryKind.NOOP, b"")
    storage.log.close()
    with PartitionLog.open(tmp_path / "log", config) as log:
        assert log.segment_count > 3
        end = log.end_offset
        active = log.segment_bases()[-1]
    for window in (1, 3, end - active, end - active + 5, end // 2, end + 10, 500_000):
        monkeypatch.setattr(producers, "REBUILD_WINDOW_OFFSETS", window)
        with PartitionLog.open(tmp_path / "log", config) as log:
            old = ProducerTable()
            old.rebuild(log)
            for start in (ProducerTable.window_start(log), active, end - 3, end):
                shared = ProducerTable()
                shared.rebuild(log, log.read_tail(start))
                assert _producer_state(shared) == _producer_state(old), (window, start)
        _assert_same_as_old_way(tmp_path / "log", config)


def test_config_change_in_the_tail_reaches_the_raft_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Raft core scans the log for configuration changes as it is built: from the ones
    the tail showed (and, before the tail, control batches found by header), it finds the
    same ones as from the log itself."""
    config = LogConfig()
    storage = LogStorage(PartitionLog.open(tmp_path / "log", config))
    _append(storage, 1, EntryKind.NOOP, b"")
    _append(storage, 1, EntryKind.NORMAL, _record(b"a"))
    _append(storage, 2, EntryKind.CONFIG, encode_conf(ConfState(voters=(1, 2, 3, 4))))
    _append(storage, 2, EntryKind.NORMAL, _record(b"b"))
    _append(storage, 3, EntryKind.CONFIG, encode_conf(ConfState((1, 2, 3), (4,))))
    _append(storage, 4, EntryKind.NOOP, b"")
    storage.log.close()
    base = ConfState(voters=(1, 2, 3))
    with PartitionLog.open(tmp_path / "log", config) as log:
        raft = RaftNode(1, LogStorage(log), base, HardState(4, 0, -1))
        assert raft.conf == ConfState((1, 2, 3), (4,), 4) and raft.last_index == 5
    with PartitionLog.open(tmp_path / "log", config) as log:
        end = log.end_offset
        every = [batch_to_entry(view) for view in log.batches(0, end, 1 << 30)]
    ranges = [(lo, hi) for lo in range(end) for hi in range(lo, end + 2)]
    # tails from every offset: the CONFIG entries before one are found by header
    for window in range(1, end + 2):
        monkeypatch.setattr(producers, "REBUILD_WINDOW_OFFSETS", window)
        with PartitionLog.open(tmp_path / "log", config) as log:
            storage = LogStorage(log)
            assert [e.index for e in storage.config_entries(0, end)] == [2, 4]
            for lo, hi in ranges:  # what reading every entry and keeping CONFIG finds
                expected = [e for e in every[lo:hi] if e.kind == EntryKind.CONFIG]
                assert storage.config_entries(lo, hi) == expected, (window, lo, hi)
    monkeypatch.setattr(producers, "REBUILD_WINDOW_OFFSETS", 2)
    with PartitionLog.open(tmp_path / "log", config) as log:
        storage = LogStorage(log)  # (the tail starts at 4)
        # entries cut and appended are tracked as they come
        storage.truncate(4)
        assert [e.index for e in storage.config_entries(0, 4)] == [2]
        _append(storage, 5, EntryKind.CONFIG, encode_conf(base))
        assert [e.index for e in storage.config_entries(3, 6)] == [4]


def test_the_tail_holds_every_header_and_only_control_batches_bytes(tmp_path: Path) -> None:
    """Opening reads a record batch's header, never its records: at 10,000 partitions and
    10 GiB, reading every byte of every tail was the whole restart."""
    config = LogConfig(segment_bytes=1024)
    storage = LogStorage(PartitionLog.open(tmp_path / "log", config))
    for i in range(12):
        _append(storage, 1 + i // 4, EntryKind.NORMAL, _record(b"x", 20 + 30 * i, 1 + i % 3))
        if i % 4 == 3:
            _append(storage, 2 + i // 4, EntryKind.NOOP, b"")
    storage.log.close()
    with PartitionLog.open(tmp_path / "log", config) as log:
        assert log.segment_count > 2
        stored = [bytes(v) for v in log.batches(0, log.end_offset, 1 << 30)]
        for start in range(log.end_offset + 1):
            tail = log.read_tail(start)
            held = [b for b in stored if read_header(b).last_offset >= start]
            assert tail.headers == [read_header(b) for b in held]
            controls = {read_header(b).base_offset: b for b in held if is_control(read_header(b))}
            assert {at: bytes(v) for at, v in tail.controls.items()} == controls


def test_damage_in_records_is_met_by_their_first_reader_not_by_opening(tmp_path: Path) -> None:
    """A flipped byte in a record batch's records: opening walks past it (headers only), the
    first read of it refuses it, as a sealed segment's reads do. A control batch, which
    opening reads, is refused there."""
    config = LogConfig()
    storage = LogStorage(PartitionLog.open(tmp_path / "log", config))
    for i in range(6):
        if i == 2:  # (a new term's no-op, before the index's last entry: opening trusts it)
            _append(storage, 2, EntryKind.NOOP, b"")
        _append(storage, 1 + i // 2, EntryKind.NORMAL, _record(b"k%d" % i, 100))
    storage.log.close()
    with PartitionLog.open(tmp_path / "log", config) as log:
        sizes = [len(v) for v in log.batches(0, log.end_offset, 1 << 30)]
    segment = tmp_path / "log" / "00000000000000000000.log"

    def flip(position: int) -> None:
        with open(segment, "r+b") as f:
            f.seek(position)
            byte = f.read(1)
            f.seek(position)
            f.write(bytes([byte[0] ^ 0xFF]))

    flip(sizes[0] + 80)  # a record byte of the second batch (its crc covers it)
    with PartitionLog.open(tmp_path / "log", config) as log:
        storage = LogStorage(log)  # (opening did not read it)
        assert log.end_offset == 7 and storage.producers is not None
        with pytest.raises(CorruptLogError, match="crc32c"):
            log.batches(0, log.end_offset, 8 << 20)
    flip(sizes[0] + 80)
    flip(sum(sizes[:2]) + 75)  # the no-op's record
    with (
        PartitionLog.open(tmp_path / "log", config) as log,
        pytest.raises(CorruptLogError, match="crc32c"),
    ):
        LogStorage(log)


def test_a_node_log_creates_its_directory_only_when_missing(tmp_path: Path) -> None:
    """Without a lock of its own (a node's replica) the log lists its directory first and
    creates it, parents too, only if the listing finds none; its start marker, when the
    listing shows one, is honoured as before."""
    path = tmp_path / "replica" / "log"
    config = LogConfig(segment_bytes=1024)
    with PartitionLog.open(path, config, lock=False) as log:
        for i in range(30):
            log.append(build_batch([(b"k", b"v" * 60, (), 1_000 + i)]), term=1)
        assert log.expire(10**15, upto=log.end_offset) > 0  # writes start.meta
        start, end = log.start_offset, log.end_offset
    assert (path / "start.meta").exists() and not (path / ".lock").exists()
    with PartitionLog.open(str(path), config, lock=False) as log:
        assert (log.start_offset, log.end_offset) == (start, end)
        assert log.term_at(start - 1) == 1
