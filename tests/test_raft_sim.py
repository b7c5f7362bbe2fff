"""Deterministic simulation of Raft clusters under faults (see tests/raft_sim.py).

``LAMINAR_SIM_SEEDS=N`` runs N seeds (default 4000, which keeps the suite in its time budget)
starting at ``LAMINAR_SIM_SEED_BASE`` (default 0), over two worker processes;
``LAMINAR_SIM_SEED=S`` with ``-k replay`` replays one seed (``LAMINAR_SIM_TRACE=N`` prints
the last N events of a failure instead of 40). The long mode is the same test with
more seeds, e.g. ``LAMINAR_SIM_SEEDS=200000 LAMINAR_SIM_SEED_BASE=1000000``.
"""

from __future__ import annotations

import os

import pytest

from laminar.raft import ConfChange, ConfChangeType, ConfState, Role
from tests.raft_sim import REPLAY, Sim, SimFailure
from tests.seeds import run_seeds

SEEDS = int(os.environ.get("LAMINAR_SIM_SEEDS", "4000"))
SEED_BASE = int(os.environ.get("LAMINAR_SIM_SEED_BASE", "0"))


def _run_one(seed: int) -> dict[str, int]:
    sim = Sim(seed)
    sim.run()
    return {**sim.stats, "acked": len(sim.acked), "reads": sim.reads_served}


# The default 300 s limit fits the default seed count; long runs get time in proportion.
@pytest.mark.timeout(max(300, SEEDS // 20))
def test_raft_sim_many_seeds() -> None:
    failures, totals = run_seeds(_run_one, SEED_BASE, SEEDS, REPLAY)
    assert not failures, "\n\n".join(failures[:3])
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
    # Restarted nodes rest until a leader calls, or until woken when none did.
    assert totals["rests"] > SEEDS // 10
    assert totals["rests_called"] > SEEDS // 20
    assert totals["rests_woken"] > SEEDS // 50


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


def _quiet_sim(voters: int) -> Sim:
    """A simulation driven by hand: no random faults, no clients, no pre-vote or lease."""
    sim = Sim(1, voters=voters)
    sim.faults = False
    sim.clients = False
    sim.pre_vote = False
    sim.check_quorum = False
    for h in sim.hosts.values():
        sim._start(h)
    return sim


def _elect(sim: Sim, nid: int) -> None:
    """``nid`` campaigns, and leads once it committed an entry of its term (steps bounded:
    deliveries take random delays)."""
    node = sim.hosts[nid].node
    node.campaign()
    sim.process(sim.hosts[nid])
    for _ in range(30):
        sim.step()
        if (
            node.role == Role.LEADER
            and node.commit >= 0
            and node.log.term(node.commit) == node.term
        ):
            return
    raise AssertionError(f"node {nid} did not lead with a commit of its term in 30 steps")


def test_a_deposed_leader_does_not_get_a_live_member_reaped() -> None:
    # Sim seeds 17856 and 19000 (before this fix): a partitioned leader without check-quorum
    # kept leading its old term with an old configuration; once the real leader crashed it was
    # the only leader() left, and the reaper stopped a learner the committed configuration
    # still held. The group could never quiesce (the leader waited for that learner).
    sim = _quiet_sim(3)
    _elect(sim, 1)
    sim.blocked |= {(1, 2), (2, 1), (1, 3), (3, 1)}
    _elect(sim, 2)
    assert sim.hosts[1].node.role == Role.LEADER  # deposed, and does not know it
    sim.hosts[2].node.propose_conf_change(ConfChange(ConfChangeType.ADD_LEARNER, 4))
    sim._create_host(4, ConfState(()))
    sim.process(sim.hosts[2])
    for _ in range(5):
        sim.step()
    assert 4 in sim.committed_conf.learners
    sim.crash(sim.hosts[2])
    assert sim.leader() is sim.hosts[1]
    sim.reap_removed()
    assert not sim.hosts[4].removed and sim.hosts[4].node is not None
