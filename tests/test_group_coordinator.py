"""The group coordinator, scenario by scenario (the simulation in test_group_sim covers the mix)."""

from __future__ import annotations

import pytest

from laminar.errors import (
    FencedMemberEpochError,
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
from laminar.groups.coordinator import Coordinator, CoordinatorConfig, HeartbeatResponse
from laminar.groups.records import (
    OffsetKey,
    Record,
    compact,
    decode,
    encode,
    replay,
    state_records,
)

SESSION = 3000
REBALANCE = 2000
CONFIG = CoordinatorConfig(session_timeout_ms=SESSION, heartbeat_interval_ms=500)


def tps(topic: str, *parts: int) -> frozenset[tuple[str, int]]:
    return frozenset((topic, p) for p in parts)


class Harness:
    """A coordinator with a log that makes every record durable at once, and a member view."""

    def __init__(self, topics: dict[str, int] | None = None, config=CONFIG) -> None:
        self.config = config
        self.topics = topics if topics is not None else {"t": 4}
        self.coord = Coordinator(config, self.topics, 0)
        self.log: list[Record] = []
        self.epochs: dict[str, int] = {}
        self.owned: dict[str, frozenset] = {}

    def flush(self) -> None:
        self.log.extend(self.coord.take_batch())
        self.coord.records_committed(self.coord.written)

    def hb(
        self,
        member: str,
        now: int,
        topics=("t",),
        instance: str | None = None,
        owned: frozenset | None = None,
        epoch: int | None = None,
        group: str = "g",
    ) -> HeartbeatResponse:
        reply = self.coord.heartbeat(
            group,
            member,
            self.epochs.get(member, 0) if epoch is None else epoch,
            instance,
            REBALANCE,
            topics,
            self.owned.get(member, frozenset()) if owned is None else owned,
            now,
        )
        self.flush()
        assert self.coord.is_released(reply)
        self.epochs[member] = reply.value.member_epoch
        self.owned[member] = reply.value.assignment
        return reply.value

    def commit(self, member: str, offsets: dict, now: int, epoch: int | None = None) -> None:
        self.coord.commit_offsets(
            "g", member, self.epochs[member] if epoch is None else epoch, offsets, now
        )
        self.flush()

    def group(self):
        return self.coord.state.groups["g"]


def test_first_member_gets_everything_and_the_reply_waits_for_its_records() -> None:
    h = Harness()
    reply = h.coord.heartbeat("g", "a", 0, None, REBALANCE, ["t"], [], 0)
    assert reply.value.assignment == tps("t", 0, 1, 2, 3)
    assert reply.value.member_epoch > 0
    assert reply.value.heartbeat_interval_ms == 500
    assert not h.coord.is_released(reply), "a join must wait for its records"
    batch = h.coord.take_batch()
    assert batch and reply.after == len(batch) == h.coord.written
    h.coord.records_committed(len(batch) - 1)
    assert not h.coord.is_released(reply)
    h.coord.records_committed(len(batch))
    assert h.coord.is_released(reply)
    commit = h.coord.commit_offsets("g", "a", reply.value.member_epoch, {("t", 0): (1, "")}, 5)
    assert commit.after == h.coord.written > len(batch)
    assert not h.coord.is_released(commit), "a commit is acknowledged only once durable"


def test_a_reply_that_writes_nothing_still_waits_for_earlier_records() -> None:
    h = Harness()
    h.hb("a", 0)
    h.coord.heartbeat("g", "b", 0, None, REBALANCE, ["t"], [], 10)  # writes, not durable yet
    quiet = h.coord.heartbeat("g", "a", h.epochs["a"], None, REBALANCE, ["t"], h.owned["a"], 20)
    assert not h.coord.is_released(quiet), "it may depend on b's unwritten join"


def test_second_member_gets_partitions_only_after_the_first_released_them() -> None:
    h = Harness()
    h.hb("a", 0)
    b = h.hb("b", 10)
    assert b.assignment == frozenset(), "nothing is released yet"
    a = h.hb("a", 20)
    assert len(a.assignment) == 2, "a is told to give up two partitions"
    kept = a.assignment
    b = h.hb("b", 30)
    assert b.assignment == frozenset(), "a has not confirmed yet"
    a = h.hb("a", 40)  # reports owning only `kept`
    assert a.assignment == kept, "a keeps what it keeps, is never stopped"
    b = h.hb("b", 50)
    assert b.assignment == tps("t", 0, 1, 2, 3) - kept
    g = h.group()
    assert all(not cur.revoking for cur in g.assignments.values())


def test_a_heartbeat_at_the_previous_epoch_changes_nothing_and_gets_the_reply_again() -> None:
    h = Harness()
    h.hb("a", 0)
    h.hb("b", 10)
    first_epoch = h.epochs["a"]
    full = h.owned["a"]
    a = h.hb("a", 20)  # revocation starts, a new epoch
    assert a.member_epoch > first_epoch
    written = h.coord.written
    # The reply was lost: a heartbeats again at the old epoch, claiming it owns nothing (a
    # delayed, older request). This must not count as having released anything.
    again = h.hb("a", 30, epoch=first_epoch, owned=frozenset())
    assert again == a
    assert h.coord.written == written
    assert h.group().assignments["a"].revoking == tuple(sorted(full - a.assignment))
    b = h.hb("b", 40)
    assert b.assignment == frozenset()


def test_an_unknown_epoch_is_fenced() -> None:
    h = Harness()
    h.hb("a", 0)
    with pytest.raises(FencedMemberEpochError):
        h.hb("a", 10, epoch=h.epochs["a"] + 5)
    with pytest.raises(UnknownMemberIdError):
        h.hb("nobody", 10, epoch=3)


def test_session_timeout_removes_the_member_and_frees_its_partitions() -> None:
    h = Harness()
    h.hb("a", 0)
    h.hb("b", 10)
    h.hb("a", 20)
    h.hb("a", 30)
    h.hb("b", 40)
    assert len(h.owned["a"]) == len(h.owned["b"]) == 2
    for now in range(500, 3000, 500):
        h.hb("b", now)
    h.coord.tick(30 + SESSION - 1)  # a's last heartbeat was at 30
    assert "a" in h.group().members
    h.coord.tick(30 + SESSION)
    h.flush()
    assert "a" not in h.group().members
    assert h.hb("b", SESSION + 10).assignment == tps("t", 0, 1, 2, 3)
    with pytest.raises(UnknownMemberIdError):
        h.hb("a", SESSION + 20)
    with pytest.raises(UnknownMemberIdError):
        h.commit("a", {("t", 0): (5, "")}, SESSION + 20)


def test_rebalance_timeout_fences_but_holds_partitions_until_the_session_ends() -> None:
    h = Harness()
    h.hb("a", 0)
    h.hb("b", 10)
    a = h.hb("a", 20)  # told to revoke two partitions at t=20
    revoked = tps("t", 0, 1, 2, 3) - a.assignment
    # a keeps heartbeating but never gives them up.
    h.hb("a", 1000, owned=tps("t", 0, 1, 2, 3))
    h.coord.tick(20 + REBALANCE)
    h.flush()
    cur = h.group().assignments["a"]
    assert cur.fenced
    with pytest.raises(FencedMemberEpochError):
        h.hb("a", 2100)
    with pytest.raises(FencedMemberEpochError):
        h.commit("a", {("t", 0): (1, "")}, 2100)
    # The target gives b everything, but a may still believe it owns them: b waits.
    assert h.hb("b", 2200).assignment == frozenset()
    h.coord.tick(1000 + SESSION)  # a's last accepted heartbeat was at 1000
    h.flush()
    assert "a" not in h.group().members
    assert h.hb("b", 4100).assignment == tps("t", 0, 1, 2, 3)
    assert revoked <= h.owned["b"]


def test_static_member_restarted_within_the_session_gets_its_partitions_back() -> None:
    h = Harness({"t": 6})
    h.hb("a1", 0, instance="ia")
    h.hb("b", 10)
    for now in (20, 30, 40):
        h.hb("a1", now, instance="ia")
        h.hb("b", now + 1)
    a_epoch, a_owned = h.epochs["a1"], h.owned["a1"]
    b_epoch, b_owned = h.epochs["b"], h.owned["b"]
    assert len(a_owned) == len(b_owned) == 3
    membership = h.group().meta.membership_epoch
    # a1 crashes; its replacement joins under a new member id within the session timeout.
    a2 = h.hb("a2", 2000, instance="ia")
    assert a2.assignment == a_owned
    assert a2.member_epoch > a_epoch
    assert h.group().assignments["a2"].previous_epoch == a_epoch
    assert h.group().meta.membership_epoch == membership, "no rebalance"
    b = h.hb("b", 2010)
    assert (b.member_epoch, b.assignment) == (b_epoch, b_owned)
    with pytest.raises(UnknownMemberIdError):
        h.commit("a1", {("t", 0): (1, "")}, 2020, epoch=a_epoch)
    assert set(h.group().members) == {"a2", "b"}


def test_static_leave_keeps_the_assignment_dynamic_leave_frees_it() -> None:
    h = Harness()
    h.hb("s", 0, instance="is")
    h.hb("d", 10)
    for now in (20, 30):
        h.hb("s", now, instance="is")
        h.hb("d", now + 1)
    owned = h.owned["s"]
    h.coord.leave("g", "s", h.epochs["s"], 100, static=True)
    h.flush()
    assert "s" in h.group().members
    assert h.hb("d", 110).assignment == h.owned["d"], "d gets nothing of s's"
    assert h.hb("s2", 200, instance="is").assignment == owned
    h.coord.leave("g", "d", h.epochs["d"], 300)
    h.flush()
    assert "d" not in h.group().members
    assert h.hb("s2", 310, instance="is").assignment == tps("t", 0, 1, 2, 3)


def test_a_paused_zombie_cannot_commit_or_heartbeat() -> None:
    h = Harness()
    h.hb("z", 0)
    h.hb("ok", 10)
    h.hb("z", 20)
    h.hb("z", 30)
    h.hb("ok", 40)
    z_epoch = h.epochs["z"]
    for now in range(500, 4000, 500):  # z is paused; ok keeps going
        h.hb("ok", now)
        h.coord.tick(now)
    h.flush()
    for epoch in (z_epoch, z_epoch - 1, 0):
        with pytest.raises((UnknownMemberIdError, FencedMemberEpochError)):
            h.coord.commit_offsets("g", "z", epoch, {("t", 0): (9, "")}, 4000)
    with pytest.raises(UnknownMemberIdError):
        h.hb("z", 4000)
    assert "g" not in {g for g, s in h.coord.state.groups.items() if s.offsets}


def test_offset_commits_are_validated_all_or_nothing() -> None:
    h = Harness()
    h.hb("a", 0)
    h.hb("b", 1)
    h.hb("a", 2)  # a revokes half: new epoch
    h.hb("a", 3)
    first = sorted(h.owned["a"])[0]
    good = {first: (10, "meta")}
    cases = [
        ({("nope", 0): (1, "")}, UnknownTopicError),
        ({("t", 4): (1, "")}, UnknownPartitionError),
        ({("t", -1): (1, "")}, UnknownPartitionError),
        ({("t", 1): (-1, "")}, InvalidOffsetError),
        ({("t", 1): (1, "x" * 5000)}, InvalidOffsetError),
    ]
    for bad, error in cases:
        with pytest.raises(error):
            h.commit("a", {**good, **bad}, 10)
    assert h.coord.fetch_offsets("g").value == {}, "a failing batch stored something"
    with pytest.raises(StaleMemberEpochError):
        h.commit("a", good, 10, epoch=h.group().assignments["a"].previous_epoch - 1)
    h.commit("a", good, 10, epoch=h.group().assignments["a"].previous_epoch)  # a reply race
    with pytest.raises(FencedMemberEpochError):
        h.commit("a", good, 10, epoch=h.epochs["a"] + 1)
    with pytest.raises(GroupNotEmptyError):
        h.coord.commit_offsets("g", "", -1, good, 10)
    h.commit("a", good, 20)
    other = min(tps("t", 0, 1, 2, 3) - h.owned["a"])
    stored = h.coord.fetch_offsets("g", [first, other]).value
    assert list(stored) == [first]
    assert (stored[first].offset, stored[first].metadata) == (10, "meta")


def test_a_member_commits_only_partitions_it_owns_or_is_revoking() -> None:
    h = Harness()
    h.hb("a", 0)
    h.hb("b", 10)
    a = h.hb("a", 20)  # revoking two
    revoking = tps("t", 0, 1, 2, 3) - a.assignment
    h.commit("a", {tp: (5, "") for tp in revoking}, 30)  # commit in the revoke callback works
    h.hb("a", 40)  # released
    with pytest.raises(PartitionNotOwnedError):
        h.commit("a", {next(iter(revoking)): (6, "")}, 50)
    with pytest.raises(PartitionNotOwnedError):
        h.commit("b", {next(iter(a.assignment)): (6, "")}, 50)


def test_an_empty_group_keeps_offsets_for_the_retention_then_is_deleted() -> None:
    config = CoordinatorConfig(
        session_timeout_ms=SESSION, heartbeat_interval_ms=500, offsets_retention_ms=10_000
    )
    h = Harness(config=config)
    h.hb("a", 0)
    h.commit("a", {("t", 0): (7, "")}, 100)
    h.coord.leave("g", "a", h.epochs["a"], 1000)
    h.flush()
    h.coord.tick(10_999)
    assert h.coord.fetch_offsets("g").value[("t", 0)].offset == 7
    h.coord.tick(11_000)
    h.flush()
    assert "g" not in h.coord.state.groups
    assert replay(h.log) == h.coord.state
    # Outside commits to an empty group are allowed and restart the clock.
    h.coord.commit_offsets("g2", "", -1, {("t", 1): (3, "spark")}, 20_000)
    h.coord.tick(29_999)
    assert "g2" in h.coord.state.groups
    h.coord.tick(30_000)
    assert "g2" not in h.coord.state.groups
    assert CoordinatorConfig().offsets_retention_ms == 7 * 24 * 3600 * 1000


def test_topic_deletion_removes_offsets_and_revokes_its_partitions() -> None:
    h = Harness({"t": 2, "u": 2})
    h.hb("a", 0, topics=("t", "u"))
    h.commit("a", {("t", 0): (1, ""), ("u", 1): (2, "")}, 10)
    h.coord.topics_changed({"t": 2}, 20)
    h.flush()
    assert set(h.coord.fetch_offsets("g").value) == {("t", 0)}
    a = h.hb("a", 30, topics=("t", "u"))
    assert a.assignment == tps("t", 0, 1)
    h.coord.topics_changed({"t": 3, "u": 1}, 40)
    h.flush()
    a = h.hb("a", 50, topics=("t", "u"))
    assert a.assignment == tps("t", 0, 1, 2) | tps("u", 0)


def test_replay_and_compaction_rebuild_the_live_state() -> None:
    h = Harness({"t": 6, "u": 3})
    h.hb("a", 0, topics=("t", "u"), instance="ia")
    h.hb("b", 10, topics=("t",))
    for now in range(100, 1000, 100):
        h.hb("a", now, topics=("t", "u"), instance="ia")
        h.hb("b", now + 1, topics=("t",))
        h.commit("a", {tp: (now, f"m{now}") for tp in sorted(h.owned["a"])[:2]}, now + 2)
    h.hb("c", 2000, topics=("u",))
    h.coord.topics_changed({"t": 6}, 2100)
    h.coord.tick(5000)  # everyone times out
    h.flush()
    assert replay(h.log) == h.coord.state
    compacted = compact(h.log)
    assert replay(compacted) == h.coord.state
    assert len(compacted) < len(h.log) / 3
    assert compact(compacted) == compacted
    assert state_records(h.coord.state) == compacted
    # A checkpoint restates the live state: a replay may start where it starts.
    before = len(h.log)
    h.coord.checkpoint()
    h.hb("d", 5100, topics=("t",))
    h.flush()
    assert replay(h.log[before:]) == h.coord.state
    assert replay(h.log) == h.coord.state
    assert [decode(encode(r)) for r in h.log] == h.log
    with pytest.raises(ValueError):
        decode(b'["OffsetKey",["g","t"]]')


def test_a_new_coordinator_rebuilds_from_the_durable_records_only() -> None:
    h = Harness()
    h.hb("a", 0)
    h.commit("a", {("t", 0): (5, "")}, 10)
    durable = list(h.log)
    # These are written but never become durable: leadership is lost.
    h.coord.commit_offsets("g", "a", h.epochs["a"], {("t", 0): (6, "")}, 20)
    h.coord.heartbeat("g", "b", 0, None, REBALANCE, ["t"], [], 20)
    h.coord.take_batch()
    h.coord.records_lost()
    with pytest.raises(NotCoordinatorError):
        h.coord.fetch_offsets("g")
    fresh = Coordinator(CONFIG, {"t": 4}, 1000, records=durable)
    assert fresh.state == replay(durable)
    assert fresh.take_batch() == ()
    assert fresh.fetch_offsets("g").value[("t", 0)].offset == 5
    assert set(fresh.state.groups["g"].members) == {"a"}
    # Sessions restart from the takeover: a (last seen at 10) survives until 1000 + session.
    fresh.tick(1000 + SESSION - 1)
    assert "a" in fresh.state.groups["g"].members
    fresh.tick(1000 + SESSION)
    assert "a" not in fresh.state.groups["g"].members


def test_a_new_coordinator_applies_topic_changes_it_missed() -> None:
    h = Harness({"t": 2, "u": 1})
    h.hb("a", 0, topics=("t", "u"))
    h.commit("a", {("u", 0): (3, "")}, 10)
    fresh = Coordinator(CONFIG, {"t": 3}, 100, records=h.log)
    assert fresh.fetch_offsets("g").value == {}
    batch = fresh.take_batch()
    assert OffsetKey("g", "u", 0) in {r.key for r in batch}
    target = fresh.state.groups["g"].target_members["a"].partitions
    assert set(target) == tps("t", 0, 1, 2)


def test_bad_requests_get_typed_errors() -> None:
    h = Harness()
    with pytest.raises(InvalidRequestError):
        h.coord.heartbeat("", "a", 0, None, REBALANCE, ["t"], [], 0)
    with pytest.raises(InvalidRequestError):
        h.coord.heartbeat("g", "", 0, None, REBALANCE, ["t"], [], 0)
    with pytest.raises(InvalidRequestError):
        h.coord.heartbeat("g", "a", -1, None, REBALANCE, ["t"], [], 0)
    with pytest.raises(InvalidRequestError):
        h.coord.heartbeat("g", "a", 0, None, 0, ["t"], [], 0)
    with pytest.raises(UnknownMemberIdError):
        h.coord.leave("g", "a", 1, 0)
    assert h.coord.written == 0
    with pytest.raises(ValueError):
        CoordinatorConfig(session_timeout_ms=100, heartbeat_interval_ms=100)
    with pytest.raises(ValueError):
        h.coord.records_committed(1)


def test_delete_group_only_without_members() -> None:
    h = Harness()
    h.hb("a", 0)
    h.commit("a", {("t", 0): (1, "")}, 0)
    with pytest.raises(GroupNotEmptyError):
        h.coord.delete_group("g")
    h.coord.leave("g", "a", h.epochs["a"], 10)
    h.coord.delete_group("g")
    h.flush()
    assert "g" not in h.coord.state.groups
    assert replay(h.log) == h.coord.state


def test_rack_aware_target_prefers_a_member_in_a_replica_rack() -> None:
    config = CoordinatorConfig(
        session_timeout_ms=SESSION, heartbeat_interval_ms=500, rack_aware=True
    )
    racks = {("t", i): frozenset({"r1" if i % 2 == 0 else "r2"}) for i in range(4)}
    coord = Coordinator(config, {"t": 4}, 0, replica_racks=racks)
    coord.heartbeat("g", "a", 0, None, REBALANCE, ["t"], [], 0, rack="r1")
    coord.heartbeat("g", "b", 0, None, REBALANCE, ["t"], [], 0, rack="r2")
    target = coord.state.groups["g"].target_members
    # a joined first and got everything; the rebalance for b moves b's rack-local partitions.
    assert set(target["b"].partitions) == tps("t", 1, 3)
    assert set(target["a"].partitions) == tps("t", 0, 2)


def test_a_member_that_closes_before_its_join_reply_can_leave() -> None:
    h = Harness()
    h.hb("a", 0)
    h.coord.heartbeat("g", "b", 0, None, REBALANCE, ["t"], [], 10)  # reply never seen
    with pytest.raises(FencedMemberEpochError):
        h.coord.leave("g", "b", 12345, 20)
    h.coord.leave("g", "b", 0, 20)
    h.flush()
    assert set(h.group().members) == {"a"}
