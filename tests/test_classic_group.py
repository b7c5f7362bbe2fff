"""Classic (JoinGroup/SyncGroup) groups on the coordinator, scenario by scenario (the
simulation in test_classic_group_sim covers the mix)."""

from __future__ import annotations

import pytest

from laminar.durable import Reply
from laminar.errors import (
    FencedInstanceIdError,
    GroupIdNotFoundError,
    GroupNotEmptyError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    InvalidSessionTimeoutError,
    LaminarError,
    MemberIdRequiredError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)
from laminar.groups.classic import (
    COMPLETING,
    EMPTY,
    PREPARING,
    STABLE,
    ClassicConfig,
    JoinResult,
    SyncResult,
    Waiting,
)
from laminar.groups.consumer_protocol import (
    assignment_partitions,
    encode_assignment,
    encode_subscription,
    subscription_topics,
)
from laminar.groups.coordinator import Coordinator, CoordinatorConfig
from laminar.groups.records import Record, compact, decode, encode, replay

SESSION = 10_000
REBALANCE = 5_000
DELAY = 1_000
CONFIG = CoordinatorConfig(
    session_timeout_ms=3000,
    heartbeat_interval_ms=500,
    classic=ClassicConfig(min_session_timeout_ms=1000, initial_rebalance_delay_ms=DELAY),
)
SUB = encode_subscription(["t"])


class Harness:
    """A coordinator whose records are durable at once; answers to held requests by token."""

    def __init__(self, config: CoordinatorConfig = CONFIG) -> None:
        self.config = config
        self.coord = Coordinator(config, {"t": 4}, 0)
        self.log: list[Record] = []
        self.answers: dict[int, object] = {}
        self.ids = 0

    def flush(self) -> None:
        for token, outcome in self.coord.classic.take_completions():
            self.answers[token] = outcome.value if isinstance(outcome, Reply) else outcome
        self.log.extend(self.coord.take_batch())
        self.coord.records_committed(self.coord.written)

    def join(self, member: str, now: int, instance: str | None = None, **kw) -> object:
        self.ids += 1
        reply = self.coord.classic.join(
            "g",
            member,
            instance,
            kw.pop("protocol_type", "consumer"),
            kw.pop("protocols", [("range", SUB)]),
            kw.pop("session", SESSION),
            kw.pop("rebalance", REBALANCE),
            now,
            new_member_id=f"m{self.ids}",
            **kw,
        )
        self.flush()
        return reply.value

    def new_member(self, now: int) -> str:
        with pytest.raises(MemberIdRequiredError) as info:
            self.join("", now)
        return info.value.member_id

    def sync(self, member: str, generation: int, now: int, assignments=None) -> object:
        reply = self.coord.classic.sync(
            "g", generation, member, None, "consumer", "range", assignments or {}, now
        )
        self.flush()
        return reply.value

    def tick(self, now: int) -> None:
        self.coord.tick(now)
        self.flush()

    def answer(self, held: object) -> object:
        assert isinstance(held, Waiting), held
        return self.answers.pop(held.token, None)

    def state(self) -> str:
        return self.coord.classic.groups["g"].state


def assignment(*parts: int) -> bytes:
    return encode_assignment([("t", p) for p in parts])


def form_group(h: Harness, now: int = 0) -> tuple[str, str, int]:
    """Two members in a stable group: (leader, follower, generation)."""
    a, b = h.new_member(now), h.new_member(now)
    held_a, held_b = h.join(a, now), h.join(b, now)
    assert h.state() == PREPARING  # the initial delay holds a new group's joins
    h.tick(now + DELAY)  # b came during the delay: it is extended once
    assert h.answer(held_a) is None and h.state() == PREPARING
    h.answers.clear()
    h.tick(now + 2 * DELAY)
    ja, jb = h.answer(held_a), h.answer(held_b)
    assert isinstance(ja, JoinResult) and isinstance(jb, JoinResult)
    assert ja.generation == jb.generation == 1 and ja.leader == a == jb.leader
    assert [m[0] for m in ja.members] == [a, b] and jb.members == ()
    assert h.state() == COMPLETING
    held_follower = h.sync(b, 1, now + 2 * DELAY)
    assert h.answer(held_follower) is None  # waits for the leader
    held_leader = h.sync(a, 1, now + 2 * DELAY, {a: assignment(0, 1), b: assignment(2, 3)})
    assert h.answer(held_leader) == SyncResult("consumer", "range", assignment(0, 1))
    assert h.answer(held_follower) == SyncResult("consumer", "range", assignment(2, 3))
    assert h.state() == STABLE
    return a, b, 1


def test_join_sync_heartbeat_and_leave() -> None:
    h = Harness()
    a, b, gen = form_group(h)
    h.coord.classic.heartbeat("g", gen, a, None, 2000)
    with pytest.raises(IllegalGenerationError):
        h.coord.classic.heartbeat("g", gen + 1, a, None, 2000)
    with pytest.raises(UnknownMemberIdError):
        h.coord.classic.heartbeat("g", gen, "nobody", None, 2000)
    # b leaves: a learns of the rebalance from its heartbeat and joins again alone.
    results = h.coord.classic.leave("g", [(b, None)], 2000).value
    assert results == [None]
    h.flush()
    with pytest.raises(RebalanceInProgressError):
        h.coord.classic.heartbeat("g", gen, a, None, 2100)
    answer = h.answer(h.join(a, 2200))
    assert isinstance(answer, JoinResult) and answer.generation == 2
    assert [m[0] for m in answer.members] == [a]
    assert h.answer(h.sync(a, 2, 2200, {a: assignment(0, 1, 2, 3)})).assignment == assignment(
        0, 1, 2, 3
    )
    # The last member leaves: the group is Empty at a new generation, offsets stay.
    h.coord.commit_classic_offsets("g", 2, a, None, {("t", 0): (5, "")}, 2300)
    h.coord.classic.leave("g", [(a, None)], 2400)
    h.flush()
    assert h.state() == EMPTY and h.coord.classic.groups["g"].generation == 3
    assert h.coord.fetch_offsets("g").value[("t", 0)].offset == 5


def test_rebalance_waits_for_known_members_then_removes_who_did_not_join() -> None:
    h = Harness()
    a, b, gen = form_group(h)
    c = h.new_member(2000)
    held_c = h.join(c, 2000)  # a new member starts a rebalance; a and b must join again
    assert h.state() == PREPARING and h.answer(held_c) is None
    held_a = h.join(a, 2100)
    h.tick(2100 + REBALANCE - 200)
    assert h.answer(held_a) is None  # b has until the rebalance timeout
    h.tick(2000 + REBALANCE)
    ja, jc = h.answer(held_a), h.answer(held_c)
    assert isinstance(ja, JoinResult) and ja.generation == gen + 1
    assert {m[0] for m in ja.members} == {a, c} and jc.leader == a
    with pytest.raises(UnknownMemberIdError):
        h.coord.classic.heartbeat("g", gen, b, None, 2000 + REBALANCE)


def test_member_id_required_and_pending_member_expiry() -> None:
    h = Harness()
    m = h.new_member(0)
    h.tick(SESSION + 1)  # never came back
    with pytest.raises(UnknownMemberIdError):
        h.join(m, SESSION + 2)
    # JoinGroup v0-v3 (no MEMBER_ID_REQUIRED): the first join is accepted with a new id.
    held = h.join("", SESSION + 3, require_known_member=False)
    h.tick(SESSION + 3 + DELAY)
    assert h.answer(held).generation == 1


def test_session_expiry_and_sync_timeout() -> None:
    h = Harness()
    a, _b, gen = form_group(h)
    for now in range(1000, 9000, 1000):
        h.coord.classic.heartbeat("g", gen, a, None, now)
        h.tick(now)
    h.tick(2 * DELAY + SESSION + 1)  # b stopped heartbeating
    assert h.state() == PREPARING
    held = h.join(a, 2 * DELAY + SESSION + 2)
    answer = h.answer(held)
    assert answer.generation == gen + 1 and [m[0] for m in answer.members] == [a]
    # The leader never syncs: after the rebalance timeout it is removed and the group empties.
    h.tick(2 * DELAY + SESSION + 2 + REBALANCE)
    assert h.state() == EMPTY


def test_static_member_takes_over_without_rebalance_and_fences_the_old_id() -> None:
    h = Harness()
    held_a = h.join("", 0, instance="i-a")
    held_b = h.join("", 0, instance="i-b")  # static members need no MEMBER_ID_REQUIRED
    h.tick(DELAY)
    h.tick(2 * DELAY)
    ja, jb = h.answer(held_a), h.answer(held_b)
    a, b = ja.member_id, jb.member_id
    h.sync(b, 1, 2 * DELAY)
    h.sync(a, 1, 2 * DELAY, {a: assignment(0, 1), b: assignment(2, 3)})
    assert h.state() == STABLE
    # b restarts: same instance id, new member id, same protocols: answered at once.
    again = h.join("", 2000, instance="i-b")
    assert isinstance(again, JoinResult) and again.generation == 1
    b2 = again.member_id
    assert b2 != b and h.state() == STABLE
    assert h.sync(b2, 1, 2000) == SyncResult("consumer", "range", assignment(2, 3))
    with pytest.raises(FencedInstanceIdError):
        h.coord.classic.heartbeat("g", 1, b, "i-b", 2100)
    with pytest.raises(UnknownMemberIdError):
        h.coord.classic.heartbeat("g", 1, b, None, 2100)
    # A fail-over keeps the new member id (it was written down).
    restarted = Coordinator(CONFIG, {"t": 4}, 3000, compact(h.log))
    restarted.classic.heartbeat("g", 1, b2, "i-b", 3000)
    # Leaving by instance id alone (LeaveGroup v3+).
    assert h.coord.classic.leave("g", [("", "i-b")], 2200).value == [None]


def test_protocol_checks_and_the_group_kinds() -> None:
    h = Harness()
    with pytest.raises(InvalidSessionTimeoutError):
        h.join("", 0, session=10)
    with pytest.raises(InconsistentGroupProtocolError):
        h.join("", 0, protocols=[])
    a, b, _gen = form_group(h)
    with pytest.raises(InconsistentGroupProtocolError):
        h.join("", 2000, protocols=[("roundrobin", SUB)], require_known_member=False)
    with pytest.raises(InconsistentGroupProtocolError):
        h.join("", 2000, protocol_type="connect", require_known_member=False)
    # A consumer-group heartbeat to a classic group with members: not a consumer group.
    with pytest.raises(GroupIdNotFoundError):
        h.coord.heartbeat("g", "x", 0, None, 1000, ["t"], [], 2000)
    with pytest.raises(GroupNotEmptyError):
        h.coord.delete_group("g")
    # A consumer group with members refuses classic joins.
    h.coord.heartbeat("k", "x", 0, None, 1000, ["t"], [], 2000)
    h.flush()
    with pytest.raises(InconsistentGroupProtocolError):
        h.coord.classic.join(
            "k", "", None, "consumer", [("range", SUB)], SESSION, REBALANCE, 2000,
            new_member_id="z", require_known_member=False,
        )  # fmt: skip
    # Once the classic group is empty, a consumer member may take the group id over.
    h.coord.classic.leave("g", [(a, None), (b, None)], 3000)
    h.flush()
    h.coord.heartbeat("g", "x", 0, None, 1000, ["t"], [], 3000)
    h.flush()
    assert "g" not in h.coord.classic.groups
    assert h.coord.describe_group("g").value.protocol == "consumer"


def test_offset_commit_rules() -> None:
    h = Harness()
    commit = h.coord.commit_classic_offsets
    # A simple commit (generation -1) to a group that does not exist creates it; v9+ answers
    # GROUP_ID_NOT_FOUND for a member's commit to a missing group, older versions
    # ILLEGAL_GENERATION.
    with pytest.raises(IllegalGenerationError):
        commit("new", 3, "m", None, {("t", 0): (1, "")}, 0)
    with pytest.raises(GroupIdNotFoundError):
        commit("new", 3, "m", None, {("t", 0): (1, "")}, 0, group_not_found=True)
    commit("new", -1, "", None, {("t", 0): (1, "")}, 0)
    a, b, gen = form_group(h)
    commit("g", gen, a, None, {("t", 0): (10, "x")}, 2000)
    with pytest.raises(IllegalGenerationError):
        commit("g", gen - 1, a, None, {("t", 0): (11, "")}, 2000)
    with pytest.raises(UnknownMemberIdError):
        commit("g", -1, "", None, {("t", 0): (11, "")}, 2000)
    with pytest.raises(GroupNotEmptyError):
        h.coord.commit_offsets("g", "", -1, {("t", 0): (11, "")}, 2000)
    # During PreparingRebalance the current generation may still commit (revocation commits).
    h.coord.classic.leave("g", [(b, None)], 2100)
    commit("g", gen, a, None, {("t", 0): (12, "")}, 2200)
    h.flush()
    assert h.coord.fetch_offsets("g").value[("t", 0)].offset == 12
    assert h.coord.fetch_offsets("new").value[("t", 0)].offset == 1


def test_failover_replay_keeps_generation_members_and_assignments() -> None:
    h = Harness()
    a, b, gen = form_group(h)
    restarted = Coordinator(CONFIG, {"t": 4}, 5000, h.log)
    group = restarted.classic.groups["g"]
    assert (group.state, group.generation, group.leader) == (STABLE, gen, a)
    assert restarted.state.groups == h.coord.state.groups
    assert restarted.state == replay(decode(encode(r)) for r in h.log)
    restarted.classic.heartbeat("g", gen, b, None, 5000)
    assert restarted.classic.sync("g", gen, b, None, None, None, {}, 5000).value == SyncResult(
        "consumer", "range", assignment(2, 3)
    )
    view = restarted.describe_group("g").value
    assert view.protocol == "classic" and view.state == "stable" and view.epoch == gen
    assert {m.member_id: m.assigned for m in view.members}[b] == (("t", 2), ("t", 3))
    assert {m.topics for m in view.members} == {("t",)}


def test_a_checkpoint_restates_classic_groups() -> None:
    h = Harness()
    form_group(h)
    h.coord.checkpoint()
    h.flush()
    start = len(h.log) - len(compact(h.log))
    assert replay(h.log[start:]) == h.coord.state


def test_consumer_protocol_payloads() -> None:
    assert subscription_topics(encode_subscription(["b", "a"])) == ("a", "b")
    assert assignment_partitions(assignment(3, 1)) == (("t", 1), ("t", 3))
    assert subscription_topics(b"\x00") == () and assignment_partitions(b"junk") == ()


def test_errors_for_held_requests_when_the_group_rebalances() -> None:
    h = Harness()
    a, b, gen = form_group(h)
    # A new member arrives while b's sync of a later generation would be waiting.
    c = h.new_member(2000)
    h.join(c, 2000)
    held_a, held_b = h.join(a, 2100), h.join(b, 2100)
    answers = [h.answer(held_a), h.answer(held_b)]
    assert all(isinstance(x, JoinResult) and x.generation == gen + 1 for x in answers)
    follower = h.sync(b, gen + 1, 2200)
    h.coord.classic.leave("g", [(c, None)], 2300)  # rebalance before the leader synced
    h.flush()
    assert isinstance(h.answer(follower), RebalanceInProgressError)
    assert isinstance(h.answers, dict) and all(
        isinstance(v, LaminarError | JoinResult | SyncResult) for v in h.answers.values()
    )


def test_a_member_that_left_stays_out_after_a_failover() -> None:
    h = Harness()
    a, b, gen = form_group(h)
    h.coord.classic.leave("g", [(b, None)], 3000)
    h.flush()
    restarted = Coordinator(CONFIG, {"t": 4}, 4000, h.log)
    group = restarted.classic.groups["g"]
    assert group.state == PREPARING and list(group.members) == [a]
    with pytest.raises(RebalanceInProgressError):  # a learns of the rebalance and joins again
        restarted.classic.heartbeat("g", gen, a, None, 4000)
    with pytest.raises(UnknownMemberIdError):
        restarted.classic.heartbeat("g", gen, b, None, 4000)
    reply = restarted.classic.join(
        "g", a, None, "consumer", [("range", SUB)], SESSION, REBALANCE, 4100, new_member_id="x"
    )
    (token, outcome), *_ = restarted.classic.take_completions()
    assert reply.value == Waiting(token) and outcome.value.generation == gen + 1
