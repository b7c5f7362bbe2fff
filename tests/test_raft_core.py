"""Feature tests for the Raft core: elections, replication flow control, transfer, read index,
quiescence, typed rejections and robustness against garbage messages."""

from __future__ import annotations

import random

import pytest

from laminar.errors import InvalidRequestError, NotLeaderError
from laminar.raft import (
    ConfState,
    Entry,
    EntryKind,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    NotLeader,
    ProgressState,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    Role,
)
from laminar.raft.core import COMMIT_NOTICE_WAIT_ROUNDS, QUICK_RETRY_TICKS
from tests.raft_harness import Net, log_of

ET = 10


def leader_net(n: int = 3, **cfg: object) -> Net:
    net = Net(range(1, n + 1), election_tick=ET, **cfg)
    net.elect(1)
    assert net[1].role == Role.LEADER
    return net


# ---------------------------------------------------------------- elections


def test_single_node_elects_itself_and_commits() -> None:
    net = Net([1])
    net.elect(1)
    assert net[1].role == Role.LEADER
    idx = net[1].propose(b"a")
    net.deliver()
    assert net[1].commit == idx[1]
    assert [e.data for e in net.committed[1]] == [b"", b"a"]  # the election no-op first


def test_randomized_timeout_elects_exactly_one_leader() -> None:
    net = Net([1, 2, 3], election_tick=ET)
    for _ in range(3 * ET):
        net.tick_all()
    leaders = [n for n in net.nodes.values() if n.role == Role.LEADER]
    assert len(leaders) == 1
    assert all(n.leader_id == leaders[0].id for n in net.nodes.values())


def test_new_leader_appends_noop_of_its_term() -> None:
    net = leader_net()
    ents = net.storages[2].all_entries()
    assert ents[-1].kind == EntryKind.NOOP and ents[-1].term == net[1].term
    assert net[2].commit == ents[-1].index  # a term's first commit is announced at once


def test_prevote_keeps_partitioned_node_from_inflating_its_term() -> None:
    net = leader_net()
    term = net[1].term
    net.isolate(3)
    net.tick(3, 5 * ET)
    assert net[3].term == term  # pre-votes failed; the real term never moved
    net.heal()
    net.tick_all(2)
    assert net[1].role == Role.LEADER and net[1].term == term


def test_without_prevote_a_rejoining_node_disrupts_the_term() -> None:
    net = leader_net(pre_vote=False, check_quorum=False)
    term = net[1].term
    net.isolate(3)
    net.tick(3, 3 * ET)
    assert net[3].term > term
    net.heal()
    net.tick_all(1)
    assert net[1].term > term  # contrast with the pre-vote test above


def test_refusing_a_stale_candidate_keeps_the_election_timer_running() -> None:
    # Simulation seed 6395 (before this fix): of voters {1, 2, 3, 4}, 4 is down; 1 has the
    # longest log, so only 1 can win. Without pre-vote, 2 campaigned again and again; each of
    # its VOTEs raised 1's term and, before the fix, restarted 1's election timer, so 1 never
    # timed out first and no leader emerged for 200+ ticks. Raft restarts the timer only on
    # hearing from a leader or on granting a vote.
    logs = {1: log_of([1, 1, 2]), 2: log_of([1, 1]), 3: log_of([1, 1]), 4: log_of([1, 1])}
    hs = {n: HardState(2, 0, 1) for n in logs}
    net = Net([1, 2, 3, 4], storages=logs, hard_states=hs, election_tick=ET, pre_vote=False)
    net.isolate(4)
    net.tick(1, ET - 1)  # 1 is almost due to campaign
    assert net[1].role == Role.FOLLOWER
    net.elect(2)  # 2's VOTE raises 1's term; 1 refuses (2's log is behind)
    assert net[1].term == net[2].term == 3
    assert net[1].vote == 0
    assert net[1].election_elapsed == ET - 1  # before the fix: 0
    # So 1 campaigns within at most ET more ticks (its timeout is below 2 * ET) and wins.
    for _ in range(ET):
        net.tick(1)
        if net[1].role != Role.FOLLOWER:
            break
    net.deliver()
    assert net[1].role == Role.LEADER


def test_granting_a_vote_restarts_the_election_timer() -> None:
    net = Net([1, 2, 3], election_tick=ET, pre_vote=False)
    net.tick(3, ET - 1)
    net.elect(1)
    assert net[3].vote == 1
    assert net[3].election_elapsed == 0


def test_a_learner_with_a_newer_term_makes_the_stale_leader_step_down() -> None:
    # Sim seed 175232 (before this fix): without pre-vote and check-quorum, a losing
    # candidate's VOTE raised learner 4's term above the leader's. 4 then dropped every append
    # of the leader's older term without a word, and as a learner it never campaigns, so
    # neither side ever moved: 4 fell behind for good.
    net = Net(
        [1, 2, 3, 4],
        voters=[1, 2, 3],
        learners=[4],
        election_tick=ET,
        pre_vote=False,
        check_quorum=False,
    )
    net.elect(1)
    term = net[1].term
    vote = Message(MessageType.VOTE, 4, 2, term + 1, log_term=term, index=net[2].last_index)
    net[4].step(vote)
    net.take()  # 4's answer to that candidate is lost
    assert net[4].term == term + 1
    net[1].propose(b"x")
    net.deliver()
    assert net[1].role == Role.FOLLOWER and net[1].term == term + 1  # before the fix: leader
    for _ in range(3 * ET):
        net.tick_all()
        if any(net[n].role == Role.LEADER for n in (1, 2, 3)):
            break
    net.deliver()
    leader = next(net[n] for n in (1, 2, 3) if net[n].role == Role.LEADER)
    assert net[4].last_index == leader.last_index and net[4].commit == leader.commit


def test_check_quorum_steps_down_an_isolated_leader() -> None:
    net = leader_net()
    net.isolate(1)
    for _ in range(2 * ET + 1):
        net.tick(1)
    assert net[1].role == Role.FOLLOWER
    with pytest.raises(NotLeader):
        net[1].propose(b"x")


def test_lease_ignores_higher_term_votes_while_leader_is_alive() -> None:
    net = leader_net(pre_vote=False)
    term = net[1].term
    vote = Message(MessageType.VOTE, 2, 3, term + 5, log_term=term, index=net[1].last_index)
    net[2].step(vote)
    assert net[2].term == term
    assert not [m for m in net.take() if m.type == MessageType.VOTE_RESP]


def test_stale_leader_learns_newer_term_and_steps_down() -> None:
    net = leader_net()
    net.isolate(1)
    net[2].report_node_down(1)
    net[3].report_node_down(1)
    net.tick_all(3 * ET)
    new = [n for n in (2, 3) if net[n].role == Role.LEADER]
    assert len(new) == 1
    net.heal()
    for n in (2, 3):  # as the liveness layer does once it hears 1 again
        net[n].report_node_up(1)
    net.tick_all(2)
    assert net[1].role == Role.FOLLOWER
    assert net[1].leader_id == new[0]


# ---------------------------------------------------------------- replication


def test_proposals_between_readys_batch_into_one_append_per_follower() -> None:
    net = leader_net()
    for i in range(100):
        net[1].propose(b"p%d" % i)
    msgs = [m for m in net.take() if m.type == MessageType.APPEND]
    assert len(msgs) == 2
    assert all(len(m.entries) == 100 for m in msgs)
    for m in msgs:
        net[m.to].step(m)
    acks = [m for m in net.take() if m.type == MessageType.APPEND_RESP]
    assert len(acks) == 2


def test_acks_coalesce_per_ready() -> None:
    net = leader_net()
    appends = []
    for i in range(5):
        net[1].propose(b"p%d" % i)
        appends += [m for m in net.take() if m.type == MessageType.APPEND and m.to == 2]
    assert len(appends) == 5
    for m in appends:
        net[2].step(m)
    acks = [m for m in net.take() if m.type == MessageType.APPEND_RESP]
    assert len(acks) == 1 and acks[0].index == net[1].last_index


def test_propose_many_and_multi_record_entries_occupy_offset_ranges() -> None:
    net = leader_net()
    start = net[1].last_index + 1
    spans = net[1].propose_many([(b"a", 3), (b"b", 1), (b"c", 5)])
    assert spans == [(start, start + 2), (start + 3, start + 3), (start + 4, start + 8)]
    net.deliver()
    net.tick_all(1)  # (followers learn a write's commit from the next round)
    assert net[2].commit == start + 8
    assert net.storages[3].term(start + 6) == net[1].term
    assert [(e.index, e.last) for e in net.committed[3][-3:]] == spans


def test_probe_then_replicate_and_inflight_window_caps_messages() -> None:
    net = leader_net(max_inflight_msgs=2, max_msg_bytes=40)
    pr = net[1].prs[2]
    assert pr.state == ProgressState.REPLICATE
    net.cut.add((2, 1))  # acks from 2 are lost: the window fills up
    for i in range(10):
        net[1].propose(b"p%d" % i)
        net.deliver()
    to2 = [m for m in net.sent if m.type == MessageType.APPEND and m.to == 2 and m.entries]
    assert pr.inflights.full()
    sent_after_full = len(to2)
    net[1].propose(b"more")
    net.deliver()
    to2 = [m for m in net.sent if m.type == MessageType.APPEND and m.to == 2 and m.entries]
    assert len(to2) == sent_after_full  # paused while the window is full
    net.heal()
    net.tick_all(3)
    assert net[2].last_index == net[1].last_index


def test_max_msg_bytes_splits_large_backlogs() -> None:
    net = leader_net(max_msg_bytes=200)
    net.isolate(3)
    for i in range(20):
        net[1].propose(b"x" * 50 + b"%d" % i)
    net.deliver()
    net.heal()
    # The appends to 3 were lost: a follower owing their answer hears a heartbeat (which
    # exposes the gap) within ET // 2 rounds.
    net.tick_all(ET // 2 + 1)
    sizes = [len(m.entries) for m in net.sent if m.type == MessageType.APPEND and m.to == 3]
    assert max(sizes) <= 3
    assert net.entries(3) == net.entries(1)


def test_follower_truncates_uncommitted_conflicting_tail() -> None:
    net = Net(
        [1, 2, 3],
        storages={1: log_of([1, 2, 2]), 2: log_of([1, 3, 3, 3]), 3: log_of([1, 2, 2])},
        hard_states={n: HardState(term=3, commit=0) for n in (1, 2, 3)},
        election_tick=ET,
    )
    # 2 has the newest log and wins; 1 and 3 lose their term-2 tail.
    net.elect(2)
    assert net[2].role == Role.LEADER
    assert [t for _, _, t in net.entries(1)] == [1, 3, 3, 3, 4]
    assert net.entries(1) == net.entries(2) == net.entries(3)


def test_max_uncommitted_bytes_drops_proposals_until_commit() -> None:
    net = leader_net(max_uncommitted_bytes=100)
    net.isolate(1)
    net[1].propose(b"x" * 80)
    with pytest.raises(ProposalDropped):
        net[1].propose(b"y" * 80)
    net.heal()
    net.tick_all(2)
    net[1].propose(b"y" * 80)  # committed backlog freed the budget


def test_leader_log_compacted_follower_gets_reset_and_catches_up() -> None:
    net = leader_net()
    net.isolate(3)
    for i in range(10):
        net[1].propose(b"p%d" % i)
    net.deliver()
    net.tick_all(1)  # (the commit notice waits for node 3's answer: a heartbeat carries it)
    assert net[2].commit == net[1].commit
    compact_to = net[1].commit - 2
    for n in (1, 2):
        net.storages[n].compact(compact_to)
    net.heal()
    net.tick_all(ET // 2 + 1)  # (the lost appends are exposed by a heartbeat, see above)
    resets = [m for m in net.sent if m.type == MessageType.RESET and m.to == 3]
    assert resets and resets[0].index == compact_to
    assert net.storages[3].first_index() == compact_to + 1
    assert net.entries(3) == net.entries(1)
    assert net[3].commit == net[1].commit
    assert net.confs[3].voters == (1, 2, 3)


# ---------------------------------------------------------------- typed rejections


def test_not_leader_carries_known_leader() -> None:
    net = leader_net()
    with pytest.raises(NotLeader) as exc:
        net[2].propose(b"x")
    assert isinstance(exc.value, NotLeaderError)
    assert exc.value.leader_id == 1
    with pytest.raises(NotLeader):
        net[2].read_index(b"r")
    with pytest.raises(NotLeader):
        net[3].transfer_leader(2)


def test_invalid_record_count_rejected() -> None:
    net = leader_net()
    with pytest.raises(InvalidRequestError):
        net[1].propose(b"x", count=0)


# ---------------------------------------------------------------- leader transfer


def test_transfer_to_caught_up_follower() -> None:
    net = leader_net()
    net[1].propose(b"a")
    net.deliver()
    net[1].transfer_leader(3)
    with pytest.raises(NotLeader) as exc:
        net[1].propose(b"during")
    assert exc.value.leader_id == 3
    net.deliver()
    assert net[3].role == Role.LEADER
    assert net[1].role == Role.FOLLOWER and net[1].leader_id == 3
    assert any(m.type == MessageType.TIMEOUT_NOW for m in net.sent)


def test_transfer_waits_for_a_lagging_target() -> None:
    net = leader_net()
    net.isolate(3)
    for i in range(5):
        net[1].propose(b"p%d" % i)
    net.deliver()
    net[1].transfer_leader(3)
    net.deliver()
    assert not any(m.type == MessageType.TIMEOUT_NOW for m in net.sent)
    net.heal()
    net.tick_all(2)
    assert net[3].role == Role.LEADER
    assert net.entries(3)[: len(net.entries(1)) - 1] == net.entries(1)[:-1]


def test_transfer_aborts_after_an_election_timeout() -> None:
    net = leader_net()
    net.isolate(3)
    net[1].transfer_leader(3)
    for _ in range(ET):
        net.tick(1)
        net.deliver()
    assert net[1].role == Role.LEADER and net[1].transferee == 0
    net[1].propose(b"again")


# ---------------------------------------------------------------- read index


def test_read_index_confirms_leadership_with_a_quorum() -> None:
    net = leader_net()
    net[1].propose(b"a")
    net.deliver()
    commit = net[1].commit
    net[1].read_index(b"r1")
    net.deliver()
    assert net.reads[1] == [(b"r1", commit)]


def test_read_index_of_isolated_leader_never_completes() -> None:
    net = leader_net()
    net.isolate(1)
    net[1].read_index(b"r1")
    net.tick(1, 3)
    net.deliver()
    assert net.reads[1] == []


def test_read_index_waits_for_first_commit_of_the_term() -> None:
    net = Net([1, 2, 3], election_tick=ET)
    net.drop = lambda m: m.type == MessageType.APPEND
    net.elect(1)
    assert net[1].role == Role.LEADER and net[1].commit < net[1].last_index
    net[1].read_index(b"early")
    net.deliver()
    net.tick_all(1)
    assert net.reads[1] == []  # heartbeats alone can't serve it before the no-op commits
    net.drop = None
    net.tick_all(2)
    assert net.reads[1] == [(b"early", net[1].last_index)]


def test_a_saved_commit_never_exceeds_the_durable_log() -> None:
    # A follower that learns entries and their commit in one append must not save that
    # commit before the entries are durable: a power cut can keep the state file and lose
    # the log's truncation, and the restart would take older entries at those offsets for
    # committed (Raft simulation seed 14291).
    net = leader_net()
    net.isolate(2)
    net[1].propose(b"written while 2 was away")
    net.deliver()
    durable = net[2].last_index
    net.heal()
    net.durable = False  # node 2's writes stay in the page cache
    for _ in range(ET):  # a heartbeat's answer shows node 2 behind: the leader sends it all
        net.tick(1)
        net.deliver()
    assert net[2].commit == net[1].commit > durable  # learnt, not yet durable
    assert net.hard_states[2].commit <= durable
    assert net[2].durable_commit == durable
    net.durable = True
    net.process(2)
    net[2].persisted(net[2].last_index, net[2].term)
    assert net[2].durable_commit == net[2].commit


# ---------------------------------------------------------------- quiescence


def test_idle_group_quiesces_and_a_proposal_wakes_it() -> None:
    net = leader_net()
    net.tick_all(2)
    assert all(net[n].quiesced for n in (1, 2, 3))
    net[1].propose(b"wake")
    assert not net[1].quiesced
    for m in net.take():
        net[m.to].step(m)
    assert not net[2].quiesced and not net[3].quiesced
    net.deliver()
    net.tick_all(1)
    assert net[2].commit == net[3].commit == net[1].commit
    assert all(net[n].quiesced for n in (1, 2, 3))


def test_a_write_is_told_committed_by_the_next_tick_round_which_quiesces_the_group() -> None:
    # The answers commit the write and nothing is sent on them: the next tick's heartbeat
    # round carries the commit and puts the group to sleep (no commit notice, an empty
    # append each and its answer, before it).
    net = leader_net()
    net.tick_all(2)
    net[1].propose(b"x")
    appends = net.take()
    assert sorted((m.type, m.to) for m in appends) == [
        (MessageType.APPEND, 2),
        (MessageType.APPEND, 3),
    ]
    for m in appends:
        net[m.to].step(m)
    answers = net.take()
    assert {m.type for m in answers} == {MessageType.APPEND_RESP}
    for m in answers:
        net[m.to].step(m)
    assert net[1].commit == net[1].last_index
    assert net.take() == []
    assert not net[1].quiesced
    net.tick(1)
    round_ = net.take()
    assert sorted((m.type, m.to) for m in round_) == [
        (MessageType.HEARTBEAT, 2),
        (MessageType.HEARTBEAT, 3),
    ]
    assert all(m.quiesce and m.commit == net[1].commit for m in round_)
    assert net[1].quiesced
    for m in round_:
        net[m.to].step(m)
    net.deliver()
    assert all(net[n].quiesced and net[n].commit == net[1].commit for n in (1, 2, 3))
    net.tick_all(ET)
    assert not [m for m in net.sent if m.type == MessageType.APPEND and not m.entries]


def test_followers_holding_everything_go_quiet_without_answering_the_round() -> None:
    # The round that quiesces a group after a write is silent for followers that hold every
    # entry: they sleep at once, and the leader counts them asleep and knowing the commit.
    net = leader_net()
    net.tick_all(2)
    net[1].propose(b"x")
    net.deliver()
    net.sent.clear()
    net.tick(1)
    net.deliver()
    assert [(m.type, m.reject) for m in net.sent] == [(MessageType.HEARTBEAT, True)] * 2
    assert all(net[n].quiesced and net[n].commit == net[1].commit for n in (1, 2, 3))
    progress = net[1].prs
    assert all(progress[n].asleep and progress[n].commit == net[1].commit for n in (2, 3))


def test_a_lost_silent_round_leaves_the_follower_awake_until_its_campaign_wakes_the_leader() -> (
    None
):
    net = leader_net()
    net.tick_all(2)
    net[1].propose(b"x")
    net.deliver()
    net.drop = lambda m: m.type == MessageType.HEARTBEAT and m.to == 3  # the silent round
    net.tick(1)
    net.deliver()
    net.drop = None
    assert net[1].quiesced and net[2].quiesced and not net[3].quiesced
    for _ in range(4 * ET):  # as the runtime does, only the awake tick: node 3's campaign
        for n in (1, 2, 3):  # reaches the quiet leader, which wakes and quiesces it again
            if not net[n].quiesced:
                net.tick(n)
        net.deliver()
        if all(net[n].quiesced for n in (1, 2, 3)):
            break
    assert all(net[n].quiesced for n in (1, 2, 3))
    assert net[3].leader_id == 1 and net[1].role == Role.LEADER and net[1].term == net[3].term


def test_a_follower_tick_says_whether_it_made_work() -> None:
    # The runtime ticks thousands of groups and asks has_ready only of those whose tick may
    # have made work: a follower's tick makes none until its election timer runs out.
    net = leader_net()
    net[1].propose(b"x")
    net.deliver()
    net.isolate(1)
    follower = net[2]
    assert not follower.quiesced and not follower.has_ready()
    for _ in range(3 * ET):
        if follower.tick():
            break
        assert not follower.has_ready()
    else:
        pytest.fail("the follower never campaigned")
    assert follower.has_ready() and any(m.type == MessageType.PRE_VOTE for m in follower.msgs)
    assert net[1].tick()  # a leader's tick may always make work (heartbeats, stepping down)


def test_a_heartbeat_round_replaces_an_unsent_older_one_to_the_same_follower() -> None:
    # A loaded node may tick a group again before draining its Ready: the older round, still
    # unsent, says nothing the newer does not, so each follower gets the newest round only.
    net = leader_net()
    net.tick_all(2)
    net[1].propose(b"x")
    for m in net.take():
        net[m.to].step(m)
    for m in net.take():
        net[m.to].step(m)  # the answers: the leader's quiescing round is now in its msgs
    net[1].tick()
    net[1].tick()
    heartbeats = [m for m in net.take() if m.type == MessageType.HEARTBEAT]
    assert sorted(m.to for m in heartbeats) == [2, 3]
    newest = max(m.index for m in heartbeats)
    assert all(m.index == newest and m.quiesce for m in heartbeats)
    assert all(m.commit == net[1].commit for m in heartbeats)
    for m in heartbeats:
        net[m.to].step(m)
    net.deliver()
    assert all(net[n].quiesced and net[n].commit == net[1].commit for n in (1, 2, 3))


def test_writes_back_to_back_carry_each_commit_on_the_next_append() -> None:
    # One write in flight at a time (a producer waiting for each acknowledgement): each
    # round is an append and its answer per follower, the commit riding on the next append.
    net = leader_net()
    net.tick_all(2)
    net.sent.clear()
    for i in range(5):
        net[1].propose(b"w%d" % i)
        net.deliver()
        assert net[1].commit == net[1].last_index
    assert {m.type for m in net.sent} == {MessageType.APPEND, MessageType.APPEND_RESP}
    assert len(net.sent) == 5 * 4
    assert net[2].commit == net[3].commit == net[1].commit - 1  # (the last, at the tick)
    net.tick(1)
    net.deliver()
    assert all(net[n].quiesced and net[n].commit == net[1].commit for n in (1, 2, 3))


def test_a_follower_holding_the_write_learns_the_commit_from_the_next_round() -> None:
    # Node 3 is away: node 2 learns the commit from the next heartbeat round; node 3 is
    # asked by heartbeats, and answers once back.
    net = leader_net()
    net.tick_all(2)
    net.isolate(3)
    net[1].propose(b"y")
    net.deliver()
    assert net[1].commit == net[1].log.last_index() and net[2].commit < net[1].commit
    net.tick_all(1)
    assert net[2].commit == net[1].commit
    net.tick_all(ET // 2)
    assert not [m for m in net.sent if m.type == MessageType.APPEND and not m.entries]
    net.heal()
    net.tick_all(ET)
    assert all(net[n].quiesced and net[n].commit == net[1].commit for n in (1, 2, 3))


def test_a_prompt_commit_group_tells_the_commit_without_waiting_for_the_slower_answer() -> None:
    # The metadata group: every node serves reads of it, so node 2 learns a change committed
    # at once, not after node 3's answer or the next heartbeat round.
    net = leader_net(prompt_commit=True)
    net.tick_all(2)
    net[1].propose(b"x")
    for m in net.take():
        net[m.to].step(m)
    answers = {m.frm: m for m in net.take()}
    net[1].step(answers[2])
    notices = net.take()
    assert [(m.type, m.to, m.commit) for m in notices if m.to == 2] == [
        (MessageType.APPEND, 2, net[1].commit)
    ]


def node_3_back_and_probed(**cfg: object) -> Net:
    """Node 3 missed a write while reported down; reported up, the leader's probe to it is
    queued (not delivered)."""
    net = leader_net(**cfg)
    net.isolate(3)
    net[1].report_node_down(3)
    net[1].propose(b"written while 3 was away")
    net.deliver()
    net.heal()
    assert net[1].report_node_up(3)
    return net


def test_no_heartbeat_while_a_commit_notice_is_unanswered_then_one_after_a_while() -> None:
    # A prompt group's write it cannot quiesce after (node 3 is being probed) is told
    # committed by an empty append; until node 2 answers it, a heartbeat would only ask what
    # that answer will say. If the notice is lost, heartbeats resume one round later.
    net = node_3_back_and_probed(prompt_commit=True)
    net.take()  # (the probe to node 3, lost)
    net[1].propose(b"x")
    for m in net.take():
        net[m.to].step(m)
    for m in net.take():
        net[m.to].step(m)
    notices = net.take()
    assert [(m.type, m.to, m.entries) for m in notices] == [(MessageType.APPEND, 2, [])]
    assert notices[0].commit == net[1].commit
    silent = 0
    while True:
        net.tick(1)
        if any(m.type == MessageType.HEARTBEAT and m.to == 2 for m in net.take()):
            break
        silent += 1
    assert silent == COMMIT_NOTICE_WAIT_ROUNDS - 1


def test_a_leader_elected_while_a_node_was_away_probes_it_above_the_log_it_holds() -> None:
    # Node 1 led and wrote, then died; node 2 was elected without it. Reported up again,
    # node 1 is probed at once where a new leader's probe stands (its own last entry), not
    # from the match of a node it never heard from: that sent node 1 the whole log it held.
    net = leader_net()
    for i in range(5):
        net[1].propose(b"x" * 100 + bytes([i]))
    net.deliver()
    held = net[1].log.last_index()
    net.isolate(1)
    for n in (2, 3):
        net[n].report_node_down(1)
    net.elect(2)
    assert net[2].role == Role.LEADER
    net.heal()
    net.take()
    assert net[2].report_node_up(1)
    probes = [m for m in net.take() if m.to == 1 and m.type == MessageType.APPEND]
    assert [(m.index, [e.index for e in m.entries]) for m in probes] == [(held, [held + 1])]
    net[1].step(probes[0])
    net.deliver()
    assert net.entries(1) == net.entries(2)


class _Gate:
    """A driver's send gate (``RaftConfig.send_gate``) closed to the peers in ``closed``."""

    def __init__(self) -> None:
        self.closed: set[int] = set()
        self.asked: list[int] = []
        self.given: list[tuple[int, int]] = []

    def open(self, to: int) -> bool:
        self.asked.append(to)
        return to not in self.closed

    def sent(self, to: int, size: int) -> None:
        self.given.append((to, size))


def test_a_closed_send_gate_holds_entries_until_resume_sends() -> None:
    # A node catching a peer up on thousands of groups bounds what all of them queue toward
    # it: a group whose gate is closed sends that peer no entries (heartbeats still go), and
    # sends them once the driver calls resume_sends.
    net = leader_net()
    gate = _Gate()
    net[1].cfg.send_gate = gate
    gate.closed.add(3)
    net[1].propose(b"x" * 100)
    sent = net.take()
    assert [(m.to, len(m.entries)) for m in sent if m.type == MessageType.APPEND] == [(2, 1)]
    assert 3 in gate.asked and all(to == 2 for to, _ in gate.given)
    for m in sent:
        net[m.to].step(m)
    net.deliver()
    net.tick_all(3)  # heartbeats reach 3; its answers ask for entries the gate still holds
    assert net[3].log.last_index() < net[1].log.last_index()
    gate.closed.clear()
    net[1].resume_sends(3)
    net.deliver()
    assert net.entries(3) == net.entries(1)


def test_no_heartbeat_to_a_follower_while_a_probe_is_unanswered() -> None:
    # A returning node is probed from its match at once. A heartbeat each round meanwhile
    # made each answer trigger another probe (with 10,000 groups catching a restarted node
    # up, that was a heartbeat and an empty append per group and round).
    net = node_3_back_and_probed()
    probes = [m for m in net.take() if m.to == 3]
    assert [m.type for m in probes] == [MessageType.APPEND]
    silent = 0
    while True:
        net.tick(1)
        if any(m.type == MessageType.HEARTBEAT and m.to == 3 for m in net.take()):
            break
        silent += 1
    # (the probe was lost: asked again after half an election timeout)
    assert silent == ET // 2 - 1
    net.tick_all(ET)
    assert net[3].last_index == net[1].last_index and net[1].quiesced


def test_report_node_down_lets_quiesced_followers_elect_promptly() -> None:
    net = leader_net()
    net.tick_all(2)
    assert net[2].quiesced and net[3].quiesced
    net.isolate(1)
    for n in (2, 3):
        net[n].report_node_down(1)
        assert not net[n].quiesced
    for _ in range(2 * ET):
        net.tick(2)
        net.tick(3)
        net.deliver()
    assert net[2].role == Role.LEADER or net[3].role == Role.LEADER


def test_the_picked_successor_of_a_dead_leader_elects_alone_at_its_next_tick() -> None:
    net = leader_net()
    net.tick_all(2)
    net.isolate(1)
    net[2].report_node_down(1, first=True)
    net[3].report_node_down(1, first=False)
    net.tick(2)
    net.tick(3)
    net.deliver()
    assert net[2].role == Role.LEADER
    assert net[3].role == Role.FOLLOWER and net[3].leader_id == 2
    assert net[3].term == net[2].term  # one election: the other survivor never campaigned


def test_the_picked_successor_asks_again_when_a_voter_had_not_yet_seen_the_leader_die() -> None:
    net = leader_net()
    net.tick_all(2)
    net.isolate(1)
    net[2].report_node_down(1, first=True)
    net.tick(2)
    net.deliver()  # node 3 still follows 1 (in lease): it ignores this pre-vote
    assert net[2].role == Role.PRE_CANDIDATE
    net[3].report_node_down(1, first=False)
    for _ in range(QUICK_RETRY_TICKS):
        net.tick(2)
        net.deliver()
    assert net[2].role == Role.LEADER  # a few ticks, not another election timeout
    assert QUICK_RETRY_TICKS < ET


# ---------------------------------------------------------------- restart and persistence


def test_restart_restores_hard_state_and_log() -> None:
    net = leader_net()
    for i in range(3):
        net[1].propose(b"p%d" % i)
    net.deliver()
    hs = net.hard_states[2]
    node = net.start(2)
    assert (node.term, node.vote, node.commit) == (hs.term, hs.vote, hs.commit)
    assert node.last_index == net[1].last_index
    assert node.role == Role.FOLLOWER
    # The application is redelivered everything after what it says it applied.
    rd = node.ready()
    assert [e.index for e in rd.committed_entries] == list(range(0, hs.commit + 1))


def test_applied_config_skips_redelivery() -> None:
    st = log_of([1, 1, 1])
    cfg = RaftConfig(applied=1, seed=1)
    node = RaftNode(1, st, ConfState((1, 2, 3)), HardState(1, 0, 2), cfg)
    rd = node.ready()
    assert [e.index for e in rd.committed_entries] == [2]


def test_deliver_committed_false_moves_only_the_commit() -> None:
    net = leader_net(deliver_committed=False)
    net[1].propose(b"a")
    net.deliver()
    net.tick_all(1)
    assert net.committed[2] == []
    assert net.hard_states[2].commit == net[1].commit


# ---------------------------------------------------------------- robustness


def _garbage(rng: random.Random, to: int, term: int) -> Message:
    t = rng.choice(list(MessageType))
    n = rng.randint(0, 3)
    start = rng.randint(-3, 12)
    ents = []
    for i in range(n):
        k = rng.choice(list(EntryKind))
        ents.append(
            Entry(rng.randint(-1, term + 2), start + i, start + i + rng.randint(-1, 2), k, b"junk")
        )
    return Message(
        t,
        to,
        rng.randint(1, 4),
        rng.randint(0, term + 3),
        log_term=rng.randint(-1, term + 3),
        index=rng.randint(-5, 15),
        entries=ents,
        commit=rng.randint(-5, 15),
        reject=rng.random() < 0.5,
        reject_hint=rng.randint(-5, 15),
        context=rng.choice((b"", b"transfer", b"\x00" * 8, b"v=1;l=", b"garbage")),
    )


@pytest.mark.parametrize("target", [1, 2])
def test_garbage_messages_never_raise(target: int) -> None:
    rng = random.Random(target)
    net = leader_net()
    for i in range(3):
        net[1].propose(b"p%d" % i)
    net.deliver()
    node = net[target]
    for _ in range(3000):
        node.step(_garbage(rng, target, node.term))
        net.process(target)
        net.queue.clear()
        assert node.commit <= node.last_index
        assert net.storages[target].last_index() == node.last_index


def test_messages_for_someone_else_are_ignored() -> None:
    net = leader_net()
    before = net[2].term
    net[2].step(Message(MessageType.VOTE, 3, 1, before + 10))
    net[2].step(Message(MessageType.APPEND, 2, 2, before + 10))
    assert net[2].term == before


def test_node_ids_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RaftNode(0, MemoryStorage(), ConfState((1,)))


def test_status_reports_peer_progress_on_the_leader() -> None:
    net = leader_net()
    st = net[1].status()
    assert st.role == Role.LEADER and st.leader_id == 1
    assert set(st.progress) == {1, 2, 3}
    assert all(p.match == net[1].last_index for p in st.progress.values())
    assert net[2].status().progress == {}


def test_group_quiesces_without_a_follower_reported_down_and_wakes_when_it_returns() -> None:
    net = leader_net()
    net.isolate(3)
    net[1].propose(b"a")
    net.tick_all(3)
    assert not net[1].quiesced  # still waiting for 3
    net[1].report_node_down(3)
    net.tick_all(2)
    assert net[1].quiesced and net[2].quiesced
    net.heal()
    net.tick(3, 3 * ET)  # 3 times out and pre-votes: the leader wakes up...
    net.deliver()
    net[1].report_node_up(3)  # ... and once the liveness layer hears 3, catches it up
    net.tick_all(3)
    assert net[3].leader_id == 1 and net[3].commit == net[1].commit
    assert net[1].role == Role.LEADER


def test_inflight_bytes_cap_pauses_replication() -> None:
    net = leader_net(max_inflight_bytes=500, max_msg_bytes=200)
    net.cut.add((2, 1))  # no acks from 2
    for i in range(20):
        net[1].propose(b"y" * 100 + b"%d" % i)
    net.deliver()
    pr = net[1].prs[2]
    assert pr.state == ProgressState.REPLICATE and pr.inflights.full()
    assert pr.inflights.bytes >= 500
    sent = sum(len(m.entries) for m in net.sent if m.type == MessageType.APPEND and m.to == 2)
    assert sent < 20  # the rest waits for acknowledgements
    net.heal()
    net.tick_all(3)
    assert net.entries(2) == net.entries(1)


def test_a_heartbeat_answer_waits_for_durability_like_an_append_ack() -> None:
    # The runtime holds after_persist messages for the next group-commit pass. A heartbeat
    # answer sent before the append acknowledgement it follows overtakes it, and the leader's
    # probe for the lagging match kept groups from quiescing (Raft simulation seed 16273).
    net = leader_net()
    net[1].propose(b"x")
    appends = [m for m in net.take() if m.type == MessageType.APPEND and m.to == 2]
    heartbeats: list[Message] = []
    for _ in range(ET):
        net.tick(1)
        heartbeats += [m for m in net.take() if m.type == MessageType.HEARTBEAT and m.to == 2]
        if heartbeats:
            break
    assert appends and heartbeats
    net[2].step(appends[0])
    net[2].step(heartbeats[0])
    answers = net.take()
    acks = [m for m in answers if m.type == MessageType.APPEND_RESP]
    beats = [m for m in answers if m.type == MessageType.HEARTBEAT_RESP]
    assert acks and all(m.after_persist for m in acks)
    assert beats and all(m.after_persist for m in beats)


# ---------------------------------------------------------------- a restarted node rests


def _restarted_resting(net: Net, nid: int) -> RaftNode:
    """``nid`` dies (its leader is told, and goes quiet without it), then restarts and
    rests, as a restarting node does."""
    net.isolate(nid)
    for other in net.ids:
        if other != nid:
            net[other].report_node_down(nid)
    for _ in range(3):
        for other in net.ids:
            if other != nid:
                net.tick(other)
        net.deliver()
    assert net[1].quiesced
    node = net.start(nid)
    node.rest()
    net.process(nid)
    net.heal()
    assert node.quiesced and node.leader_id == 0
    return node


def _returning_node_probed(net: Net) -> tuple[RaftNode, list[Message]]:
    """Node 3 misses a write, restarts resting and is reported up: the leader's append to
    it, taken before any tick (not delivered)."""
    net.isolate(3)
    net[1].propose(b"written while 3 was away")
    net.deliver()
    node = _restarted_resting(net, 3)
    assert net[1].report_node_up(3)
    probe = net.take()  # before any tick: no heartbeat round trip first
    assert [(m.type, m.to) for m in probe] == [(MessageType.APPEND, 3)]
    return node, probe


def test_a_resting_replica_does_not_campaign_and_a_quiet_leader_calls_it_once() -> None:
    net = leader_net()
    node = _restarted_resting(net, 3)
    net.sent.clear()
    assert net[1].report_node_up(3)  # work to drain: one heartbeat, the group stays asleep
    net.deliver()
    heartbeats = [m for m in net.sent if m.type == MessageType.HEARTBEAT]
    assert [(m.to, m.quiesce) for m in heartbeats] == [(3, True)]
    assert net[1].quiesced and node.quiesced and node.leader_id == 1
    assert node.pre_votes == 0 and node.elections == 0
    net.sent.clear()
    assert not net[1].report_node_up(3)  # reported up twice (connection, then gossip): once
    net.deliver()
    assert net.sent == []


def test_a_leader_owing_a_returning_node_entries_sends_them_at_once() -> None:
    # The append holds everything the node lacks, all committed, and node 2 holds it too:
    # it puts the node to sleep once held, and its answer the group, with no heartbeat round.
    net = leader_net()
    node, probe = _returning_node_probed(net)
    assert [m.quiesce for m in probe] == [True]
    for m in probe:
        node.step(m)
    assert node.quiesced and node.leader_id == 1
    assert node.last_index == net[1].last_index and node.commit == net[1].commit
    net.sent.clear()
    net.deliver()
    assert [(m.type, m.quiesce) for m in net.sent] == [(MessageType.APPEND_RESP, True)]
    assert net[1].quiesced and node.quiesced


def test_a_second_up_report_of_the_same_return_sends_nothing_more() -> None:
    # A node's return is reported twice (its connection, then its gossip). The second report
    # reset what the leader knew it had sent, so every group of a restarted node heartbeated
    # it (plainly, waking it) while the quiescing append was on its way: 1.3-1.7 heartbeats a
    # group, then a quiescing round each. Now the append alone catches it up and quiets it.
    net = leader_net()
    node, probe = _returning_node_probed(net)
    assert not net[1].report_node_up(3)
    for _ in range(3):  # node 3 is slow to answer
        net.tick(1)
        assert [m for m in net.take() if m.to == 3 and not m.quiesce] == []
    for m in probe:
        node.step(m)
    assert node.quiesced
    net.sent.clear()
    net.deliver()
    assert [(m.type, m.quiesce) for m in net.sent] == [(MessageType.APPEND_RESP, True)]
    assert net[1].quiesced and node.last_index == net[1].last_index


def test_an_append_that_leaves_the_follower_behind_does_not_put_it_to_sleep() -> None:
    # The leader has an uncommitted entry: the append cannot quiesce anyone, and the
    # group quiesces only once the entry is committed and everyone was told.
    net = leader_net()
    net[1].propose(b"uncommitted")
    appends = [m for m in net.take() if m.type == MessageType.APPEND]  # (not delivered yet)
    assert appends and not any(m.quiesce for m in appends)
    for m in appends:
        net[m.to].step(m)
    assert not net[2].quiesced and not net[3].quiesced
    net.deliver()
    net.tick_all(3)
    assert all(net[n].quiesced for n in (1, 2, 3))
    assert net[2].commit == net[3].commit == net[1].commit == net[1].last_index


def test_a_resting_replica_no_leader_calls_campaigns_once_woken() -> None:
    net = Net([1, 2, 3], election_tick=ET)  # every node restarted: nobody leads
    for n in (1, 2, 3):
        net[n].rest()
        assert net[n].quiesced
    net[1].wake()
    for _ in range(2 * ET):
        net.tick(1)
        net.deliver()
    assert net[1].role == Role.LEADER and net[1].pre_votes >= 1


def test_an_asleep_follower_gets_no_heartbeats_while_a_returning_node_catches_up() -> None:
    # Node 2 answered the quiescing round asleep. While node 3 returns and is caught up the
    # leader ticks, but sends 2 nothing (2 does not tick: nothing to keep from campaigning),
    # and the answer that brings 3 level puts the group back to sleep without waiting a tick.
    net = leader_net()
    node, probe = _returning_node_probed(net)
    assert net[2].quiesced
    net.tick(1, 3)  # node 3's answer is slow
    assert not [m for m in net.take() if m.to == 2]
    for m in probe:
        node.step(m)  # level, and asleep: the append said the group is quiet otherwise
    for m in net.take():
        net[m.to].step(m)  # 3's answer: 3 is level and asleep
    assert net.take() == []  # no quiescing round: everyone already sleeps
    assert all(net[n].quiesced for n in (1, 2, 3))
    assert node.commit == net[1].commit == net[2].commit


def test_an_asleep_follower_woken_by_its_own_node_is_heartbeated_again() -> None:
    # The leader counts node 2 asleep, but 2 woke for its own reasons (its node restarted
    # the group's timer). Its first campaign message wakes the leader, which heartbeats it
    # again instead of letting it campaign on. The pre-vote also woke node 3, which tells
    # the leader so at once: 3 never times out and campaigns in turn. Nobody's term moves.
    net = leader_net()
    net.tick_all(2)
    assert all(net[n].quiesced for n in (1, 2, 3))
    term = net[1].term
    net.sent.clear()
    net[2].wake()
    for _ in range(3 * ET):  # (as a node's runtime does: only awake replicas tick)
        for n in (1, 2, 3):
            if not net[n].quiesced:
                net.tick(n)
        net.deliver()
    assert net[1].role == Role.LEADER and net[2].leader_id == 1
    assert all(net[n].term == term for n in (1, 2, 3))
    assert all(net[n].quiesced for n in (1, 2, 3))
    campaigners = {m.frm for m in net.sent if m.type == MessageType.PRE_VOTE}
    assert campaigners == {2}
