"""Membership changes: learners, promotion, removal, one-at-a-time rule, restart and reset."""

from __future__ import annotations

import pytest

from laminar.raft import (
    ConfChange,
    ConfChangeRejected,
    ConfChangeType,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    RaftConfig,
    RaftNode,
    Role,
    decode_conf,
    encode_conf,
)
from tests.raft_harness import Net, log_of

ADD_LEARNER = ConfChangeType.ADD_LEARNER
PROMOTE = ConfChangeType.PROMOTE
REMOVE = ConfChangeType.REMOVE
ADD_VOTER = ConfChangeType.ADD_VOTER
ET = 10


def cluster(n: int = 3, **cfg: object) -> Net:
    net = Net(range(1, n + 1), election_tick=ET, **cfg)
    net.elect(1)
    assert net[1].role == Role.LEADER
    return net


def add_learner(net: Net, nid: int) -> None:
    net[1].propose_conf_change(ConfChange(ADD_LEARNER, nid))
    net.start(nid, ConfState(()))
    net.deliver()


def test_conf_encoding_round_trips_and_rejects_garbage() -> None:
    conf = ConfState((1, 2, 5), (7,))
    back = decode_conf(encode_conf(conf), 9)
    assert back is not None and back.same_members(conf) and back.index == 9
    for junk in (b"", b"v=1", b"v=a;l=", b"v=1;l=1", b"\xff\xfe", b"v=0;l=", b"x=1;l="):
        assert decode_conf(junk) is None


def test_learner_catches_up_but_neither_votes_nor_counts() -> None:
    net = cluster()
    for i in range(5):
        net[1].propose(b"p%d" % i)
    net.deliver()
    add_learner(net, 4)
    assert net[1].conf == ConfState((1, 2, 3), (4,), net[1].conf.index)
    assert net.entries(4) == net.entries(1)
    assert net[4].is_learner and net[4].commit == net[1].commit
    # The learner never campaigns.
    net.tick(4, 5 * ET)
    assert net[4].role == Role.FOLLOWER and not any(
        m.frm == 4 and m.type in (MessageType.VOTE, MessageType.PRE_VOTE) for m in net.sent
    )
    # Leader + learner are not a quorum.
    net.isolate(2)
    net.isolate(3)
    net.cut -= {(1, 4), (4, 1)}
    before = net[1].commit
    net[1].propose(b"needs voters")
    net.deliver()
    assert net[4].last_index == net[1].last_index
    assert net[1].commit == before


def test_promoted_learner_counts_for_commit() -> None:
    net = cluster()
    add_learner(net, 4)
    net[1].propose_conf_change(ConfChange(PROMOTE, 4))
    net.deliver()
    assert net[1].conf.voters == (1, 2, 3, 4)
    assert net.confs[4].voters == (1, 2, 3, 4)
    net.isolate(3)
    net.isolate(2)
    net.cut -= {(1, 4), (4, 1), (1, 2), (2, 1)}
    net[1].propose(b"x")
    net.deliver()
    assert net[1].commit == net[1].last_index  # 1, 2 and 4 are 3 of 4


def test_removed_voter_no_longer_needed_for_quorum() -> None:
    net = cluster()
    net[1].propose_conf_change(ConfChange(REMOVE, 3))
    net.deliver()
    assert net[1].conf.voters == (1, 2)
    assert 3 not in net[1].prs
    assert net.confs[2].voters == (1, 2)
    net.isolate(3)
    net[1].propose(b"x")
    net.deliver()
    assert net[1].commit == net[1].last_index


def test_only_one_change_at_a_time() -> None:
    net = cluster()
    net.isolate(2)
    net.isolate(3)
    net[1].propose_conf_change(ConfChange(ADD_LEARNER, 4))
    with pytest.raises(ConfChangeRejected):
        net[1].propose_conf_change(ConfChange(ADD_LEARNER, 5))
    net.heal()
    net.tick_all(2)
    net[1].propose_conf_change(ConfChange(ADD_LEARNER, 5))  # the first one committed


def test_leader_must_commit_in_its_term_before_a_change() -> None:
    net = Net([1, 2, 3], election_tick=ET)
    net.drop = lambda m: m.type == MessageType.APPEND
    net.elect(1)
    assert net[1].role == Role.LEADER
    with pytest.raises(ConfChangeRejected):
        net[1].propose_conf_change(ConfChange(ADD_LEARNER, 4))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (ConfChange(REMOVE, 1), "leader"),
        (ConfChange(REMOVE, 9), "not a member"),
        (ConfChange(PROMOTE, 2), "not a learner"),
        (ConfChange(ADD_LEARNER, 2), "already"),
        (ConfChange(ADD_VOTER, 3), "already"),
        (ConfChange(ADD_LEARNER, 0), "invalid"),
    ],
)
def test_invalid_changes_are_rejected_with_a_reason(change: ConfChange, why: str) -> None:
    net = cluster()
    with pytest.raises(ConfChangeRejected, match=why):
        net[1].propose_conf_change(change)


def test_config_takes_effect_on_append_and_reverts_on_truncation() -> None:
    net = cluster()
    net.isolate(3)
    net.cut.add((2, 1))  # 2 gets the entry but its ack is lost
    net[1].propose_conf_change(ConfChange(ADD_LEARNER, 4))
    net.deliver()
    assert net[2].conf.learners == (4,)  # effective on append, before commit
    assert net[2].committed_conf.learners == ()
    assert net[1].commit < net[1].last_index
    # The old leader is cut off with its uncommitted change; 2 and 3 move on without it...
    net.isolate(1)
    net.isolate(2)
    net.cut -= {(2, 3), (3, 2)}
    for n in (2, 3):
        net[n].report_node_down(1)
    net.tick_all(3 * ET)
    assert net[2].role == Role.LEADER  # only 2 has the longer log
    assert net[2].conf.learners == (4,)
    # ...and 1 reverts its configuration when a newer leader overwrites its tail.
    old = RaftNode(1, log_of([1, 1]), ConfState((1, 2, 3)), HardState(2, 0, 0))
    cfg_entry = Entry(2, 2, 2, EntryKind.CONFIG, encode_conf(ConfState((1, 2, 3), (4,))))
    append = lambda ents, prev, term: old.step(  # noqa: E731
        Message(MessageType.APPEND, 1, 2, term, log_term=1, index=prev, entries=ents)
    )
    append([cfg_entry], 1, 2)
    assert old.conf.learners == (4,)
    append([Entry(3, 2, 2, EntryKind.NOOP, b"")], 1, 3)
    assert old.conf.learners == ()
    assert old.last_index == 2 and old.log.term(2) == 3


def test_restart_rescans_uncommitted_config_entries() -> None:
    conf_entry = Entry(1, 2, 2, EntryKind.CONFIG, encode_conf(ConfState((1, 2, 3), (4,))))
    st = log_of([1, 1])
    st.append([conf_entry])
    node = RaftNode(1, st, ConfState((1, 2, 3)), HardState(1, 0, 1), RaftConfig(seed=1))
    assert node.conf.learners == (4,)
    assert node.committed_conf.learners == ()
    # With the entry committed and the configuration persisted at its offset: no rescan needed.
    node = RaftNode(1, st, ConfState((1, 2, 3), (4,), 2), HardState(1, 0, 2), RaftConfig(seed=1))
    assert node.conf.learners == (4,)


def test_committed_config_reaches_ready_even_without_delivering_entries() -> None:
    net = cluster(deliver_committed=False)
    net[1].propose_conf_change(ConfChange(ADD_LEARNER, 4))
    net.start(4, ConfState(()))
    net.deliver()
    for n in (1, 2, 3, 4):
        assert net.confs[n].learners == (4,), n
        assert net.committed[n] == []


def test_learner_joining_after_compaction_learns_config_from_reset() -> None:
    net = cluster()
    for i in range(6):
        net[1].propose(b"p%d" % i)
    net.deliver()
    add_learner(net, 4)
    for n in (1, 2, 3):
        net.storages[n].compact(net[n].commit)
    net.start(5, ConfState(()))
    net[1].propose_conf_change(ConfChange(ADD_LEARNER, 5))
    net.deliver()
    net.tick_all(3)
    assert any(m.type == MessageType.RESET and m.to == 5 for m in net.sent)
    assert net[5].conf.learners == (4, 5)
    assert net.confs[5].learners in ((4,), (4, 5))
    assert net[5].commit == net[1].commit
    net[1].propose_conf_change(ConfChange(PROMOTE, 5))
    net.deliver()
    net.isolate(1)
    net[5].report_node_down(1)
    for n in (2, 3, 5):
        net[n].report_node_down(1)
    net.tick_all(4 * ET)
    leaders = [n for n in (2, 3, 4, 5) if net[n].role == Role.LEADER]
    assert len(leaders) == 1 and leaders[0] != 4


def test_add_voter_directly_and_the_new_voter_can_lead() -> None:
    net = cluster()
    net[1].propose_conf_change(ConfChange(ADD_VOTER, 4))
    net.start(4, ConfState(()))
    net.deliver()
    net.tick_all(2)
    assert net[4].conf.voters == (1, 2, 3, 4) and net[4].promotable()
    net[1].transfer_leader(4)
    net.deliver()
    assert net[4].role == Role.LEADER
    net[4].propose(b"from 4")
    net.deliver()
    net.tick_all(1)  # (followers learn a write's commit from the next round)
    assert all(net[n].commit == net[4].commit for n in (1, 2, 3, 4))


def test_a_member_added_after_a_down_report_holds_off_quiescence() -> None:
    """A node reported down, removed, then added back as a learner must be caught up before
    the group goes quiet (the node layer may never repeat its up report for this group)."""
    net = cluster(4)
    net[1].report_node_down(4)
    net[1].propose_conf_change(ConfChange(REMOVE, 4))
    net.deliver()
    net.isolate(4)
    for i in range(5):
        net[1].propose(b"while away %d" % i)
    net.deliver()
    net[1].propose_conf_change(ConfChange(ADD_LEARNER, 4))
    net.deliver()
    net.tick_all(3)
    assert not net[1].quiesced, "the new learner lags: the leader must keep heartbeating"
    net.heal()
    for _ in range(5):
        net.tick_all(1)
        net.deliver()
    assert net.entries(4) == net.entries(1)


def test_a_learner_recreated_empty_is_caught_up_again() -> None:
    """A replica moved back onto a node starts with an empty log under the same node id; the
    leader must not trust the match its earlier incarnation acknowledged."""
    net = cluster()
    add_learner(net, 4)
    for i in range(5):
        net[1].propose(b"before %d" % i)
    net.deliver()
    assert net.entries(4) == net.entries(1)
    net.storages[4] = MemoryStorage()  # a fresh, empty replica with the same id
    net.hard_states.pop(4, None)
    net.start(4, ConfState((1, 2, 3), (4,)))
    assert net.entries(4) == []
    net[1].propose(b"after")
    net.deliver()
    for _ in range(3):
        net.tick_all(1)
        net.deliver()
    assert net.entries(4) == net.entries(1)
