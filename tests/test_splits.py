"""Key-range partitioning: the range map, the split/merge metadata commands and the seal in a
partition's log (no I/O beyond a temporary log directory)."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar import cli_split
from laminar.client.descriptions import PartitionDescription, TopicDescription, TopicOperation
from laminar.errors import InvalidRequestError
from laminar.node import metadata_checkpoint as checkpoints
from laminar.node.log_storage import LogStorage
from laminar.node.metadata import MetadataState
from laminar.raft import Entry, EntryKind
from laminar.segment.batch import build_batch
from laminar.segment.log import LogConfig, PartitionLog
from laminar.splits import ops
from laminar.splits.auto import AutoScaler, PartitionView, Policy, policy_of
from laminar.splits.ranges import (
    HASH_SPACE,
    RangeMap,
    check_tiling,
    initial_ranges,
    key_hash,
    merge_ranges,
    split_range,
)
from laminar.splits.seal import seal_batch

SETTINGS = {
    "partitions": 1,
    "replication_factor": 1,
    "segment_bytes": 1 << 20,
    "segment_ms": 1000,
    "retention_ms": None,
    "retention_bytes": None,
    "partitioning": "range",
}


def range_topic(state: MetadataState, partitions: int = 1) -> object:
    settings_ = {**SETTINGS, "partitions": partitions}
    command = {"op": "create_topic", "name": "t", "settings": settings_}
    return state.apply({**command, "replicas": [[1]] * partitions})


def begin_split(state: MetadataState, partition: int, at: int | None = None, op: str = "") -> dict:
    topic = state.topics["t"]
    command = {"op": "begin_split", "name": "t", "partition": partition, "at": at}
    state.apply({**command, "from": len(topic.partitions), "replicas": [[1], [1]]})
    return state.topics["t"].operation | {"op_id": op}


def begin_merge(state: MetadataState, first: int, second: int) -> dict:
    topic = state.topics["t"]
    command = {"op": "begin_merge", "name": "t", "partitions": [first, second]}
    state.apply({**command, "from": len(topic.partitions), "replicas": [[1]]})
    return state.topics["t"].operation


def finish(state: MetadataState, operation: dict, end: int = 10) -> None:
    ends = {str(p): end for p in operation["parents"]}
    state.apply({"op": "finish_op", "name": "t", "op_id": operation["id"], "ends": ends})


def active_ranges(state: MetadataState) -> list[tuple[int, int]]:
    return sorted(
        (a.range_start, a.range_end) for a in state.topics["t"].partitions if a.state == "active"
    )


# the range map ----------------------------------------------------------------------------
def test_initial_ranges_tile_the_space() -> None:
    for count in (1, 2, 3, 7, 64):
        ranges = initial_ranges(count)
        check_tiling(ranges)
        assert len(ranges) == count
    with pytest.raises(InvalidRequestError):
        initial_ranges(0)


def test_split_and_merge_ranges() -> None:
    assert split_range((0, HASH_SPACE)) == ((0, 1 << 31), (1 << 31, HASH_SPACE))
    assert split_range((0, 10), 3) == ((0, 3), (3, 10))
    for bad in (0, 10, 11, -1):
        with pytest.raises(InvalidRequestError):
            split_range((0, 10), bad)
    with pytest.raises(InvalidRequestError):
        split_range((5, 6))
    assert merge_ranges((3, 10), (0, 3)) == (0, 10)
    with pytest.raises(InvalidRequestError):
        merge_ranges((0, 3), (4, 10))


def test_range_map_routes_every_hash_to_its_owner() -> None:
    routes = RangeMap([(7, (1 << 31, HASH_SPACE)), (3, (0, 100)), (5, (100, 1 << 31))])
    assert routes.partitions == [3, 5, 7]
    assert [routes.owner(h) for h in (0, 99, 100, (1 << 31) - 1, 1 << 31, HASH_SPACE - 1)] == [
        3,
        3,
        5,
        5,
        7,
        7,
    ]
    key = b"some key"
    assert routes.owner_of_key(key) == routes.owner(key_hash(key))
    with pytest.raises(ValueError):
        RangeMap([(1, (0, 100)), (2, (101, HASH_SPACE))])  # a gap
    with pytest.raises(ValueError):
        RangeMap([(1, (0, 100)), (2, (50, HASH_SPACE))])  # an overlap


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 1 << 40)), max_size=40))
def test_active_ranges_always_tile_the_space(steps: list[tuple[bool, int]]) -> None:
    """Any sequence of splits (at arbitrary points) and merges of adjacent active partitions,
    through the metadata state machine, leaves active ranges that tile the space exactly and
    route every key to one active partition."""
    state = MetadataState()
    range_topic(state, 2)
    for is_split, choice in steps:
        topic = state.topics["t"]
        active = sorted(
            (i for i, a in enumerate(topic.partitions) if a.state == "active"),
            key=lambda i: topic.partitions[i].range_start,
        )
        if is_split or len(active) < 2:
            victim = active[choice % len(active)]
            start, end = topic.partitions[victim].range_start, topic.partitions[victim].range_end
            if end - start < 2:
                continue
            at = start + 1 + choice % (end - start - 1)
            operation = begin_split(state, victim, at)
        else:
            index = choice % (len(active) - 1)
            operation = begin_merge(state, active[index], active[index + 1])
        check_tiling(active_ranges(state))  # unchanged while the operation is open
        finish(state, operation)
        check_tiling(active_ranges(state))
        routes = RangeMap(
            (i, (a.range_start, a.range_end))
            for i, a in enumerate(state.topics["t"].partitions)
            if a.state == "active"
        )
        assert state.topics["t"].partitions[routes.owner(choice % HASH_SPACE)].state == "active"


# the metadata commands --------------------------------------------------------------------
def test_split_creates_pending_children_and_finish_activates_them() -> None:
    state = MetadataState()
    range_topic(state)
    assert state.topics["t"].partitions[0].range_start == 0
    operation = begin_split(state, 0)
    topic = state.topics["t"]
    assert [a.state for a in topic.partitions] == ["active", "pending", "pending"]
    assert [a.parents for a in topic.partitions] == [[], [0], [0]]
    assert operation["children"] == [1, 2] and operation["parents"] == [0]
    assert topic.settings.partitions == 3
    # one operation at a time per topic
    with pytest.raises(InvalidRequestError, match="in progress"):
        begin_split(state, 0)
    finish(state, operation, end=42)
    assert [a.state for a in topic.partitions] == ["sealed", "active", "active"]
    assert topic.partitions[0].seal_end == 42
    assert topic.operation is None
    # a retried finish changes nothing
    finish(state, operation, end=99)
    assert topic.partitions[0].seal_end == 42


def test_split_and_merge_refusals() -> None:
    state = MetadataState()
    state.apply(
        {
            "op": "create_topic",
            "name": "h",
            "settings": {**SETTINGS, "partitioning": "hash"},
            "replicas": [[1]],
        }
    )
    with pytest.raises(InvalidRequestError, match="hash-partitioned"):
        state.apply({"op": "begin_split", "name": "h", "partition": 0, "from": 1, "replicas": []})
    with pytest.raises(InvalidRequestError):
        state.apply(
            {
                "op": "create_topic",
                "name": "x",
                "settings": {**SETTINGS, "partitioning": "zig"},
                "replicas": [[1]],
            }
        )
    range_topic(state, 3)
    finish(state, begin_split(state, 0))
    with pytest.raises(InvalidRequestError, match="sealed"):
        begin_split(state, 0)
    with pytest.raises(InvalidRequestError, match="not adjacent"):
        begin_merge(state, 3, 2)  # ranges [1/6, 1/3) and [2/3, 1): not adjacent
    with pytest.raises(InvalidRequestError, match="no partition"):
        begin_split(state, 9)
    with pytest.raises(InvalidRequestError):
        begin_split(state, 1, at=0)  # not inside the range
    with pytest.raises(InvalidRequestError, match="range-partitioned"):
        state.apply({"op": "add_partitions", "name": "t", "total": 9, "from": 5, "replicas": [[1]]})
    # a placement made for another partition count is refused (a concurrent begin won)
    topic = state.topics["t"]
    command = {"op": "begin_split", "name": "t", "partition": 1, "at": None}
    with pytest.raises(InvalidRequestError, match="try again"):
        state.apply({**command, "from": len(topic.partitions) - 1, "replicas": [[1], [1]]})
    assert topic.operation is None and len(topic.partitions) == 5


def test_merge_of_siblings() -> None:
    state = MetadataState()
    range_topic(state)
    finish(state, begin_split(state, 0))
    operation = begin_merge(state, 2, 1)
    assert operation["parents"] == [1, 2] and operation["children"] == [3]
    finish(state, operation)
    child = state.topics["t"].partitions[3]
    assert (child.range_start, child.range_end, child.parents) == (0, HASH_SPACE, [1, 2])
    assert active_ranges(state) == [(0, HASH_SPACE)]


# the seal in a partition's log ----------------------------------------------------------------
def test_seal_is_found_on_append_cleared_by_truncation_and_found_again_on_open(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=4096)
    storage = LogStorage(PartitionLog.open(tmp_path / "log", config))
    assert storage.seal_offset is None
    entries = []
    for offset in range(40):  # enough records to roll segments
        data = build_batch([(b"k", b"v" * 200, (), 1)])
        entries.append(Entry(1, offset, offset, EntryKind.NORMAL, memoryview(data)))
    storage.append(entries)
    seal = seal_batch("op-1", 5)
    storage.append([Entry(1, 40, 40, EntryKind.NORMAL, memoryview(seal))])
    assert storage.seal_offset == 40
    storage.append([Entry(2, 41, 41, EntryKind.NOOP, b"")])
    storage.log.close()
    reopened = LogStorage(PartitionLog.open(tmp_path / "log", config))
    assert reopened.seal_offset == 40
    reopened.truncate(40)  # a seal that never committed is cut by a new leader
    assert reopened.seal_offset is None
    reopened.log.close()
    assert LogStorage(PartitionLog.open(tmp_path / "log", config)).seal_offset is None


def test_seeded_split_merge_walks_keep_one_owner_per_key() -> None:
    """Seeded random walks of splits and merges: before and after each operation every key
    has exactly one active owner, and a key's owner after an operation is a child of its
    owner before or the same partition (lineage covers every move of a key)."""
    for seed in range(200):
        rng = random.Random(seed)
        state = MetadataState()
        range_topic(state, rng.randint(1, 4))
        keys = [rng.randbytes(8) for _ in range(50)]
        for _ in range(15):
            topic = state.topics["t"]
            active = [i for i, a in enumerate(topic.partitions) if a.state == "active"]
            before = _owners(state, keys)
            siblings = _adjacent_pairs(state)
            if siblings and rng.random() < 0.4:
                operation = begin_merge(state, *rng.choice(siblings))
            else:
                victim = rng.choice(active)
                a = topic.partitions[victim]
                if a.range_end - a.range_start < 2:
                    continue
                operation = begin_split(state, victim)
            finish(state, operation)
            after = _owners(state, keys)
            for key in keys:
                moved = after[key] != before[key]
                assert (
                    not moved or before[key] in state.topics["t"].partitions[after[key]].parents
                ), f"seed {seed}: key moved outside its lineage"


def _owners(state: MetadataState, keys: list[bytes]) -> dict[bytes, int]:
    partitions = state.topics["t"].partitions
    routes = RangeMap(
        (i, (a.range_start, a.range_end)) for i, a in enumerate(partitions) if a.state == "active"
    )
    return {key: routes.owner_of_key(key) for key in keys}


def _adjacent_pairs(state: MetadataState) -> list[tuple[int, int]]:
    partitions = state.topics["t"].partitions
    active = sorted(
        (i for i, a in enumerate(partitions) if a.state == "active"),
        key=lambda i: partitions[i].range_start,
    )
    return list(itertools.pairwise(active))


def test_ops_module_constants() -> None:
    assert (ops.ACTIVE, ops.PENDING, ops.SEALED, ops.RANGE) == (
        "active",
        "pending",
        "sealed",
        "range",
    )


# how the CLI shows range topics -------------------------------------------------------------
def test_describe_shows_ranges_and_the_lineage_tree() -> None:
    half = 1 << 31

    def part(n: int, state: str, lo: int, hi: int, parents: tuple[int, ...] = (), end: int = -1):
        return PartitionDescription(n, 1, (1,), lo, hi, state, parents, end)

    description = TopicDescription(
        "t",
        1,
        (
            part(0, "sealed", 0, HASH_SPACE, end=12),
            part(1, "sealed", 0, half, (0,), 5),
            part(2, "active", half, HASH_SPACE, (0,)),
            part(3, "sealed", 0, half // 2, (1,), 3),
            part(4, "sealed", half // 2, half, (1,), 4),
            part(5, "active", 0, half, (3, 4)),
        ),
        1,
        None,
        None,
        None,
        None,
        partitioning="range",
        operation=TopicOperation("t", "split", (2,), (6, 7)),
    )
    text = "\n".join(cli_split.describe_lines(description))
    assert "[0x00000000, 0x100000000)" in text and "50.0%" in text
    tree = cli_split.lineage_tree(description)
    assert tree == [
        "  0 (sealed)",
        "  ├─ 1 (sealed)",
        "  │  ├─ 3 (sealed)",
        "  │  │  └─ 5 (active)",
        "  │  └─ 4 (sealed)",
        "  │     └─ 5 (active)",
        "  └─ 2 (active)",
    ]
    assert "in progress: t: split of 2 into 6, 7" in text
    status = "\n".join(cli_split.status_lines((description.operation,)))
    assert "splits and merges in progress (1)" in status and "split" in status
    assert cli_split.status_lines(()) == []


# automatic splits and merges ------------------------------------------------------------------
def _views(*parts: tuple[int, str, int, tuple[int, ...]]) -> list[PartitionView]:
    return [PartitionView(*p) for p in parts]


def test_rates_need_a_full_window_and_ignore_shrinking_logs() -> None:
    auto = AutoScaler()
    auto.observe(0, "t", 0, 0)
    assert auto.rate("t", 0, 500, 1000) is None
    auto.observe(1000, "t", 0, 5000)
    assert auto.rate("t", 0, 1000, 1000) == 5000.0
    auto.observe(2000, "t", 0, 1000)  # retention deleted a segment
    assert auto.rate("t", 0, 2000, 1000) == 0.0
    assert auto.rate("t", 9, 2000, 1000) is None


def test_the_hottest_partition_splits_then_the_topic_waits_a_window() -> None:
    policy = Policy(split_above=1000, merge_below=100, window_ms=1000, max_partitions=4)
    parts = _views((0, "active", 0, ()), (1, "active", 1 << 31, ()))
    auto = AutoScaler()
    for now, (a, b) in zip((0, 1000), ((0, 0), (3000, 5000)), strict=True):
        auto.observe(now, "t", 0, a)
        auto.observe(now, "t", 1, b)
    assert auto.decide(1000, [("t", policy, parts, True)]) == []  # an operation is open
    assert auto.decide(1000, [("t", policy, parts, False)]) == [
        {"op": "begin_split", "name": "t", "partition": 1, "at": None}
    ]
    assert auto.decide(1500, [("t", policy, parts, False)]) == []  # quiet for a window
    full = replace(policy, max_partitions=2)
    assert AutoScaler().decide(1000, [("t", full, parts, False)]) == []


def test_cold_siblings_merge_but_unrelated_neighbours_do_not() -> None:
    policy = Policy(split_above=10_000, merge_below=100, window_ms=1000, max_partitions=8)
    parts = _views(
        (0, "sealed", 0, ()),
        (1, "active", 0, ()),
        (2, "active", 1 << 30, (0,)),
        (3, "active", 1 << 31, (0,)),
    )
    auto = AutoScaler()
    for now in (0, 1000):
        for partition in (1, 2, 3):
            auto.observe(now, "t", partition, 10)
    assert auto.decide(1000, [("t", policy, parts, False)]) == [
        {"op": "begin_merge", "name": "t", "partitions": [2, 3]}
    ]
    assert policy_of(SimpleNamespace(partitioning="hash", auto_split_above=5)) is None


# metadata checkpoints restate key-range state -------------------------------------------------
def test_checkpoints_restate_ranges_lineage_and_open_operations() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        state = MetadataState()
        range_topic(state, 2)
        state.apply({"op": "alter_topic", "name": "t", "settings": {"auto_split_above": 99}})
        restored = None
        for step in range(12):
            topic = state.topics["t"]
            if topic.operation is not None and rng.random() < 0.6:
                finish(state, {**topic.operation}, end=step)
            elif topic.operation is None:
                active = [i for i, a in enumerate(topic.partitions) if a.state == "active"]
                begin_split(state, rng.choice(active))
            if rng.random() < 0.4:
                data = checkpoints.encode(state)
                restored = MetadataState()
                checkpoints.restore(restored, data)
                assert checkpoints.encode(restored) == data, f"seed {seed}"
        if restored is not None:
            assert restored.topics["t"].settings.auto_split_above == 99


def test_a_checkpoint_from_before_range_topics_restores_hash_defaults() -> None:
    state = MetadataState()
    state.apply(
        {
            "op": "create_topic",
            "name": "h",
            "settings": {**SETTINGS, "partitioning": "hash"},
            "replicas": [[1]],
        },
        3,
    )
    doc = json.loads(checkpoints.encode(state))
    name, topic_id, settings_, partitions, _operation = doc["topics"][0]
    doc["topics"] = [[name, topic_id, settings_[:6], [p[:8] for p in partitions]]]
    old = MetadataState()
    checkpoints.restore(old, json.dumps(doc).encode())
    assert checkpoints.encode(old) == checkpoints.encode(state)
