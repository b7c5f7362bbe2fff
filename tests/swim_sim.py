"""Deterministic simulation of a SWIM cluster: many cores, one seeded lossy network, one clock.

Every run is a pure function of its seed, so a failing seed replays exactly
(``SWIM_SEED=<seed> pytest tests/test_swim_sim.py``). Datagrams take 1..max_latency ticks, may
be dropped at random, and are dropped between different sides of a partition and to or from
crashed members. With ``wire=True`` every datagram also goes through the real codec.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from laminar.membership import codec
from laminar.membership.messages import Message
from laminar.membership.swim import EventKind, MemberEvent, MemberState, Swim, SwimConfig


def seeds_from_env(default: list[int]) -> list[int]:
    """SWIM_SEED=1,2,3 replaces a test's seed list (to replay a failure)."""
    raw = os.environ.get("SWIM_SEED")
    return [int(s) for s in raw.split(",")] if raw else default


def address_of(node_id: int) -> str:
    return f"10.0.{node_id // 250}.{node_id % 250 + 1}:7946"


@dataclass
class Recorded:
    tick: int
    observer: int
    event: MemberEvent


@dataclass
class SimStats:
    datagrams: int = 0
    dropped: int = 0
    bytes: int = 0
    max_datagram: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Simulation:
    """A cluster of ``Swim`` cores on a simulated network."""

    def __init__(
        self,
        seed: int,
        config: SwimConfig | None = None,
        loss: float = 0.0,
        max_latency: int = 1,
        wire: bool = False,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.config = config or SwimConfig()
        self.loss = loss
        self.max_latency = max_latency
        self.wire = wire
        self.now = 0
        self.nodes: dict[int, Swim] = {}
        self.by_address: dict[str, int] = {}
        self.crashed: set[int] = set()
        self.slow: dict[int, int] = {}  # extra ticks on every datagram to or from a member
        self.side: dict[int, int] = {}  # partition side per node; absent = side 0
        self.in_flight: dict[int, list[tuple[str, str, Message | bytes]]] = defaultdict(list)
        self.events: list[Recorded] = []
        self.stats = SimStats()

    # -------------------------------------------------------------- membership of the sim

    def add(self, node_id: int, seeds: list[int] | None = None) -> Swim:
        cfg = dataclasses.replace(self.config, seed=self.rng.getrandbits(64))
        seed_addresses = [address_of(s) for s in seeds or []]
        swim = Swim(node_id, address_of(node_id), {"raft": f"raft-{node_id}"}, cfg, seed_addresses)
        self.nodes[node_id] = swim
        self.by_address[swim.address] = node_id
        self._collect(node_id)
        return swim

    def bootstrap(self, count: int, settle_ticks: int = 0) -> None:
        """Start ``count`` members (ids 1..count), each joining through member 1."""
        for node_id in range(1, count + 1):
            self.add(node_id, [1] if node_id != 1 else [])
        if settle_ticks:
            self.run(settle_ticks)

    def crash(self, node_id: int) -> None:
        self.crashed.add(node_id)

    def partition(self, groups: list[set[int]]) -> None:
        self.side = {n: i + 1 for i, group in enumerate(groups) for n in group}

    def heal(self) -> None:
        self.side = {}

    def live(self) -> list[int]:
        return [n for n in self.nodes if n not in self.crashed]

    # -------------------------------------------------------------- running

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.step()

    def run_until(
        self, predicate: Callable[[], bool], max_ticks: int, every: int = 1
    ) -> int | None:
        """Run until ``predicate()`` holds (checked every ``every`` ticks); the tick or None."""
        for _ in range(0, max_ticks, every):
            self.run(every)
            if predicate():
                return self.now
        return None

    def step(self) -> None:
        self.now += 1
        for source, destination, payload in self.in_flight.pop(self.now, []):
            node_id = self.by_address.get(destination)
            if node_id is None or node_id in self.crashed:
                continue
            message = codec.decode(payload) if isinstance(payload, bytes) else payload
            self.nodes[node_id].receive(source, message)
            self._collect(node_id)
        for node_id, swim in self.nodes.items():
            if node_id in self.crashed:
                continue
            swim.tick()
            self._collect(node_id)

    def _collect(self, node_id: int) -> None:
        swim = self.nodes[node_id]
        for event in swim.events():
            self.events.append(Recorded(self.now, node_id, event))
        for destination, message in swim.outbox():
            self._transmit(node_id, swim.address, destination, message)

    def _transmit(self, sender: int, source: str, destination: str, message: Message) -> None:
        stats = self.stats
        stats.datagrams += 1
        stats.by_kind[type(message).__name__] += 1
        payload: Message | bytes = message
        if self.wire:
            payload = codec.encode(message)
            stats.bytes += len(payload)
            stats.max_datagram = max(stats.max_datagram, len(payload))
        receiver = self.by_address.get(destination)
        if (
            receiver is None
            or self.side.get(sender, 0) != self.side.get(receiver, 0)
            or (self.loss and self.rng.random() < self.loss)
        ):
            stats.dropped += 1
            return
        delay = self.rng.randint(1, self.max_latency)
        delay += self.slow.get(sender, 0) + self.slow.get(receiver, 0)
        self.in_flight[self.now + delay].append((source, destination, payload))

    # -------------------------------------------------------------- observations

    def view(self, observer: int) -> dict[int, tuple[MemberState, int]]:
        return {m.node_id: (m.state, m.incarnation) for m in self.nodes[observer].members()}

    def all_see(self, node_id: int, states: set[MemberState]) -> bool:
        """Every live member other than ``node_id`` sees it in one of ``states``."""
        for observer in self.live():
            if observer == node_id:
                continue
            member = self.nodes[observer].member(node_id)
            if member is None or member.state not in states:
                return False
        return True

    def converged(self) -> bool:
        """Every live member sees exactly the live members, all alive, with equal incarnations."""
        live = sorted(self.live())
        expected = {n: self.nodes[n].incarnation for n in live}
        for observer in live:
            seen = {
                m.node_id: m.incarnation
                for m in self.nodes[observer].members()
                if m.state is MemberState.ALIVE
            }
            if seen != expected:
                return False
        return True

    def declared(self, kind: EventKind, about: int | None = None) -> list[Recorded]:
        return [
            r
            for r in self.events
            if r.event.kind is kind and (about is None or r.event.member.node_id == about)
        ]

    def replay_hint(self, nodeid: str) -> str:
        """The failing seed and the command that replays exactly this run."""
        test = nodeid.split("[")[0]
        return f"seed={self.seed}; replay: SWIM_SEED={self.seed} pytest '{test}'"
