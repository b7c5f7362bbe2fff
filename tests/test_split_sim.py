"""Deterministic simulation of splits and merges (see tests/split_sim.py).

``LAMINAR_SPLIT_SIM_SEEDS=N`` runs N seeds (default 150), ``LAMINAR_SPLIT_SIM_SEED_BASE=S``
starts at seed S; a failing seed prints its replay command.
"""

from __future__ import annotations

import os

from tests.seeds import run_seeds
from tests.split_sim import REPLAY, SplitSim

SEEDS = int(os.environ.get("LAMINAR_SPLIT_SIM_SEEDS", "150"))
SEED_BASE = int(os.environ.get("LAMINAR_SPLIT_SIM_SEED_BASE", "0"))


def _run_one(seed: int) -> dict[str, int]:
    sim = SplitSim(seed)
    sim.run()
    return dict(sim.stats)


def test_split_sim_many_seeds() -> None:
    failures, totals = run_seeds(_run_one, SEED_BASE, SEEDS, REPLAY)
    assert not failures, "\n\n".join(failures)
    for seen in ("splits", "merges", "finished", "leader_crashes", "driver_crashes"):
        assert totals[seen] >= SEEDS, (seen, totals)
    for seen in ("refused_sealed", "stale_answers", "lost", "acked"):
        assert totals[seen] > 0, (seen, totals)


def test_split_sim_is_deterministic() -> None:
    a, b = SplitSim(11), SplitSim(11)
    a.run()
    b.run()
    assert a.stats == b.stats
