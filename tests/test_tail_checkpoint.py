"""A replica's tail saved in this boot (``tail_checkpoint``) stands in for walking its log on
open: what opening learns from it (producer table, seal, the Raft core's configuration) must
equal what walking the whole log finds, the log before the saved end must not be read at all,
and a log that changed under the saved state (cut, reset, rewritten) must be walked as before.
These tests reopen real logs and compare both ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar.errors import CorruptLogError
from laminar.node import log_storage
from laminar.node.log_storage import LogStorage
from laminar.node.tail_checkpoint import CHECKPOINT_FILE, TailCheckpoint, TailState
from laminar.raft import ConfState, Entry, EntryKind, HardState, RaftNode, encode_conf
from laminar.segment.batch import build_batch, read_header
from laminar.segment.log import LogConfig, PartitionLog
from laminar.splits.seal import seal_batch

CONFIG = LogConfig(index_interval_bytes=64)  # an index entry for about every batch
BASE = ConfState(voters=(1, 2, 3))
MAGIC_AT = 24  # the header's magic byte: after base offset, term, length and crc


def _record(pid: int, sequence: int, count: int = 2) -> memoryview:
    records = [(b"k", b"v" * 40, (), 1_000 + i) for i in range(count)]
    batch = build_batch(records, producer_id=pid, producer_epoch=0, base_sequence=sequence)
    return memoryview(batch)


def _append(storage: LogStorage, term: int, kind: EntryKind, data: bytes | memoryview) -> int:
    index = storage.log.end_offset
    last = index + (read_header(data).last_offset_delta if kind == EntryKind.NORMAL else 0)
    storage.append([Entry(term, index, last, kind, data)])
    return index


def _write(storage: LogStorage, term: int, batches: int, sequences: dict[int, int]) -> None:
    """Idempotent batches of two producers, a no-op and a configuration change among them."""
    _append(storage, term, EntryKind.NOOP, b"")
    for i in range(batches):
        pid = 7 + i % 2
        _append(storage, term, EntryKind.NORMAL, _record(pid, sequences[pid]))
        sequences[pid] += 2
        if i == batches // 2:
            conf = ConfState(voters=(1, 2, 3, 4 + term))
            _append(storage, term, EntryKind.CONFIG, encode_conf(conf))


def _opened(path: Path, resume: TailState | None) -> tuple[object, ...]:
    """What opening the log learns: producer table, seal, and the Raft core's configuration
    (scanned from a saved commit of -1, so over the whole log)."""
    log = PartitionLog.open(path, CONFIG, same_boot=True)
    try:
        storage = LogStorage(log, resume=resume)
        raft = RaftNode(1, storage, BASE, HardState(9, 0, -1))
        table = storage.producers.snapshot(log.end_offset)
        return (table, storage.seal_offset, raft.conf, raft.last_index)
    finally:
        log.close()


def _damage_header(path: Path, offset: int) -> None:
    """Break the magic byte of the batch at ``offset``: whoever walks over it fails."""
    with PartitionLog.open(path, CONFIG) as log:
        position = log.read(offset, 1).position
    segment = path / "00000000000000000000.log"
    with open(segment, "r+b") as f:
        f.seek(position + MAGIC_AT)
        f.write(b"\x07")


def test_a_saved_tail_opens_like_the_walk_without_reading_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_storage, "UNINDEXED_WALK_BYTES", 256)  # (these batches are small)
    path = tmp_path / "log"
    storage = LogStorage(PartitionLog.open(path, CONFIG))
    sequences = {7: 0, 8: 0}
    _write(storage, 1, 10, sequences)
    state = storage.tail_state()
    assert state is not None and state.end == storage.log.end_offset
    _write(storage, 2, 6, sequences)  # after the state: walked on open
    storage.log.close()
    walked = _opened(path, None)
    assert _opened(path, state) == walked
    assert walked[2] == ConfState(voters=(1, 2, 3, 6), index=walked[2].index)

    _damage_header(path, 3)  # well before the saved end (and the last index entry)
    assert _opened(path, state) == walked  # not read
    with pytest.raises(CorruptLogError):
        _opened(path, None)


def test_a_batch_proposed_but_not_yet_in_the_log_is_not_saved(tmp_path: Path) -> None:
    """A leader records a batch in its producer table when it proposes it, before its log
    holds it: a state saved then must not remember it, or a retry after a crash that lost
    it would be answered with offsets the log does not hold."""
    path = tmp_path / "log"
    storage = LogStorage(PartitionLog.open(path, CONFIG))
    _write(storage, 1, 4, {7: 0, 8: 0})
    end = storage.log.end_offset
    proposed = _record(7, 4)
    header = read_header(proposed)
    storage.producers.record(header, end, end + 1)  # (as PartitionIO.append does)
    state = storage.tail_state()
    assert state is not None and all(row[3] < end for row in state.producers)
    storage.log.close()
    log = PartitionLog.open(path, CONFIG, same_boot=True)
    try:
        reopened = LogStorage(log, resume=state)
        assert reopened.resumed and reopened.producers.find(header) is None
        assert reopened.producers.last(7).last_sequence == 3
    finally:
        log.close()


def test_a_seal_before_or_after_the_saved_end_is_found(tmp_path: Path) -> None:
    for seal_before in (True, False):
        path = tmp_path / f"log-{seal_before}"
        storage = LogStorage(PartitionLog.open(path, CONFIG))
        _write(storage, 1, 4, {7: 0, 8: 0})
        if seal_before:
            seal_at = _append(storage, 1, EntryKind.NORMAL, memoryview(seal_batch("op", 5)))
        state = storage.tail_state()
        if not seal_before:
            seal_at = _append(storage, 1, EntryKind.NORMAL, memoryview(seal_batch("op", 5)))
        _append(storage, 2, EntryKind.NOOP, b"")  # an election after the seal
        storage.log.close()
        assert _opened(path, state) == _opened(path, None)
        assert _opened(path, state)[1] == seal_at


@pytest.mark.parametrize("change", ["cut", "cut-and-rewritten", "reset"])
def test_a_log_changed_under_its_saved_tail_is_walked(tmp_path: Path, change: str) -> None:
    path = tmp_path / "log"
    storage = LogStorage(PartitionLog.open(path, CONFIG))
    sequences = {7: 0, 8: 0}
    _write(storage, 1, 10, sequences)
    state = storage.tail_state()
    assert state is not None
    if change == "reset":
        storage.reset(state.end + 5, 3)
        _write(storage, 3, 2, sequences)
    else:  # a new leader cut the last entries (and wrote others in its term)
        storage.truncate(state.end - 4)
        if change == "cut-and-rewritten":
            _write(storage, 2, 3, {7: 100, 8: 100})
    log = storage.log
    assert not state.matches(log)
    log.close()
    assert _opened(path, state) == _opened(path, None)


async def test_the_checkpoint_file_keeps_states_for_the_same_boot_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LogStorage(PartitionLog.open(tmp_path / "log", CONFIG))
    _write(storage, 1, 4, {7: 0, 8: 0})
    checkpoint = TailCheckpoint(tmp_path)
    checkpoint.capture("p-0", storage)
    await checkpoint.save()
    saved = storage.tail_state()

    calls = []
    original = LogStorage.tail_state
    monkeypatch.setattr(LogStorage, "tail_state", lambda s: calls.append(1) or original(s))
    checkpoint.capture("p-0", storage)
    assert not calls  # unchanged since the last capture: not captured again
    _append(storage, 1, EntryKind.NORMAL, _record(7, 100))
    checkpoint.capture("p-0", storage)
    assert calls == [1]
    saved = original(storage)
    emptied = LogStorage(PartitionLog.open(tmp_path / "emptied", CONFIG))
    _write(emptied, 1, 2, {7: 0, 8: 0})
    checkpoint.capture("p-1", emptied)
    emptied.reset(40, 2)  # a snapshot installed: nothing to save (a restart walks nothing)
    checkpoint.capture("p-1", emptied)
    await checkpoint.save()
    assert b'"p-1"' not in (tmp_path / CHECKPOINT_FILE).read_bytes()
    emptied.log.close()
    storage.log.close()

    again = TailCheckpoint(tmp_path)
    again.load(same_boot=True)
    assert again.take("p-0") == saved
    assert again.take("p-0") is None  # (once)
    assert again.take("p-1") is None

    (tmp_path / CHECKPOINT_FILE).write_bytes(b'{"name": "p-0", "end": 3}\n{not json')
    damaged = TailCheckpoint(tmp_path)
    damaged.load(same_boot=True)
    assert damaged.take("p-0") is None

    await checkpoint.save()
    other_boot = TailCheckpoint(tmp_path)
    other_boot.load(same_boot=False)
    assert other_boot.take("p-0") is None
    assert not (tmp_path / CHECKPOINT_FILE).exists()


def test_a_saved_tail_writes_the_index_only_past_a_short_walk(tmp_path: Path) -> None:
    """A new replica's few index entries stay buffered (creating its index files costs more
    than walking a few KiB on restart); past UNINDEXED_WALK_BYTES they are written."""
    config = LogConfig(index_interval_bytes=1024)  # (fewer entries than a buffer's worth)
    path = tmp_path / "log"
    storage = LogStorage(PartitionLog.open(path, config))
    _write(storage, 1, 3, {7: 0, 8: 0})
    assert storage.tail_state() is not None
    index = path / "00000000000000000000.index"
    assert not index.exists()
    while storage.log.size_bytes < log_storage.UNINDEXED_WALK_BYTES + 1024:
        _write(storage, 1, 20, {7: 0, 8: 0})
    assert not index.exists()  # (still buffered)
    assert storage.tail_state() is not None
    entries = storage.log.size_bytes // 2 // config.index_interval_bytes  # (at least)
    assert index.stat().st_size >= 24 * entries
    storage.log.close()


async def test_a_failed_save_is_logged_and_the_node_goes_on(tmp_path: Path) -> None:
    checkpoint = TailCheckpoint(tmp_path)
    (tmp_path / CHECKPOINT_FILE).mkdir()  # (any write error: the file cannot be replaced)
    storage = LogStorage(PartitionLog.open(tmp_path / "log", CONFIG))
    _write(storage, 1, 2, {7: 0, 8: 0})
    await checkpoint.capture_all([("p-0", storage)])
    await checkpoint.save()  # no exception: the next save tries again
    storage.log.close()
