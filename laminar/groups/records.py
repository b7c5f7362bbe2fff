"""The durable form of group state: keyed records, the state they fold into, and compaction.

Every change the coordinator makes is a ``Record(key, value)`` written to the group's internal
partition; ``value=None`` is a tombstone (the key no longer exists). The coordinator never
mutates its state any other way: it writes a record and folds it with ``GroupsState.apply``, the
same function a new coordinator uses to replay the partition after a leader change. So the live
state and the replayed state cannot drift apart.

Record kinds (one key per fact, so the newest record of a key is all that matters):

* ``GroupKey(g)`` -> ``GroupValue``: the group's epoch counter (member epochs are drawn from
  it, so they only grow), the epoch of the last membership/subscription change, since when it
  has been empty (for offset retention), and the partition counts its target was computed for.
* ``MemberKey(g, m)`` -> ``MemberValue``: instance id, rack, subscribed topics, rebalance timeout.
* ``TargetKey(g)`` -> ``TargetValue``: the group epoch the target assignment was computed at.
* ``TargetMemberKey(g, m)`` -> ``TargetMemberValue``: the partitions the target gives ``m``.
* ``AssignmentKey(g, m)`` -> ``AssignmentValue``: the member's current epoch (and the previous
  one), whether it is fenced, the partitions it may own now and those it must still revoke.
* ``OffsetKey(g, topic, partition)`` -> ``OffsetValue``: committed offset, metadata, commit time.
* ``ClassicGroupKey(g)`` -> ``ClassicGroupValue``: a classic (JoinGroup/SyncGroup) group as of
  its last state change (a rebalance starting, a join or sync completing, a static member
  taking over, emptying): protocol type and protocol, generation, leader, state and
  every member with its subscription and assignment (Kafka's GroupMetadata record). A group
  id holds either this or consumer members (``MemberKey``), never both.

Because folding is per key, the order of records with different keys does not matter, and
``compact`` (the newest live record of every key) rebuilds exactly the same state: the internal
partition can be compacted to the size of the live state.

Session and rebalance deadlines are deliberately not records: they are timers, and a new
coordinator restarts them from the time it takes over (which only ever gives a member more time,
never less).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class MemberKey:
    group: str
    member_id: str


@dataclass(frozen=True, slots=True)
class TargetKey:
    group: str


@dataclass(frozen=True, slots=True)
class TargetMemberKey:
    group: str
    member_id: str


@dataclass(frozen=True, slots=True)
class AssignmentKey:
    group: str
    member_id: str


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class ClassicGroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class GroupValue:
    epoch: int
    membership_epoch: int
    empty_since_ms: int  # -1 while the group has members
    topic_partitions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class MemberValue:
    instance_id: str | None
    rack: str | None
    topics: tuple[str, ...]
    rebalance_timeout_ms: int


@dataclass(frozen=True, slots=True)
class TargetValue:
    epoch: int


@dataclass(frozen=True, slots=True)
class TargetMemberValue:
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class AssignmentValue:
    epoch: int
    previous_epoch: int
    fenced: bool
    assigned: tuple[TopicPartition, ...]
    revoking: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetValue:
    offset: int
    metadata: str
    commit_ms: int


ClassicMemberTuple = tuple[str, str | None, str, str, int, int, str, str]
"""(member id, instance id, client id, client host, session timeout ms, rebalance timeout ms,
subscription of the selected protocol and assignment, both base64): plain values, so the JSON
encoding round-trips."""


@dataclass(frozen=True, slots=True)
class ClassicGroupValue:
    protocol_type: str
    protocol: str | None
    generation: int
    leader: str | None
    state: str  # Empty, PreparingRebalance, CompletingRebalance or Stable
    empty_since_ms: int  # -1 while the group has members
    members: tuple[ClassicMemberTuple, ...]


Key = (
    GroupKey | MemberKey | TargetKey | TargetMemberKey | AssignmentKey | OffsetKey | ClassicGroupKey
)
Value = (
    GroupValue
    | MemberValue
    | TargetValue
    | TargetMemberValue
    | AssignmentValue
    | OffsetValue
    | ClassicGroupValue
)


@dataclass(frozen=True, slots=True)
class Record:
    key: Key
    value: Value | None  # None: tombstone


@dataclass
class GroupState:
    """One group as the records describe it (plain values, compared with ``==`` in tests)."""

    meta: GroupValue | None = None
    members: dict[str, MemberValue] = field(default_factory=dict)
    target: TargetValue | None = None
    target_members: dict[str, TargetMemberValue] = field(default_factory=dict)
    assignments: dict[str, AssignmentValue] = field(default_factory=dict)
    offsets: dict[TopicPartition, OffsetValue] = field(default_factory=dict)
    classic: ClassicGroupValue | None = None

    def is_empty(self) -> bool:
        return not (
            self.meta
            or self.classic
            or self.members
            or self.target
            or self.target_members
            or self.assignments
            or self.offsets
        )


@dataclass
class GroupsState:
    """All groups of one coordinator shard; ``apply`` is the only way it changes."""

    groups: dict[str, GroupState] = field(default_factory=dict)

    def apply(self, record: Record) -> None:
        key, value = record.key, record.value
        group = self.groups.get(key.group)
        if group is None:
            if value is None:
                return
            group = self.groups[key.group] = GroupState()
        if isinstance(key, GroupKey):
            group.meta = value  # type: ignore[assignment]
        elif isinstance(key, TargetKey):
            group.target = value  # type: ignore[assignment]
        elif isinstance(key, ClassicGroupKey):
            group.classic = value  # type: ignore[assignment]
        elif isinstance(key, MemberKey):
            _put(group.members, key.member_id, value)
        elif isinstance(key, TargetMemberKey):
            _put(group.target_members, key.member_id, value)
        elif isinstance(key, AssignmentKey):
            _put(group.assignments, key.member_id, value)
        elif isinstance(key, OffsetKey):
            _put(group.offsets, (key.topic, key.partition), value)
        else:
            raise TypeError(f"not a group record key: {key!r}")
        if group.is_empty():
            del self.groups[key.group]


def _put(table: dict, name: object, value: Value | None) -> None:
    if value is None:
        table.pop(name, None)
    else:
        table[name] = value


def replay(records: Iterable[Record]) -> GroupsState:
    """The state a sequence of records describes (what a new coordinator starts from)."""
    state = GroupsState()
    for record in records:
        state.apply(record)
    return state


_KIND_ORDER = {
    GroupKey: 0,
    MemberKey: 1,
    TargetKey: 2,
    TargetMemberKey: 3,
    AssignmentKey: 4,
    OffsetKey: 5,
    ClassicGroupKey: 6,
}


def _sort_key(key: Key) -> tuple:
    return (key.group, _KIND_ORDER[type(key)], *_fields(key)[1:])


def compact(records: Iterable[Record]) -> list[Record]:
    """The smallest record list that replays to the same state: the newest live record per key.

    Tombstones are dropped too: compaction starts a partition from nothing, where an absent key
    already means "does not exist". Output order is canonical (by group, kind, key).
    """
    newest: dict[Key, Record] = {}
    for record in records:
        newest[record.key] = record
    live = [r for r in newest.values() if r.value is not None]
    live.sort(key=lambda r: _sort_key(r.key))
    return live


def state_records(state: GroupsState) -> list[Record]:
    """Every live record of ``state`` in canonical order: what a checkpoint writes, so a replay
    that starts at the checkpoint rebuilds ``state``. Equals ``compact`` of any log that
    replays to ``state``."""
    out: list[Record] = []
    for name in sorted(state.groups):
        group = state.groups[name]
        if group.meta is not None:
            out.append(Record(GroupKey(name), group.meta))
        out += [Record(MemberKey(name, m), v) for m, v in sorted(group.members.items())]
        if group.target is not None:
            out.append(Record(TargetKey(name), group.target))
        targets = sorted(group.target_members.items())
        out += [Record(TargetMemberKey(name, m), v) for m, v in targets]
        out += [Record(AssignmentKey(name, m), v) for m, v in sorted(group.assignments.items())]
        out += [Record(OffsetKey(name, *tp), v) for tp, v in sorted(group.offsets.items())]
        if group.classic is not None:
            out.append(Record(ClassicGroupKey(name), group.classic))
    return out


# --------------------------------------------------------------------------- encoding

_KEY_TYPES = {cls.__name__: cls for cls in _KIND_ORDER}
_VALUE_OF = {
    GroupKey: GroupValue,
    MemberKey: MemberValue,
    TargetKey: TargetValue,
    TargetMemberKey: TargetMemberValue,
    AssignmentKey: AssignmentValue,
    OffsetKey: OffsetValue,
    ClassicGroupKey: ClassicGroupValue,
}


def _fields(obj: object) -> list:
    return [getattr(obj, name) for name in obj.__slots__]  # type: ignore[attr-defined]


def encode(record: Record) -> bytes:
    """A record as bytes for the internal partition (JSON, compact, stable)."""
    key = record.key
    body = [type(key).__name__, _fields(key)]
    if record.value is not None:
        body.append(_fields(record.value))
    return json.dumps(body, separators=(",", ":")).encode()


def _tuples(value: object) -> object:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def decode(data: bytes) -> Record:
    """The inverse of ``encode``; raises ``ValueError`` on anything else."""
    try:
        body = json.loads(data)
        key_cls = _KEY_TYPES[body[0]]
        key = key_cls(*body[1])
        if len(body) == 2:
            return Record(key, None)
        value = _VALUE_OF[key_cls](*(_tuples(v) for v in body[2]))
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ValueError(f"not a group record: {e}") from e
    return Record(key, value)
