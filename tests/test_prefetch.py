"""Warming logs before a restart opens them (``laminar.segment.prefetch``) only reads: every
file stays as it was, whatever state a log directory is in, and the logs open as before."""

from __future__ import annotations

import os
from pathlib import Path

from laminar.segment.batch import build_batch
from laminar.segment.log import LogConfig, PartitionLog
from laminar.segment.prefetch import warm, warm_log

CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def _files(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(path.relative_to(root)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_warming_reads_and_changes_nothing(tmp_path: Path) -> None:
    logs = []
    for i in range(4):
        log = PartitionLog.open(tmp_path / f"log-{i}", CONFIG)
        for n in range(10 * i):
            log.append(build_batch([(None, b"v" * 100, (), 1_000 + n)]), term=1)
        log.write_index()
        log.close()
        logs.append(tmp_path / f"log-{i}")
    (tmp_path / "log-3" / "00000000000000000000.index").write_bytes(b"\x01" * 30)  # damaged
    (tmp_path / "empty").mkdir()
    (tmp_path / "only-index").mkdir()
    (tmp_path / "only-index" / "00000000000000000000.index").write_bytes(b"\x00" * 24)
    before = _files(tmp_path)
    directories = [str(d) for d in (*logs, tmp_path / "empty", tmp_path / "only-index")]
    for directory in [*directories, str(tmp_path / "missing")]:
        warm_log(directory)
    warm([*directories, str(tmp_path / "missing")], threads=3).join()
    assert _files(tmp_path) == before
    assert not (tmp_path / "missing").exists()
    for i, directory in enumerate(logs):
        with PartitionLog.open(directory, CONFIG) as log:
            assert log.end_offset == 10 * i
    assert os.listdir(tmp_path / "empty") == []
