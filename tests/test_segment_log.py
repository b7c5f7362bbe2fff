"""PartitionLog operations on real files: appends, reads, terms, rolls, retention, truncation."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
from pathlib import Path

import pytest

from laminar.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    CorruptLogError,
    InvalidRequestError,
    OffsetOutOfRangeError,
)
from laminar.segment import LogConfig, PartitionLog, build_batch, decode_records, verify_batch
from laminar.segment.batch import iter_batches, stamp
from tests.test_descriptors import open_files_under

NOW = 1_800_000_000_000


def batch(n: int = 1, size: int = 100, ts: int = NOW, tag: int = 0) -> bytes:
    return build_batch([(None, bytes([tag % 256]) * size, (), ts + i) for i in range(n)])


def snapshot(plog: PartitionLog) -> tuple[int, int, int, list[bytes]]:
    out = []
    off = plog.start_offset
    while off < plog.end_offset:
        s = plog.read(off, 1 << 30)
        out.append(s.tobytes())
        off = s.next_offset
    return plog.start_offset, plog.end_offset, plog.segment_count, out


@pytest.fixture
def plog(tmp_path: Path) -> PartitionLog:
    log = PartitionLog.open(
        tmp_path / "p0", LogConfig(segment_bytes=4096, index_interval_bytes=512)
    )
    yield log  # type: ignore[misc]
    log.close()


def test_open_creates_empty_log(tmp_path: Path) -> None:
    with PartitionLog.open(tmp_path / "new" / "p") as log:
        assert (log.start_offset, log.end_offset, log.durable_offset) == (0, 0, 0)
        assert log.term_at(-1) == 0
        assert (tmp_path / "new" / "p" / "00000000000000000000.log").exists()
        assert log.read(0, 100).length == 0


def test_append_stamps_and_returns_offsets(plog: PartitionLog) -> None:
    assert plog.append(batch(3), term=2) == (0, 2)
    original = batch(2, tag=7)
    assert plog.append(original, term=2) == (3, 4)
    assert verify_batch(original).base_offset == 0  # the caller's bytes are never mutated
    data = plog.read(3, 1 << 20).tobytes()
    h = verify_batch(data)
    assert (h.base_offset, h.term) == (3, 2)
    assert [r.offset for r in decode_records(data)] == [3, 4]
    assert plog.end_offset == 5


def test_append_accepts_bytearray_and_memoryview(plog: PartitionLog) -> None:
    ba = bytearray(batch(1))
    plog.append(ba, term=1)
    plog.append(memoryview(batch(2)), term=1)
    assert bytes(ba[:16]) == bytes(16)
    assert plog.end_offset == 3


@pytest.mark.parametrize(
    "bad",
    [
        lambda b: b[:-1],
        lambda b: b[:10],
        lambda b: b[:30] + bytes([b[30] ^ 1]) + b[31:],
        lambda b: b[:24] + b"\x02" + b[25:],
    ],
)
def test_bad_input_leaves_log_unchanged(plog: PartitionLog, bad) -> None:  # type: ignore[no-untyped-def]
    for i in range(30):
        plog.append(batch(2, tag=i), term=1)
    before = snapshot(plog)
    files = sorted((p.name, p.stat().st_size) for p in plog.directory.iterdir())
    with pytest.raises(CorruptBatchError):
        plog.append(bad(batch(2)), term=1)
    with pytest.raises(CorruptBatchError):
        plog.append_stamped(bad(batch(2)))
    assert snapshot(plog) == before
    assert sorted((p.name, p.stat().st_size) for p in plog.directory.iterdir()) == files


def test_oversize_batch_rejected(tmp_path: Path) -> None:
    with PartitionLog.open(tmp_path, LogConfig(max_batch_bytes=1000)) as log:
        log.append(batch(1, size=500), term=1)
        with pytest.raises(BatchTooLargeError):
            log.append(batch(1, size=2000), term=1)
        assert log.end_offset == 1


def test_append_stamped_requires_end_offset(plog: PartitionLog) -> None:
    b = bytearray(batch(2))
    stamp(b, 0, 4)
    assert plog.append_stamped(b) == (0, 1)
    stamp(b, 5, 4)
    with pytest.raises(InvalidRequestError):
        plog.append_stamped(b)
    stamp(b, 2, 5)
    assert plog.append_stamped(bytes(b)) == (2, 3)
    assert (plog.term_at(1), plog.term_at(2)) == (4, 5)


def test_terms_and_bounds(plog: PartitionLog) -> None:
    terms = [1, 1, 1, 2, 2, 5, 5, 5, 5, 6]
    for i, t in enumerate(terms):
        plog.append(batch(3, tag=i), term=t)
    for i, t in enumerate(terms):
        for o in range(3 * i, 3 * i + 3):
            assert plog.term_at(o) == t
            assert plog.batch_bounds(o) == (3 * i, 3 * i + 2)
    for o in (-2, 30, 31):
        with pytest.raises(OffsetOutOfRangeError):
            plog.term_at(o)
    with pytest.raises(OffsetOutOfRangeError):
        plog.batch_bounds(30)
    assert plog.term_at(-1) == 0
    plog.close()
    with PartitionLog.open(plog.directory, plog.config) as again:
        assert [again.term_at(3 * i) for i in range(10)] == terms


def test_read_semantics(plog: PartitionLog) -> None:
    sizes = []
    for i in range(40):
        plog.append(batch(2, size=150, tag=i), term=1)
        sizes.append(len(batch(2, size=150)))
    one = sizes[0]
    s = plog.read(5, 3 * one)  # starts at the batch holding 5 = [4, 5]
    assert (s.base_offset, s.next_offset, s.length) == (4, 10, 3 * one)
    assert [h.base_offset for _, h in iter_batches(s.tobytes())] == [4, 6, 8]
    s = plog.read(4, 10)  # smaller than a batch: still one whole batch
    assert (s.length, s.next_offset) == (one, 6)
    s = plog.read(4, 1 << 20, upto=9)  # only batches whose last offset < 9
    assert s.next_offset == 8
    assert plog.read(4, 1 << 20, upto=5).length == 0
    s = plog.read(0, 1 << 30)  # never crosses a segment
    assert s.position == 0 and s.next_offset < plog.end_offset
    end = plog.read(plog.end_offset, 100)
    assert (end.length, end.base_offset, end.next_offset) == (0, 80, 80)
    for bad in (-1, 81):
        with pytest.raises(OffsetOutOfRangeError) as ei:
            plog.read(bad, 100)
        assert (ei.value.start, ei.value.end) == (0, 80)
    # reading every batch from every offset through slices yields exactly the log, in order
    seen = []
    off = 0
    while off < plog.end_offset:
        s = plog.read(off, 700)
        seen += [r.offset for b in _split(s.tobytes()) for r in decode_records(b)]
        off = s.next_offset
    assert seen == list(range(80))


def _split(data: bytes) -> list[bytes]:
    return [data[p : p + h.batch_length] for p, h in iter_batches(data)]


def test_batches_across_segments(plog: PartitionLog) -> None:
    for i in range(60):
        plog.append(batch(1, size=200, tag=i), term=1 + i // 20)
    assert plog.segment_count > 3
    views = plog.batches(10, 50, 1 << 30)
    assert [verify_batch(v).base_offset for v in views] == list(range(10, 50))
    assert all(v.obj is not None for v in views)
    assert [verify_batch(v).term for v in views[9:12]] == [1, 2, 2]
    limited = plog.batches(10, 50, 700)
    assert 1 <= len(limited) < 40 and verify_batch(limited[0]).base_offset == 10
    assert len(plog.batches(10, 50, 1)) == 1  # at least one batch
    assert plog.batches(60, 60, 100) == []
    with pytest.raises(OffsetOutOfRangeError):
        plog.batches(61, 62, 100)


def test_roll_by_size_and_age(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=2000, segment_ms=1000)
    with PartitionLog.open(tmp_path, cfg) as log:
        for _i in range(10):
            log.append(batch(1, size=400), term=1, now_ms=NOW)
        by_size = log.segment_count
        assert by_size == 3  # 4 batches of 468 bytes fit in 2000
        log.append(batch(1, size=10), term=1, now_ms=NOW + 500)
        assert log.segment_count == by_size
        log.append(batch(1, size=10), term=1, now_ms=NOW + 1001)
        assert log.segment_count == by_size + 1
        names = sorted(p.name for p in tmp_path.glob("*.log"))
        assert names[1] == "00000000000000000004.log"


def test_expire_by_time_and_bytes(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=1000, retention_ms=10_000, retention_bytes=None)
    with PartitionLog.open(tmp_path, cfg) as log:
        for i in range(12):
            log.append(batch(1, size=400, ts=NOW + i * 1000), term=1 + i // 5)
        assert log.segment_count == 6  # two batches per segment
        assert log.expire(NOW + 10_000) == 0
        # segments whose newest batch is older than now - retention go, oldest first
        assert log.expire(NOW + 12_500) == 1
        assert log.start_offset == 2
        assert log.expire(NOW + 100_000, upto=7) == 2  # never a segment holding offsets >= 7
        assert log.start_offset == 6
        assert log.term_at(5) == 2 and log.term_at(6) == 2
        with pytest.raises(OffsetOutOfRangeError):
            log.read(5, 100)
        assert log.expire(NOW + 100_000) == 2  # never the active segment
        assert log.segment_count == 1 and log.start_offset == 10
        assert log.term_at(9) == 2
        assert (tmp_path / "start.meta").exists()
    with PartitionLog.open(tmp_path, cfg) as log:
        assert (log.start_offset, log.end_offset, log.term_at(9)) == (10, 12, 2)
    cfg2 = LogConfig(segment_bytes=1000, retention_ms=None, retention_bytes=2000)
    with PartitionLog.open(tmp_path / "b", cfg2) as log:
        for _ in range(12):
            log.append(batch(1, size=400, ts=0), term=1)
        total = log.size_bytes
        assert log.expire(NOW) == 3
        assert log.size_bytes >= 2000 and log.size_bytes < total


def test_expire_uses_timestamps_stored_on_disk(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=1000, retention_ms=1000)
    with PartitionLog.open(tmp_path, cfg) as log:
        for i in range(6):
            log.append(batch(1, size=400, ts=NOW + i), term=1)
    with PartitionLog.open(tmp_path, cfg) as log:  # a restart must not reset segment ages
        assert log.expire(NOW + 1003) == 1
        assert log.expire(NOW + 1004) == 1
        assert log.start_offset == 4


def test_offset_for_timestamp(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=3000, index_interval_bytes=300)
    stamps = [10, 20, 20, 15, 40, 41, 42, 30, 50, 60, 60, 70, 65, 80]
    with PartitionLog.open(tmp_path, cfg) as log:
        for ts in stamps:
            log.append(batch(1, size=250, ts=ts), term=1)
        assert log.segment_count > 1

        def expected(t: int) -> int | None:
            return next((i for i, s in enumerate(stamps) if s >= t), None)

        for t in range(0, 90):
            assert log.offset_for_timestamp(t) == expected(t), t
        log.close()
        with PartitionLog.open(tmp_path, cfg) as again:
            assert [again.offset_for_timestamp(t) for t in range(90)] == [
                expected(t) for t in range(90)
            ]


def test_truncate(plog: PartitionLog) -> None:
    for i in range(40):
        plog.append(batch(2, size=150, tag=i), term=1 + i // 10)
    segments = plog.segment_count
    before = snapshot(plog)
    for bad in (-1, 3, 81, 79):
        with pytest.raises(InvalidRequestError):
            plog.truncate(bad)
    assert snapshot(plog) == before
    plog.truncate(80)  # no-op at the end
    plog.truncate(50)
    assert plog.end_offset == 50 and plog.durable_offset == 50
    assert plog.segment_count < segments
    assert plog.term_at(49) == 3
    with pytest.raises(OffsetOutOfRangeError):
        plog.term_at(50)
    assert plog.append(batch(1), term=9) == (50, 50)
    assert plog.term_at(50) == 9
    plog.flush()
    plog.close()
    with PartitionLog.open(plog.directory, plog.config) as again:
        assert again.end_offset == 51 and again.term_at(50) == 9 and again.term_at(49) == 3
        assert again.verify() == 26
        again.truncate(0)
        assert (again.start_offset, again.end_offset, again.segment_count) == (0, 0, 1)


def test_reset(plog: PartitionLog) -> None:
    for _i in range(20):
        plog.append(batch(2, size=150), term=3)
    plog.reset(500, 7)
    assert (plog.start_offset, plog.end_offset, plog.durable_offset) == (500, 500, 500)
    assert plog.term_at(499) == 7
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(10, 100)
    assert plog.append(batch(1), term=8) == (500, 500)
    plog.close()
    with PartitionLog.open(plog.directory, plog.config) as again:
        assert (again.start_offset, again.end_offset, again.term_at(499)) == (500, 501, 7)
        again.reset(3, 1)  # backwards as well
        assert (again.start_offset, again.end_offset, again.term_at(2)) == (3, 3, 1)
    with PartitionLog.open(plog.directory, plog.config) as again:
        assert (again.start_offset, again.end_offset, again.term_at(2)) == (3, 3, 1)
        assert sorted(p.name for p in plog.directory.glob("*.log")) == ["00000000000000000003.log"]


def test_flush_from_worker_thread_while_appending(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path, LogConfig(segment_bytes=64 * 1024))
    stop = threading.Event()
    results: list[int] = []
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                results.append(log.flush())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=flusher)
    t.start()
    try:
        for i in range(3000):
            log.append(batch(1, size=200, tag=i), term=1 + i // 1000)
            if i % 100 == 0:
                log.term_at(log.end_offset - 1)
                log.read(max(0, log.end_offset - 50), 4096).tobytes()
            if i == 1500:
                log.truncate(1400)
    finally:
        stop.set()
        t.join()
    assert not errors
    assert results and max(results) <= 3000
    assert log.flush() == log.end_offset == log.durable_offset == 2899
    assert log.verify() == 2899
    log.close()


async def test_slice_file_works_with_sendfile(plog: PartitionLog) -> None:
    for i in range(20):
        plog.append(batch(1, size=300, tag=i), term=1)
    s = plog.read(3, 2000)
    expected = s.tobytes()
    loop = asyncio.get_running_loop()
    received = bytearray()
    done = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while len(received) < len(expected):
            chunk = await reader.read(65536)
            if not chunk:
                break
            received.extend(chunk)
        done.set()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    with s:
        sent = await loop.sendfile(writer.transport, s.file, s.position, s.length)
    assert sent == len(expected)
    await asyncio.wait_for(done.wait(), 5)
    writer.close()
    server.close()
    await server.wait_closed()
    assert bytes(received) == expected
    assert [h.base_offset for _, h in iter_batches(expected)] == list(
        range(s.base_offset, s.next_offset)
    )


def test_slice_survives_segment_deletion(tmp_path: Path) -> None:
    cfg = LogConfig(segment_bytes=1000, retention_ms=0)
    with PartitionLog.open(tmp_path, cfg) as log:
        for i in range(6):
            log.append(batch(1, size=400, ts=0, tag=i), term=1)
        s = log.read(0, 10_000)
        data = s.tobytes()
        assert log.expire(NOW) == 2
        assert not (tmp_path / "00000000000000000000.log").exists()
        assert s.tobytes() == data and s.file.read(s.length) == data
        s.close()


def test_close_is_idempotent_and_blocks_appends(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path)
    log.append(batch(1), term=1)
    log.close()
    log.close()
    with pytest.raises(ValueError):
        log.append(batch(1), term=1)
    assert os.listdir(tmp_path)
    _ = struct, socket


def test_directory_is_locked_while_open(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path)
    with pytest.raises(InvalidRequestError, match="already open"):
        PartitionLog.open(tmp_path)
    log.close()
    with PartitionLog.open(tmp_path) as again:
        assert again.end_offset == 0


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        LogConfig(segment_bytes=10)
    with pytest.raises(ValueError):
        LogConfig(max_batch_bytes=1)
    with pytest.raises(ValueError):
        LogConfig(index_interval_bytes=0)


def test_failed_fdatasync_poisons_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = PartitionLog.open(tmp_path)
    log.append(batch(1), term=1)
    log.flush()
    log.append(batch(1), term=1)

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("laminar.segment.log.os.fdatasync", broken)
    with pytest.raises(CorruptLogError, match="fdatasync failed"):
        log.flush()
    monkeypatch.undo()
    with pytest.raises(CorruptLogError):
        log.flush()  # a retry must not report success
    with pytest.raises(CorruptLogError):
        log.append(batch(1), term=1)
    assert log.durable_offset == 1
    log.close()
    with PartitionLog.open(tmp_path) as again:  # reopening recovers and verifies the tail
        assert again.end_offset == 2 and again.verify() == 2


def test_time_roll_after_reopen_uses_the_first_batch_timestamp(tmp_path: Path) -> None:
    cfg = LogConfig(segment_ms=1000)
    with PartitionLog.open(tmp_path, cfg) as log:
        log.append(batch(1, ts=NOW), term=1, now_ms=NOW)
    with PartitionLog.open(tmp_path, cfg) as log:
        log.append(batch(1, ts=NOW), term=1, now_ms=NOW + 999)
        assert log.segment_count == 1
        log.append(batch(1, ts=NOW), term=1, now_ms=NOW + 1001)
        assert log.segment_count == 2


def test_sealed_segments_hold_few_descriptors(tmp_path: Path) -> None:
    from laminar.segment.log import MAX_OPEN_SEALED

    cfg = LogConfig(segment_bytes=1000)
    with PartitionLog.open(tmp_path, cfg) as log:
        for i in range(60):
            log.append(batch(1, size=400, tag=i), term=1)
    with PartitionLog.open(tmp_path, cfg) as log:
        assert log.segment_count == 30
        assert open_files_under(tmp_path, ".log") == 1  # only the active segment after open
        for off in range(0, 60, 2):
            assert verify_batch(log.read(off, 10_000).tobytes()[: len(batch(1, size=400))])
        assert log.verify() == 60
        assert open_files_under(tmp_path, ".log") <= MAX_OPEN_SEALED + 1
