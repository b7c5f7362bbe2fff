"""The metadata voters follow the cluster: the planner's decisions, case by case."""

from __future__ import annotations

from laminar.node.metadata_voters import Follower, HandOver, Promote, Remove, next_step

UP = Follower(match=1000, recent_active=True)
BEHIND = Follower(match=10, recent_active=True)


def step(voters, learners, eligible, live=None, followers=None, me=1):  # type: ignore[no-untyped-def]
    everyone = set(voters) | set(learners)
    followers = followers if followers is not None else {n: UP for n in everyone if n != me}
    live = eligible if live is None else live
    return next_step(me, voters, learners, eligible, live, followers, last_index=1000)


def test_grows_to_five_voters_once_five_nodes_are_eligible() -> None:
    assert step([1, 2, 3], [4], [1, 2, 3, 4]) is None, "four nodes: three voters"
    assert step([1, 2, 3], [4, 5], [1, 2, 3, 4, 5]) == Promote(4)
    assert step([1, 2, 3, 4], [5], [1, 2, 3, 4, 5]) == Promote(5)
    assert step([1, 2, 3, 4, 5], [], [1, 2, 3, 4, 5]) is None


def test_only_caught_up_live_learners_are_promoted() -> None:
    followers = {2: UP, 3: UP, 4: BEHIND, 5: UP}
    assert step([1, 2, 3], [4, 5], [1, 2, 3, 4, 5], followers=followers) == Promote(5)
    assert step([1, 2, 3], [4, 5], [1, 2, 3, 4, 5], live=[1, 2, 3, 4]) == Promote(4)
    assert step([1, 2, 3], [4, 5], [1, 2, 3, 4, 5], live=[1, 2, 3], followers=followers) is None


def test_losing_two_of_the_first_three_leaves_three_good_voters() -> None:
    eligible = [3, 4, 5]  # 1 and 2 are gone
    assert step([1, 2, 3, 4, 5], [], eligible, me=3) == Remove(1)
    assert step([2, 3, 4, 5], [], eligible, me=3) == Remove(2)
    assert step([3, 4, 5], [], eligible, me=3) is None


def test_a_gone_voter_stays_until_a_replacement_exists() -> None:
    assert step([1, 2, 3], [], [1, 2]) is None, "no learner: removing it would not help"
    assert step([1, 2, 3], [4], [1, 2, 4]) == Promote(4)
    assert step([1, 2, 3, 4], [], [1, 2, 4]) == Remove(3)


def test_a_draining_leader_hands_over_before_it_is_removed() -> None:
    eligible = [2, 3, 4]  # 1 (this leader) is draining
    assert step([1, 2, 3], [4], eligible) == Promote(4)
    assert step([1, 2, 3, 4], [], eligible) == HandOver(2)
    assert step([1, 2, 3, 4], [], eligible, followers={2: BEHIND, 3: UP, 4: UP}) == HandOver(3)
