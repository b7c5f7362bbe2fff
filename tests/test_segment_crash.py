"""Crash test: a child process appends and flushes in a loop and is SIGKILLed at random
moments; after every kill the reopened log must hold every flushed batch, byte for byte.

SIGKILL alone keeps the page cache (and never splits one write), so every other kill also
damages the newest segment after its last flushed batch (cut at a random point, then zeros,
random bytes or a stale header appended) as a stand-in for losing unflushed data to a power cut.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laminar.segment import LogConfig, PartitionLog
from laminar.segment.batch import build_batch, iter_batches, stamp, verify_batch

pytestmark = pytest.mark.slow

SEGMENT_BYTES = 200_000
KILLS = 25

CHILD = r"""
import sys
from laminar.segment import LogConfig, PartitionLog
from laminar.segment.batch import build_batch

def records_for(base):
    rnd = (base * 2654435761) % 4096
    count = 1 + rnd % 7
    size = 20 + (rnd * 7) % 3000
    return [(str(base).encode(), bytes([(base + i) % 251]) * size, (), 1_000 + base + i)
            for i in range(count)]

path, term = sys.argv[1], int(sys.argv[2])
log = PartitionLog.open(path, LogConfig(segment_bytes=SEGMENT_BYTES, index_interval_bytes=1024))
n = 0
while True:
    log.append(build_batch(records_for(log.end_offset)), term=term)
    n += 1
    if n % 5 == 0:
        sys.stdout.write(f"{log.flush()}\n")
        sys.stdout.flush()
""".replace("SEGMENT_BYTES", str(SEGMENT_BYTES))


def records_for(base: int) -> list[tuple[bytes, bytes, tuple[()], int]]:
    rnd = (base * 2654435761) % 4096
    count = 1 + rnd % 7
    size = 20 + (rnd * 7) % 3000
    return [
        (str(base).encode(), bytes([(base + i) % 251]) * size, (), 1_000 + base + i)
        for i in range(count)
    ]


def expected_batch(base: int, term: int) -> bytes:
    buf = bytearray(build_batch(records_for(base)))
    stamp(buf, base, term)
    return bytes(buf)


def lose_unflushed_tail(path: Path, flushed: int, rng: random.Random) -> None:
    """Power-loss stand-in: bytes after the last flushed batch of the newest segment are cut
    at a random point and replaced by zeros, random bytes or a stale batch header."""
    last = max(path.glob("*.log"), key=lambda p: int(p.stem))
    data = last.read_bytes()
    keep = 0
    for pos, h in iter_batches(data):
        if h.base_offset >= flushed:
            break
        keep = pos + h.batch_length
    cut = rng.randint(keep, len(data))
    junk = rng.choice(
        [bytes(rng.randint(1, 5000)), rng.randbytes(rng.randint(1, 5000)), data[keep : keep + 68]]
    )
    with open(last, "r+b") as f:
        f.truncate(cut)
        f.seek(cut)
        f.write(junk)


def test_sigkill_never_loses_flushed_batches(tmp_path: Path) -> None:
    rng = random.Random(1234)
    path = tmp_path / "p"
    cfg = LogConfig(segment_bytes=SEGMENT_BYTES, index_interval_bytes=1024)
    run_starts: list[tuple[int, int]] = []  # (first offset written by the run, its term)
    flushed = 0
    deadline = time.monotonic() + 120
    for term in range(1, KILLS + 1):
        with PartitionLog.open(path, cfg) as log:
            start = log.end_offset
        run_starts.append((start, term))
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(term)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert child.stdout is not None
            first = child.stdout.readline()  # the child is up and flushing
            assert first.endswith(b"\n"), "child died before its first flush"
            time.sleep(rng.uniform(0.0, 0.25))
        finally:
            os.kill(child.pid, signal.SIGKILL)
            out, _ = child.communicate(timeout=30)
        lines = [first, *out.split(b"\n")[:-1]]  # a cut last line is ignored
        flushed = max([flushed, *(int(x) for x in lines if x.strip())])
        if term % 2 == 0:
            lose_unflushed_tail(path, flushed, rng)

        with PartitionLog.open(path, cfg) as log:
            assert log.end_offset >= flushed, f"kill {term}: flushed {flushed} lost"
            assert log.verify() > 0
            views = log.batches(0, log.end_offset, 1 << 40)
            for view in views:
                h = verify_batch(view)
                run_term = max(t for s, t in run_starts if s <= h.base_offset)
                assert h.term == run_term
                assert bytes(view) == expected_batch(h.base_offset, run_term)
            assert verify_batch(views[-1]).next_offset == log.end_offset
            for o in range(0, log.end_offset, 97):
                base, _ = log.batch_bounds(o)
                assert log.term_at(o) == max(t for s, t in run_starts if s <= base)
        assert time.monotonic() < deadline
    assert flushed > 100
    assert len(list(path.glob("*.log"))) > 2  # the kills also hit rolled segments
