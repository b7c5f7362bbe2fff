"""Deterministic simulation of a SWIM cluster: many cores, one seeded lossy network, one clock.

Every run is a pure function of its seed, so a failing seed replays exactly
(``SWIM_SEED=<seed> pytest tests/test_swim_sim.py``). Datagrams take 1..max_latency ticks (so
they reorder), may be dropped or duplicated at random, and are dropped between different sides
of a partition and to or from crashed members. A paused member (SIGSTOP, a long GC or a
stalled event loop) neither ticks nor reads: datagrams for it wait in its socket buffer, up to
``SOCKET_BUFFER`` of them, the rest are lost; on resume it reads the stale backlog and carries
on from where its clock stopped, with the view it had. With ``wire=True`` every datagram also
goes through the real codec.

``Chaos(seed)`` runs one seeded random schedule of all of that on a small cluster and checks
SWIM's properties along the way (see its docstring).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from laminar.membership import codec
from laminar.membership.messages import Message
from laminar.membership.swim import EventKind, MemberEvent, MemberState, Swim, SwimConfig

SOCKET_BUFFER = 64  # datagrams a paused member's socket holds before the kernel drops more


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
        self.paused: dict[int, list[tuple[str, Message | bytes]]] = {}  # node -> socket buffer
        self.duplicate = 0.0
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

    def pause(self, node_id: int) -> None:
        self.paused.setdefault(node_id, [])

    def resume(self, node_id: int) -> None:
        """The process runs again: it first reads what waited in its socket buffer."""
        backlog = self.paused.pop(node_id, [])
        if node_id in self.crashed:
            return
        swim = self.nodes[node_id]
        for source, payload in backlog:
            message = codec.decode(payload) if isinstance(payload, bytes) else payload
            swim.receive(source, message)
        self._collect(node_id)

    def partition(self, groups: list[set[int]]) -> None:
        self.side = {n: i + 1 for i, group in enumerate(groups) for n in group}

    def heal(self) -> None:
        self.side = {}

    def live(self) -> list[int]:
        return [n for n in self.nodes if n not in self.crashed]

    def running(self) -> list[int]:
        """Live members that are not paused."""
        return [n for n in self.nodes if n not in self.crashed and n not in self.paused]

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
        paused = self.paused
        for source, destination, payload in self.in_flight.pop(self.now, []):
            node_id = self.by_address.get(destination)
            if node_id is None or node_id in self.crashed:
                continue
            if node_id in paused:
                buffer = paused[node_id]
                if len(buffer) < SOCKET_BUFFER:
                    buffer.append((source, payload))
                else:
                    self.stats.dropped += 1
                continue
            message = codec.decode(payload) if isinstance(payload, bytes) else payload
            self.nodes[node_id].receive(source, message)
            self._collect(node_id)
        for node_id, swim in self.nodes.items():
            if node_id in self.crashed or node_id in paused:
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
        copies = 2 if self.duplicate and self.rng.random() < self.duplicate else 1
        for _ in range(copies):
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


def detection_bound_periods(size: int, config: SwimConfig) -> int:
    """Worst case the protocol allows for every member to see a crash, in periods: a full
    round of probes before the first accuser finds it (round-robin order), the longest
    suspicion timeout (Lifeguard starts at ``suspicion_max_mult`` times the minimum and only
    shrinks with independent confirmations, which a small cluster has few of), and a few
    periods to spread the verdict."""
    minimum = config.suspicion_mult * max(1.0, math.log10(size))
    return math.ceil(size + minimum * config.suspicion_max_mult + 5)


CHAOS_REPLAY = "LAMINAR_SWIM_SEED={seed} .venv/bin/pytest tests/test_swim_sim.py -k chaos_replay"


class ChaosFailure(AssertionError):
    pass


class Chaos:
    """One seeded random fault schedule on a small cluster, with SWIM's properties checked.

    After converging on a clean network the cluster runs ``fault_periods`` protocol periods of
    loss, delay (and so reordering), duplication, process pauses (short ones and ones far past
    the suspicion timeout), crashes, restarts of crashed members as fresh processes, and, in
    some seeds, partitions. Checked throughout:

    * nobody invents an incarnation: every view of a member holds an incarnation that member
      itself has had, and no member sees itself suspect or dead;
    * without partitions, no member that was never paused, crashed or restarted is declared
      dead by another such member (loss, delay and others' pauses must not cost a healthy
      member its membership).

    Then every fault ends (pauses resume, partitions heal, loss stops) and:

    * no live member stays dead: within ``heal_periods`` every live member sees exactly the
      live members, all alive at their current incarnation, so every paused member that came
      back with a stale view, and every member suspected or declared dead meanwhile, has
      refuted with a higher incarnation;
    * a member that crashes now is declared dead by everyone within
      ``detection_bound_periods``.
    """

    def __init__(
        self,
        seed: int,
        fault_periods: int = 100,
        heal_periods: int = 50,
    ) -> None:
        self.seed = seed
        r = self.rng = random.Random(seed)
        self.size = r.choice((5, 8, 12))
        self.loss = r.choice((0.0, 0.05, 0.1))
        self.max_latency = r.choice((1, 2, 3))
        self.duplicate = r.choice((0.0, 0.02))
        self.partitions = r.random() < 0.3
        self.fault_periods = fault_periods
        self.heal_periods = heal_periods
        self.sim = Simulation(seed, max_latency=1)
        self.period = self.sim.config.protocol_period_ticks
        self.detect_periods = detection_bound_periods(self.size, self.sim.config)
        self.unhealthy: set[int] = set()  # ever paused, crashed or restarted
        self.max_incarnation: dict[int, int] = {}
        self.pause_ends: dict[int, int] = {}
        self.next_id = self.size + 1
        self.stats = {
            "pauses": 0,
            "long_pauses": 0,
            "crashes": 0,
            "restarts": 0,
            "refuted": 0,
            "back_from_dead": 0,
        }

    def fail(self, why: str) -> None:
        raise ChaosFailure(
            f"seed {self.seed} tick {self.sim.now}: {why}\n"
            f"replay: {CHAOS_REPLAY.format(seed=self.seed)}"
        )

    def run(self) -> None:
        sim = self.sim
        sim.bootstrap(self.size)
        if sim.run_until(sim.converged, 80 * self.period, every=5) is None:
            self.fail("the cluster did not converge on a clean network")
        sim.loss, sim.max_latency, sim.duplicate = self.loss, self.max_latency, self.duplicate
        self.note_incarnations()
        start = len(sim.events)
        for _ in range(self.fault_periods):
            self.fault_period()
        self.check_no_false_death(start)
        self.heal()
        self.check_final()

    # -------------------------------------------------------------- faults

    def fault_period(self) -> None:
        sim, r = self.sim, self.rng
        running = sim.running()
        if len(running) > 3 and r.random() < 0.06:
            victim = r.choice(running)
            sim.pause(victim)
            self.unhealthy.add(victim)
            long = r.random() < 0.4
            periods = r.randint(15, 40) if long else r.randint(1, 4)
            ticks = periods * self.period if long else r.randint(1, periods * self.period)
            self.pause_ends[victim] = sim.now + ticks
            self.stats["pauses"] += 1
            self.stats["long_pauses"] += long
        if len(running) > 3 and r.random() < 0.02:
            victim = r.choice(running)
            sim.crash(victim)
            self.unhealthy.add(victim)
            self.stats["crashes"] += 1
        crashed = sorted(sim.crashed - {n for n in sim.nodes if n in sim.paused})
        if crashed and r.random() < 0.05:
            self.restart(r.choice(crashed))
        if self.partitions and not sim.side and r.random() < 0.03:
            ids = sim.live()
            r.shuffle(ids)
            cut = r.randint(1, len(ids) - 1)
            sim.partition([set(ids[:cut]), set(ids[cut:])])
        elif sim.side and r.random() < 0.1:
            sim.heal()
        for _ in range(self.period):
            sim.step()
            for node_id, end in list(self.pause_ends.items()):
                if sim.now >= end:
                    del self.pause_ends[node_id]
                    sim.resume(node_id)
            self.note_incarnations()
        self.check_incarnations()

    def restart(self, node_id: int) -> None:
        """The crashed process starts again, fresh: incarnation 0, joining through others."""
        sim = self.sim
        self.note_incarnations()  # the old process's last incarnation stays the bound
        sim.crashed.discard(node_id)
        sim.paused.pop(node_id, None)
        seeds = self.rng.sample(sim.live(), min(2, len(sim.live())))
        sim.add(node_id, [s for s in seeds if s != node_id])
        self.stats["restarts"] += 1

    def heal(self) -> None:
        sim = self.sim
        for node_id in list(self.pause_ends):
            del self.pause_ends[node_id]
            sim.resume(node_id)
        sim.heal()
        # Loss stops too: under steady loss some suspicion is always in flight somewhere, so
        # "everyone sees everyone alive" is a question for a quiet network.
        sim.loss = sim.duplicate = 0.0
        self.note_incarnations()

    # -------------------------------------------------------------- checks

    def note_incarnations(self) -> None:
        top = self.max_incarnation
        for node_id, swim in self.sim.nodes.items():
            inc = swim.incarnation
            if inc > top.get(node_id, -1):
                top[node_id] = inc

    def check_incarnations(self) -> None:
        top = self.max_incarnation
        for observer, swim in self.sim.nodes.items():
            if observer in self.sim.crashed:
                continue
            for m in swim.members():
                if m.node_id == observer:
                    if m.state not in (MemberState.ALIVE, MemberState.LEFT):
                        self.fail(f"member {observer} sees itself {m.state.name}")
                elif m.incarnation > top.get(m.node_id, -1):
                    self.fail(
                        f"member {observer} holds incarnation {m.incarnation} of {m.node_id}, "
                        f"which never had more than {top.get(m.node_id)}"
                    )

    def check_no_false_death(self, start: int) -> None:
        if self.partitions:
            return
        for rec in self.sim.events[start:]:
            if rec.event.kind is not EventKind.DEAD:
                continue
            subject = rec.event.member.node_id
            if subject not in self.unhealthy and rec.observer not in self.unhealthy:
                self.fail(
                    f"healthy member {subject} declared dead by healthy member {rec.observer} "
                    f"at tick {rec.tick}"
                )

    def check_final(self) -> None:
        sim = self.sim
        healed = sim.run_until(sim.converged, self.heal_periods * self.period, every=1)
        if healed is None:
            stuck = {
                o: {m: v for m, v in sim.view(o).items() if v[0] is not MemberState.ALIVE}
                for o in sim.live()
            }
            self.fail(f"no convergence {self.heal_periods} periods after healing: {stuck}")
        for node_id in self.unhealthy & set(sim.live()):
            if sim.nodes[node_id].stats.refutations:
                self.stats["refuted"] += 1
            final = sim.nodes[node_id].incarnation
            if any(
                r.event.kind is EventKind.DEAD
                and r.event.member.node_id == node_id
                and r.event.member.incarnation < final
                for r in sim.events
            ):
                self.stats["back_from_dead"] += 1
        victim = self.rng.choice(sim.live())
        sim.crash(victim)
        crashed_at = sim.now
        seen = sim.run_until(
            lambda: sim.all_see(victim, {MemberState.DEAD}), self.detect_periods * self.period
        )
        if seen is None:
            self.fail(f"crashed member {victim} not seen dead by all within {self.detect_periods}")
        self.detect_ticks = seen - crashed_at
