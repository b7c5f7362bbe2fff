"""Power loss on a killed node: every file loses what no completed fsync covered.

The node ran with ``LAMINAR_TEST_POWERLOSS_JOURNAL`` (see laminar/segment/fileio.py), so the
journal holds "inode size path" for each fsync/fdatasync, the size taken before the sync. After
SIGKILL the page cache still holds everything written; a power cut would not. For each file
this cuts back to the last synced length, and with ``garble`` keeps a random part of the
unsynced tail, sometimes overwritten with random bytes (a torn write). A file never synced loses
everything. Directory entries are not modelled (a file created and never synced keeps its name,
empty).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from laminar.node.boot import MARKER


@dataclass
class PowerLossReport:
    files: int = 0
    cut_files: int = 0
    bytes_lost: int = 0
    garbled_files: int = 0


def synced_lengths(journal: Path) -> dict[int, int]:
    """inode -> length covered by its last completed sync."""
    lengths: dict[int, int] = {}
    if not journal.exists():
        return lengths
    for line in journal.read_text(errors="replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit():
            lengths[int(parts[0])] = int(parts[1])
    return lengths


def lose_power(data_dir: Path, journal: Path, rng: random.Random, garble: bool) -> PowerLossReport:
    """Apply a power cut to ``data_dir`` (the node must not be running). The machine boots
    again after one: the node's boot marker no longer matches (``laminar.node.boot``), so its
    restart checks every unsynced tail instead of trusting the page cache."""
    (data_dir / MARKER).unlink(missing_ok=True)
    synced = synced_lengths(journal)
    report = PowerLossReport()
    for path in sorted(p for p in data_dir.rglob("*") if p.is_file()):
        report.files += 1
        info = path.stat()
        keep = min(info.st_size, synced.get(info.st_ino, 0))
        if keep == info.st_size:
            continue
        tail = info.st_size - keep
        # with garble, sometimes part of the unsynced writes reached the disk
        keep_tail = rng.randrange(tail + 1) if garble and rng.random() < 0.5 else 0
        with open(path, "r+b") as file:
            file.truncate(keep + keep_tail)
            if keep_tail and rng.random() < 0.5:
                start = keep + rng.randrange(keep_tail)
                length = min(keep + keep_tail - start, rng.randint(1, 512))
                file.seek(start)
                file.write(rng.randbytes(length))
                report.garbled_files += 1
            file.flush()
            os.fsync(file.fileno())
        report.cut_files += 1
        report.bytes_lost += tail - keep_tail
    return report
