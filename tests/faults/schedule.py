"""Seeded fault schedules: the same seed, node count and fault list give the same schedule.

A schedule is a list of cycles; each cycle applies one fault (or, mixed, two at once), holds
them for a while, then heals everything. Targets named "leader" are resolved when the cycle
runs (the node leading most partitions at that moment) and logged, since that is the one
choice that depends on the run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

ALL_FAULTS = (
    "kill_one",
    "kill_leader",
    "kill_majority",
    "kill_all",
    "pause",
    "isolate",
    "oneway",
    "split",
    "powerloss_one",
    "powerloss_all",
    "corrupt",
    "client_kill",
    "amnesia",
)
CORRUPTIONS = ("bitflip_sealed", "truncate_data", "delete_index")
AT_LEADER = ("pause_leader", "isolate_leader", "oneway_leader")  # the "leader" target forced
ELECTION_TIMEOUT = 0.5  # 10 ticks of 50 ms (node defaults); randomized up to twice that


@dataclass(frozen=True)
class Fault:
    kind: str
    params: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.kind}({extra})" if extra else self.kind


@dataclass(frozen=True)
class Cycle:
    number: int
    faults: tuple[Fault, ...]
    hold: float  # seconds the faults last before healing

    def __str__(self) -> str:
        return f"cycle {self.number}: {' + '.join(map(str, self.faults))} for {self.hold:.1f}s"


def _fault(kind: str, rng: random.Random, nodes: int) -> Fault:
    ids = list(range(1, nodes + 1))
    majority = nodes // 2 + 1
    if kind == "kill_one":
        return Fault(kind, {"node": rng.choice(ids)})
    if kind == "kill_majority":
        return Fault(kind, {"nodes": sorted(rng.sample(ids, majority))})
    if kind == "pause":
        return Fault(kind, {"node": rng.choice([*ids, "leader"])})
    if kind == "isolate":
        return Fault(kind, {"node": rng.choice([*ids, "leader"])})
    if kind == "oneway":
        return Fault(kind, {"node": rng.choice([*ids, "leader"]), "way": rng.choice(["out", "in"])})
    if kind == "split":
        minority = sorted(rng.sample(ids, nodes - majority))
        return Fault(kind, {"minority": minority})
    if kind == "powerloss_one":
        return Fault(kind, {"node": rng.choice(ids), "garble": rng.random() < 0.5})
    if kind == "powerloss_all":
        return Fault(kind, {"garble": rng.random() < 0.5})
    if kind == "corrupt":
        return Fault(kind, {"node": rng.choice(ids), "how": rng.choice(CORRUPTIONS)})
    if kind in AT_LEADER:
        fault = _fault(kind.removesuffix("_leader"), rng, nodes)
        return Fault(fault.kind, {**fault.params, "node": "leader"})
    if kind in CORRUPTIONS:
        return Fault("corrupt", {"node": rng.choice(ids), "how": kind})
    if kind == "amnesia":
        lagging, forgetful, holder = rng.sample(ids, 3)
        return Fault(kind, {"lagging": lagging, "forgetful": forgetful, "holder": holder})
    if kind == "client_kill":
        return Fault(kind, {"client": rng.choice(["producer", "consumer"])})
    return Fault(kind)  # kill_leader, kill_all


def make_schedule(
    seed: int, nodes: int, faults: list[str], cycles: int, mixed: bool = False
) -> list[Cycle]:
    """``cycles`` cycles drawn from ``faults``; ``mixed`` sometimes applies two at once."""
    unknown = set(faults) - set(ALL_FAULTS) - set(CORRUPTIONS) - set(AT_LEADER)
    if unknown:
        known = ", ".join([*ALL_FAULTS, *CORRUPTIONS, *AT_LEADER])
        raise ValueError(f"unknown faults {sorted(unknown)}; known: {known}")
    if nodes < 5 and "split" in faults:
        raise ValueError("split (3 vs 2) needs at least five nodes")
    if nodes != 3 and "amnesia" in faults:
        raise ValueError("amnesia is written for three nodes")
    rng = random.Random(seed)
    schedule: list[Cycle] = []
    for number in range(1, cycles + 1):
        first = faults[(number - 1) % len(faults)] if not mixed else rng.choice(faults)
        chosen = [_fault(first, rng, nodes)]
        if mixed and rng.random() < 0.4:
            chosen.append(_fault(rng.choice(faults), rng, nodes))
        hold = round(rng.uniform(3 * ELECTION_TIMEOUT, 6 * ELECTION_TIMEOUT), 1)
        schedule.append(Cycle(number, tuple(chosen), hold))
    return schedule
