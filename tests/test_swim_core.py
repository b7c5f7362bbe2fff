"""The SWIM state machine in isolation: messages handed in by hand, outputs checked exactly."""

from __future__ import annotations

import pytest

from laminar.membership.broadcast import BroadcastQueue
from laminar.membership.messages import Ack, Gossip, Nack, Ping, PingReq, Sync, Update
from laminar.membership.suspicion import Suspicion
from laminar.membership.swim import EventKind, MemberState, Swim, SwimConfig

A, B, C = "10.0.0.1:7946", "10.0.0.2:7946", "10.0.0.3:7946"


def alive(node_id: int, address: str, inc: int = 0, **meta: str) -> Update:
    return Update(node_id, address, inc, MemberState.ALIVE, meta, node_id)


def make(node_id: int = 1, address: str = A, **cfg: int) -> Swim:
    return Swim(node_id, address, {"raft": "r"}, SwimConfig(seed=7, **cfg))


def run(swim: Swim, ticks: int) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for _ in range(ticks):
        swim.tick()
        out.extend(swim.outbox())
    return out


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        SwimConfig(protocol_period_ticks=5, ack_timeout_ticks=5)
    with pytest.raises(ValueError):
        SwimConfig(max_datagram_bytes=100)
    with pytest.raises(ValueError):
        Swim(0, A)
    with pytest.raises(ValueError, match="fit"):
        Swim(1, A, {"k": "v" * 2000})


def test_join_sends_full_state_to_seeds_and_merges_the_reply() -> None:
    swim = Swim(2, B, {"raft": "b"}, SwimConfig(seed=1), seeds=[A])
    out = swim.outbox()
    assert [(addr, type(m).__name__, m.want_reply) for addr, m in out] == [(A, "Sync", True)]
    assert [u.node_id for u in out[0][1].members] == [2]
    swim.receive(A, Sync(1, (alive(1, A, 3, raft="a"), alive(2, B)), False))
    assert [(e.kind, e.member.node_id) for e in swim.events()] == [(EventKind.JOINED, 1)]
    one = swim.member(1)
    assert one is not None
    assert (one.address, one.incarnation, one.state, one.meta) == (
        A,
        3,
        MemberState.ALIVE,
        {"raft": "a"},
    )
    assert [m.node_id for m in swim.members()] == [1, 2]


def test_join_is_retried_until_someone_answers() -> None:
    swim = Swim(2, B, None, SwimConfig(seed=1, join_retry_ticks=4), seeds=[A])
    swim.outbox()
    syncs = [m for _, m in run(swim, 12) if isinstance(m, Sync) and m.want_reply]
    assert len(syncs) == 3
    swim.receive(A, Sync(1, (alive(1, A),), False))
    assert not [
        m for addr, m in run(swim, 12) if isinstance(m, Sync) and addr == A and m.want_reply
    ]


def test_sync_request_is_answered_with_full_state() -> None:
    swim = make()
    swim.receive(B, Sync(2, (alive(2, B),), True))
    replies = [(addr, m) for addr, m in swim.outbox() if isinstance(m, Sync)]
    assert len(replies) == 1 and replies[0][0] == B and not replies[0][1].want_reply
    assert {u.node_id for u in replies[0][1].members} == {1, 2}


def test_ping_is_acked_with_piggybacked_news() -> None:
    swim = make()
    swim.receive(B, Sync(2, (alive(2, B),), False))
    swim.outbox()
    swim.receive(C, Ping(3, 42, 1))
    ((addr, ack),) = swim.outbox()
    assert addr == C and isinstance(ack, Ack) and ack.seq == 42
    assert {u.node_id for u in ack.updates} >= {1, 2}  # our own alive and the join news


def test_ping_for_another_node_id_is_ignored() -> None:
    """An old address reused by a new node must not ack probes meant for the old one."""
    swim = make()
    swim.receive(B, Ping(2, 5, 99))
    assert swim.outbox() == []


def test_failed_probe_goes_indirect_then_suspect() -> None:
    swim = make(protocol_period_ticks=10, ack_timeout_ticks=4)
    for node_id, addr in ((2, B), (3, C), (4, "10.0.0.4:1"), (5, "10.0.0.5:1")):
        swim.receive(addr, Sync(node_id, (alive(node_id, addr),), False))
    swim.events()
    swim.outbox()
    out = run(swim, 10)
    pings = [m for _, m in out if isinstance(m, Ping)]
    assert len(pings) == 1
    target = pings[0].target_id
    reqs = [(a, m) for a, m in out if isinstance(m, PingReq)]
    assert len(reqs) == 3 and all(m.target_id == target for _, m in reqs)
    assert all(m.seq == pings[0].seq for _, m in reqs)
    run(swim, 10)  # the period ends without an ack
    events = swim.events()
    assert [(e.kind, e.member.node_id) for e in events] == [(EventKind.SUSPECT, target)]
    assert swim.member(target).state is MemberState.SUSPECT  # type: ignore[union-attr]


def test_an_ack_through_a_helper_prevents_suspicion() -> None:
    swim = make(protocol_period_ticks=10, ack_timeout_ticks=4)
    for node_id, addr in ((2, B), (3, C)):
        swim.receive(addr, Sync(node_id, (alive(node_id, addr),), False))
    swim.outbox()
    out = run(swim, 10)
    (ping,) = [m for _, m in out if isinstance(m, Ping)]
    helper = next(a for a, m in out if isinstance(m, PingReq))
    swim.receive(helper, Ack(3 if ping.target_id == 2 else 2, ping.seq))
    run(swim, 10)
    assert [e.kind for e in swim.events()] == [EventKind.JOINED, EventKind.JOINED]


def test_helper_relays_ping_req_and_forwards_the_ack() -> None:
    swim = make()
    swim.receive(C, PingReq(3, 77, 2, B))
    ((addr, ping),) = swim.outbox()
    assert addr == B and isinstance(ping, Ping) and ping.target_id == 2
    swim.receive(B, Ack(2, ping.seq))
    ((addr, ack),) = swim.outbox()
    assert addr == C and isinstance(ack, Ack) and ack.seq == 77


def test_helper_nacks_when_the_target_stays_silent() -> None:
    swim = make(ack_timeout_ticks=4)
    swim.receive(C, PingReq(3, 77, 2, B))
    swim.outbox()
    out = run(swim, 2)
    assert [(a, type(m).__name__, m.seq) for a, m in out] == [(C, "Nack", 77)]
    swim.receive(C, PingReq(3, 78, 2, B))
    ((_, ping),) = swim.outbox()
    swim.receive(B, Ack(2, ping.seq))  # answered in time: the ack is forwarded, no nack
    assert [type(m).__name__ for _, m in swim.outbox() + run(swim, 5)] == ["Ack"]


Sent = list[tuple[str, object]]


def _probe_period(swim: Swim, pending: Sent, ack: bool, nack: bool) -> tuple[int, Sent]:
    """Answer one whole probe as told, from its ping (in ``pending``) to the next probe's start.

    Returns the ticks it took and the datagrams of that last tick (the next probe's ping).
    """
    ticks = 0
    while True:
        for addr, message in pending:
            if isinstance(message, Ping) and ack:
                swim.receive(addr, Ack(message.target_id, message.seq))
            if isinstance(message, PingReq) and nack:
                swim.receive(addr, Nack(9, message.seq))
        swim.tick()
        ticks += 1
        pending = swim.outbox()
        probe = swim._probe
        if probe and any(isinstance(m, Ping) and m.seq == probe.seq for _, m in pending):
            return ticks, pending


def test_local_health_stretches_probing_when_our_probes_fail_without_nacks() -> None:
    swim = make(protocol_period_ticks=10, ack_timeout_ticks=4)
    for node_id in range(2, 7):
        addr = f"10.0.0.{node_id}:7946"
        swim.receive(addr, Sync(node_id, (alive(node_id, addr),), False))
    _, pending = _probe_period(swim, swim.outbox(), ack=False, nack=False)  # up to a first probe
    ticks, pending = _probe_period(swim, pending, ack=False, nack=True)
    assert (ticks, swim.health) == (10, 0)  # helpers answered: our network is fine
    ticks, pending = _probe_period(swim, pending, ack=False, nack=False)
    assert (ticks, swim.health) == (10, 3)  # three helpers, not one nack: we are the problem
    ticks, pending = _probe_period(swim, pending, ack=True, nack=False)
    assert (ticks, swim.health) == (40, 2)  # the period was stretched 4x; an ack heals a step
    ticks, pending = _probe_period(swim, pending, ack=True, nack=False)
    assert (ticks, swim.health) == (30, 1)
    swim.receive(B, Gossip(2, (Update(1, A, swim.incarnation, MemberState.SUSPECT, {}, 2),)))
    assert swim.health == 2  # having to refute an accusation costs a step


def test_suspicion_is_refuted_with_a_higher_incarnation() -> None:
    swim = make()
    swim.outbox()
    swim.receive(B, Ping(2, 9, 1, (Update(1, A, 0, MemberState.SUSPECT, {}, 2),)))
    assert swim.incarnation == 1
    ((_, ack),) = swim.outbox()
    assert ack.updates[0] == Update(1, A, 1, MemberState.ALIVE, {"raft": "r"}, 1)
    # A stale accusation (older incarnation) is answered with the current state, not a new one.
    swim.receive(B, Ping(2, 10, 1, (Update(1, A, 0, MemberState.DEAD, {}, 2),)))
    assert swim.incarnation == 1
    ((_, ack),) = swim.outbox()
    assert ack.updates[0].incarnation == 1 and ack.updates[0].state is MemberState.ALIVE
    assert swim.stats.refutations == 1


def test_incarnation_precedence() -> None:
    swim = make()
    swim.receive(B, Sync(2, (alive(2, B, 5),), False))
    swim.events()

    def state() -> tuple[MemberState, int]:
        member = swim.member(2)
        assert member is not None
        return member.state, member.incarnation

    swim.receive(C, Gossip(3, (alive(2, B, 4),)))
    assert state() == (MemberState.ALIVE, 5)  # older alive ignored
    swim.receive(C, Gossip(3, (Update(2, B, 4, MemberState.SUSPECT, {}, 3),)))
    assert state() == (MemberState.ALIVE, 5)  # older suspicion ignored
    swim.receive(C, Gossip(3, (Update(2, B, 5, MemberState.SUSPECT, {}, 3),)))
    assert state() == (MemberState.SUSPECT, 5)  # same incarnation: suspect wins over alive
    swim.receive(C, Gossip(3, (alive(2, B, 5),)))
    assert state() == (MemberState.SUSPECT, 5)  # only a higher incarnation refutes
    swim.receive(C, Gossip(3, (alive(2, B, 6, raft="new"),)))
    assert state() == (MemberState.ALIVE, 6)
    assert swim.member(2).meta == {"raft": "new"}  # type: ignore[union-attr]
    swim.receive(C, Gossip(3, (Update(2, B, 6, MemberState.DEAD, {}, 3),)))
    assert state() == (MemberState.DEAD, 6)
    swim.receive(C, Gossip(3, (alive(2, B, 6),)))
    assert state() == (MemberState.DEAD, 6)  # dead is final for its incarnation
    swim.receive(C, Gossip(3, (alive(2, B, 7),)))
    assert state() == (MemberState.ALIVE, 7)  # a rejoin
    kinds = [e.kind for e in swim.events()]
    assert kinds == [EventKind.SUSPECT, EventKind.ALIVE, EventKind.DEAD, EventKind.ALIVE]


def test_unknown_members_are_not_created_by_death_notices() -> None:
    swim = make()
    swim.receive(C, Gossip(3, (Update(9, B, 0, MemberState.DEAD, {}, 3),)))
    swim.receive(C, Gossip(3, (Update(8, B, 0, MemberState.LEFT, {}, 8),)))
    assert [m.node_id for m in swim.members()] == [1]


def test_dead_in_a_sync_is_only_suspicion() -> None:
    swim = make()
    swim.receive(B, Sync(2, (alive(2, B, 1),), False))
    swim.receive(C, Sync(3, (Update(2, B, 1, MemberState.DEAD, {}, 3),), False))
    assert swim.member(2).state is MemberState.SUSPECT  # type: ignore[union-attr]


def _hearsay_suspicion(refute_from_tick: int | None) -> tuple[Swim, int, list[int]]:
    """Node 2 answers every probe (so we never accuse it ourselves) but is suspected by 3.

    From ``refute_from_tick`` on its acks carry a refutation. Returns the core, the tick node 2
    left SUSPECT, and the ticks at which pings to node 2 were sent.
    """
    swim = make(protocol_period_ticks=10, ack_timeout_ticks=4, suspicion_mult=4)
    swim.receive(B, Sync(2, (alive(2, B),), False))
    swim.receive(C, Gossip(3, (Update(2, B, 0, MemberState.SUSPECT, {}, 3),)))
    swim.outbox()
    ping_ticks: list[int] = []
    for tick in range(1, 200):
        swim.tick()
        for addr, message in swim.outbox():
            if addr == B and isinstance(message, Ping):
                ping_ticks.append(tick)
                refute = refute_from_tick is not None and tick >= refute_from_tick
                swim.receive(B, Ack(2, message.seq, (alive(2, B, 1),) if refute else ()))
        if swim.member(2).state is not MemberState.SUSPECT:  # type: ignore[union-attr]
            return swim, tick, ping_ticks
    raise AssertionError("suspicion never ended")


def test_hearsay_suspicion_gets_a_last_check_then_dead() -> None:
    swim, ended, pings = _hearsay_suspicion(refute_from_tick=None)
    # Three members: k = 0, so the timeout is the minimum (4 periods = 40 ticks); as we never
    # failed a probe of node 2 ourselves, two direct pings go out first and one period is added.
    assert pings.count(40) == 2
    assert ended == 50
    assert swim.member(2).state is MemberState.DEAD  # type: ignore[union-attr]
    assert swim.stats.probes_failed == 0


def test_last_check_ack_with_refutation_saves_the_suspect() -> None:
    swim, ended, _ = _hearsay_suspicion(refute_from_tick=40)
    assert ended == 40
    member = swim.member(2)
    assert member is not None and (member.state, member.incarnation) == (MemberState.ALIVE, 1)


def test_own_failed_probe_plus_a_confirmation_needs_no_last_check() -> None:
    swim = make(protocol_period_ticks=10, ack_timeout_ticks=4, suspicion_mult=4)
    swim.receive(B, Sync(2, (alive(2, B),), False))
    swim.receive(C, Gossip(3, (Update(2, B, 0, MemberState.SUSPECT, {}, 3),)))
    ticks = 0
    while swim.member(2).state is MemberState.SUSPECT:  # type: ignore[union-attr]
        run(swim, 1)  # node 2 never answers: our own probes fail too
        ticks += 1
        assert ticks < 200
    assert swim.member(2).state is MemberState.DEAD  # type: ignore[union-attr]
    assert ticks == 40 and swim.stats.probes_failed >= 1


def test_leave_and_update_meta() -> None:
    swim = make()
    swim.receive(B, Sync(2, (alive(2, B),), False))
    swim.outbox()
    swim.update_meta({"raft": "r2"})
    assert swim.incarnation == 1 and swim.member(1).meta == {"raft": "r2"}  # type: ignore[union-attr]
    swim.leave()
    out = swim.outbox()
    assert swim.member(1).state is MemberState.LEFT  # type: ignore[union-attr]
    assert [(a, type(m).__name__) for a, m in out] == [(B, "Gossip")]
    left = out[0][1].updates[0]
    assert (left.node_id, left.state, left.incarnation) == (1, MemberState.LEFT, 2)
    assert not [m for _, m in run(swim, 50) if isinstance(m, Ping | PingReq)]  # no more probing
    other = make(3, C)
    other.receive(B, Sync(2, (alive(1, A),), False))
    other.receive(A, Gossip(1, (left,)))
    assert other.member(1).state is MemberState.LEFT  # type: ignore[union-attr]


def test_broadcast_queue_limits_retransmissions_and_budget() -> None:
    queue = BroadcastQueue()
    for node_id in range(1, 4):
        queue.push(alive(node_id, A))
    assert len(queue.take(10_000, limit=2)) == 3
    assert len(queue.take(10_000, limit=2)) == 3
    assert queue.take(10_000, limit=2) == []
    queue.push(alive(1, A, 1))
    queue.push(alive(1, A, 2))  # replaces the older news about node 1
    assert [u.incarnation for u in queue.take(10_000, limit=5)] == [2]
    assert queue.take(10, limit=5) == []  # nothing fits in 10 bytes


def test_suspicion_timer_shrinks_with_confirmations() -> None:
    s = Suspicion(0, 100, min_ticks=50, max_ticks=300, k=3)
    s.confirm(1)
    assert s.deadline() == 400
    assert s.confirm(2) and not s.confirm(2)
    first = s.deadline()
    s.confirm(3)
    second = s.deadline()
    s.confirm(4)
    assert 400 > first > second > s.deadline() == 150


def test_down_members_are_reaped_after_the_timeout_and_can_rejoin() -> None:
    swim = make(reap_after_ticks=50)
    swim.receive(B, Gossip(2, (alive(2, B, 1), alive(3, C, 1))))
    swim.receive(B, Gossip(2, (Update(3, C, 1, MemberState.DEAD, {}, 2),)))
    swim.receive(C, Gossip(3, (Update(2, B, 2, MemberState.LEFT, {}, 2),)))
    swim.events()
    run(swim, 49)
    assert {m.node_id for m in swim.members()} == {1, 2, 3}, "not before the timeout"
    run(swim, 1)
    assert [(e.kind, e.member.node_id) for e in swim.events()] == [
        (EventKind.REAPED, 3),  # in the order they went down
        (EventKind.REAPED, 2),
    ]
    assert [m.node_id for m in swim.members()] == [1]
    # Stale news of a reaped member changes nothing; a rejoin (alive) brings it back.
    swim.receive(B, Gossip(2, (Update(3, C, 1, MemberState.DEAD, {}, 2),)))
    assert swim.member(3) is None and not swim.events()
    swim.receive(C, Gossip(3, (alive(3, C, 0),)))
    assert [(e.kind, e.member.node_id) for e in swim.events()] == [(EventKind.JOINED, 3)]
    member = swim.member(3)
    assert member is not None and member.state is MemberState.ALIVE


def test_reaping_can_be_turned_off() -> None:
    swim = make(reap_after_ticks=0)
    swim.receive(B, Gossip(2, (alive(2, B, 1),)))
    swim.receive(B, Gossip(2, (Update(2, B, 2, MemberState.LEFT, {}, 2),)))
    run(swim, 2000)
    member = swim.member(2)
    assert member is not None and member.state is MemberState.LEFT
