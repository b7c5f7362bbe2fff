"""Which nodes vote in the metadata group: the voters follow the cluster.

The first nodes of a new cluster start as the metadata group's voters and every later node
joins as a learner. Left at that, losing two of the first three nodes would stop the control
plane for good, and draining one would never move its vote. So the metadata leader keeps the
voters at 5 once 5 eligible nodes exist (3 before): it promotes caught-up learners while fewer
good voters exist than that, and removes voters that are gone (dead for longer than
``node_dead_after``) or draining once enough good ones remain. One change at a time (the Raft
core allows no more); the leader never removes itself, it hands leadership over first.

``next_step`` is a pure function of what the leader knows, tested on its own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

CATCH_UP_SLACK = 64
"""A learner within this many entries of the leader's log counts as caught up."""


@dataclass(frozen=True, slots=True)
class Follower:
    match: int
    recent_active: bool


@dataclass(frozen=True, slots=True)
class Promote:
    node_id: int


@dataclass(frozen=True, slots=True)
class Remove:
    node_id: int


@dataclass(frozen=True, slots=True)
class HandOver:
    """The leader itself must leave the voters: transfer leadership to ``node_id`` first."""

    node_id: int


Step = Promote | Remove | HandOver


def wanted_voters(eligible: int) -> int:
    return 5 if eligible >= 5 else 3


def next_step(
    me: int,
    voters: Collection[int],
    learners: Collection[int],
    eligible: Collection[int],
    live: Collection[int],
    followers: Mapping[int, Follower],
    last_index: int,
) -> Step | None:
    """The next membership change of the metadata group, or None when it is as it should be.

    ``eligible``: registered nodes that are neither gone nor draining nor re-admitting after
    a loss of state; ``live``: those reachable now (promotion needs a live, caught-up learner).
    """
    target = wanted_voters(len(eligible))
    good = [v for v in voters if v in eligible]
    bad = sorted(v for v in voters if v not in eligible)

    def caught_up(node_id: int) -> bool:
        follower = followers.get(node_id)
        return (
            node_id in live
            and follower is not None
            and follower.recent_active
            and follower.match >= last_index - CATCH_UP_SLACK
        )

    if len(good) < target:
        ready = sorted(n for n in learners if n in eligible and caught_up(n))
        if ready:
            return Promote(ready[0])
    if bad and (len(good) >= target or len(voters) > target):
        victim = next((v for v in bad if v != me), bad[0])
        if victim != me:
            return Remove(victim)
        successors = sorted(v for v in good if caught_up(v))
        return HandOver(successors[0]) if successors else None
    return None
