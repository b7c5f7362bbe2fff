"""Deterministic simulation of Raft clusters under faults (see tests/raft_sim.py).

``LAMINAR_SIM_SEEDS=N`` runs N seeds (default 10000) starting at ``LAMINAR_SIM_SEED_BASE``
(default 0), over two worker processes; ``LAMINAR_SIM_SEED=S`` with ``-k replay`` replays one
seed. The long mode is the same test with more seeds, e.g.
``LAMINAR_SIM_SEEDS=200000 LAMINAR_SIM_SEED_BASE=1000000``.
"""

from __future__ import annotations

import multiprocessing
import os

import pytest

from tests.raft_sim import REPLAY, STAT_KEYS, Sim, SimFailure

SEEDS = int(os.environ.get("LAMINAR_SIM_SEEDS", "10000"))
SEED_BASE = int(os.environ.get("LAMINAR_SIM_SEED_BASE", "0"))


def _run_range(bounds: tuple[int, int]) -> tuple[list[str], dict[str, int]]:
    failures: list[str] = []
    totals = dict.fromkeys(STAT_KEYS, 0)
    totals["acked"] = 0
    totals["reads"] = 0
    for seed in range(*bounds):
        sim = Sim(seed)
        try:
            sim.run()
        except SimFailure as e:
            failures.append(str(e))
        except Exception as e:  # a crash inside the core is a failure of this seed too
            failures.append(f"seed {seed}: {e!r}\nreplay: {REPLAY.format(seed=seed)}")
        if len(failures) >= 3:
            break
        for k, v in sim.stats.items():
            totals[k] += v
        totals["acked"] += len(sim.acked)
        totals["reads"] += sim.reads_served
    return failures, totals


def test_raft_sim_many_seeds() -> None:
    workers = min(2, os.cpu_count() or 1)
    step = (SEEDS + workers - 1) // workers
    end = SEED_BASE + SEEDS
    ranges = [(i, min(i + step, end)) for i in range(SEED_BASE, end, step)]
    if workers > 1:
        # spawn, not fork: earlier tests in this process may have left threads holding locks.
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers) as pool:
            results = pool.map(_run_range, ranges)
    else:
        results = [_run_range(r) for r in ranges]
    failures = [f for fs, _ in results for f in fs]
    assert not failures, "\n\n".join(failures[:3])
    totals: dict[str, int] = {}
    for _, t in results:
        for k, v in t.items():
            totals[k] = totals.get(k, 0) + v
    # The schedules must actually exercise the features they claim to.
    assert totals["leaders"] > SEEDS
    assert totals["acked"] > SEEDS * 10
    assert totals["crashes"] > SEEDS // 10
    assert totals["conf_changes"] > SEEDS // 10
    assert totals["transfers"] > SEEDS // 20
    assert totals["resets"] > 0
    assert totals["reads"] > SEEDS // 10
    # Power loss really bites: crashes lose un-synced writes, tear records, and keep or lose
    # un-synced state files.
    assert totals["dirty_crashes"] > SEEDS // 10
    assert totals["lost_writes"] > SEEDS // 10
    assert totals["torn"] > SEEDS // 50
    assert totals["state_survived"] > SEEDS // 50
    assert totals["state_lost"] > SEEDS // 50


@pytest.mark.skipif("LAMINAR_SIM_SEED" not in os.environ, reason="set LAMINAR_SIM_SEED")
def test_raft_sim_replay() -> None:
    Sim(int(os.environ["LAMINAR_SIM_SEED"])).run()


def test_raft_sim_is_deterministic() -> None:
    a, b = Sim(7), Sim(7)
    a.run()
    b.run()
    assert a.committed == b.committed
    assert a.leaders == b.leaders
    assert a.now == b.now


def test_raft_sim_failure_names_the_seed_and_the_replay_command() -> None:
    sim = Sim(4242)
    with pytest.raises(SimFailure) as exc:
        sim.fail("synthetic")
    text = str(exc.value)
    assert "seed 4242" in text
    assert "LAMINAR_SIM_SEED=4242 .venv/bin/pytest tests/test_raft_sim.py -k replay" in text
