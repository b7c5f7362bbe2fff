"""Deterministic simulation of users and ACLs (see tests/auth_sim.py).

``LAMINAR_AUTH_SIM_SEEDS=N`` runs N seeds (default 100), ``LAMINAR_AUTH_SIM_SEED_BASE=S``
starts at seed S; a failing seed prints its replay command.
"""

from __future__ import annotations

import os

from tests.auth_sim import REPLAY, AuthSim
from tests.seeds import run_seeds

SEEDS = int(os.environ.get("LAMINAR_AUTH_SIM_SEEDS", "100"))
SEED_BASE = int(os.environ.get("LAMINAR_AUTH_SIM_SEED_BASE", "0"))


def _run_one(seed: int) -> dict[str, int]:
    sim = AuthSim(seed)
    sim.run()
    return dict(sim.stats)


def test_auth_sim_many_seeds() -> None:
    failures, totals = run_seeds(_run_one, SEED_BASE, SEEDS, REPLAY)
    assert not failures, "\n\n".join(failures)
    # The runs reached the interesting cases: refusals of every rule, and both decisions.
    assert totals["create_user_ok"] > SEEDS, totals
    assert totals["create_user_InvalidRequestError"] > 0, totals  # first user not a superuser
    assert totals["delete_user_InvalidRequestError"] > 0, totals  # last superuser, unknown
    assert totals["delete_user_ok"] > 0 and totals["alter_user_ok"] > 0, totals
    assert totals["add_acl_ok"] > 0 and totals["remove_acl_ok"] > 0, totals
    assert totals["retried"] > 0, totals
    assert totals["decisions_allowed"] > 0 and totals["decisions_refused"] > 0, totals


def test_auth_sim_is_deterministic() -> None:
    a, b = AuthSim(11), AuthSim(11)
    a.run()
    b.run()
    assert a.stats == b.stats and a.log == b.log
