"""Partition log throughput against plain file I/O on the same disk.

Appends 16 KiB batches with a flush (fdatasync) every 1 MiB and reads them back in 1 MiB slices;
in the same run writes and reads the same bytes with plain os.write + os.fdatasync / os.read.
The machine is shared and noisy, so raw and log work is interleaved in 32 MiB chunks (both see
the same disk and CPU conditions) and each figure is total bytes / total time of its side.
Reads come from the page cache (just written) for both sides. The log then holds 1 GiB in 16
segments (64 MiB, the default) and is reopened for the reopen timing (warm page cache).

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


class Raw:
    """Plain file I/O: os.write + os.fdatasync every 1 MiB, os.read of 1 MiB."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.wfd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self.rfd = -1

    def write(self, data: bytes, total: int) -> float:
        t0 = time.perf_counter()
        since = 0
        for _ in range(total // len(data)):
            os.write(self.wfd, data)
            since += len(data)
            if since >= FLUSH_EVERY:
                os.fdatasync(self.wfd)
                since = 0
        os.fdatasync(self.wfd)
        return time.perf_counter() - t0

    def read(self, total: int) -> float:
        if self.rfd < 0:
            self.rfd = os.open(self.path, os.O_RDONLY)
        t0 = time.perf_counter()
        got = 0
        while got < total:
            chunk = os.read(self.rfd, MiB)
            assert chunk
            got += len(chunk)
        return time.perf_counter() - t0

    def rewind(self) -> None:
        if self.rfd >= 0:
            os.lseek(self.rfd, 0, os.SEEK_SET)

    def close(self) -> None:
        os.close(self.wfd)
        if self.rfd >= 0:
            os.close(self.rfd)


class Log:
    """The same work through PartitionLog.append/flush and read().tobytes()."""

    def __init__(self, path: Path) -> None:
        self.log = PartitionLog.open(path, LogConfig(max_batch_bytes=BATCH))
        self.offset = 0

    def write(self, data: bytes, total: int) -> float:
        log = self.log
        t0 = time.perf_counter()
        since = 0
        for _ in range(total // len(data)):
            log.append(data, term=1)
            since += len(data)
            if since >= FLUSH_EVERY:
                log.flush()
                since = 0
        log.flush()
        return time.perf_counter() - t0

    def read(self, total: int) -> float:
        log = self.log
        t0 = time.perf_counter()
        got = 0
        off = self.offset
        while got < total:
            s = log.read(off, MiB)
            got += len(s.tobytes())
            off = s.next_offset
        self.offset = off
        return time.perf_counter() - t0

    def rewind(self) -> None:
        self.offset = self.log.start_offset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="1 GiB of writes (default 2 GiB)")
    parser.add_argument("--read-passes", type=int, default=3)
    args = parser.parse_args()
    total = (1024 if args.quick else 2048) * MiB
    chunk = 32 * MiB
    data = make_batch()
    root = Path(tempfile.mkdtemp(prefix="laminar-segbench-", dir="/tmp"))
    try:
        raw = Raw(root / "raw")
        log = Log(root / "log")
        t_raw_w = t_log_w = 0.0
        for i in range(total // chunk):
            if i % 2:  # alternate who goes first
                t_log_w += log.write(data, chunk)
                t_raw_w += raw.write(data, chunk)
            else:
                t_raw_w += raw.write(data, chunk)
                t_log_w += log.write(data, chunk)
        t_raw_r = t_log_r = 0.0
        for _ in range(args.read_passes):
            raw.rewind()
            log.rewind()
            for i in range(total // chunk):
                if i % 2:
                    t_log_r += log.read(chunk)
                    t_raw_r += raw.read(chunk)
                else:
                    t_raw_r += raw.read(chunk)
                    t_log_r += log.read(chunk)
        raw.close()
        log_bytes = log.log.size_bytes
        segments = log.log.segment_count
        log.log.close()
        opens = []
        for _ in range(5):
            t0 = time.perf_counter()
            again = PartitionLog.open(root / "log", LogConfig(max_batch_bytes=BATCH))
            opens.append((time.perf_counter() - t0) * 1000)
            again.close()
        read_bytes = total * args.read_passes
        result = {
            "bench": "segment",
            "batch_bytes": BATCH,
            "flush_every_bytes": FLUSH_EVERY,
            "bytes_written": total,
            "append_mb_s": round(total / t_log_w / MiB, 1),
            "raw_write_mb_s": round(total / t_raw_w / MiB, 1),
            "append_ratio": round(t_raw_w / t_log_w, 3),
            "read_mb_s": round(read_bytes / t_log_r / MiB, 1),
            "raw_read_mb_s": round(read_bytes / t_raw_r / MiB, 1),
            "read_ratio": round(t_raw_r / t_log_r, 3),
            "reopen_ms": round(statistics.median(opens), 1),
            "reopen_log_bytes": log_bytes,
            "reopen_segments": segments,
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
