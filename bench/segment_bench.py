"""Partition log throughput against plain file I/O on the same disk.

Appends 16 KiB batches with a flush (fdatasync) every 1 MiB and reads them back in 1 MiB slices;
in the same run writes and reads the same bytes with plain os.write + os.fdatasync / os.read.
Rounds alternate raw and log so disk noise hits both; the best round of each is reported.
The log runs append to one log, which then holds 1 GiB in 16 segments for the reopen timing.
Reads come from the page cache (just written) for both sides.

Last line of output: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from laminar.segment import HEADER_SIZE, LogConfig, PartitionLog, build_batch

BATCH = 16 * 1024
FLUSH_EVERY = 1 << 20
MiB = 1 << 20


def make_batch() -> bytes:
    # one record whose value fills the batch to exactly 16 KiB
    now = int(time.time() * 1000)
    size = BATCH - HEADER_SIZE
    batch = build_batch([(None, b"v" * size, (), now)])
    size -= len(batch) - BATCH  # minus the record's own varints
    batch = build_batch([(None, b"v" * size, (), now)])
    assert len(batch) == BATCH, len(batch)
    return batch


def raw_write(path: Path, data: bytes, total: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    t0 = time.perf_counter()
    since = 0
    for _ in range(total // len(data)):
        os.write(fd, data)
        since += len(data)
        if since >= FLUSH_EVERY:
            os.fdatasync(fd)
            since = 0
    os.fdatasync(fd)
    elapsed = time.perf_counter() - t0
    os.close(fd)
    return total / elapsed / MiB


def raw_read(path: Path, total: int) -> float:
    fd = os.open(path, os.O_RDONLY)
    t0 = time.perf_counter()
    got = 0
    while True:
        chunk = os.read(fd, MiB)
        if not chunk:
            break
        got += len(chunk)
    elapsed = time.perf_counter() - t0
    os.close(fd)
    assert got == total
    return total / elapsed / MiB


def log_append(log: PartitionLog, data: bytes, total: int) -> float:
    t0 = time.perf_counter()
    since = 0
    for _ in range(total // len(data)):
        log.append(data, term=1)
        since += len(data)
        if since >= FLUSH_EVERY:
            log.flush()
            since = 0
    log.flush()
    return total / (time.perf_counter() - t0) / MiB


def log_read(log: PartitionLog, start: int, total: int) -> float:
    t0 = time.perf_counter()
    off = start
    got = 0
    while got < total:
        s = log.read(off, MiB)
        got += len(s.tobytes())
        off = s.next_offset
    elapsed = time.perf_counter() - t0
    assert got == total
    return total / elapsed / MiB


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="512 MiB per round (default 1 GiB)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    per_round = (512 if args.quick else 1024) * MiB
    data = make_batch()
    root = Path(tempfile.mkdtemp(prefix="laminar-segbench-", dir="/tmp"))
    try:
        appends, reads, raw_writes, raw_reads = [], [], [], []
        log = PartitionLog.open(root / "log", LogConfig(max_batch_bytes=BATCH))
        for r in range(args.rounds):
            raw = root / f"raw-{r}"
            raw_writes.append(raw_write(raw, data, per_round))
            raw_reads.append(raw_read(raw, per_round))
            raw.unlink()
            start = log.end_offset
            appends.append(log_append(log, data, per_round))
            reads.append(log_read(log, start, per_round))
            print(
                f"round {r}: raw write {raw_writes[-1]:.0f} MiB/s, append {appends[-1]:.0f} "
                f"MiB/s, raw read {raw_reads[-1]:.0f} MiB/s, log read {reads[-1]:.0f} MiB/s"
            )
        log_bytes = log.size_bytes
        segments = log.segment_count
        log.close()
        opens = []
        for _ in range(3):
            t0 = time.perf_counter()
            again = PartitionLog.open(root / "log", LogConfig(max_batch_bytes=BATCH))
            opens.append((time.perf_counter() - t0) * 1000)
            again.close()
        result = {
            "bench": "segment",
            "batch_bytes": BATCH,
            "flush_every_bytes": FLUSH_EVERY,
            "bytes_per_round": per_round,
            "append_mb_s": round(max(appends), 1),
            "raw_write_mb_s": round(max(raw_writes), 1),
            "append_ratio": round(max(appends) / max(raw_writes), 3),
            "read_mb_s": round(max(reads), 1),
            "raw_read_mb_s": round(max(raw_reads), 1),
            "read_ratio": round(max(reads) / max(raw_reads), 3),
            "reopen_ms": round(statistics.median(opens), 1),
            "reopen_log_bytes": log_bytes,
            "reopen_segments": segments,
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
