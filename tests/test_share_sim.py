"""Deterministic simulation of a share partition (see tests/share_sim.py).

``LAMINAR_SHARE_SIM_SEEDS=N`` runs N seeds (default 300, about 7 s on one core),
``LAMINAR_SHARE_SIM_SEED_BASE=S`` starts at seed S; a failing seed prints its replay command.
"""

from __future__ import annotations

import os

from tests.seeds import run_seeds
from tests.share_sim import REPLAY, ShareSim, SimFailure

SEEDS = int(os.environ.get("LAMINAR_SHARE_SIM_SEEDS", "300"))
SEED_BASE = int(os.environ.get("LAMINAR_SHARE_SIM_SEED_BASE", "0"))


def _run_one(seed: int) -> dict[str, int]:
    sim = ShareSim(seed)
    sim.run()
    return dict(sim.stats)


def test_share_sim_many_seeds() -> None:
    failures, totals = run_seeds(_run_one, SEED_BASE, SEEDS, REPLAY)
    assert not failures, "\n\n".join(failures)
    if SEEDS < 50:
        return  # a replay of a few seeds: the coverage below is about the whole default range
    # The schedules must exercise what they claim to.
    for what in ("crashes", "failovers", "checkpoints"):
        assert totals[what] >= SEEDS // 2, (what, totals)
    for what in (
        "from_checkpoint",
        "member_gone",
        "skipped",
        "deferred",
        "release",
        "reject",
        "extend",
        "refused",
        "redeliveries",
        "dead_letters",
        "acquire_runs_calls",
        "settle_runs_acks",
        "settle_runs_mixed",
    ):
        assert totals[what] > 0, (what, totals)
    assert totals["ack"] > SEEDS * 100, totals


def test_share_sim_is_deterministic() -> None:
    a, b = ShareSim(7), ShareSim(7)
    a.run()
    b.run()
    assert a.log == b.log
    assert a.sp.state == b.sp.state
    assert a.stats == b.stats


def test_share_sim_failure_names_the_seed_and_the_replay_command() -> None:
    sim = ShareSim(4242)
    try:
        sim.fail("synthetic")
    except SimFailure as e:
        text = str(e)
    else:
        raise AssertionError("fail() did not raise")
    assert "seed 4242" in text
    assert "LAMINAR_SHARE_SIM_SEEDS=1 LAMINAR_SHARE_SIM_SEED_BASE=4242" in text
