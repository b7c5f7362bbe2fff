"""SWIM on a simulated 50-member cluster: detection bound, loss tolerance, partitions, joins.

Default config (memberlist's LAN profile in ticks): protocol period 10 ticks, ack timeout 5,
k = 3, suspicion_mult 4 (min suspicion 4*log10(50) = 6.8 periods, max 6x that), λ = 4. Network:
one tick per datagram (100 ms one-way at the driver's 100 ms tick). A failure prints its seed;
replay it with SWIM_SEED=<seed> pytest <test>.
"""

from __future__ import annotations

import os
import random

import pytest

from laminar.membership.swim import EventKind, MemberState, SwimConfig
from tests.seeds import run_seeds
from tests.swim_sim import CHAOS_REPLAY, Chaos, Simulation, seeds_from_env

N = 50
PERIOD = SwimConfig().protocol_period_ticks
# Stated bound: every live member sees a crashed member DEAD within 20 protocol periods of the
# crash. It is the sum of the wait for the first probe of the victim (~1-3 periods, geometric
# tail), the minimum suspicion 4*log10(50) = 6.8 periods once two accusers confirm, and ~3 periods
# of dissemination. bench/swim_bench.py over 200 seeds: mean 11.6, p99 16.0, max 17.9 periods.
DETECTION_BOUND_PERIODS = 20
HEAL_BOUND_PERIODS = 40  # measured 16-21 periods over 10 seeds
JOIN_BOUND_PERIODS = 15  # 10 simultaneous joins: measured 4-8 periods over 10 seeds
CONVERGE_TICKS = 80 * PERIOD


def _cluster(seed: int, loss: float = 0.0, wire: bool = False) -> Simulation:
    """50 members that have converged on a clean network; then ``loss`` is switched on."""
    sim = Simulation(seed, max_latency=1, wire=wire)
    sim.bootstrap(N)
    assert sim.run_until(sim.converged, CONVERGE_TICKS, every=5) is not None, f"seed={seed}"
    sim.loss = loss
    return sim


@pytest.mark.parametrize("seed", seeds_from_env([101, 202, 303, 404, 505]))
def test_crashed_member_is_declared_dead_by_all_within_bound(
    seed: int, request: pytest.FixtureRequest
) -> None:
    sim = _cluster(seed)
    hint = sim.replay_hint(request.node.nodeid)
    victim = random.Random(seed).randint(1, N)
    sim.crash(victim)
    crashed_at = sim.now
    detected = sim.run_until(
        lambda: sim.all_see(victim, {MemberState.DEAD}), DETECTION_BOUND_PERIODS * PERIOD
    )
    assert detected is not None, f"not detected within {DETECTION_BOUND_PERIODS} periods; {hint}"
    assert (detected - crashed_at) / PERIOD <= DETECTION_BOUND_PERIODS
    wrongly_dead = {r.event.member.node_id for r in sim.declared(EventKind.DEAD)} - {victim}
    assert not wrongly_dead, f"live members declared dead: {wrongly_dead}; {hint}"


@pytest.mark.parametrize("seed", seeds_from_env([7, 8]))
def test_no_live_member_declared_dead_under_10pct_loss(
    seed: int, request: pytest.FixtureRequest
) -> None:
    sim = _cluster(seed, loss=0.10)
    hint = sim.replay_hint(request.node.nodeid)
    sim.run(1000 * PERIOD)
    dead = sim.declared(EventKind.DEAD)
    assert not dead, (
        f"{len(dead)} false deaths, first: member {dead[0].event.member.node_id} by "
        f"{dead[0].observer} at tick {dead[0].tick}; {hint}"
    )
    # Loss does cause suspicions; each must have been refuted, not left to expire.
    assert sim.declared(EventKind.SUSPECT), "10% loss should cause some suspicion"
    assert sim.stats.dropped > 0.09 * sim.stats.datagrams


def test_every_datagram_through_the_codec_under_loss(request: pytest.FixtureRequest) -> None:
    """Same protocol with every message encoded and decoded: same outcome, datagrams fit."""
    seed = seeds_from_env([17])[0]
    sim = _cluster(seed, loss=0.10, wire=True)
    sim.run(40 * PERIOD)
    assert not sim.declared(EventKind.DEAD), sim.replay_hint(request.node.nodeid)
    assert 0 < sim.stats.max_datagram <= SwimConfig().max_datagram_bytes


@pytest.mark.parametrize("seed", seeds_from_env([31, 32]))
def test_member_lists_converge_after_a_partition_heals(
    seed: int, request: pytest.FixtureRequest
) -> None:
    sim = _cluster(seed)
    hint = sim.replay_hint(request.node.nodeid)
    ids = list(range(1, N + 1))
    random.Random(seed).shuffle(ids)
    left, right = set(ids[:30]), set(ids[30:])
    sim.partition([left, right])
    sim.run(60 * PERIOD)  # long enough for each side to declare the other dead
    for observer in left:
        view = sim.view(observer)
        assert all(view[n][0] is MemberState.DEAD for n in right), hint
        assert all(view[n][0] is MemberState.ALIVE for n in left), hint
    sim.heal()
    healed_at = sim.now
    # Measured 16-21 periods over 10 seeds: a sync to a member seen as dead (each member does
    # one every 30 periods) makes both sides refute; then ordinary gossip spreads it.
    converged = sim.run_until(sim.converged, HEAL_BOUND_PERIODS * PERIOD, every=1)
    assert converged is not None, f"no convergence {HEAL_BOUND_PERIODS} periods after heal; {hint}"
    periods = (converged - healed_at) / PERIOD
    assert periods <= HEAL_BOUND_PERIODS
    # And it stays converged: the rejoined incarnations are stable.
    sim.run(20 * PERIOD)
    assert sim.converged(), hint


@pytest.mark.parametrize("seed", seeds_from_env([41, 42]))
def test_ten_members_joining_at_once_converge(seed: int, request: pytest.FixtureRequest) -> None:
    sim = Simulation(seed, max_latency=1)
    sim.bootstrap(40)
    assert sim.run_until(sim.converged, CONVERGE_TICKS, every=5) is not None
    rng = random.Random(seed)
    for node_id in range(41, 51):
        sim.add(node_id, rng.sample(range(1, 41), 2))  # each through two random seeds
    joined_at = sim.now
    converged = sim.run_until(sim.converged, JOIN_BOUND_PERIODS * PERIOD, every=1)
    hint = sim.replay_hint(request.node.nodeid)
    assert converged is not None, f"10 joins not converged in {JOIN_BOUND_PERIODS} periods; {hint}"
    assert converged - joined_at <= JOIN_BOUND_PERIODS * PERIOD
    assert len(sim.live()) == 50
    joined = {(r.observer, r.event.member.node_id) for r in sim.declared(EventKind.JOINED)}
    assert all((old, new) in joined for old in range(1, 41) for new in range(41, 51)), hint
    assert not sim.declared(EventKind.DEAD), hint


def test_local_health_keeps_a_slow_member_from_accusing_everyone(
    request: pytest.FixtureRequest,
) -> None:
    """A member whose datagrams take 8 extra ticks each way (an overloaded process) fails every
    probe it makes. Lifeguard's local health stretches its timing instead of letting it accuse
    the whole cluster; nobody but the slow member itself may ever be declared dead."""

    def accusations(awareness_max: int) -> int:
        sim = Simulation(seeds_from_env([71])[0], config=SwimConfig(awareness_max=awareness_max))
        sim.bootstrap(N)
        assert sim.run_until(sim.converged, CONVERGE_TICKS, every=5) is not None
        sim.slow[7] = 8
        start = len(sim.events)
        sim.run(200 * PERIOD)
        dead = {r.event.member.node_id for r in sim.declared(EventKind.DEAD)}
        assert dead <= {7}, f"healthy members declared dead: {dead - {7}}; " + sim.replay_hint(
            request.node.nodeid
        )
        return sum(
            1 for r in sim.events[start:] if r.observer == 7 and r.event.kind is EventKind.SUSPECT
        )

    without, with_health = accusations(1), accusations(SwimConfig().awareness_max)
    assert without > 100  # without it: a false accusation nearly every period
    assert with_health * 10 < without


def test_graceful_leave_is_seen_as_left_not_dead(request: pytest.FixtureRequest) -> None:
    sim = _cluster(seeds_from_env([51])[0])
    sim.nodes[9].leave()
    seen = sim.run_until(lambda: sim.all_see(9, {MemberState.LEFT}), 10 * PERIOD)
    assert seen is not None, sim.replay_hint(request.node.nodeid)
    sim.crash(9)  # the process exits after leaving
    sim.run(30 * PERIOD)
    assert sim.all_see(9, {MemberState.LEFT})
    assert not sim.declared(EventKind.DEAD) and not sim.declared(EventKind.SUSPECT, 9)


def test_restarted_member_rejoins_with_a_higher_incarnation(request: pytest.FixtureRequest) -> None:
    sim = _cluster(seeds_from_env([61])[0])
    sim.crash(12)
    assert sim.run_until(lambda: sim.all_see(12, {MemberState.DEAD}), 30 * PERIOD)
    dead_incarnation = sim.nodes[1].member(12).incarnation  # type: ignore[union-attr]
    sim.crashed.discard(12)
    sim.add(12, [1])  # a fresh process: incarnation 0, learns it was declared dead, refutes
    assert sim.run_until(sim.converged, 30 * PERIOD, every=PERIOD), sim.replay_hint(
        request.node.nodeid
    )
    assert sim.nodes[30].member(12).incarnation > dead_incarnation  # type: ignore[union-attr]


def test_simulation_is_deterministic() -> None:
    def trace(seed: int) -> list[tuple[int, int, str, int, int]]:
        sim = Simulation(seed, loss=0.1, max_latency=1)
        sim.bootstrap(20)
        sim.crash(5)
        sim.run(60 * PERIOD)
        return [
            (
                r.tick,
                r.observer,
                r.event.kind.value,
                r.event.member.node_id,
                r.event.member.incarnation,
            )
            for r in sim.events
        ]

    first = trace(99)
    assert first == trace(99)
    assert first != trace(98)


# Random fault schedules (tests/swim_sim.py, Chaos): LAMINAR_SWIM_SEEDS of them (default 200)
# from LAMINAR_SWIM_SEED_BASE (default 0); LAMINAR_SWIM_SEED=S with -k chaos_replay replays one.
CHAOS_SEEDS = int(os.environ.get("LAMINAR_SWIM_SEEDS", "200"))
CHAOS_SEED_BASE = int(os.environ.get("LAMINAR_SWIM_SEED_BASE", "0"))


def _chaos_one(seed: int) -> dict[str, int]:
    chaos = Chaos(seed)
    chaos.run()
    return chaos.stats


def test_swim_chaos_many_seeds() -> None:
    failures, totals = run_seeds(_chaos_one, CHAOS_SEED_BASE, CHAOS_SEEDS, CHAOS_REPLAY)
    assert not failures, "\n\n".join(failures[:3])
    # The schedules do what they claim: pauses past the suspicion timeout get members declared
    # dead, and they come back by refuting; crashed members restart as fresh processes.
    assert totals["long_pauses"] > CHAOS_SEEDS
    assert totals["back_from_dead"] > CHAOS_SEEDS
    assert totals["restarts"] > CHAOS_SEEDS // 2


@pytest.mark.skipif("LAMINAR_SWIM_SEED" not in os.environ, reason="set LAMINAR_SWIM_SEED")
def test_swim_chaos_replay() -> None:
    Chaos(int(os.environ["LAMINAR_SWIM_SEED"])).run()


def test_swim_chaos_is_deterministic() -> None:
    a, b = Chaos(5), Chaos(5)
    a.run()
    b.run()
    assert a.sim.now == b.sim.now
    assert [(r.tick, r.observer, r.event.kind) for r in a.sim.events] == [
        (r.tick, r.observer, r.event.kind) for r in b.sim.events
    ]


def test_paused_member_reads_its_stale_backlog_and_refutes_its_death() -> None:
    """A member paused far past the suspicion timeout is declared dead; when it runs again it
    first reads the datagrams that waited in its socket buffer, still believes its old view,
    learns it was declared dead and comes back with a higher incarnation."""
    sim = Simulation(3, max_latency=1)
    sim.bootstrap(8)
    assert sim.run_until(sim.converged, CONVERGE_TICKS, every=5) is not None
    before = sim.nodes[4].incarnation
    sim.pause(4)
    assert sim.run_until(lambda: sim.all_see(4, {MemberState.DEAD}), 40 * PERIOD) is not None
    assert 0 < len(sim.paused[4]) <= 64  # pings and gossip queued in its socket buffer
    assert all(v[0] is MemberState.ALIVE for v in sim.view(4).values())  # its stale view
    sim.resume(4)
    assert sim.run_until(sim.converged, 20 * PERIOD) is not None
    assert sim.nodes[4].incarnation > before
    assert sim.nodes[1].member(4).state is MemberState.ALIVE  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", seeds_from_env([91, 92]))
def test_down_members_are_reaped_everywhere_and_only_they(
    seed: int, request: pytest.FixtureRequest
) -> None:
    reap_periods = 60
    sim = Simulation(seed, max_latency=1, config=SwimConfig(reap_after_ticks=reap_periods * PERIOD))
    sim.bootstrap(N)
    assert sim.run_until(sim.converged, CONVERGE_TICKS, every=5) is not None
    hint = sim.replay_hint(request.node.nodeid)
    sim.loss = 0.05
    sim.nodes[7].leave()
    for victim in (3, 21, 40):
        sim.crash(victim)
    gone = {3, 7, 21, 40}
    forgotten = sim.run_until(
        lambda: all(
            not gone & {m.node_id for m in sim.nodes[o].members()} for o in sim.live() if o != 7
        ),
        (DETECTION_BOUND_PERIODS + reap_periods + 10) * PERIOD,
        every=5,
    )
    assert forgotten is not None, f"down members not reaped everywhere; {hint}"
    reaped = {r.event.member.node_id for r in sim.declared(EventKind.REAPED)}
    assert reaped <= gone, f"live members reaped: {reaped - gone}; {hint}"
    # A reaped member that starts again joins like a new one.
    sim.crashed.discard(21)
    sim.add(21, [1])
    assert sim.run_until(lambda: sim.all_see(21, {MemberState.ALIVE}), 30 * PERIOD), hint
