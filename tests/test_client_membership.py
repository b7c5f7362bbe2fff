"""The client's sans-I/O group membership: what it sends, revokes, assigns and loses."""

from __future__ import annotations

import itertools

from laminar.client.group_types import HeartbeatReply
from laminar.client.membership import Membership, Plan
from laminar.client.types import TopicPartition

A0, A1, A2 = (TopicPartition("a", p) for p in range(3))


def member() -> Membership:
    ids = (f"m{i}" for i in itertools.count(1))
    return Membership("g", id_factory=lambda: next(ids))


def reply(m: Membership, epoch: int, *tps: TopicPartition, session: int = 1000) -> HeartbeatReply:
    return HeartbeatReply(m.member_id, epoch, 100, session, frozenset(tps))


def test_join_then_assign_then_heartbeat_reports_owned() -> None:
    m = member()
    assert m.subscribe(["a", "a"]) and not m.subscribe(["a"])
    sent = m.request()
    assert (sent.member_id, sent.member_epoch, sent.topics, sent.owned) == ("m1", 0, ("a",), set())
    assert m.on_reply(sent, reply(m, 3, A0, A1), sent_ms=0)
    assert m.joined and m.heartbeat_interval_ms == 100 and m.session_timeout_ms == 1000
    assert m.plan() == Plan(frozenset(), frozenset({A0, A1}))
    m.assigned({A0, A1})
    assert not m.plan()
    assert m.request().owned == {A0, A1} and m.request().member_epoch == 3


def test_revocation_is_reported_only_once_done() -> None:
    m = member()
    m.subscribe(["a"])
    m.on_reply(m.request(), reply(m, 1, A0, A1, A2), 0)
    m.assigned({A0, A1, A2})
    sent = m.request()
    m.on_reply(sent, reply(m, 5, A0), 10)
    plan = m.plan()
    assert plan.revoke == {A1, A2} and not plan.assign
    # Heartbeats while the listener runs still list the revoking partitions as owned.
    assert m.request().owned == {A0, A1, A2} and m.request().member_epoch == 5
    m.revoked(plan.revoke)
    assert m.request().owned == {A0} and not m.plan()


def test_assignment_only_takes_what_the_latest_answer_lists() -> None:
    m = member()
    m.subscribe(["a"])
    m.on_reply(m.request(), reply(m, 1, A0, A1), 0)
    m.on_reply(m.request(), reply(m, 2, A0), 5)  # A1 taken back before it was positioned
    m.assigned({A0, A1})
    assert m.owned == {A0}


def test_fenced_loses_everything_and_rejoins_under_a_new_id() -> None:
    m = member()
    m.subscribe(["a"])
    m.on_reply(m.request(), reply(m, 4, A0), 0)
    m.assigned({A0})
    old = m.request()
    generation = m.generation
    assert m.fenced() == {A0}
    assert m.generation == generation + 1
    sent = m.request()
    assert (sent.member_id, sent.member_epoch, sent.owned, sent.topics) == ("m2", 0, set(), ("a",))
    assert not m.on_reply(old, reply(m, 9, A0), 1)  # a late answer to the old incarnation
    assert m.epoch == 0 and not m.target


def test_session_expiry_counts_from_when_the_request_left() -> None:
    m = member()
    m.subscribe(["a"])
    m.on_reply(m.request(), reply(m, 1, A0, session=1000), sent_ms=100)
    assert not m.session_expired(1000)  # nothing owned yet: nothing to lose
    m.assigned({A0})
    assert not m.session_expired(1099)
    assert m.session_expired(1100)
    assert m.expire() == {A0}
    assert not m.owned and not m.target and not m.session_expired(5000)
    # The id is kept: the coordinator's next answer says what (if anything) is still ours.
    assert m.request().member_id == "m1" and m.request().member_epoch == 1
    m.on_reply(m.request(), reply(m, 1, A0), 5000)
    assert m.plan().assign == {A0}
