"""Deterministic simulation of the group coordinator (see tests/group_sim.py).

``LAMINAR_GROUP_SIM_SEEDS=N`` runs N seeds (default 100, about 9 s on one core),
``LAMINAR_GROUP_SIM_SEED_BASE=S`` starts at seed S; a failing seed prints its replay command.
"""

from __future__ import annotations

import os

from tests.group_sim import REPLAY, GroupSim, SimFailure
from tests.seeds import run_seeds

SEEDS = int(os.environ.get("LAMINAR_GROUP_SIM_SEEDS", "100"))
SEED_BASE = int(os.environ.get("LAMINAR_GROUP_SIM_SEED_BASE", "0"))


def _run_one(seed: int) -> dict[str, int]:
    sim = GroupSim(seed)
    sim.run()
    return dict(sim.stats)


def test_group_sim_many_seeds() -> None:
    failures, totals = run_seeds(_run_one, SEED_BASE, SEEDS, REPLAY)
    assert not failures, "\n\n".join(failures)
    # The schedules must exercise what they claim to.
    for fault in (
        "crashes",
        "pauses",
        "leaves",
        "subscriptions",
        "failovers",
        "compactions",
        "trims",
    ):
        assert totals[fault] >= SEEDS // 4, (fault, totals)
    for fault in ("deleted", "created", "grown", "records_lost", "lease_expired", "fenced"):
        assert totals[fault] > 0, (fault, totals)
    assert totals["commits_acked"] > SEEDS * 50
    assert totals["commits_refused"] > 0


def test_group_sim_is_deterministic() -> None:
    a, b = GroupSim(11), GroupSim(11)
    a.run()
    b.run()
    assert a.log == b.log
    assert a.coord.state == b.coord.state
    assert a.stats == b.stats


def test_group_sim_failure_names_the_seed_and_the_replay_command() -> None:
    sim = GroupSim(4242)
    try:
        sim.fail("synthetic")
    except SimFailure as e:
        text = str(e)
    else:
        raise AssertionError("fail() did not raise")
    assert "seed 4242" in text
    assert "LAMINAR_GROUP_SIM_SEEDS=1 LAMINAR_GROUP_SIM_SEED_BASE=4242" in text
