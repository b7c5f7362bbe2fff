"""The sticky assignor: validity, balance, stickiness, minimal movement, determinism."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from laminar.groups.assignor import AssignorMember, assign

TOPICS = ["a", "b", "c"]


def _all(partitions: dict[str, int], topics: frozenset[str]) -> set[tuple[str, int]]:
    return {(t, i) for t in topics for i in range(partitions.get(t, 0))}


def _check_valid(members, partitions, result) -> None:
    owners = Counter(tp for tps in result.values() for tp in tps)
    assert all(n == 1 for n in owners.values()), "a partition went to two members"
    subscribed = set().union(*(m.topics for m in members)) if members else set()
    assert set(owners) == _all(partitions, frozenset(subscribed)), "not every partition assigned"
    by_id = {m.member_id: m for m in members}
    for mid, tps in result.items():
        assert all(t in by_id[mid].topics for t, _ in tps), f"{mid} got a topic it did not ask for"


def _check_balanced(members, result) -> None:
    by_subscription: dict[frozenset[str], list[int]] = {}
    for m in members:
        by_subscription.setdefault(m.topics, []).append(len(result[m.member_id]))
    for topics, counts in by_subscription.items():
        assert max(counts) - min(counts) <= 1, f"subscription {sorted(topics)}: counts {counts}"


members_st = st.lists(
    st.tuples(
        st.sampled_from(["m1", "m2", "m3", "m4", "m5", "m6", "m7"]),
        st.frozensets(st.sampled_from(TOPICS), min_size=1),
        st.sampled_from([None, "r1", "r2"]),
    ),
    max_size=7,
    unique_by=lambda x: x[0],
)
partitions_st = st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 24))


@st.composite
def scenarios(draw):
    members = [AssignorMember(mid, topics, rack) for mid, topics, rack in draw(members_st)]
    partitions = draw(partitions_st)
    # A "current" assignment that may be stale: unknown members, vanished partitions, overlaps.
    everything = sorted((t, i) for t in TOPICS for i in range(26))
    current = {}
    for mid in ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "gone"]:
        if draw(st.booleans()):
            current[mid] = frozenset(draw(st.lists(st.sampled_from(everything), max_size=12)))
    return members, partitions, current


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_every_partition_once_to_a_subscriber_and_balanced(scenario) -> None:
    members, partitions, current = scenario
    result = assign(members, partitions, current)
    assert set(result) == {m.member_id for m in members}
    _check_valid(members, partitions, result)
    _check_balanced(members, result)


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_same_input_in_any_order_gives_the_same_output(scenario, rnd: random.Random) -> None:
    members, partitions, current = scenario
    expected = assign(members, partitions, current)
    shuffled_members = list(members)
    rnd.shuffle(shuffled_members)
    shuffled_partitions = dict(rnd.sample(sorted(partitions.items()), len(partitions)))
    shuffled_current = dict(rnd.sample(sorted(current.items()), len(current)))
    assert assign(shuffled_members, shuffled_partitions, shuffled_current) == expected


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_a_balanced_valid_assignment_is_kept_as_is(scenario) -> None:
    members, partitions, current = scenario
    first = assign(members, partitions, current)
    assert assign(members, partitions, first) == first


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 8),
    st.integers(0, 64),
    st.integers(1, 3),
    st.randoms(use_true_random=False),
)
def test_movement_is_minimal_for_a_homogeneous_group(n, count, joiners, rnd) -> None:
    """Members joining or leaving move only the surplus: the sum over members of what they
    had beyond their new count, nothing more."""
    members = [AssignorMember(f"m{i:02d}", frozenset({"a"})) for i in range(n)]
    before = assign(members, {"a": count}, {})
    if rnd.random() < 0.5:
        after_members = members + [
            AssignorMember(f"n{i:02d}", frozenset({"a"})) for i in range(joiners)
        ]
    else:
        after_members = rnd.sample(members, max(1, n - joiners))
    after = assign(after_members, {"a": count}, before)
    _check_balanced(after_members, after)
    moved = sum(
        len(after[m.member_id] - before.get(m.member_id, frozenset())) for m in after_members
    )
    orphaned = count - sum(len(before.get(m.member_id, ())) for m in after_members)
    surplus = sum(
        max(0, len(before.get(m.member_id, ())) - len(after[m.member_id])) for m in after_members
    )
    # What a member gains comes from the departed (orphaned) or from another member's surplus.
    assert moved == orphaned + surplus
    for m in after_members:
        kept = before.get(m.member_id, frozenset()) & after[m.member_id]
        assert len(kept) == min(len(before.get(m.member_id, ())), len(after[m.member_id]))


def test_new_member_takes_only_from_the_surplus() -> None:
    members = [AssignorMember(m, frozenset({"t"})) for m in ("a", "b", "c")]
    before = assign(members, {"t": 12}, {})
    assert sorted(len(v) for v in before.values()) == [4, 4, 4]
    after = assign([*members, AssignorMember("d", frozenset({"t"}))], {"t": 12}, before)
    assert sorted(len(v) for v in after.values()) == [3, 3, 3, 3]
    for m in ("a", "b", "c"):
        assert after[m] <= before[m], "a staying member gained or swapped partitions"


def test_heterogeneous_subscriptions() -> None:
    members = [
        AssignorMember("a", frozenset({"x"})),
        AssignorMember("b", frozenset({"x", "y"})),
        AssignorMember("c", frozenset({"y"})),
    ]
    result = assign(members, {"x": 4, "y": 4}, {})
    _check_valid(members, {"x": 4, "y": 4}, result)
    assert sorted(len(v) for v in result.values()) == [2, 3, 3]


def test_rack_breaks_ties_without_costing_balance() -> None:
    members = [
        AssignorMember("a", frozenset({"t"}), "r1"),
        AssignorMember("b", frozenset({"t"}), "r2"),
    ]
    racks = {("t", i): frozenset({"r1" if i % 2 == 0 else "r2"}) for i in range(6)}
    result = assign(members, {"t": 6}, {}, racks)
    assert result["a"] == {("t", 0), ("t", 2), ("t", 4)}
    assert result["b"] == {("t", 1), ("t", 3), ("t", 5)}
    # All replicas in r1: balance still wins.
    all_r1 = {tp: frozenset({"r1"}) for tp in racks}
    assert sorted(len(v) for v in assign(members, {"t": 6}, {}, all_r1).values()) == [3, 3]


def test_duplicate_member_ids_are_refused() -> None:
    m = AssignorMember("a", frozenset({"t"}))
    try:
        assign([m, m], {"t": 1}, {})
    except ValueError:
        return
    raise AssertionError("duplicate ids accepted")
