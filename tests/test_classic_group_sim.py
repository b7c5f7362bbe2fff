"""Deterministic simulation of classic groups (see tests/classic_group_sim.py).

``LAMINAR_CLASSIC_SIM_SEEDS=N`` runs N seeds (default 60), ``LAMINAR_CLASSIC_SIM_SEED_BASE=S``
starts at seed S; a failing seed prints its replay command.
"""

from __future__ import annotations

import os

from tests.classic_group_sim import REPLAY, ClassicSim, SimFailure
from tests.seeds import run_seeds

SEEDS = int(os.environ.get("LAMINAR_CLASSIC_SIM_SEEDS", "60"))
SEED_BASE = int(os.environ.get("LAMINAR_CLASSIC_SIM_SEED_BASE", "0"))


def _run_one(seed: int) -> dict[str, int]:
    sim = ClassicSim(seed)
    sim.run()
    return dict(sim.stats)


def test_classic_sim_many_seeds() -> None:
    failures, totals = run_seeds(_run_one, SEED_BASE, SEEDS, REPLAY)
    assert not failures, "\n\n".join(failures)
    for fault in ("crashes", "pauses", "leaves", "failovers"):
        assert totals[fault] >= SEEDS // 4, (fault, totals)
    for seen in ("compactions", "from_checkpoint", "rebalances_seen", "unknown_member"):
        assert totals[seen] > 0, (seen, totals)
    assert totals["commits_acked"] > SEEDS * 20, totals
    assert totals["commits_refused"] > 0, totals
    # Zombies' commits were tried and refused (stale generation or a member already removed).
    assert totals["refused_UnknownMemberIdError"] + totals["refused_IllegalGenerationError"] > 0


def test_classic_sim_is_deterministic() -> None:
    a, b = ClassicSim(7), ClassicSim(7)
    a.run()
    b.run()
    assert a.log == b.log and a.stats == b.stats


def test_classic_sim_failure_names_the_seed_and_the_replay_command() -> None:
    sim = ClassicSim(4242)
    try:
        sim.fail("synthetic")
    except SimFailure as e:
        text = str(e)
    else:
        raise AssertionError("fail() did not raise")
    assert "seed 4242" in text
    assert "LAMINAR_CLASSIC_SIM_SEEDS=1 LAMINAR_CLASSIC_SIM_SEED_BASE=4242" in text
