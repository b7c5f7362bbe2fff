"""The group coordinator: a sans-I/O state machine for the consumer groups of one shard.

Protocol (in the spirit of Kafka's KIP-848): members heartbeat with the topics they subscribe to
and the partitions they own; the coordinator computes a *target assignment* with the sticky
assignor whenever membership, subscriptions or partition counts change, and answers each member
with the partitions it may own *now*. There is no group-wide barrier: a member is only ever told
to give up what the target takes from it, and it is only given a partition once nobody else owns
it. That is the revocation handshake:

* a partition the target moves from A to B goes first into A's ``revoking`` set (A's reply no
  longer lists it); it leaves ``revoking`` when A heartbeats *at its current epoch* without it,
  or when A is removed (session timeout, leave); only then can B's reply list it;
* a member's epoch changes every time the partitions it may own change, and epochs are drawn
  from a group-wide counter, so they only grow. At one epoch a member can only lose partitions,
  which is why a delayed heartbeat at the current epoch can never make a revocation look done
  too early, and a heartbeat at the previous epoch (its reply was lost) changes nothing and just
  gets the current reply again. Any other epoch is fenced.

Fencing zombies: a member that misses its session timeout is removed; one that does not finish
revoking within its rebalance timeout is *fenced* (its heartbeats and commits are refused, the
target no longer counts it) but keeps its partitions until its session runs out, because until
then it may still believe it owns them. Offset commits are accepted only from current, unfenced
members at their current or previous epoch, and only for partitions they may own (assigned or
being revoked), so a late commit can never overwrite the next owner's progress; a group with no
members also accepts commits from outside it (admin, Spark).
A member id names one incarnation: after ``UnknownMemberIdError``/``FencedMemberEpochError`` the
client drops everything and joins again (epoch 0) under a new id.

Static membership (KIP-345): a join (epoch 0) with an instance id already in the group takes over
that member (its current and target assignment, its epoch as the previous one) under the new
member id and a new epoch; the old id is gone, so a zombie of it is fenced. The others see no
rebalance: the target is not recomputed unless the subscription changed.

Durability and acknowledgement. Every change is a record (``records.py``) applied through the
same fold a replay uses. The driver takes them with ``take_batch``, appends each batch atomically
(one entry) to the group's internal partition and reports ``records_committed(n)`` once the
first ``n`` records of this coordinator are durable. Every successful call returns a ``Reply``
whose ``after`` is the number of records written up to then: the driver sends it only once
``after`` records are durable, because the reply may depend on any of them (its own or earlier
ones). Errors are raised at once: they only ever make a client give up or retry, which is safe
even if the state they were based on is lost. If an append fails (leadership lost), the driver
calls ``records_lost`` and drops this object; unsent replies are discarded and clients retry
against the new coordinator, built from the durable records (``Coordinator(..., records=...)``).
Timers are not records: a new coordinator gives every member a fresh session (and revoking
members a fresh rebalance timeout) from the time it takes over.

Classic groups. Kafka clients' JoinGroup/SyncGroup groups live beside these in ``classic``
(``classic.py``), writing through the same records, outbox and offsets. A group id is one kind at
a time: a heartbeat here to a classic group with members is ``GroupIdNotFoundError`` (an empty
one is taken over), and ``commit_classic_offsets`` routes Kafka's OffsetCommit by the kind.

Time is always passed in (``now_ms``); nothing here reads a clock, does I/O or draws randomness.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from laminar.durable import RecordOutbox, Reply
from laminar.errors import (
    FencedMemberEpochError,
    GroupIdNotFoundError,
    GroupNotEmptyError,
    InvalidOffsetError,
    InvalidRequestError,
    NotCoordinatorError,
    PartitionNotOwnedError,
    StaleMemberEpochError,
    UnknownMemberIdError,
    UnknownPartitionError,
    UnknownTopicError,
)
from laminar.groups import lineage as lineage_rules
from laminar.groups.assignor import AssignorMember, assign
from laminar.groups.classic import ClassicConfig, ClassicGroups
from laminar.groups.records import (
    AssignmentKey,
    AssignmentValue,
    GroupKey,
    GroupsState,
    GroupState,
    GroupValue,
    Key,
    MemberKey,
    MemberValue,
    OffsetKey,
    OffsetValue,
    Record,
    TargetKey,
    TargetMemberKey,
    TargetMemberValue,
    TargetValue,
    TopicPartition,
    Value,
    state_records,
)
from laminar.groups.views import GroupView, describe, describe_classic

DAY_MS = 24 * 3600 * 1000
MAX_METADATA_CHARS = 4096


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    offsets_retention_ms: int = 7 * DAY_MS
    rack_aware: bool = False
    classic: ClassicConfig = field(default_factory=ClassicConfig)

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise ValueError("need 0 < heartbeat_interval_ms < session_timeout_ms")
        if self.offsets_retention_ms <= 0:
            raise ValueError("offsets_retention_ms must be > 0")


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    """What the member should own now; it drops anything it owns that is not listed."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: frozenset[TopicPartition]


class Coordinator(RecordOutbox[Record]):
    """The groups of one coordinator shard. See the module docstring for the protocol."""

    lost_error = NotCoordinatorError
    lost_message = "coordinator state was lost; rebuild from the log"

    def __init__(
        self,
        config: CoordinatorConfig,
        topics: Mapping[str, int],
        now_ms: int,
        records: Iterable[Record] = (),
        replica_racks: Mapping[TopicPartition, frozenset[str]] | None = None,
        lineage: lineage_rules.Lineage | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.state = GroupsState()
        for record in records:
            self.state.apply(record)
        self.classic = ClassicGroups(
            config.classic, self.state, self._write, lambda: self._written, now_ms
        )
        """Classic (JoinGroup/SyncGroup) groups of this shard, sharing its records."""
        self.topics: dict[str, int] = dict(topics)
        self.replica_racks = dict(replica_racks or {})
        self.lineage: lineage_rules.Lineage = dict(lineage or {})
        """Key-range topics' lineage (``groups/lineage.py``): children wait for parents."""
        self._blocked: dict[str, frozenset[TopicPartition]] = {}
        """Per group, the partitions its last target left out for the lineage."""
        self._session: dict[tuple[str, str], int] = {}
        self._rebalance: dict[tuple[str, str], int] = {}
        for name in sorted(self.state.groups):
            group = self.state.groups[name]
            for mid in sorted(group.members):
                self._session[(name, mid)] = now_ms + config.session_timeout_ms
                cur = group.assignments.get(mid)
                if cur is not None and cur.revoking and not cur.fenced:
                    timeout = group.members[mid].rebalance_timeout_ms
                    self._rebalance[(name, mid)] = now_ms + timeout
        # Topics may have changed while no coordinator was running.
        self._apply_topics(now_ms)

    # ------------------------------------------------------------------ log interface

    def checkpoint(self) -> int:
        """Restate every live record (``state_records``) as the next records to write; returns
        how many. The state does not change; once they are durable, a replay may start where
        they start, so the internal partition's log before that point can be dropped."""
        self._alive()
        restated = state_records(self.state)
        self._emit(restated)
        return len(restated)

    # ------------------------------------------------------------------ requests

    def heartbeat(
        self,
        group: str,
        member_id: str,
        member_epoch: int,
        instance_id: str | None,
        rebalance_timeout_ms: int,
        subscribed_topics: Iterable[str],
        owned_partitions: Iterable[TopicPartition],
        now_ms: int,
        rack: str | None = None,
    ) -> Reply[HeartbeatResponse]:
        """Join (epoch 0) or heartbeat; raises the typed errors of the module docstring."""
        self._alive()
        _require_name(group, "group")
        _require_name(member_id, "member id")
        if member_epoch < 0:
            raise InvalidRequestError("a heartbeat's member epoch is >= 0 (leave() to leave)")
        if rebalance_timeout_ms <= 0:
            raise InvalidRequestError("rebalance timeout must be > 0")
        topics = tuple(sorted(set(subscribed_topics)))
        for topic in topics:
            _require_name(topic, "topic")
        owned = frozenset(owned_partitions)
        if self.classic.has_members(group):
            raise GroupIdNotFoundError(f"group {group} is a classic group, not a consumer group")
        if group in self.classic.groups:  # an empty classic group becomes a consumer group
            self.classic.forget(group)
        state = self.state.groups.get(group)
        cur = state.assignments.get(member_id) if state else None
        if member_epoch == 0:
            if cur is not None:  # a retried join: the member has not seen a reply yet
                if cur.fenced:
                    raise FencedMemberEpochError(f"member {member_id} is fenced")
                self._touch(group, member_id, now_ms)
                return self._respond(group, member_id)
            meta = MemberValue(instance_id or None, rack, topics, rebalance_timeout_ms)
            self._join(group, member_id, meta, now_ms)
        else:
            if cur is None:
                raise UnknownMemberIdError(f"member {member_id} is not in group {group}")
            if cur.fenced:
                raise FencedMemberEpochError(f"member {member_id} is fenced")
            if member_epoch == cur.previous_epoch and member_epoch != cur.epoch:
                self._touch(group, member_id, now_ms)
                return self._respond(group, member_id)
            if member_epoch != cur.epoch:
                raise FencedMemberEpochError(
                    f"member {member_id} sent epoch {member_epoch}, current is {cur.epoch}"
                )
            self._touch(group, member_id, now_ms)
            assert state is not None
            old = state.members[member_id]
            meta = MemberValue(old.instance_id, rack, topics, rebalance_timeout_ms)
            if meta != old:
                self._write(MemberKey(group, member_id), meta)
                if (meta.topics, meta.rack) != (old.topics, old.rack):
                    self._membership_changed(group, now_ms)
            self._release_revoked(group, member_id, owned)
        self._reconcile(group, member_id, now_ms)
        return self._respond(group, member_id)

    def leave(
        self, group: str, member_id: str, member_epoch: int, now_ms: int, static: bool = False
    ) -> Reply[None]:
        """The member has released everything. ``static``: keep its assignment for the next
        incarnation of its instance id until its session runs out."""
        self._alive()
        state = self.state.groups.get(group)
        cur = state.assignments.get(member_id) if state else None
        if state is None or cur is None:
            raise UnknownMemberIdError(f"member {member_id} is not in group {group}")
        if member_epoch not in (0, cur.epoch, cur.previous_epoch):  # 0: closed before its reply
            raise FencedMemberEpochError(f"member {member_id}: epoch {member_epoch} is not current")
        if static and state.members[member_id].instance_id is not None and not cur.fenced:
            self._release_revoked(group, member_id, frozenset())
            self._reconcile(group, member_id, now_ms)
        else:
            self._remove(group, member_id, now_ms)
        return Reply(None, self._written)

    def commit_offsets(
        self,
        group: str,
        member_id: str,
        member_epoch: int,
        offsets: Mapping[TopicPartition, tuple[int, str]],
        now_ms: int,
    ) -> Reply[None]:
        """Store committed offsets, all or none. ``member_id=""``/``member_epoch=-1`` commits
        from outside the group (admin, Spark), allowed only while the group has no members."""
        self._alive()
        _require_name(group, "group")
        state = self.state.groups.get(group)
        holds = None
        if member_id == "" and member_epoch == -1:
            if (state is not None and state.members) or self.classic.has_members(group):
                raise GroupNotEmptyError(f"group {group} has members")
        else:
            cur = state.assignments.get(member_id) if state else None
            if cur is None:
                raise UnknownMemberIdError(f"member {member_id} is not in group {group}")
            if cur.fenced or member_epoch > cur.epoch:
                raise FencedMemberEpochError(f"member {member_id} is fenced")
            if member_epoch not in (cur.epoch, cur.previous_epoch):
                raise StaleMemberEpochError(
                    f"member {member_id}: epoch {member_epoch}, current is {cur.epoch}"
                )
            holds = frozenset(cur.assigned) | frozenset(cur.revoking)
        return self._store_offsets(group, offsets, holds, member_id, now_ms)

    def commit_classic_offsets(
        self,
        group: str,
        generation: int,
        member_id: str,
        instance_id: str | None,
        offsets: Mapping[TopicPartition, tuple[int, str]],
        now_ms: int,
        group_not_found: bool = False,
    ) -> Reply[None]:
        """Kafka's OffsetCommit: a consumer group's member commits at its member epoch, a
        classic member at its generation, anyone with generation -1 while the group has no
        members (``classic.check_commit`` has the rules)."""
        self._alive()
        _require_name(group, "group")
        state = self.state.groups.get(group)
        if state is not None and state.members:
            return self.commit_offsets(group, member_id, generation, offsets, now_ms)
        if not self.classic.check_commit(
            group, generation, member_id, instance_id, now_ms, group_not_found
        ):
            return self.commit_offsets(group, "", -1, offsets, now_ms)
        return self._store_offsets(group, offsets, None, member_id, now_ms, classic=True)

    def _store_offsets(
        self,
        group: str,
        offsets: Mapping[TopicPartition, tuple[int, str]],
        holds: frozenset[TopicPartition] | None,
        member_id: str,
        now_ms: int,
        classic: bool = False,
    ) -> Reply[None]:
        state = self.state.groups.get(group)
        for tp, value in offsets.items():
            if not (isinstance(tp, tuple) and len(tp) == 2 and isinstance(value, tuple)):
                raise InvalidRequestError("offsets map (topic, partition) to (offset, metadata)")
            (topic, partition), (offset, metadata) = tp, value
            self._check_partition(topic, partition)
            if not isinstance(offset, int) or offset < 0:
                raise InvalidOffsetError(f"offset {offset!r} of {topic}/{partition} is invalid")
            if not isinstance(metadata, str) or len(metadata) > MAX_METADATA_CHARS:
                raise InvalidOffsetError(f"metadata of {topic}/{partition} is invalid")
            if holds is not None and (topic, partition) not in holds:
                raise PartitionNotOwnedError(f"member {member_id} does not own {topic}/{partition}")
        if offsets and not classic and (state is None or state.meta is None):
            self._write(GroupKey(group), GroupValue(0, 0, now_ms))
        for topic, partition in sorted(offsets):
            offset, metadata = offsets[(topic, partition)]
            self._write(OffsetKey(group, topic, partition), OffsetValue(offset, metadata, now_ms))
        if self.lineage and any(tp[0] in self.lineage for tp in offsets):
            self._relineage(group, now_ms)  # a parent read to its seal frees its children
        return Reply(None, self._written)

    def _relineage(self, group: str, now_ms: int) -> None:
        """Recompute the group's target if the lineage rule now blocks other partitions; a
        child freed by its parents starts at offset 0 (written as the group's offset)."""
        state = self.state.groups.get(group)
        if state is None or not state.members or state.meta is None:
            return
        topics = {t for m in state.members.values() for t in m.topics}
        now_blocked = lineage_rules.blocked(self.lineage, topics, state.offsets)
        before = self._blocked.get(group)
        if before == now_blocked:
            return
        for topic, partition in lineage_rules.starts(
            self.lineage, before or now_blocked, now_blocked
        ):
            if (topic, partition) not in state.offsets:
                self._write(OffsetKey(group, topic, partition), OffsetValue(0, "", now_ms))
        self._recompute_target(group, now_ms)

    def fetch_offsets(
        self, group: str, partitions: Iterable[TopicPartition] | None = None
    ) -> Reply[dict[TopicPartition, OffsetValue]]:
        """Committed offsets of ``group`` (all, or those of ``partitions`` that have one)."""
        self._alive()
        state = self.state.groups.get(group)
        stored = state.offsets if state else {}
        if partitions is None:
            found = dict(stored)
        else:
            found = {tp: stored[tp] for tp in partitions if tp in stored}
        return Reply(found, self._written)

    def describe_group(self, group: str) -> Reply[GroupView]:
        self._alive()
        return Reply(self._view(group), self._written)

    def list_groups(self) -> Reply[list[GroupView]]:
        """Every group of this shard, without offsets (a listing stays small)."""
        self._alive()
        names = sorted(set(self.state.groups) | set(self.classic.groups))
        return Reply([replace(self._view(name), offsets={}) for name in names], self._written)

    def _view(self, group: str) -> GroupView:
        state = self.state.groups.get(group)
        classic = self.classic.describe(group)
        if classic is not None:
            return describe_classic(classic, dict(state.offsets) if state else {})
        return describe(group, state)

    def delete_group(self, group: str) -> Reply[None]:
        """Delete a group with no members, offsets included."""
        self._alive()
        state = self.state.groups.get(group)
        if (state is not None and state.members) or self.classic.has_members(group):
            raise GroupNotEmptyError(f"group {group} has members")
        self.classic.forget(group)
        if state is not None and group in self.state.groups:
            self._delete(group)
        return Reply(None, self._written)

    # ------------------------------------------------------------------ time and metadata

    def tick(self, now_ms: int) -> None:
        """Expire sessions, fence members past their rebalance timeout, expire empty groups."""
        self._alive()
        for key in sorted(self._session):
            if key in self._session and now_ms >= self._session[key]:
                self._remove(key[0], key[1], now_ms)
        for key in sorted(self._rebalance):
            if key in self._rebalance and now_ms >= self._rebalance[key]:
                self._fence(key[0], key[1], now_ms)
        self.classic.tick(now_ms)
        retention = self.config.offsets_retention_ms
        for name in sorted(self.state.groups):
            state = self.state.groups[name]
            if state.members or self.classic.active(name):
                continue
            stamps = [o.commit_ms for o in state.offsets.values()]
            if state.meta is not None:
                stamps.append(state.meta.empty_since_ms)
            if state.classic is not None:
                stamps.append(state.classic.empty_since_ms)
            elif state.meta is None:
                continue
            if now_ms >= max(stamps) + retention:
                self._delete(name)

    def topics_changed(self, topics: Mapping[str, int], now_ms: int) -> None:
        """New partition counts per topic: drop offsets of what is gone, rebalance who cares."""
        self._alive()
        self.topics = dict(topics)
        self._apply_topics(now_ms)

    def set_lineage(self, lineage: lineage_rules.Lineage) -> None:
        """The key-range topics' lineage now (applied with the next ``topics_changed``)."""
        self.lineage = lineage

    def set_replica_racks(self, replica_racks: Mapping[TopicPartition, frozenset[str]]) -> None:
        """Racks holding each partition's replicas (used by the next target computation)."""
        self.replica_racks = dict(replica_racks)

    # ------------------------------------------------------------------ internals

    def _write(self, key: Key, value: Value | None) -> None:
        record = Record(key, value)
        self.state.apply(record)
        self._emit([record])

    def _touch(self, group: str, member_id: str, now_ms: int) -> None:
        self._session[(group, member_id)] = now_ms + self.config.session_timeout_ms

    def _respond(self, group: str, member_id: str) -> Reply[HeartbeatResponse]:
        cur = self.state.groups[group].assignments[member_id]
        response = HeartbeatResponse(
            member_id, cur.epoch, self.config.heartbeat_interval_ms, frozenset(cur.assigned)
        )
        return Reply(response, self._written)

    def _next_epoch(self, group: str, membership: bool, now_ms: int) -> int:
        """Draw the next group epoch; ``membership`` marks a change the target must follow."""
        state = self.state.groups.get(group)
        meta = state.meta if state else None
        meta = meta or GroupValue(0, 0, now_ms)
        epoch = meta.epoch + 1
        self._write(
            GroupKey(group),
            GroupValue(
                epoch,
                epoch if membership else meta.membership_epoch,
                meta.empty_since_ms,
                meta.topic_partitions,
            ),
        )
        return epoch

    def _join(self, group: str, member_id: str, meta: MemberValue, now_ms: int) -> None:
        state = self.state.groups.get(group)
        old_id = None
        if meta.instance_id is not None and state is not None:
            old_id = next(
                (m for m, v in sorted(state.members.items()) if v.instance_id == meta.instance_id),
                None,
            )
        if old_id is None or state is None:
            self._write(MemberKey(group, member_id), meta)
            epoch = self._next_epoch(group, membership=True, now_ms=now_ms)
            self._write(AssignmentKey(group, member_id), AssignmentValue(epoch, -1, False, (), ()))
            self._touch(group, member_id, now_ms)
            self._recompute_target(group, now_ms)
            return
        # Static rejoin: the new incarnation takes over the old one's place, epoch included.
        old_meta = state.members[old_id]
        old_cur = state.assignments[old_id]
        old_target = state.target_members.get(old_id)
        self._write(MemberKey(group, old_id), None)
        self._write(AssignmentKey(group, old_id), None)
        self._write(TargetMemberKey(group, old_id), None)
        self._write(MemberKey(group, member_id), meta)
        # A fresh epoch: epochs the old id was removed at stay dead even if a delayed join of
        # that old id later takes the instance back.
        epoch = self._next_epoch(group, membership=False, now_ms=now_ms)
        cur = AssignmentValue(epoch, old_cur.epoch, False, old_cur.assigned, old_cur.revoking)
        self._write(AssignmentKey(group, member_id), cur)
        if old_target is not None:
            self._write(TargetMemberKey(group, member_id), old_target)
        self._session.pop((group, old_id), None)
        deadline = self._rebalance.pop((group, old_id), None)
        if deadline is not None:
            self._rebalance[(group, member_id)] = deadline
        elif cur.revoking:  # the old incarnation was fenced while revoking
            self._rebalance[(group, member_id)] = now_ms + meta.rebalance_timeout_ms
        self._touch(group, member_id, now_ms)
        if old_cur.fenced or (old_meta.topics, old_meta.rack) != (meta.topics, meta.rack):
            self._membership_changed(group, now_ms)

    def _remove(self, group: str, member_id: str, now_ms: int) -> None:
        self._write(MemberKey(group, member_id), None)
        self._write(AssignmentKey(group, member_id), None)
        self._write(TargetMemberKey(group, member_id), None)
        self._session.pop((group, member_id), None)
        self._rebalance.pop((group, member_id), None)
        self._membership_changed(group, now_ms)

    def _fence(self, group: str, member_id: str, now_ms: int) -> None:
        """Rebalance timeout: stop counting the member, keep its partitions until its session
        ends (it may still believe it owns them until then)."""
        cur = self.state.groups[group].assignments[member_id]
        self._write(
            AssignmentKey(group, member_id),
            AssignmentValue(cur.epoch, cur.previous_epoch, True, cur.assigned, cur.revoking),
        )
        self._rebalance.pop((group, member_id), None)
        self._membership_changed(group, now_ms)

    def _delete(self, group: str) -> None:
        self.classic.forget(group)
        state = self.state.groups.get(group)
        if state is None:
            return
        for tp in sorted(state.offsets):
            self._write(OffsetKey(group, *tp), None)
        for mid in sorted(state.target_members):
            self._write(TargetMemberKey(group, mid), None)
        for mid in sorted(set(state.members) | set(state.assignments)):
            self._write(MemberKey(group, mid), None)
            self._write(AssignmentKey(group, mid), None)
            self._session.pop((group, mid), None)
            self._rebalance.pop((group, mid), None)
        self._write(TargetKey(group), None)
        self._write(GroupKey(group), None)

    def _membership_changed(self, group: str, now_ms: int) -> None:
        state = self.state.groups.get(group)
        if state is None:
            return
        self._next_epoch(group, membership=True, now_ms=now_ms)
        self._recompute_target(group, now_ms)

    def _subscribed_partitions(self, state: GroupState) -> dict[str, int]:
        wanted = {t for m in state.members.values() for t in m.topics}
        return {t: self.topics[t] for t in sorted(wanted) if t in self.topics}

    def _recompute_target(self, group: str, now_ms: int) -> None:
        state = self.state.groups[group]
        assert state.meta is not None
        partitions = self._subscribed_partitions(state)
        live = [
            AssignorMember(
                mid,
                frozenset(meta.topics),
                meta.rack if self.config.rack_aware else None,
            )
            for mid, meta in sorted(state.members.items())
            if not state.assignments[mid].fenced
        ]
        current = {mid: frozenset(v.partitions) for mid, v in state.target_members.items()}
        racks = self.replica_racks if self.config.rack_aware else None
        excluded = lineage_rules.blocked(self.lineage, set(partitions), state.offsets)
        self._blocked[group] = excluded
        target = assign(live, partitions, current, racks, excluded)
        for mid in sorted(set(current) - set(target)):
            self._write(TargetMemberKey(group, mid), None)
        for mid in sorted(target):
            if target[mid] != current.get(mid):
                self._write(
                    TargetMemberKey(group, mid), TargetMemberValue(tuple(sorted(target[mid])))
                )
        meta = state.meta
        empty_since = (
            -1 if state.members else (meta.empty_since_ms if meta.empty_since_ms >= 0 else now_ms)
        )
        self._write(
            GroupKey(group),
            GroupValue(meta.epoch, meta.membership_epoch, empty_since, tuple(partitions.items())),
        )
        self._write(TargetKey(group), TargetValue(meta.epoch))

    def _release_revoked(self, group: str, member_id: str, owned: frozenset) -> None:
        """A heartbeat at the current epoch: what it no longer owns is released."""
        cur = self.state.groups[group].assignments[member_id]
        still = tuple(tp for tp in cur.revoking if tp in owned)
        if still != cur.revoking:
            self._write(
                AssignmentKey(group, member_id),
                AssignmentValue(cur.epoch, cur.previous_epoch, False, cur.assigned, still),
            )
            if not still:
                self._rebalance.pop((group, member_id), None)

    def _reconcile(self, group: str, member_id: str, now_ms: int) -> None:
        """Move the member's current assignment one step toward its target."""
        state = self.state.groups[group]
        cur = state.assignments[member_id]
        wanted = state.target_members[member_id].partitions
        if cur.fenced or (cur.assigned == wanted and not cur.revoking):
            return  # the steady state: nothing to compute
        target = set(wanted)
        assigned = set(cur.assigned)
        revoking = set(cur.revoking)
        back = revoking & target  # the target returned a partition it is still revoking
        revoking -= back
        assigned |= back
        revoking |= assigned - target
        assigned &= target
        others: set[TopicPartition] = set()
        for mid, other in state.assignments.items():
            if mid != member_id:
                others.update(other.assigned)
                others.update(other.revoking)
        assigned |= target - others - revoking
        new_assigned = tuple(sorted(assigned))
        new_revoking = tuple(sorted(revoking))
        if (new_assigned, new_revoking) == (cur.assigned, cur.revoking):
            return
        if new_assigned != cur.assigned:
            epoch = self._next_epoch(group, membership=False, now_ms=now_ms)
            previous = cur.epoch
        else:  # only the revoking set shrank or grew without changing what it may own
            epoch, previous = cur.epoch, cur.previous_epoch
        self._write(
            AssignmentKey(group, member_id),
            AssignmentValue(epoch, previous, False, new_assigned, new_revoking),
        )
        key = (group, member_id)
        if new_revoking and not cur.revoking:
            self._rebalance[key] = now_ms + state.members[member_id].rebalance_timeout_ms
        elif not new_revoking:
            self._rebalance.pop(key, None)

    def _check_partition(self, topic: str, partition: int) -> None:
        if topic not in self.topics:
            raise UnknownTopicError(f"unknown topic {topic!r}")
        if not isinstance(partition, int) or not 0 <= partition < self.topics[topic]:
            raise UnknownPartitionError(f"topic {topic!r} has no partition {partition!r}")

    def _apply_topics(self, now_ms: int) -> None:
        for name in sorted(self.state.groups):
            state = self.state.groups.get(name)
            if state is None:
                continue
            for topic, partition in sorted(state.offsets):
                if not 0 <= partition < self.topics.get(topic, 0):
                    self._write(OffsetKey(name, topic, partition), None)
            state = self.state.groups.get(name)
            if state is None or not state.members or state.meta is None:
                continue
            wanted = tuple(self._subscribed_partitions(state).items())
            if wanted != state.meta.topic_partitions:
                self._membership_changed(name, now_ms)
            elif self.lineage:
                self._relineage(name, now_ms)


def _require_name(value: object, what: str) -> None:
    if not isinstance(value, str) or not value or len(value) > 255:
        raise InvalidRequestError(f"{what} must be a non-empty string of at most 255 characters")
