"""Scenarios from the Raft paper (figures 7 and 8) and its basic election/replication rules."""

from __future__ import annotations

import pytest

from laminar.raft import HardState, Message, MessageType, Role
from tests.raft_harness import Net, log_of

LEADER_LOG = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
FIGURE_7 = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


@pytest.mark.parametrize("case", sorted(FIGURE_7))
def test_figure7_leader_repairs_any_follower_log(case: str) -> None:
    """A leader of term 8 brings every figure-7 follower to exactly its own log."""
    net = Net(
        [1, 2, 3],
        storages={1: log_of(LEADER_LOG), 2: log_of(FIGURE_7[case])},
        hard_states={1: HardState(term=7), 2: HardState(term=7), 3: HardState(term=7)},
        election_tick=10,
    )
    net.elect(1)
    assert net[1].role == Role.LEADER
    assert net[1].term == 8
    net[1].propose(b"after")
    net.deliver()
    net.tick_all(1)  # (followers learn a write's commit from the next round)
    assert net.entries(2) == net.entries(1)
    terms = [t for _, _, t in net.entries(1)]
    assert terms == [*LEADER_LOG, 8, 8]
    assert net[2].commit == net[1].commit == len(LEADER_LOG) + 1


def test_figure7_rejections_use_the_hint_not_one_step_at_a_time() -> None:
    """Follower f diverges for 8 entries; the hint gets the leader there in few round trips."""
    net = Net(
        [1, 2, 3],
        storages={1: log_of(LEADER_LOG), 2: log_of(FIGURE_7["f"])},
        hard_states={n: HardState(term=7) for n in (1, 2, 3)},
    )
    net.elect(1)
    rejects = [m for m in net.sent if m.type == MessageType.APPEND_RESP and m.reject and m.frm == 2]
    assert 1 <= len(rejects) <= 2


def test_figure8_leader_never_commits_old_term_entries_by_counting() -> None:
    """Figure 8 (c): S1 (term 4) sees its term-2 entry on a majority (S1-S3) but must not
    commit it until an entry of term 4 is on a majority too."""
    storages = {
        1: log_of([1, 2]),
        2: log_of([1, 2]),
        3: log_of([1, 2]),
        4: log_of([1]),
        5: log_of([1, 3]),
    }
    hs = {n: HardState(term=3, commit=0) for n in range(1, 6)}
    net = Net(range(1, 6), storages=storages, hard_states=hs, pre_vote=False)
    net.isolate(5)

    def strip_term4(m: Message) -> bool:
        if m.type == MessageType.APPEND:
            m.entries = [e for e in m.entries if e.term != 4]
        return False

    net.drop = strip_term4
    net.elect(1)
    assert net[1].role == Role.LEADER and net[1].term == 4
    net.tick_all(3)
    prs = net[1].prs
    assert prs[2].match == 1 and prs[3].match == 1
    assert net[1].commit == 0  # a majority holds offset 1, but its term is 2
    net.drop = None
    net.tick_all(3)
    assert net[1].commit == 2
    assert [t for _, _, t in net.entries(1)] == [1, 2, 4]
    # S5 can no longer win: its last term 3 < 4 on the majority.
    net.heal()
    net[5].campaign()
    net.deliver()
    assert net[5].role != Role.LEADER
    assert [t for _, _, t in net.entries(2)] == [1, 2, 4]


def test_figure8_old_term_entry_overwritten_when_not_committed() -> None:
    """Figure 8 (d): S5 (last term 3) is elected by S2..S4 and overwrites S1/S2's term-2 entry,
    which was safe exactly because it had never been committed."""
    storages = {
        1: log_of([1, 2]),
        2: log_of([1, 2]),
        3: log_of([1, 2]),
        4: log_of([1]),
        5: log_of([1, 3]),
    }
    hs = {n: HardState(term=4, commit=0) for n in range(1, 6)}
    net = Net(range(1, 6), storages=storages, hard_states=hs, pre_vote=False)
    net.isolate(1)
    net.elect(5)
    assert net[5].role == Role.LEADER
    net.heal()
    # (S1's probe was lost in the partition: a heartbeat asks again within half an election
    # timeout, and its answer brings the probe that overwrites S1's entry)
    net.tick_all(10)
    for n in range(1, 6):
        assert [t for _, _, t in net.entries(n)][:2] == [1, 3]


def test_election_safety_one_vote_per_term() -> None:
    net = Net([1, 2, 3], pre_vote=False)
    net[1].campaign()
    net[3].campaign()
    msgs = net.take()
    # Node 2 gets both requests for term 1; it can grant only the first.
    for m in msgs:
        if m.to == 2:
            net[2].step(m)
    grants = [
        m
        for m in net.take()
        if m.type == MessageType.VOTE_RESP and m.frm == 2 and not m.reject and m.term == 1
    ]
    assert len(grants) == 1
    assert net.hard_states[2].vote in (1, 3)


def test_candidate_with_stale_log_loses() -> None:
    net = Net(
        [1, 2, 3],
        storages={1: log_of([1]), 2: log_of([1, 1]), 3: log_of([1, 1])},
        hard_states={n: HardState(term=1) for n in (1, 2, 3)},
        pre_vote=False,
    )
    net.elect(1)
    assert net[1].role == Role.FOLLOWER
    assert net[1].term == 2


def test_votes_are_only_sent_after_persist() -> None:
    net = Net([1, 2, 3], pre_vote=False)
    net[1].campaign()
    for m in net.take():
        net[m.to].step(m)
    for m in net.take():
        if m.type == MessageType.VOTE_RESP:
            assert m.after_persist
        if m.type == MessageType.VOTE:
            assert m.after_persist


def test_follower_acks_only_after_persist_and_leader_counts_itself_from_persisted() -> None:
    net = Net([1, 2, 3])
    net.elect(1)
    net.durable = False
    net[1].propose(b"a")
    msgs = net.take()
    appends = [m for m in msgs if m.type == MessageType.APPEND]
    assert appends and not any(m.after_persist for m in appends)
    for m in appends:
        net[m.to].step(m)
    acks = [m for m in net.take() if m.type == MessageType.APPEND_RESP]
    assert acks and all(m.after_persist for m in acks)
    # One follower ack + an unpersisted leader = 1 of 3 + nothing: not committed yet.
    net[1].step(acks[0])
    assert net[1].commit < net[1].last_index
    last = net.storages[1].last_index()
    net[1].persisted(last, net.storages[1].term(last))
    assert net[1].commit == last
