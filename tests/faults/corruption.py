"""Disk corruption on a stopped node: a flipped bit, a truncated data file, a deleted index."""

from __future__ import annotations

import random
from pathlib import Path

KINDS = ("bitflip_sealed", "truncate_data", "delete_index")


def _segments(data_dir: Path) -> dict[Path, list[Path]]:
    """Partition directory -> its segment data files in offset order."""
    found: dict[Path, list[Path]] = {}
    for directory in sorted((data_dir / "partitions").glob("*/log")):
        logs = sorted(directory.glob("*.log"))
        if logs:
            found[directory] = logs
    return found


def has_sealed_segment(data_dir: Path) -> bool:
    """Whether some replica under ``data_dir`` has rolled its first segment already."""
    return any(len(logs) > 1 for logs in _segments(data_dir).values())


def corrupt(data_dir: Path, kind: str, rng: random.Random) -> str:
    """Damage one file of one replica under ``data_dir``; returns what was done (or why not)."""
    segments = _segments(data_dir)
    if not segments:
        return f"{kind}: no partition data under {data_dir}"
    if kind == "bitflip_sealed":
        sealed = [logs[:-1] for logs in segments.values() if len(logs) > 1]
        candidates = [path for group in sealed for path in group if path.stat().st_size > 0]
        if not candidates:
            return "bitflip_sealed: no sealed segment yet"
        path = rng.choice(candidates)
        data = bytearray(path.read_bytes())
        position = rng.randrange(len(data))
        bit = rng.randrange(8)
        data[position] ^= 1 << bit
        path.write_bytes(data)
        return f"bitflip_sealed: {path} byte {position} bit {bit}"
    if kind == "truncate_data":
        directory = rng.choice(sorted(segments))
        logs = segments[directory]
        path = rng.choice(logs[:-1]) if len(logs) > 1 else logs[-1]
        size = path.stat().st_size
        if size == 0:
            return f"truncate_data: {path} is empty"
        new_size = rng.randrange(size)
        with open(path, "r+b") as file:
            file.truncate(new_size)
        return f"truncate_data: {path} {size} -> {new_size} bytes"
    if kind == "delete_index":
        indexes = [p for logs in segments.values() for p in logs]
        path = rng.choice(indexes).with_suffix(".index")
        if not path.exists():
            return f"delete_index: {path} does not exist"
        path.unlink()
        return f"delete_index: {path}"
    raise ValueError(f"unknown corruption {kind!r}")
