"""SWIM membership as a deterministic, sans-I/O state machine.

Ticks and received messages go in; datagrams to send (``outbox``) and member events (``events``)
come out. Nothing here reads a clock, a socket or global randomness, so a simulation can replay a
whole cluster from one seed. A tick is a fixed unit of wall time chosen by the driver (the asyncio
driver uses 100 ms, so the defaults below give a 1 s protocol period and a 500 ms ack timeout).

Follows Das, Gupta and Motivala (2002) with the Lifeguard refinements memberlist uses: suspicion
timeouts that start long and shrink with independent confirmations, a suspect target is told it
is suspected on the probe itself ("buddy system"), local health (helpers nack, and a member whose
probes fail without nacks stretches its own timing), and dead states received in a full sync are
only taken as suspicion so that the accused can refute them. docs/ARCHITECTURE.md
describes the additions that make 10% packet loss safe.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from laminar.membership.broadcast import BroadcastQueue
from laminar.membership.messages import (
    MESSAGE_OVERHEAD_BYTES,
    Ack,
    Gossip,
    Message,
    Nack,
    Ping,
    PingReq,
    Sync,
    Update,
    text_size,
    update_size,
)
from laminar.membership.state import (
    LIVE_STATES,
    MAX_INCARNATION,
    EventKind,
    Member,
    MemberEvent,
    MemberState,
)
from laminar.membership.suspicion import Suspicion

__all__ = [
    "EventKind",
    "Member",
    "MemberEvent",
    "MemberState",
    "Swim",
    "SwimConfig",
]


@dataclass(slots=True)
class SwimConfig:
    """Protocol timing in ticks; defaults are memberlist's LAN profile at 100 ms per tick."""

    protocol_period_ticks: int = 10
    ack_timeout_ticks: int = 5
    indirect_checks: int = 3
    suspicion_mult: int = 4
    suspicion_max_mult: int = 6
    retransmit_mult: int = 4
    sync_period_ticks: int = 300
    join_retry_ticks: int = 20
    max_datagram_bytes: int = 1400
    # Lifeguard local health: probe timing is stretched up to this factor while our own probes
    # fail without the helpers' nacks that would show our network is fine.
    awareness_max: int = 8
    reap_after_ticks: int = 864_000
    """A dead or left member is forgotten this long after it went down (24 h at 100 ms per
    tick, as memberlist's and Serf's reap timeouts); 0 keeps it forever."""
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.protocol_period_ticks < 2:
            raise ValueError("protocol_period_ticks must be at least 2")
        if not 1 <= self.ack_timeout_ticks < self.protocol_period_ticks:
            raise ValueError("ack_timeout_ticks must be in [1, protocol_period_ticks)")
        if self.indirect_checks < 0 or self.suspicion_mult < 1 or self.retransmit_mult < 1:
            raise ValueError("indirect_checks, suspicion_mult and retransmit_mult must be >= 0/1")
        if self.suspicion_max_mult < 1 or self.sync_period_ticks < 1:
            raise ValueError("suspicion_max_mult and sync_period_ticks must be >= 1")
        if self.awareness_max < 1:
            raise ValueError("awareness_max must be at least 1")
        if self.reap_after_ticks < 0:
            raise ValueError("reap_after_ticks must be >= 0")
        if self.max_datagram_bytes < 512:
            raise ValueError("max_datagram_bytes must be at least 512")


@dataclass(slots=True)
class _Probe:
    target_id: int
    seq: int
    indirect_at: int  # when to fall back to ping-req
    indirect_sent: bool = False
    acked: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass(slots=True)
class _Relay:
    """A ping sent for another member's ping-req: its ack is forwarded to ``address``."""

    address: str
    seq: int
    nack_at: int
    expires: int
    nacked: bool = False


@dataclass(slots=True)
class _Stats:
    messages_sent: int = 0
    probes: int = 0
    probes_failed: int = 0
    refutations: int = 0
    ignored: int = 0


class Swim:
    """One member's view of the cluster, driven by ``tick`` and ``receive``."""

    def __init__(
        self,
        node_id: int,
        address: str,
        meta: Mapping[str, str] | None = None,
        config: SwimConfig | None = None,
        seeds: list[str] | None = None,
        incarnation: int = 0,
    ) -> None:
        """``incarnation`` is this member's first: a restarted member that starts above
        whatever its previous life reached is taken for alive at its first message, where
        one starting at 0 must first hear itself declared dead and refute it (see
        ``SwimDriver``)."""
        if node_id <= 0:
            raise ValueError("node_id must be a positive integer (0 means 'nobody' on the wire)")
        self.config = config or SwimConfig()
        self.stats = _Stats()
        self._id = node_id
        self._rng = random.Random(self.config.seed)
        self._now = 0
        if not 0 <= incarnation < MAX_INCARNATION:
            raise ValueError(f"incarnation must be in [0, {MAX_INCARNATION})")
        self._self = Member(node_id, address, incarnation, MemberState.ALIVE, dict(meta or {}))
        self._check_size()
        self._members: dict[int, Member] = {node_id: self._self}
        self._live_count = 1
        self._health = 0  # Lifeguard local health score: 0 (healthy) .. awareness_max - 1
        self._order: list[int] = []
        self._order_pos = 0
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._suspicions: dict[int, Suspicion] = {}
        self._down_since: dict[int, int] = {}
        """Dead or left members -> the tick they went down (reaped ``reap_after_ticks`` later)."""
        self._broadcasts = BroadcastQueue()
        self._outbox: list[tuple[str, Message]] = []
        self._events: list[MemberEvent] = []
        self._seq = 0
        period = self.config.protocol_period_ticks
        # Random phases so members do not probe and sync in lockstep.
        self._next_probe = self._rng.randrange(1, period + 1)
        self._next_sync = self._rng.randrange(1, self.config.sync_period_ticks + 1)
        self._seeds: list[str] = []
        self._next_join = 0
        # Members the message being handled has stale news of: the reply carries ours first.
        self._corrections: dict[int, None] = {}
        self._broadcast_self()
        if seeds:
            self.join(seeds)

    # ----------------------------------------------------------------- public API

    @property
    def node_id(self) -> int:
        return self._id

    @property
    def address(self) -> str:
        return self._self.address

    @property
    def now(self) -> int:
        """Ticks elapsed since this core was created."""
        return self._now

    @property
    def incarnation(self) -> int:
        return self._self.incarnation

    @property
    def health(self) -> int:
        """Local health score (0 = healthy); probe timing is stretched by ``health + 1``."""
        return self._health

    def members(self) -> list[Member]:
        """Every known member including this one, sorted by node id (copies)."""
        return [self._members[i].copy() for i in sorted(self._members)]

    def member(self, node_id: int) -> Member | None:
        found = self._members.get(node_id)
        return found.copy() if found is not None else None

    def outbox(self) -> list[tuple[str, Message]]:
        """Datagrams to send as (address, message); the caller takes ownership."""
        out, self._outbox = self._outbox, []
        return out

    def events(self) -> list[MemberEvent]:
        out, self._events = self._events, []
        return out

    def join(self, seeds: list[str]) -> None:
        """Ask every seed for its member list; repeated until some other member is known."""
        self._seeds = [s for s in seeds if s != self._self.address]
        self._next_join = self._now + self.config.join_retry_ticks
        self._send_join()

    def leave(self) -> None:
        """Announce a graceful leave; the node stops probing but still answers pings."""
        if self._self.state is MemberState.LEFT:
            return
        self._self.incarnation += 1
        self._self.state = MemberState.LEFT
        self._probe = None
        self._seeds = []
        update = self._update_of(self._self)
        self._broadcasts.push(update)
        self._gossip_now(update)

    def update_meta(self, meta: Mapping[str, str]) -> None:
        """Replace this member's metadata; a new incarnation carries it to everyone."""
        previous = self._self.meta
        self._self.meta = dict(meta)
        try:
            self._check_size()
        except ValueError:
            self._self.meta = previous
            raise
        self._self.incarnation += 1
        self._broadcast_self()

    def tick(self) -> None:
        """Advance one tick: probe deadlines, suspicion timers, periodic sync, join retries."""
        self._now += 1
        now = self._now
        active = self._self.state is not MemberState.LEFT
        probe = self._probe
        if (
            probe is not None
            and not probe.acked
            and not probe.indirect_sent
            and now >= probe.indirect_at
        ):
            self._send_indirect(probe)
        if now >= self._next_probe:
            self._finish_probe()
            self._next_probe = now + self._scaled(self.config.protocol_period_ticks)
            if active:
                self._start_probe()
        if self._suspicions:
            for node_id, suspicion in list(self._suspicions.items()):
                if now < suspicion.deadline():
                    continue
                confirmed = self._id in suspicion.accusers and len(suspicion.accusers) > 1
                if confirmed or suspicion.checked:
                    self._declare(node_id, suspicion.incarnation, MemberState.DEAD, self._id)
                else:
                    self._last_check(node_id, suspicion)
        if self._relays:
            self._tick_relays(now)
        reap_after = self.config.reap_after_ticks
        if reap_after and self._down_since:
            for node_id, since in list(self._down_since.items()):
                if now - since >= reap_after:
                    self._reap(node_id)
        if active and now >= self._next_sync:
            self._next_sync = now + self.config.sync_period_ticks
            self._periodic_sync()
        if self._seeds and now >= self._next_join:
            if self._live_count > 1:
                self._seeds = []
            else:
                self._next_join = now + self.config.join_retry_ticks
                self._send_join()

    def receive(self, from_address: str, message: Message) -> None:
        """Handle one decoded datagram from ``from_address`` (its UDP source address)."""
        if message.source_id == self._id:
            self.stats.ignored += 1
            return
        self._corrections.clear()
        for update in message.updates:
            self._note_stale(update)
            self._apply(update)
        match message:
            case Ping():
                if message.target_id not in (0, self._id):
                    self.stats.ignored += 1
                    return
                self._send(from_address, Ack(self._id, message.seq, self._reply_updates()))
            case Ack():
                self._on_ack(message)
            case Nack():
                if self._probe is not None and message.seq == self._probe.seq:
                    self._probe.nacks += 1
            case PingReq():
                if self._self.state is MemberState.LEFT:
                    return
                seq = self._next_seq()
                now = self._now
                nack_at = now + max(1, self.config.ack_timeout_ticks // 2)
                expires = now + self.config.protocol_period_ticks
                self._relays[seq] = _Relay(from_address, message.seq, nack_at, expires)
                target = self._members.get(message.target_id)
                buddy = self._buddy(target) if target is not None else ()
                updates = buddy + self._piggyback(_size(buddy), skip={message.target_id})
                ping = Ping(self._id, seq, message.target_id, updates)
                self._send(message.target_address, ping)
            case Sync():
                for update in message.members:
                    self._apply(update, synced_from=message.source_id)
                if message.want_reply:
                    self._send_state(from_address, want_reply=False)
            case Gossip():
                pass

    # ----------------------------------------------------------------- probing

    def _start_probe(self) -> None:
        target = self._next_target()
        if target is None:
            self._probe = None
            return
        indirect_at = self._now + self._scaled(self.config.ack_timeout_ticks)
        probe = _Probe(target.node_id, self._next_seq(), indirect_at)
        self._probe = probe
        self.stats.probes += 1
        buddy = self._buddy(target)
        updates = buddy + self._piggyback(_size(buddy), skip={target.node_id})
        self._send(target.address, Ping(self._id, probe.seq, target.node_id, updates))

    def _last_check(self, node_id: int, suspicion: Suspicion) -> None:
        """Ping a suspect once more before declaring it dead on hearsay alone.

        An extension of Lifeguard, for suspicions this member did not see confirmed by its own
        failed probe plus another accuser's: it may simply have missed the refutation (gossip is
        retransmitted a bounded number of times). Two direct pings carry the accusation; the
        suspect's ack carries its refutation.
        """
        suspicion.checked = True
        suspicion.extend(self.config.protocol_period_ticks)
        target = self._members[node_id]
        buddy = (self._update_of(target, self._accuser(node_id)),)
        for _ in range(2):
            self._send(target.address, Ping(self._id, self._next_seq(), node_id, buddy))

    def _send_indirect(self, probe: _Probe) -> None:
        probe.indirect_sent = True
        target = self._members.get(probe.target_id)
        if target is None or target.state not in LIVE_STATES:
            return
        helpers = self._pick(
            self.config.indirect_checks,
            lambda m: m.state is MemberState.ALIVE and m.node_id != probe.target_id,
        )
        # The helper learns the accusation too, so its ping tells the suspect (buddy system).
        buddy = self._buddy(target)
        used = text_size(target.address) + _size(buddy)
        probe.expected_nacks = len(helpers)
        for helper in helpers:
            updates = buddy + self._piggyback(used, skip={target.node_id})
            req = PingReq(self._id, probe.seq, target.node_id, target.address, updates)
            self._send(helper.address, req)

    def _finish_probe(self) -> None:
        probe, self._probe = self._probe, None
        if probe is None:
            return
        if probe.acked:
            self._adjust_health(-1)
            return
        # Lifeguard: missing nacks mean our own network or process is the problem, not the target.
        missing = probe.expected_nacks - probe.nacks if probe.expected_nacks else 1
        self._adjust_health(missing)
        self.stats.probes_failed += 1
        target = self._members.get(probe.target_id)
        if target is not None and target.state in LIVE_STATES:
            self._suspect(target.node_id, target.incarnation, self._id)

    def _tick_relays(self, now: int) -> None:
        for seq, relay in list(self._relays.items()):
            if relay.expires <= now:
                del self._relays[seq]
            elif not relay.nacked and now >= relay.nack_at:
                relay.nacked = True
                self._send(relay.address, Nack(self._id, relay.seq, self._piggyback()))

    def _scaled(self, ticks: int) -> int:
        return ticks * (self._health + 1)

    def _adjust_health(self, delta: int) -> None:
        self._health = min(max(self._health + delta, 0), self.config.awareness_max - 1)

    def _on_ack(self, ack: Ack) -> None:
        probe = self._probe
        if probe is not None and ack.seq == probe.seq:
            probe.acked = True
            return
        relay = self._relays.pop(ack.seq, None)
        if relay is not None:
            self._send(relay.address, Ack(self._id, relay.seq, self._piggyback()))

    def _next_target(self) -> Member | None:
        """Shuffled round-robin over live members (a fresh shuffle after each full pass)."""
        for _ in range(2):
            while self._order_pos < len(self._order):
                node_id = self._order[self._order_pos]
                self._order_pos += 1
                member = self._members.get(node_id)
                if member is not None and member.state in LIVE_STATES:
                    return member
            self._order = [
                m.node_id
                for m in self._members.values()
                if m.node_id != self._id and m.state in LIVE_STATES
            ]
            self._rng.shuffle(self._order)
            self._order_pos = 0
            if not self._order:
                return None
        return None

    # ----------------------------------------------------------------- state merging

    def _apply(self, update: Update, synced_from: int = 0) -> None:
        if update.incarnation >= MAX_INCARNATION or not update.address:
            self.stats.ignored += 1
            return
        if update.node_id == self._id:
            self._about_self(update)
            return
        if update.node_id <= 0:
            self.stats.ignored += 1
            return
        state = update.state
        if state is MemberState.ALIVE:
            self._alive(update)
        elif state is MemberState.SUSPECT:
            self._suspect(update.node_id, update.incarnation, update.from_id, update)
        elif state is MemberState.DEAD and synced_from:
            # A dead state from a full sync may be stale: only suspect, so the node can refute.
            if update.node_id in self._members:
                self._suspect(update.node_id, update.incarnation, synced_from)
        else:
            self._declare(update.node_id, update.incarnation, state, update.from_id)

    def _about_self(self, update: Update) -> None:
        me = self._self
        if me.state is MemberState.LEFT:
            return
        if update.state is MemberState.ALIVE:
            stale_life = update.incarnation == me.incarnation and (
                update.address != me.address or dict(update.meta) != me.meta
            )
            if update.incarnation > me.incarnation or stale_life:
                self._refute(update.incarnation)
            return
        if update.incarnation >= me.incarnation:
            self._refute(update.incarnation)
        else:
            # Already refuted, but the sender has not heard: gossip our alive state again.
            self._broadcast_self()

    def _gossip_now(self, update: Update) -> None:
        """Send news about ourselves straight to a few random members (leave, refutation)."""
        fanout = max(3, self.config.indirect_checks)
        for peer in self._pick(fanout, lambda m: m.state is MemberState.ALIVE):
            self._send(peer.address, Gossip(self._id, (update,)))

    def _note_stale(self, update: Update) -> None:
        """Remember members the sender is behind on (an old incarnation, or accusing us)."""
        if update.node_id == self._id:
            if update.state is not MemberState.ALIVE or update.incarnation < self.incarnation:
                self._corrections[update.node_id] = None
            return
        current = self._members.get(update.node_id)
        if current is not None and update.incarnation < current.incarnation:
            self._corrections[update.node_id] = None

    def _reply_updates(self) -> tuple[Update, ...]:
        """Corrections for the sender first (Lifeguard-style direct refutation), then gossip."""
        budget = self.config.max_datagram_bytes - MESSAGE_OVERHEAD_BYTES
        first: list[Update] = []
        for node_id in self._corrections:
            update = self._update_of(self._members[node_id], self._accuser(node_id))
            size = update_size(update)
            if size > budget:
                break
            budget -= size
            first.append(update)
        used = self.config.max_datagram_bytes - MESSAGE_OVERHEAD_BYTES - budget
        return (*first, *self._piggyback(used, skip=self._corrections.keys()))

    def _buddy(self, target: Member) -> tuple[Update, ...]:
        """Lifeguard: a probe of a suspect tells it so, letting it refute without waiting."""
        if target.state is not MemberState.SUSPECT:
            return ()
        return (self._update_of(target, self._accuser(target.node_id)),)

    def _refute(self, seen: int) -> None:
        self.stats.refutations += 1
        self._adjust_health(1)  # being suspected hints that we are the slow one
        self._self.incarnation = max(self._self.incarnation, seen) + 1
        self._broadcast_self()
        # Push the refutation out now too: piggy-backing alone waits for our (possibly stretched)
        # probe period, and the accusers' suspicion timers are already running.
        self._gossip_now(self._update_of(self._self, self._id))

    def _alive(self, update: Update) -> None:
        current = self._members.get(update.node_id)
        if current is None:
            member = Member(
                update.node_id,
                update.address,
                update.incarnation,
                MemberState.ALIVE,
                dict(update.meta),
            )
            self._add(member)
            self._broadcasts.push(update)
            self._emit(EventKind.JOINED, member)
            return
        if update.incarnation <= current.incarnation:
            return
        changed = current.address != update.address or current.meta != dict(update.meta)
        previous = current.state
        current.incarnation = update.incarnation
        current.address = update.address
        current.meta = dict(update.meta)
        self._set_state(current, MemberState.ALIVE)
        self._suspicions.pop(current.node_id, None)
        self._broadcasts.push(self._update_of(current))
        if previous is not MemberState.ALIVE:
            self._emit(EventKind.ALIVE, current)
        elif changed:
            self._emit(EventKind.UPDATED, current)

    def _suspect(
        self, node_id: int, incarnation: int, accuser: int, update: Update | None = None
    ) -> None:
        current = self._members.get(node_id)
        if current is None:
            if update is None:
                return
            # Learnt of a member while it is under suspicion (e.g. in a sync on join).
            current = Member(node_id, update.address, incarnation, MemberState.ALIVE, {})
            current.meta = dict(update.meta)
            self._add(current)
            self._emit(EventKind.JOINED, current)
        if current.state not in LIVE_STATES or incarnation < current.incarnation:
            return
        suspicion = self._suspicions.get(node_id)
        if (
            current.state is MemberState.SUSPECT
            and suspicion is not None
            and incarnation == suspicion.incarnation
        ):
            if accuser and suspicion.confirm(accuser):
                self._broadcasts.push(self._update_of(current, accuser))
            return
        current.incarnation = incarnation
        self._set_state(current, MemberState.SUSPECT)
        self._suspicions[node_id] = self._new_suspicion(incarnation, accuser)
        self._broadcasts.push(self._update_of(current, accuser))
        self._emit(EventKind.SUSPECT, current)

    def _declare(self, node_id: int, incarnation: int, state: MemberState, reporter: int) -> None:
        """Apply a DEAD or LEFT state, which only a newer alive (a rejoin) can undo."""
        current = self._members.get(node_id)
        if current is None or incarnation < current.incarnation:
            return
        if current.state is MemberState.LEFT or current.state is state:
            return
        current.incarnation = incarnation
        self._set_state(current, state)
        self._suspicions.pop(node_id, None)
        self._broadcasts.push(self._update_of(current, reporter))
        self._emit(EventKind.DEAD if state is MemberState.DEAD else EventKind.LEFT, current)

    def _new_suspicion(self, incarnation: int, accuser: int) -> Suspicion:
        cfg = self.config
        n = self._live_count
        min_ticks = math.ceil(
            cfg.suspicion_mult * max(1.0, math.log10(max(n, 1))) * cfg.protocol_period_ticks
        )
        k = cfg.suspicion_mult - 2
        if n - 2 < k:
            k = 0
        suspicion = Suspicion(
            incarnation, self._now, min_ticks, min_ticks * cfg.suspicion_max_mult, k
        )
        if accuser:
            suspicion.confirm(accuser)
        return suspicion

    def _accuser(self, node_id: int) -> int:
        suspicion = self._suspicions.get(node_id)
        if suspicion is None or not suspicion.accusers:
            return self._id
        return min(suspicion.accusers)

    # ----------------------------------------------------------------- bookkeeping

    def _add(self, member: Member) -> None:
        self._members[member.node_id] = member
        if member.state in LIVE_STATES:
            self._live_count += 1
        # Join the current round-robin pass at a random place, as memberlist does.
        pos = self._rng.randint(self._order_pos, len(self._order))
        self._order.insert(pos, member.node_id)

    def _set_state(self, member: Member, state: MemberState) -> None:
        was_live = member.state in LIVE_STATES
        member.state = state
        self._live_count += (state in LIVE_STATES) - was_live
        if state in LIVE_STATES:
            self._down_since.pop(member.node_id, None)
        elif member.node_id != self._id:
            self._down_since.setdefault(member.node_id, self._now)

    def _reap(self, node_id: int) -> None:
        """Forget a member that has been down for ``reap_after_ticks``. Stale news of it (a
        dead or left update) changes nothing; only an alive update (a rejoin) brings it back."""
        del self._down_since[node_id]
        member = self._members.pop(node_id)
        self._suspicions.pop(node_id, None)
        if node_id in self._order:
            position = self._order.index(node_id)
            del self._order[position]
            if position < self._order_pos:
                self._order_pos -= 1
        self._emit(EventKind.REAPED, member)

    def _emit(self, kind: EventKind, member: Member) -> None:
        self._events.append(MemberEvent(kind, member.copy()))

    def _update_of(self, member: Member, from_id: int = 0) -> Update:
        return Update(
            member.node_id,
            member.address,
            member.incarnation,
            member.state,
            dict(member.meta),
            from_id,
        )

    def _broadcast_self(self) -> None:
        self._broadcasts.push(self._update_of(self._self, self._id))

    def _retransmit_limit(self) -> int:
        return self.config.retransmit_mult * max(1, math.ceil(math.log10(self._live_count + 1)))

    def _piggyback(self, used: int = 0, skip: Collection[int] = ()) -> tuple[Update, ...]:
        budget = self.config.max_datagram_bytes - MESSAGE_OVERHEAD_BYTES - used
        return tuple(self._broadcasts.take(budget, self._retransmit_limit(), skip))

    def _pick(self, count: int, accept: Callable[[Member], bool]) -> list[Member]:
        """Up to ``count`` random other members for which ``accept(member)`` holds."""
        pool = [m for m in self._members.values() if m.node_id != self._id and accept(m)]
        if len(pool) <= count:
            return pool
        return self._rng.sample(pool, count)

    def _check_size(self) -> None:
        budget = self.config.max_datagram_bytes - MESSAGE_OVERHEAD_BYTES
        if update_size(self._update_of(self._self)) > budget // 2:
            raise ValueError("address and metadata must fit in half a datagram")

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _send(self, address: str, message: Message) -> None:
        self.stats.messages_sent += 1
        self._outbox.append((address, message))

    # ----------------------------------------------------------------- full sync and join

    def _send_join(self) -> None:
        for seed in self._seeds:
            self._send_state(seed, want_reply=True)

    def _periodic_sync(self) -> None:
        """Repair divergence with a random live member, and retry one dead one (heals splits)."""
        for peer in self._pick(1, lambda m: m.state is MemberState.ALIVE):
            self._send_state(peer.address, want_reply=True)
        for peer in self._pick(1, lambda m: m.state is MemberState.DEAD):
            self._send_state(peer.address, want_reply=True)

    def _send_state(self, address: str, want_reply: bool) -> None:
        """Send the whole member list in datagram-sized chunks; only the first asks for a reply."""
        budget = self.config.max_datagram_bytes - MESSAGE_OVERHEAD_BYTES
        chunk: list[Update] = []
        used = 0
        first = True
        for node_id in sorted(self._members):
            member = self._members[node_id]
            # A suspect keeps its first accuser: a sync is not an independent confirmation.
            reporter = self._accuser(node_id) if member.state is MemberState.SUSPECT else self._id
            update = self._update_of(member, reporter)
            size = update_size(update)
            if chunk and used + size > budget:
                self._send(address, Sync(self._id, tuple(chunk), want_reply and first))
                first = False
                chunk, used = [], 0
            chunk.append(update)
            used += size
        self._send(address, Sync(self._id, tuple(chunk), want_reply and first))


def _size(updates: tuple[Update, ...]) -> int:
    return sum(update_size(u) for u in updates)
