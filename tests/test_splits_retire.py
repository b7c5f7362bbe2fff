"""Retiring sealed partitions retention emptied: the seal ends its segment, the
``retire_partition`` metadata command, the metadata leader's decision, and every reader
treating a retired partition as finished (no I/O beyond a temporary log directory)."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar import cli_split
from laminar.client.descriptions import ClusterMetadata, PartitionDescription, TopicDescription
from laminar.client.lineage import Lineage as ClientLineage
from laminar.client.types import TopicPartition
from laminar.errors import InvalidRequestError
from laminar.groups.coordinator import Coordinator
from laminar.groups.lineage import RangePartition, blocked, lineage_of, starts
from laminar.node import metadata_checkpoint as checkpoints
from laminar.node.log_storage import LogStorage
from laminar.node.metadata import MetadataState
from laminar.raft import Entry, EntryKind
from laminar.segment.batch import build_batch
from laminar.segment.log import LogConfig, PartitionLog
from laminar.splits.retire import retirable, retire_command, sealed_replicas
from laminar.splits.seal import seal_batch
from tests.test_group_coordinator import CONFIG, Harness, tps
from tests.test_splits import begin_split, finish, range_topic


def split_twice() -> MetadataState:
    """t/0 split into 1 and 2, then 1 into 3 and 4 (0 and 1 sealed, replicas on 1 and 2)."""
    state = MetadataState()
    state.apply(
        {
            "op": "create_topic",
            "name": "t",
            "settings": {
                "partitions": 1,
                "replication_factor": 2,
                "segment_bytes": 1 << 20,
                "segment_ms": 1000,
                "retention_ms": 1000,
                "retention_bytes": None,
                "partitioning": "range",
            },
            "replicas": [[1, 2]],
        }
    )
    topic = state.topics["t"]
    for parent in (0, 1):
        command = {"op": "begin_split", "name": "t", "partition": parent, "at": None}
        state.apply({**command, "from": len(topic.partitions), "replicas": [[1, 2], [1, 2]]})
        finish(state, topic.operation, end=10 + parent)
    return state


def retire(state: MetadataState, partition: int) -> object:
    command = retire_command(state.topics["t"].topic_id, partition)
    return state.apply_once({**command, "request_id": f"r{len(state.outcomes)}"})[0]


def test_retire_drops_replicas_and_lineage_and_keeps_the_number() -> None:
    state = split_twice()
    topic = state.topics["t"]
    assert [a.state for a in topic.partitions] == ["sealed", "sealed", "active"] + ["active"] * 2
    with pytest.raises(InvalidRequestError, match="still has parents"):
        retire(state, 1)  # its parent 0 holds older records of the same keys
    with pytest.raises(InvalidRequestError, match="not sealed"):
        retire(state, 2)
    assert retire(state, 0) is not None
    zero = topic.partitions[0]
    assert (zero.state, zero.replicas, zero.origins, zero.leader) == ("retired", [], {}, 0)
    assert topic.partitions[1].parents == [] and topic.partitions[2].parents == []
    assert topic.partitions[3].parents == [1]
    assert len(topic.partitions) == topic.settings.partitions == 5  # numbers never repeat
    assert retire(state, 0) is None  # a retry changes nothing
    assert retire(state, 1) is not None
    assert [a.parents for a in topic.partitions] == [[], [], [], [], []]
    assert state.replica_counts() == {1: 3, 2: 3}
    # a retired partition is no partition to split, and a deleted topic retires nothing
    with pytest.raises(InvalidRequestError, match="retired, not active"):
        begin_split(state, 0)
    assert state.apply({"op": "retire_partition", "topic_id": 99, "partition": 0}) is None
    # the checkpoint restates it exactly
    data = checkpoints.encode(state)
    copy = MetadataState()
    checkpoints.restore(copy, data)
    assert copy == state and checkpoints.encode(copy) == data


def test_a_partition_being_moved_is_not_retired() -> None:
    state = split_twice()
    topic = state.topics["t"]
    state.apply(
        {"op": "start_move", "topic_id": topic.topic_id, "partition": 0, "from": 2, "to": 3}
    )
    with pytest.raises(InvalidRequestError, match="being moved"):
        retire(state, 0)
    assert retirable(state.topics.values(), {(1, 0, n): 99 for n in (1, 2, 3)}) == []


def test_retirable_needs_every_replica_past_the_seal_end() -> None:
    state = split_twice()
    topics = state.topics.values()
    assert sealed_replicas(topics, 1) == [("t", 1, 0), ("t", 1, 1)]
    assert sealed_replicas(topics, 7) == []
    assert retirable(topics, {}) == []
    assert retirable(topics, {(1, 0, 1): 10}) == []  # node 2 did not report
    assert retirable(topics, {(1, 0, 1): 10, (1, 0, 2): 9}) == []  # node 2 still holds 9
    # both past their seal ends, but 1 waits for its parent 0 to retire first
    both = {(1, p, n): 11 for p in (0, 1) for n in (1, 2)}
    assert retirable(topics, both) == [(1, 0)]
    retire(state, 0)
    assert retirable(state.topics.values(), both) == [(1, 1)]
    hash_state = MetadataState()
    range_topic(hash_state)
    hash_state.topics["t"].settings.partitioning = "hash"
    assert retirable(hash_state.topics.values(), {(1, 0, 1): 99}) == []


def test_the_seal_ends_its_segment_so_retention_can_empty_the_log(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=1 << 20, retention_ms=1000)
    storage = LogStorage(PartitionLog.open(tmp_path / "log", config))
    entries = [
        Entry(1, i, i, EntryKind.NORMAL, memoryview(build_batch([(b"k", b"v", (), 1000)])))
        for i in range(5)
    ]
    storage.append(entries)
    storage.append([Entry(1, 5, 5, EntryKind.NORMAL, memoryview(seal_batch("op", 1000)))])
    assert storage.seal_offset == 5
    assert storage.log.segment_bases() == [0, 6]  # the seal closed its segment
    storage.append([Entry(2, 6, 6, EntryKind.NOOP, b"")])  # a new leader's no-op after it
    assert storage.log.expire(now_ms=1500, upto=7) == 0  # not past retention yet
    assert storage.log.expire(now_ms=10_000, upto=5) == 0  # the seal not committed yet
    assert storage.log.expire(now_ms=10_000, upto=7) == 1
    assert storage.log.start_offset == 6 >= 5 + 1  # at the seal end: nothing left to read
    storage.log.close()
    reopened = LogStorage(PartitionLog.open(tmp_path / "log", config))
    assert reopened.log.start_offset == 6 and reopened.log.end_offset == 7
    reopened.log.close()


def test_retention_keeps_the_seal_until_the_metadata_shows_the_partition_sealed() -> None:
    from types import SimpleNamespace

    from laminar.splits.retire import retention_upto

    state = MetadataState()
    range_topic(state)
    operation = begin_split(state, 0)
    replica = SimpleNamespace(
        topic="t", partition=0, high_watermark=9, storage=SimpleNamespace(seal_offset=None)
    )
    assert retention_upto(replica, state.topics) == 9
    replica.storage.seal_offset = 8  # sealed in its log, the split not finished yet
    assert retention_upto(replica, state.topics) == 8
    finish(state, operation, end=9)
    assert retention_upto(replica, state.topics) == 9


def _desc(*parts: PartitionDescription) -> ClusterMetadata:
    topic = TopicDescription("t", 1, parts, 1, None, None, None, None, partitioning="range")
    return ClusterMetadata({1: "a"}, {"t": topic}, 1)


def _part(n: int, state: str, parents: tuple[int, ...] = (), end: int = -1):
    return PartitionDescription(n, 1 if state != "retired" else 0, (1,), 0, 1, state, parents, end)


def test_the_consumer_skips_retired_partitions_and_their_children_are_free() -> None:
    metadata = _desc(_part(0, "retired"), _part(1, "sealed", (), 8), _part(2, "active", (1,)))
    lineage = ClientLineage(lambda: metadata)
    lineage.follow("t")
    positions = {TopicPartition("t", 1): 8, TopicPartition("t", 2): 0}

    def position(tp: TopicPartition) -> int:
        if tp not in positions:
            raise ValueError(tp)
        return positions[tp]

    assert not lineage.readable(TopicPartition("t", 0), position)
    assert lineage.readable(TopicPartition("t", 2), position)
    assert lineage.new_partitions(metadata, []) == [TopicPartition("t", 1), TopicPartition("t", 2)]
    # a child whose parent shows retired (in any metadata) is not held back by it
    stale = _desc(_part(0, "retired"), _part(1, "active", (0,)))
    lineage = ClientLineage(lambda: stale)
    lineage.gate("t")
    assert lineage.readable(TopicPartition("t", 1), lambda tp: 3)


def test_groups_give_retired_partitions_to_nobody_and_free_children_start_at_zero() -> None:
    state = split_twice()
    assert lineage_of(state.topics)["t"][0] == RangePartition("sealed", (), 10)
    retire(state, 0)
    lineage = lineage_of(state.topics)
    assert lineage["t"][0] == RangePartition("retired", (), 10)
    assert blocked(lineage, {"t"}, {}) == tps("t", 0, 3, 4)
    # a child freed because its parent retired (it has no parents now) starts at 0
    assert starts(lineage, tps("t", 0, 2, 3, 4), tps("t", 0, 3, 4)) == [("t", 2)]
    # through the coordinator: a group that never committed 0 reads 1 and 2 from 0
    before = lineage_of(split_twice().topics)
    h = Harness({"t": 5})
    h.coord = Coordinator(CONFIG, {"t": 5}, 0, lineage=before)
    h.hb("a", 0)
    h.hb("a", 1)
    assert h.owned["a"] == tps("t", 0)
    h.coord.set_lineage(lineage)
    h.coord.topics_changed({"t": 5}, 2)
    h.flush()
    for now in range(3, 6):
        h.hb("a", now)
    assert h.owned["a"] == tps("t", 1, 2)
    offsets = h.coord.fetch_offsets("g").value
    assert {tp: v.offset for tp, v in offsets.items()} == {("t", 1): 0, ("t", 2): 0}


def test_spark_planning_is_not_held_by_a_retired_parent() -> None:
    from spark_source.planning import Lineage, hold_children

    lineage = {("t", 0): Lineage("retired", (), 10), ("t", 1): Lineage("active", (0,), -1)}
    assert hold_children({("t", 0): 4, ("t", 1): 0}, {("t", 1): 5}, lineage) == {("t", 1): 5}


def test_describe_leaves_retired_partitions_out_of_ranges_and_tree() -> None:
    metadata = _desc(_part(0, "retired", (), 10), _part(1, "active", ()), _part(2, "sealed", (), 4))
    description = metadata.topics["t"]
    assert cli_split.lineage_tree(description) == ["  1 (active)", "  2 (sealed)"]
    rows = cli_split.range_rows(description)
    assert [row[0] for row in rows] == ["PARTITION", "1", "2"]
    text = "\n".join(cli_split.describe_lines(description))
    assert "retired (emptied by retention, numbers not reused): 0" in text
