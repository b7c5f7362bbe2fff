"""Vote requests for a group a node does not host yet wait for its replica to open, briefly
and boundedly; the opened replica elects a leader from them without a second campaign."""

from __future__ import annotations

import pytest

from laminar.node import early_messages
from laminar.node.early_messages import KEEP_SECONDS, PER_GROUP, EarlyMessages
from laminar.raft import Message, MessageType
from tests.raft_harness import Net


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def request(kind: MessageType, term: int) -> Message:
    return Message(kind, 2, 1, term, log_term=0, index=-1)


def test_the_newest_vote_requests_are_kept_until_the_group_opens() -> None:
    early = EarlyMessages()
    early.keep(7, 1, request(MessageType.PRE_VOTE, 1))
    early.keep(7, 1, request(MessageType.APPEND, 1))  # a leader retries its appends itself
    early.keep(7, 1, request(MessageType.VOTE, 1))
    early.keep(7, 3, request(MessageType.PRE_VOTE, 2))
    kept = early.take(7)
    assert len(kept) == PER_GROUP
    assert [(peer, m.type, m.term) for peer, m in kept] == [
        (1, MessageType.VOTE, 1),
        (3, MessageType.PRE_VOTE, 2),
    ]
    assert early.take(7) == [] and len(early) == 0


def test_requests_expire_and_their_number_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    early = EarlyMessages(clock)
    early.keep(1, 2, request(MessageType.PRE_VOTE, 1))
    clock.now += KEEP_SECONDS + 0.1
    assert early.take(1) == []  # too old to be worth handing over
    early.keep(2, 2, request(MessageType.PRE_VOTE, 1))
    clock.now += KEEP_SECONDS + 0.1
    early.keep(3, 2, request(MessageType.PRE_VOTE, 1))
    early.expire()
    assert len(early) == 1 and early.take(3)
    monkeypatch.setattr(early_messages, "MAX_GROUPS", 10)
    for group in range(20):
        early.keep(group, 2, request(MessageType.PRE_VOTE, 1))
    assert len(early) == 10


def test_a_replica_that_opens_late_answers_the_first_campaign() -> None:
    # Node 3 opens the new group only after node 1's (pre-)vote requests arrived: handed the
    # kept requests, it answers them, and node 1 leads without waiting for another timeout.
    net = Net([1, 2, 3], election_tick=10)
    early = EarlyMessages()
    net.cut |= {(1, 2), (2, 1)}  # node 2 is slow too: node 1 needs node 3's votes
    net[1].campaign()
    for _ in range(2):  # pre-vote round, then the vote round
        for m in net.take():
            if m.to == 3:
                early.keep(99, m.frm, m)  # not hosted yet: kept, not stepped
        for _peer, m in early.take(99):  # node 3 opens the group
            net[3].step(m)
        for m in net.take():
            net[m.to].step(m)
    assert net[1].role.name == "LEADER"
