"""Consumer groups on key-range topics: a child is given to a member only once the group has
committed every parent to its seal end (the coordinator, sans-I/O)."""

from __future__ import annotations

from laminar.groups.assignor import AssignorMember, assign
from laminar.groups.coordinator import Coordinator
from laminar.groups.lineage import RangePartition, blocked, starts
from tests.test_group_coordinator import CONFIG, Harness, tps

# t/0 was split into 1 and 2; 1 then into 3 and 4 (3 and 4 still pending).
LINEAGE = {
    "t": {
        0: RangePartition("sealed", (), 5),
        1: RangePartition("sealed", (0,), 7),
        2: RangePartition("active", (0,), -1),
        3: RangePartition("pending", (1,), -1),
        4: RangePartition("pending", (1,), -1),
    }
}


class _Offset:
    def __init__(self, offset: int) -> None:
        self.offset = offset


def test_blocked_follows_commits_along_the_lineage() -> None:
    assert blocked(LINEAGE, {"t"}, {}) == tps("t", 1, 2, 3, 4)
    assert blocked(LINEAGE, {"t"}, {("t", 0): _Offset(4)}) == tps("t", 1, 2, 3, 4)
    at_seal = {("t", 0): _Offset(5)}
    assert blocked(LINEAGE, {"t"}, at_seal) == tps("t", 0, 3, 4)
    assert blocked(LINEAGE, {"other"}, {}) == frozenset()
    assert starts(LINEAGE, tps("t", 1, 2, 3, 4), tps("t", 0, 3, 4)) == [("t", 1), ("t", 2)]


def test_assignor_gives_excluded_partitions_to_nobody() -> None:
    members = [AssignorMember("a", frozenset({"t"})), AssignorMember("b", frozenset({"t"}))]
    current = {"a": tps("t", 0, 1)}
    target = assign(members, {"t": 4}, current, None, tps("t", 0, 3))
    assert target["a"] | target["b"] == tps("t", 1, 2)


def test_children_are_assigned_once_the_parent_is_committed_to_its_seal() -> None:
    h = Harness({"t": 5})
    h.coord = Coordinator(CONFIG, {"t": 5}, 0, lineage=LINEAGE)
    assert h.hb("a", 0) == h.hb("a", 1)  # steady
    assert h.owned["a"] == tps("t", 0)
    h.hb("b", 2)
    assert h.owned["b"] == frozenset()  # nothing else may be read yet
    h.commit("a", {("t", 0): (3, "")}, 3)
    assert h.hb("a", 4).assignment == tps("t", 0)
    h.commit("a", {("t", 0): (5, "")}, 5)  # read to the seal: the children are free
    offsets = h.coord.fetch_offsets("g").value
    assert {tp: v.offset for tp, v in offsets.items()} == {("t", 0): 5, ("t", 1): 0, ("t", 2): 0}
    h.hb("a", 6)  # gives 0 up
    h.hb("a", 7)
    h.hb("b", 8)
    owned = h.owned["a"] | h.owned["b"]
    assert owned == tps("t", 1, 2) and h.owned["a"] and h.owned["b"]
    # the splits of 1 finish: 3 and 4 stay blocked until 1 is read to its seal
    lineage = {
        "t": {
            **LINEAGE["t"],
            3: RangePartition("active", (1,), -1),
            4: RangePartition("active", (1,), -1),
        }
    }
    h.coord.set_lineage(lineage)
    h.coord.topics_changed({"t": 5}, 9)
    h.flush()
    holder = "a" if ("t", 1) in h.owned["a"] else "b"
    h.commit(holder, {("t", 1): (7, "")}, 10)
    for now in range(11, 16):
        h.hb("a", now)
        h.hb("b", now)
    assert h.owned["a"] | h.owned["b"] == tps("t", 2, 3, 4)


def test_a_new_coordinator_applies_the_lineage_on_load() -> None:
    h = Harness({"t": 5})
    h.coord = Coordinator(CONFIG, {"t": 5}, 0, lineage=LINEAGE)
    h.hb("a", 0)
    h.commit("a", {("t", 0): (5, "")}, 1)
    again = Coordinator(CONFIG, {"t": 5}, 2, h.log, lineage=LINEAGE)
    state = again.state.groups["g"]
    assert state.target_members["a"].partitions == (("t", 1), ("t", 2))
