"""Runs a deterministic simulation over a range of seeds and sums what the runs report.

Each simulation test hands over a module-level ``run_one(seed) -> dict[str, int]`` (its
statistics), which raises an AssertionError naming the seed and its replay command when an
invariant breaks; any other exception is a crash inside the code under test and fails the seed
too. Seeds run in small chunks over two spawned worker processes (spawn, not fork: earlier
tests may have left threads holding locks), so both stay busy to the end.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from collections.abc import Callable
from functools import partial

RunOne = Callable[[int], dict[str, int]]
MAX_FAILURES = 3


def run_seeds(run_one: RunOne, base: int, count: int, replay: str) -> tuple[list[str], Counter]:
    """Failures (at most a few per chunk) and the summed statistics of seeds [base, base+count)."""
    workers = min(2, os.cpu_count() or 1)
    step = max(1, min(500, count // (8 * workers)))
    end = base + count
    chunks = [(lo, min(lo + step, end)) for lo in range(base, end, step)]
    job = partial(_run_chunk, run_one, replay)
    if workers > 1 and len(chunks) > 1:
        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            results = pool.map(job, chunks)
    else:
        results = [job(chunk) for chunk in chunks]
    failures = [f for fs, _ in results for f in fs]
    totals: Counter = Counter()
    for _, stats in results:
        totals.update(stats)
    return failures, totals


def _run_chunk(run_one: RunOne, replay: str, bounds: tuple[int, int]) -> tuple[list[str], Counter]:
    failures: list[str] = []
    totals: Counter = Counter()
    for seed in range(*bounds):
        try:
            totals.update(run_one(seed))
        except AssertionError as e:
            failures.append(str(e))
        except Exception as e:
            failures.append(f"seed {seed}: {e!r}\nreplay: {replay.format(seed=seed)}")
        if len(failures) >= MAX_FAILURES:
            break
    return failures, totals
