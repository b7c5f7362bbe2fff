"""Classic consumer groups (Kafka's JoinGroup / SyncGroup / Heartbeat / LeaveGroup): a sans-I/O
state machine living beside the KIP-848 coordinator of the same shard.

Kafka clients mostly speak this protocol: the coordinator only runs the membership barrier and
the client-side leader computes the assignment. Group states follow Kafka's:

* ``Empty``: no members (offsets may remain). A join starts a rebalance; for a group that was
  empty, the join is held for ``initial_rebalance_delay_ms`` (extended while new members keep
  coming, within the rebalance timeout) so that members starting together land in one
  generation.
* ``PreparingRebalance``: joins are held until every known member has joined again (and no
  member given an id by ``MEMBER_ID_REQUIRED`` is still to come back) or the rebalance timeout
  passes; members that did not join by then are removed.
* ``CompletingRebalance``: the join completed with a new generation and protocol; every member
  got its join response (the leader with every member's subscription). The leader's SyncGroup
  carries the assignment; followers' SyncGroups wait for it. Members that do not sync within
  the rebalance timeout are removed and the group rebalances.
* ``Stable``: SyncGroup answers at once with the member's assignment, heartbeats succeed. A
  member leaving or expiring, the leader rejoining or a member rejoining with other protocols
  starts a rebalance; a follower rejoining unchanged is answered at once.
* ``Dead``: the group was deleted (never stored: an absent group).

Fencing: a heartbeat, sync or offset commit names a member and the generation it joined; a
member not in the group is ``UNKNOWN_MEMBER_ID``, another generation ``ILLEGAL_GENERATION``, and
a member whose static instance id (KIP-345) has been taken over by a newer member id is
``FENCED_INSTANCE_ID``. A static member that joins again under its instance id takes over its
predecessor's place (and assignment): in ``Stable``, unless that changes the protocol the
group would select, nobody rebalances.

Durability: the group as of its last state change (generation, protocol, leader, state, each
member with its subscription and assignment) is the record ``ClassicGroupKey`` (Kafka's
GroupMetadata), written through the owning ``Coordinator`` so it shares the shard's log and
checkpoints, when a join or sync completes, a static member takes over, and when a rebalance
starts (so a member that left or expired stays out after a fail-over; Kafka writes nothing
then). A join or sync response is released only once that record is committed, so a
coordinator fail-over never hands out a generation twice or forgets an assignment it sent.
Everything else (held joins and syncs, sessions, the timers, members waiting for their second
join) is transient, like Kafka's: a new coordinator loads the last record, gives every member
a fresh session, and a group loaded while preparing a rebalance waits for its members to join
again within the rebalance timeout.

Held requests: ``join`` and ``sync`` may answer ``Waiting(token)``; their answers come later out
of ``take_completions`` as ``(token, Reply | LaminarError)`` (driven by other requests or
``tick``). Nothing here reads a clock, draws randomness (new member ids come from the caller)
or does I/O.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from laminar.durable import Reply
from laminar.errors import (
    FencedInstanceIdError,
    GroupIdNotFoundError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidRequestError,
    InvalidSessionTimeoutError,
    LaminarError,
    MemberIdRequiredError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from laminar.groups.records import (
    ClassicGroupKey,
    ClassicGroupValue,
    ClassicMemberTuple,
    GroupsState,
    Key,
    Value,
)

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class ClassicConfig:
    """Kafka's ``group.min/max.session.timeout.ms`` and ``group.initial.rebalance.delay.ms``."""

    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000


@dataclass(frozen=True, slots=True)
class Waiting:
    """The answer comes later from ``take_completions`` under this token."""

    token: int


@dataclass(frozen=True, slots=True)
class JoinResult:
    generation: int
    protocol_type: str
    protocol: str | None
    leader: str
    member_id: str
    members: tuple[tuple[str, str | None, bytes], ...]
    """(member id, instance id, subscription) of every member: the leader's only."""
    skip_assignment: bool = False
    """A static leader rejoined a stable group: it need not assign again (JoinGroup v9+)."""


@dataclass(frozen=True, slots=True)
class SyncResult:
    protocol_type: str
    protocol: str | None
    assignment: bytes


@dataclass(slots=True)
class ClassicMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    join_waiter: int | None = None
    sync_waiter: int | None = None
    session_until: int = 0

    def metadata(self, protocol: str | None) -> bytes:
        """The subscription for ``protocol`` (before a protocol is chosen: the preferred)."""
        if protocol is None:
            return self.protocols[0][1] if self.protocols else b""
        return next((m for name, m in self.protocols if name == protocol), b"")


@dataclass(slots=True)
class ClassicGroup:
    name: str
    state: str = EMPTY
    protocol_type: str | None = None
    protocol: str | None = None
    generation: int = 0
    leader: str | None = None
    members: dict[str, ClassicMember] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)
    """Member ids handed out with MEMBER_ID_REQUIRED -> until when they may come back."""
    static: dict[str, str] = field(default_factory=dict)
    """Instance id -> member id."""
    empty_since_ms: int = -1
    rebalance_until: int = -1
    initial_delay: bool = False
    delay_remaining_ms: int = 0
    new_member_joined: bool = False
    sync_until: int = -1
    pending_sync: set[str] = field(default_factory=set)
    stored: bool = False

    def supports(self, protocol_type: str, protocols: Iterable[str]) -> bool:
        names = set(protocols)
        if not self.members:
            return bool(protocol_type) and bool(names)
        if protocol_type != self.protocol_type:
            return False
        common = set.intersection(*({n for n, _ in m.protocols} for m in self.members.values()))
        return bool(common & names)

    def select_protocol(self) -> str:
        """Kafka's vote: the protocols every member supports; each member votes for the first
        of them in its own order; most votes wins (ties: the first member's preference)."""
        members = list(self.members.values())
        common = set.intersection(*({n for n, _ in m.protocols} for m in members))
        votes: dict[str, int] = {}
        for m in members:
            choice = next(n for n, _ in m.protocols if n in common)
            votes[choice] = votes.get(choice, 0) + 1
        order = [n for n, _ in members[0].protocols if n in common]
        return max(order, key=lambda n: (votes.get(n, 0), -order.index(n)))

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def active(self) -> bool:
        """Has members or someone is on the way in: offsets must not expire."""
        return bool(self.members or self.pending or self.state != EMPTY)


@dataclass(frozen=True, slots=True)
class ClassicMemberView:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class ClassicGroupView:
    name: str
    state: str
    protocol_type: str
    protocol: str
    generation: int
    leader: str
    members: tuple[ClassicMemberView, ...]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


class ClassicGroups:
    """The classic groups of one shard. Writes go through ``write`` (the coordinator's record
    fold), ``written`` is the coordinator's record count (for ``Reply.after``)."""

    def __init__(
        self,
        config: ClassicConfig,
        state: GroupsState,
        write: Callable[[Key, Value | None], None],
        written: Callable[[], int],
        now_ms: int,
    ) -> None:
        self.config = config
        self._state = state
        self._write = write
        self._written = written
        self.groups: dict[str, ClassicGroup] = {}
        self._completions: list[tuple[int, Reply | LaminarError]] = []
        self._next_token = 0
        for name in sorted(state.groups):
            value = state.groups[name].classic
            if value is not None:
                self.groups[name] = self._load(name, value, now_ms)

    def _load(self, name: str, value: ClassicGroupValue, now_ms: int) -> ClassicGroup:
        group = ClassicGroup(
            name,
            state=value.state,
            protocol_type=value.protocol_type or None,
            protocol=value.protocol,
            generation=value.generation,
            leader=value.leader,
            empty_since_ms=value.empty_since_ms,
            stored=True,
        )
        for mid, iid, client_id, host, session, rebalance, sub, assignment in value.members:
            protocols = ((value.protocol, _unb64(sub)),) if value.protocol is not None else ()
            group.members[mid] = ClassicMember(
                mid,
                iid,
                client_id,
                host,
                session,
                rebalance,
                value.protocol_type,
                protocols,
                _unb64(assignment),
                session_until=now_ms + session,
            )
            if iid is not None:
                group.static[iid] = mid
        if group.state == COMPLETING:
            group.sync_until = now_ms + group.max_rebalance_timeout_ms()
            group.pending_sync = set(group.members)
        elif group.state == PREPARING:  # members learn it from their heartbeats and rejoin
            group.rebalance_until = now_ms + group.max_rebalance_timeout_ms()
        return group

    # ------------------------------------------------------------------ queries

    def has_members(self, group: str) -> bool:
        g = self.groups.get(group)
        return g is not None and (bool(g.members) or bool(g.pending))

    def active(self, group: str) -> bool:
        g = self.groups.get(group)
        return g is not None and g.active()

    def take_completions(self) -> list[tuple[int, Reply | LaminarError]]:
        out, self._completions = self._completions, []
        return out

    def describe(self, group: str) -> ClassicGroupView | None:
        g = self.groups.get(group)
        if g is None:
            return None
        members = tuple(
            ClassicMemberView(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.metadata(g.protocol),
                m.assignment,
            )
            for m in g.members.values()
        )
        return ClassicGroupView(
            g.name,
            g.state,
            g.protocol_type or "",
            g.protocol or "",
            g.generation,
            g.leader or "",
            members,
        )

    # ------------------------------------------------------------------ requests

    def join(
        self,
        group: str,
        member_id: str,
        instance_id: str | None,
        protocol_type: str,
        protocols: Iterable[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        now_ms: int,
        *,
        new_member_id: str,
        require_known_member: bool = True,
        client_id: str = "",
        client_host: str = "",
    ) -> Reply[JoinResult | Waiting]:
        """JoinGroup. ``new_member_id`` is the id a new member gets (the caller draws it)."""
        if not group:
            raise InvalidRequestError("the group id must not be empty")
        protocols = tuple((name, bytes(meta)) for name, meta in protocols)
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_timeout_ms <= cfg.max_session_timeout_ms:
            raise InvalidSessionTimeoutError(
                f"session timeout {session_timeout_ms} ms is outside "
                f"[{cfg.min_session_timeout_ms}, {cfg.max_session_timeout_ms}]"
            )
        if rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms  # JoinGroup v0 has none
        shared = self._state.groups.get(group)
        if shared is not None and shared.members:
            raise InconsistentGroupProtocolError(f"group {group} is a consumer group")
        g = self.groups.get(group)
        if g is None:
            if member_id:
                raise UnknownMemberIdError(f"group {group} has no member {member_id}")
            g = ClassicGroup(group)
            meta = shared.meta if shared is not None else None
            g.empty_since_ms = meta.empty_since_ms if meta is not None else now_ms
        if not g.supports(protocol_type, (name for name, _ in protocols)):
            raise InconsistentGroupProtocolError(
                f"protocol type {protocol_type!r} and protocols do not match group {group}"
            )
        self.groups[group] = g
        iid = instance_id or None
        details = (
            iid,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            protocols,
        )
        if not member_id:
            if iid is not None and iid in g.static:
                return self._static_rejoin(g, g.static[iid], new_member_id, details, now_ms)
            if iid is None and require_known_member:
                g.pending[new_member_id] = now_ms + session_timeout_ms
                raise MemberIdRequiredError(f"join again as {new_member_id}", new_member_id)
            return self._add(g, new_member_id, details, now_ms)
        if member_id in g.pending:
            del g.pending[member_id]
            return self._add(g, member_id, details, now_ms)
        self._check_member(g, member_id, iid)
        member = g.members[member_id]
        if g.state == PREPARING:
            self._update(member, details, now_ms)
            token = self._hold_join(member)
            self._maybe_complete_join(g, now_ms)
            return Reply(Waiting(token), self._written())
        if g.state in (COMPLETING, STABLE):
            unchanged = member.protocols == protocols and member.protocol_type == protocol_type
            if unchanged and (g.state == COMPLETING or member_id != g.leader):
                self._touch(member, now_ms)
                return Reply(self._join_result(g, member), self._written())
            self._update(member, details, now_ms)
            token = self._hold_join(member)
            self._prepare_rebalance(g, now_ms)
            return Reply(Waiting(token), self._written())
        raise UnknownMemberIdError(f"group {group} has no member {member_id}")

    def sync(
        self,
        group: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        protocol_type: str | None,
        protocol: str | None,
        assignments: Mapping[str, bytes],
        now_ms: int,
    ) -> Reply[SyncResult | Waiting]:
        """SyncGroup: the leader's carries every member's assignment."""
        g = self.groups.get(group)
        if g is None:
            raise UnknownMemberIdError(f"group {group} has no member {member_id}")
        self._check_member(g, member_id, instance_id or None)
        if generation != g.generation:
            raise IllegalGenerationError(f"generation {generation}, group is at {g.generation}")
        if (protocol_type and protocol_type != g.protocol_type) or (
            protocol and protocol != g.protocol
        ):
            raise InconsistentGroupProtocolError(f"group {group} uses {g.protocol}")
        if g.state == PREPARING:
            raise RebalanceInProgressError(f"group {group} is rebalancing")
        member = g.members[member_id]
        self._touch(member, now_ms)
        g.pending_sync.discard(member_id)
        if g.state == STABLE:
            return Reply(self._sync_result(g, member), self._written())
        # CompletingRebalance
        self._next_token += 1
        if member.sync_waiter is not None:
            self._fail(member.sync_waiter, RebalanceInProgressError("superseded by a new sync"))
        member.sync_waiter = self._next_token
        if member_id == g.leader:
            for mid, m in g.members.items():
                m.assignment = bytes(assignments.get(mid, b""))
            g.state = STABLE
            g.sync_until = -1
            g.pending_sync.clear()
            self._persist(g)
            for m in g.members.values():
                if m.sync_waiter is not None:
                    self._answer(m.sync_waiter, self._sync_result(g, m))
                    m.sync_waiter = None
        return Reply(Waiting(self._next_token), self._written())

    def heartbeat(
        self, group: str, generation: int, member_id: str, instance_id: str | None, now_ms: int
    ) -> Reply[None]:
        g = self.groups.get(group)
        if g is None:
            raise UnknownMemberIdError(f"group {group} has no member {member_id}")
        self._check_member(g, member_id, instance_id or None)
        if generation != g.generation:
            raise IllegalGenerationError(f"generation {generation}, group is at {g.generation}")
        self._touch(g.members[member_id], now_ms)
        if g.state == PREPARING:
            raise RebalanceInProgressError(f"group {group} is rebalancing")
        return Reply(None, self._written())

    def leave(
        self, group: str, members: Iterable[tuple[str, str | None]], now_ms: int
    ) -> Reply[list[LaminarError | None]]:
        """LeaveGroup (v3+: a batch; a static member may leave by instance id alone)."""
        g = self.groups.get(group)
        if g is None:
            raise UnknownMemberIdError(f"group {group} has no members")
        results: list[LaminarError | None] = []
        removed = False
        for member_id, instance_id in members:
            iid = instance_id or None
            try:
                if not member_id and iid is not None:
                    if iid not in g.static:
                        raise UnknownMemberIdError(f"no member has instance id {iid}")
                    member_id = g.static[iid]
                if member_id in g.pending and iid is None:
                    del g.pending[member_id]
                    removed = True
                    results.append(None)
                    continue
                self._check_member(g, member_id, iid)
                self._remove(g, member_id, UnknownMemberIdError("the member left"))
                removed = True
                results.append(None)
            except LaminarError as exc:
                results.append(exc)
        if removed:
            self._membership_lost(g, now_ms)
        return Reply(results, self._written())

    def check_commit(
        self,
        group: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        now_ms: int,
        group_not_found: bool = False,
    ) -> bool:
        """Validate an OffsetCommit to a classic group (or a group of neither kind). Returns
        False for a simple commit (generation < 0 to a group without members: admin tools),
        True for a member's commit; raises what Kafka answers otherwise
        (``group_not_found``: OffsetCommit v9+ answers GROUP_ID_NOT_FOUND for a missing group)."""
        g = self.groups.get(group)
        if g is None or (not g.members and g.state == EMPTY):
            if generation < 0:
                return False
            if g is None and group not in self._state.groups:
                if group_not_found:
                    raise GroupIdNotFoundError(f"group {group} does not exist")
                raise IllegalGenerationError(f"group {group} has no generation {generation}")
            raise UnknownMemberIdError(f"group {group} has no member {member_id}")
        self._check_member(g, member_id, instance_id or None)
        if generation != g.generation:
            raise IllegalGenerationError(f"generation {generation}, group is at {g.generation}")
        if g.state == COMPLETING:
            raise RebalanceInProgressError(f"group {group} is completing a rebalance")
        self._touch(g.members[member_id], now_ms)
        return True

    def forget(self, group: str) -> None:
        """The group is deleted (or becomes a consumer group): no record, no in-memory state."""
        g = self.groups.pop(group, None)
        state = self._state.groups.get(group)
        if state is not None and state.classic is not None:
            self._write(ClassicGroupKey(group), None)
        if g is not None:
            for member in g.members.values():
                self._drop_waiters(member, UnknownMemberIdError(f"group {group} was deleted"))

    # ------------------------------------------------------------------ time

    def tick(self, now_ms: int) -> None:
        for name in sorted(self.groups):
            g = self.groups.get(name)
            if g is None:
                continue
            lost = False
            for mid in sorted(g.pending):
                if now_ms >= g.pending[mid]:
                    del g.pending[mid]
                    lost = True
            for mid, m in list(g.members.items()):
                waiting = m.join_waiter is not None or m.sync_waiter is not None
                if not waiting and now_ms >= m.session_until:
                    self._remove(g, mid, UnknownMemberIdError("session expired"))
                    lost = True
            if g.state == COMPLETING and g.sync_until >= 0 and now_ms >= g.sync_until:
                for mid in sorted(g.pending_sync):
                    if mid in g.members:
                        self._remove(g, mid, UnknownMemberIdError("did not sync in time"))
                lost = True
            if lost:
                self._membership_lost(g, now_ms)
            if g.state == PREPARING and now_ms >= g.rebalance_until:
                if g.initial_delay and g.new_member_joined and g.delay_remaining_ms > 0:
                    delay = min(self.config.initial_rebalance_delay_ms, g.delay_remaining_ms)
                    g.delay_remaining_ms -= delay
                    g.new_member_joined = False
                    g.rebalance_until = now_ms + delay
                else:
                    g.initial_delay = False
                    self._complete_join(g, now_ms)
            if g.state == EMPTY and not g.members and not g.pending and not g.stored:
                del self.groups[name]  # never completed a join: nothing to keep

    # ------------------------------------------------------------------ internals

    def _check_member(self, g: ClassicGroup, member_id: str, instance_id: str | None) -> None:
        if instance_id is not None:
            owner = g.static.get(instance_id)
            if owner is not None and owner != member_id:
                raise FencedInstanceIdError(f"instance {instance_id} is now {owner}")
        member = g.members.get(member_id)
        if member is None:
            raise UnknownMemberIdError(f"group {g.name} has no member {member_id}")
        if member.instance_id is not None and instance_id not in (None, member.instance_id):
            raise FencedInstanceIdError(f"member {member_id} is {member.instance_id}")

    def _touch(self, member: ClassicMember, now_ms: int) -> None:
        member.session_until = now_ms + member.session_timeout_ms

    def _update(self, member: ClassicMember, details: tuple, now_ms: int) -> None:
        (
            _iid,
            member.client_id,
            member.client_host,
            member.session_timeout_ms,
            member.rebalance_timeout_ms,
            member.protocol_type,
            member.protocols,
        ) = details
        self._touch(member, now_ms)

    def _hold_join(self, member: ClassicMember) -> int:
        if member.join_waiter is not None:
            self._fail(member.join_waiter, RebalanceInProgressError("superseded by a new join"))
        self._next_token += 1
        member.join_waiter = self._next_token
        return self._next_token

    def _add(
        self, g: ClassicGroup, member_id: str, details: tuple, now_ms: int
    ) -> Reply[JoinResult | Waiting]:
        iid = details[0]
        member = ClassicMember(member_id, iid, "", "", 0, 0, "", ())
        self._update(member, details, now_ms)
        if not g.members:
            g.protocol_type = member.protocol_type
        g.members[member_id] = member
        if iid is not None:
            g.static[iid] = member_id
        if g.leader is None or g.leader not in g.members:
            g.leader = member_id
        g.empty_since_ms = -1
        token = self._hold_join(member)
        if g.state == PREPARING:
            g.new_member_joined = True
            self._maybe_complete_join(g, now_ms)
        else:
            self._prepare_rebalance(g, now_ms)
        return Reply(Waiting(token), self._written())

    def _static_rejoin(
        self, g: ClassicGroup, old_id: str, new_id: str, details: tuple, now_ms: int
    ) -> Reply[JoinResult | Waiting]:
        """A static member came back under a new member id: it takes the old one's place."""
        old = g.members[old_id]
        fenced = FencedInstanceIdError(f"instance {old.instance_id} joined again as {new_id}")
        self._drop_waiters(old, fenced)
        member = ClassicMember(new_id, old.instance_id, "", "", 0, 0, "", (), old.assignment)
        self._update(member, details, now_ms)
        g.members = {(new_id if k == old_id else k): (member if k == old_id else v)
                     for k, v in g.members.items()}  # fmt: skip
        g.static[member.instance_id or ""] = new_id
        if g.leader == old_id:
            g.leader = new_id
        if old_id in g.pending_sync:
            g.pending_sync.discard(old_id)
            g.pending_sync.add(new_id)
        if g.state == STABLE and g.select_protocol() == g.protocol:
            # Kafka's rule: only a change of the protocol the group would select rebalances
            # (a subscription's bytes differ between incarnations: owned partitions...).
            self._persist(g)  # the new member id must survive a fail-over
            result = self._join_result(g, member, skip_assignment=new_id == g.leader)
            return Reply(result, self._written())
        token = self._hold_join(member)
        if g.state == PREPARING:
            self._maybe_complete_join(g, now_ms)
        else:
            self._prepare_rebalance(g, now_ms)
        return Reply(Waiting(token), self._written())

    def _prepare_rebalance(self, g: ClassicGroup, now_ms: int) -> None:
        if g.state == COMPLETING:
            for m in g.members.values():
                m.assignment = b""
                if m.sync_waiter is not None:
                    self._fail(m.sync_waiter, RebalanceInProgressError("the group rebalances"))
                    m.sync_waiter = None
            g.pending_sync.clear()
            g.sync_until = -1
        delay = min(self.config.initial_rebalance_delay_ms, g.max_rebalance_timeout_ms())
        if g.state == EMPTY and delay > 0:
            g.initial_delay = True
            g.delay_remaining_ms = g.max_rebalance_timeout_ms() - delay
            g.new_member_joined = False
            g.rebalance_until = now_ms + delay
        else:
            g.initial_delay = False
            g.rebalance_until = now_ms + g.max_rebalance_timeout_ms()
        g.state = PREPARING
        if g.stored:
            # Who is still in the group survives a fail-over: a member that left or expired
            # does not come back with the next coordinator to hold its partitions until its
            # session runs out there (Kafka writes nothing here and has that gap).
            self._persist(g)
        self._maybe_complete_join(g, now_ms)

    def _membership_lost(self, g: ClassicGroup, now_ms: int) -> None:
        if g.state in (STABLE, COMPLETING):
            self._prepare_rebalance(g, now_ms)
        elif g.state == PREPARING:
            self._maybe_complete_join(g, now_ms)

    def _maybe_complete_join(self, g: ClassicGroup, now_ms: int) -> None:
        if g.state != PREPARING or g.initial_delay or g.pending:
            return
        if all(m.join_waiter is not None for m in g.members.values()):
            self._complete_join(g, now_ms)

    def _complete_join(self, g: ClassicGroup, now_ms: int) -> None:
        """A new generation: members that did not join are out."""
        for mid, m in list(g.members.items()):
            if m.join_waiter is None:
                self._remove(g, mid, UnknownMemberIdError("did not join in time"))
        g.pending.clear()
        g.initial_delay = False
        g.generation += 1
        g.rebalance_until = -1
        if not g.members:
            g.state = EMPTY
            g.protocol = None
            g.leader = None
            g.empty_since_ms = now_ms
            self._persist(g)
            return
        g.protocol = g.select_protocol()
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        g.sync_until = now_ms + g.max_rebalance_timeout_ms()
        g.pending_sync = set(g.members)
        for m in g.members.values():
            m.assignment = b""
        self._persist(g)
        for m in g.members.values():
            assert m.join_waiter is not None
            self._answer(m.join_waiter, self._join_result(g, m))
            m.join_waiter = None
            self._touch(m, now_ms)

    def _join_result(
        self, g: ClassicGroup, member: ClassicMember, skip_assignment: bool = False
    ) -> JoinResult:
        members: tuple[tuple[str, str | None, bytes], ...] = ()
        if member.member_id == g.leader:
            members = tuple(
                (m.member_id, m.instance_id, m.metadata(g.protocol)) for m in g.members.values()
            )
        assert g.leader is not None
        return JoinResult(
            g.generation,
            g.protocol_type or "",
            g.protocol,
            g.leader,
            member.member_id,
            members,
            skip_assignment,
        )

    def _sync_result(self, g: ClassicGroup, member: ClassicMember) -> SyncResult:
        return SyncResult(g.protocol_type or "", g.protocol, member.assignment)

    def _remove(self, g: ClassicGroup, member_id: str, error: LaminarError) -> None:
        member = g.members.pop(member_id)
        self._drop_waiters(member, error)
        if member.instance_id is not None and g.static.get(member.instance_id) == member_id:
            del g.static[member.instance_id]
        g.pending_sync.discard(member_id)
        if g.leader == member_id:
            g.leader = next(iter(g.members), None)

    def _drop_waiters(self, member: ClassicMember, error: LaminarError) -> None:
        for token in (member.join_waiter, member.sync_waiter):
            if token is not None:
                self._fail(token, error)
        member.join_waiter = member.sync_waiter = None

    def _persist(self, g: ClassicGroup) -> None:
        members: tuple[ClassicMemberTuple, ...] = tuple(
            (
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                m.session_timeout_ms,
                m.rebalance_timeout_ms,
                _b64(m.metadata(g.protocol)),
                _b64(m.assignment),
            )
            for m in g.members.values()
        )
        stored_state = g.state if g.state != DEAD else EMPTY
        value = ClassicGroupValue(
            g.protocol_type or "",
            g.protocol,
            g.generation,
            g.leader,
            stored_state,
            g.empty_since_ms if not g.members else -1,
            members,
        )
        self._write(ClassicGroupKey(g.name), value)
        g.stored = True

    def _answer(self, token: int, value: object) -> None:
        self._completions.append((token, Reply(value, self._written())))

    def _fail(self, token: int, error: LaminarError) -> None:
        self._completions.append((token, error))
