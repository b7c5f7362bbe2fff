"""SWIM on the deterministic simulator: failure-detection time and message load.

Measures, for a 50-member cluster with the default SwimConfig (10-tick protocol period):
* detection: ticks from crashing one member until its first DEAD declaration and until every
  live member sees it DEAD, over many seeds, in protocol periods;
* load: datagrams and bytes sent per member per protocol period in steady state (every message
  encoded through the real codec), without loss and with 10% loss;
* false deaths of live members under 10% loss.

Prints a few readable lines, then one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from laminar.membership.swim import EventKind, MemberState, SwimConfig
from tests.swim_sim import Simulation

N = 50
PERIOD = SwimConfig().protocol_period_ticks


def converged_cluster(seed: int, wire: bool = False) -> Simulation:
    sim = Simulation(seed, wire=wire)
    sim.bootstrap(N)
    if sim.run_until(sim.converged, 200 * PERIOD, every=5) is None:
        raise SystemExit(f"seed {seed}: cluster did not converge")
    return sim


def detection(seed: int, loss: float) -> tuple[float, float]:
    sim = converged_cluster(seed)
    sim.loss = loss
    victim = random.Random(seed).randint(1, N)
    sim.crash(victim)
    start = sim.now
    done = sim.run_until(lambda: sim.all_see(victim, {MemberState.DEAD}), 100 * PERIOD)
    if done is None:
        raise SystemExit(f"seed {seed}: crash not detected in 100 periods")
    first = min(r.tick for r in sim.declared(EventKind.DEAD, victim))
    return (first - start) / PERIOD, (done - start) / PERIOD


def load(seed: int, loss: float, periods: int) -> dict[str, float]:
    sim = converged_cluster(seed, wire=True)
    sim.loss = loss
    datagrams, sent_bytes = sim.stats.datagrams, sim.stats.bytes
    sim.run(periods * PERIOD)
    per = N * periods
    return {
        "datagrams": (sim.stats.datagrams - datagrams) / per,
        "bytes": (sim.stats.bytes - sent_bytes) / per,
        "max_datagram": sim.stats.max_datagram,
        "false_deaths": len(sim.declared(EventKind.DEAD)),
        "suspicions": len(sim.declared(EventKind.SUSPECT)),
    }


def false_deaths(seeds: list[int], periods: int) -> int:
    total = 0
    for seed in seeds:
        sim = converged_cluster(seed)
        sim.loss = 0.10
        sim.run(periods * PERIOD)
        total += len(sim.declared(EventKind.DEAD))
    return total


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "mean": round(statistics.fmean(ordered), 2),
        "p50": round(ordered[len(ordered) // 2], 2),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "max": round(ordered[-1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer seeds and periods")
    args = parser.parse_args()
    seeds = 20 if args.quick else 200
    loss_runs = 2 if args.quick else 10
    periods = 200 if args.quick else 1000
    started = time.perf_counter()

    clean = [detection(seed, 0.0) for seed in range(seeds)]
    lossy = [detection(seed, 0.10) for seed in range(seeds // 2)]
    steady = load(1, 0.0, periods // 4)
    steady_lossy = load(2, 0.10, periods // 4)
    deaths = false_deaths(list(range(100, 100 + loss_runs)), periods)

    result = {
        "bench": "swim",
        "members": N,
        "protocol_period_ticks": PERIOD,
        "detect_first_dead_periods": summary([c[0] for c in clean]),
        "detect_all_dead_periods": summary([c[1] for c in clean]),
        "detect_all_dead_periods_10pct_loss": summary([c[1] for c in lossy]),
        "detection_seeds": seeds,
        "datagrams_per_member_per_period": round(steady["datagrams"], 2),
        "bytes_per_member_per_period": round(steady["bytes"], 1),
        "datagrams_per_member_per_period_10pct_loss": round(steady_lossy["datagrams"], 2),
        "bytes_per_member_per_period_10pct_loss": round(steady_lossy["bytes"], 1),
        "max_datagram_bytes": max(steady["max_datagram"], steady_lossy["max_datagram"]),
        "false_deaths_10pct_loss": deaths,
        "false_death_member_periods": loss_runs * periods * N,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(f"detection, all members see DEAD (periods): {result['detect_all_dead_periods']}")
    print(f"  with 10% loss: {result['detect_all_dead_periods_10pct_loss']}")
    print(
        f"load: {result['datagrams_per_member_per_period']} datagrams, "
        f"{result['bytes_per_member_per_period']} bytes per member per period"
    )
    print(f"false deaths under 10% loss over {loss_runs} x {periods} periods: {deaths}")
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
