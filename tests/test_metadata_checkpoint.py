"""Metadata checkpoints: the state restated exactly, and a log that starts with one.

* A seeded simulation applies random metadata commands (every kind, failing ones and retries
  with the same request id included) to one state and, at random points, restores a second
  state from the first one's checkpoint: from there both must stay byte-for-byte equal, and
  equal to a third state that replayed the whole history. ``LAMINAR_MD_SIM_SEEDS=N`` runs N
  seeds (default 60), ``LAMINAR_MD_SIM_SEED_BASE=S`` starts at S; a failing seed is printed.
* Real (unstarted) nodes apply entries the way the runtime hands them out: a checkpoint on a
  node whose state equals it changes nothing; on a node that starts from it (after a gap) it
  rebuilds the state and opens exactly the replicas assigned to that node, in the
  directories their assignments named; commands after a gap and before any checkpoint are
  never applied.
* The metadata log rolls a segment at each checkpoint, so cutting below one leaves a log that
  starts exactly at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from laminar.auth.scram import ScramCredential, make_credential
from laminar.errors import InvalidRequestError, LaminarError
from laminar.node import metadata_checkpoint as checkpoints
from laminar.node.config import NodeConfig
from laminar.node.log_storage import LogStorage
from laminar.node.metadata import METADATA_GROUP, MetadataState, encode_command, group_id
from laminar.node.node import Node
from laminar.node.replica import Replica
from laminar.raft import ConfState, Entry, EntryKind
from laminar.segment import batch as record_batch
from laminar.segment.log import LogConfig, PartitionLog

SEEDS = int(os.environ.get("LAMINAR_MD_SIM_SEEDS", "60"))
SEED_BASE = int(os.environ.get("LAMINAR_MD_SIM_SEED_BASE", "0"))
NODES = [1, 2, 3, 4, 5]


def settings(partitions: int) -> dict[str, Any]:
    return {
        "partitions": partitions,
        "replication_factor": 2,
        "segment_bytes": 1 << 20,
        "segment_ms": 60_000,
        "retention_ms": None,
        "retention_bytes": None,
    }


class Commands:
    """Random, mostly valid metadata commands against the state they will be applied to."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.sent: list[dict[str, Any]] = []
        self.count = 0

    def next(self, state: MetadataState) -> dict[str, Any]:
        rng = self.rng
        if self.sent and rng.random() < 0.05:
            return rng.choice(self.sent)  # a retry: the same request id again
        self.count += 1
        command = self._fresh(state, rng)
        command["request_id"] = f"r{self.count}"
        self.sent = [*self.sent[-20:], command]
        return command

    def _fresh(self, state: MetadataState, rng: random.Random) -> dict[str, Any]:
        topics = list(state.topics.values())
        kind = rng.randrange(19)
        if kind == 0 or not topics:
            n = rng.randint(1, 4)
            name = f"t{rng.randrange(12)}"
            replicas = [rng.sample(NODES, 2) for _ in range(n)]
            spec = settings(n)
            if rng.random() < 0.4:
                spec["partitioning"] = "range"  # key-range topics split, merge and retire
            return {
                "op": "create_topic",
                "name": name,
                "settings": spec,
                "replicas": replicas,
            }
        topic = rng.choice(topics)
        partition = rng.randrange(len(topic.partitions))
        assignment = topic.partitions[partition]
        base = {"topic_id": topic.topic_id, "partition": partition}
        if kind == 1:
            return {"op": "delete_topic", "name": topic.name if rng.random() < 0.9 else "nope"}
        if kind == 2:
            return {
                **base,
                "op": "set_leader",
                "leader": rng.choice(NODES),
                "term": rng.randrange(9),
            }
        if kind == 3:
            target = rng.choice([n for n in NODES if n not in assignment.replicas])
            source = rng.choice(assignment.replicas or NODES)  # none: retired
            return {**base, "op": "start_move", "from": source, "to": target}
        if kind in (4, 5):
            op = "finish_move" if kind == 4 else "abort_move"
            return {**base, "op": op, "from": assignment.removing, "to": assignment.adding}
        if kind == 6:
            return {
                **base,
                "op": "move_target_ready",
                "to": assignment.adding,
                "move_id": assignment.move_id,
            }
        if kind == 7:
            node = rng.choice(NODES)
            return {
                "op": "register_node",
                "node_id": node,
                "client_address": f"127.0.0.1:{9000 + node}",
                "peer_address": f"127.0.0.1:{8000 + node}",
                "rack": rng.choice(["", "a", "b"]),
                "incarnation": f"inc{rng.randrange(3)}",
            }
        if kind == 8:
            op = rng.choice(["drain_node", "undrain_node", "forget_node"])
            return {"op": op, "node_id": rng.choice(NODES)}
        if kind == 9:
            node = rng.choice(NODES)
            incident = f"i{rng.randrange(5)}"
            return {
                "op": "replica_lost",
                "group": group_id(topic.topic_id, partition),
                "node": node,
                "incident": incident,
            }
        if kind == 10 and state.recovering:
            (group, node), recovery = rng.choice(sorted(state.recovering.items()))
            return {
                "op": "replica_recovered",
                "group": group,
                "node": node,
                "incident": recovery.incident,
            }
        if kind == 11:
            value = rng.choice([1000, 30_000, "bad"])
            return {
                "op": "alter_queue_config",
                "group": f"g{rng.randrange(3)}",
                "set": {"lock_ms": value} if rng.random() < 0.7 else {},
                "reset": ["lock_ms"] if rng.random() < 0.2 else [],
            }
        if kind == 17:  # users (laminar/auth/state.py)
            name = rng.choice(["alice", "bob", "carol"])
            op = rng.choice(["create_user", "create_user", "alter_user", "delete_user"])
            command = {"op": op, "name": name, "superuser": rng.random() < 0.5}
            if op != "delete_user":
                command["credential"] = _credential(rng.randrange(3)).to_json()
            if op == "create_user" and not state.auth.internal_secret:
                command["internal_secret"] = f"{rng.getrandbits(256):064x}"
            return command
        if kind == 18:
            kind_of = rng.choice(["topic", "prefix", "any"])
            rule = {
                "principal": rng.choice(["alice", "bob", "*"]),
                "kind": kind_of,
                "name": "" if kind_of == "any" else rng.choice(["t1", "t"]),
                "operation": rng.choice(["produce", "consume", "admin"]),
            }
            return {"op": rng.choice(["add_acl", "add_acl", "remove_acl"]), "rule": rule}
        if kind == 14:
            return {
                "op": "begin_split",
                "name": topic.name,
                "partition": partition,
                "at": None,
                "from": len(topic.partitions),
                "replicas": [rng.sample(NODES, 2) for _ in range(2)],
            }
        if kind == 15 and topic.operation is not None:
            ends = {str(p): rng.randrange(50) for p in topic.operation["parents"]}
            return {
                "op": "finish_op",
                "name": topic.name,
                "op_id": topic.operation["id"],
                "ends": ends,
            }
        if kind in (15, 16):
            sealed = [i for i, a in enumerate(topic.partitions) if a.state == "sealed"]
            return {
                "op": "retire_partition",
                "topic_id": topic.topic_id,
                "partition": rng.choice(sealed) if sealed else partition,
            }
        if kind == 12:
            n = rng.randint(1, 2)
            return {
                "op": "add_partitions",
                "name": topic.name,
                "total": len(topic.partitions) + n,
                "from": len(topic.partitions),
                "replicas": [rng.sample(NODES, 2) for _ in range(n)],
            }
        return {
            "op": "alter_topic",
            "name": topic.name,
            "settings": {"retention_ms": rng.choice([None, 1000, 60_000])},
        }


@functools.cache
def _credential(index: int) -> ScramCredential:
    return make_credential(f"pw{index}", salt=bytes([index + 1]) * 16)


def apply(state: MetadataState, command: dict[str, Any], index: int) -> None:
    with contextlib.suppress(LaminarError):
        state.apply_once(command, index)


def run_seed(seed: int) -> int:
    """Returns how many checkpoints it restored (and checked)."""
    commands = Commands(seed)
    rng = random.Random(seed ^ 0x5EED)
    history: list[dict[str, Any]] = []
    main = MetadataState()
    restored: MetadataState | None = None
    restores = 0
    for index in range(400):
        command = commands.next(main)
        history.append(command)
        apply(main, command, index)
        if restored is not None:
            apply(restored, command, index)
        if rng.random() < 0.03:
            data = checkpoints.encode(main)
            restored = MetadataState()
            checkpoints.restore(restored, data)
            restores += 1
            assert checkpoints.encode(restored) == data, f"seed {seed}: restore differs at {index}"
        if restored is not None and (index % 40 == 0 or index == 399):
            assert checkpoints.encode(restored) == checkpoints.encode(main), (
                f"seed {seed}: a state restored from a checkpoint diverged at command {index}: "
                f"{command}"
            )
    replayed = MetadataState()
    for index, command in enumerate(history):
        apply(replayed, command, index)
    assert checkpoints.encode(replayed) == checkpoints.encode(main), f"seed {seed}: replay"
    return restores


def test_checkpoint_restore_stays_equal_seeded() -> None:
    failures = []
    restores = 0
    for seed in range(SEED_BASE, SEED_BASE + SEEDS):
        try:
            restores += run_seed(seed)
        except AssertionError as exc:
            failures.append(
                f"{exc}\nreplay: LAMINAR_MD_SIM_SEEDS=1 LAMINAR_MD_SIM_SEED_BASE={seed}"
            )
    assert not failures, "\n\n".join(failures[:3])
    assert restores >= SEEDS * 4  # the schedules restore often enough to mean something


def test_checkpoint_round_trip_restates_everything() -> None:
    state = MetadataState()
    for index, command in enumerate(
        [
            {
                "op": "register_node",
                "node_id": 2,
                "client_address": "c",
                "peer_address": "p",
                "rack": "r",
                "kafka_address": "k",
                "incarnation": "x",
            },
            {
                "op": "create_topic",
                "name": "a",
                "settings": settings(2),
                "replicas": [[1, 2], [2, 3]],
                "request_id": "q1",
            },
            {
                "op": "create_topic",
                "name": "a",
                "settings": settings(1),
                "replicas": [[1, 2]],
                "request_id": "q2",
            },
            {
                "op": "start_move",
                "topic_id": 1,
                "partition": 1,
                "from": 3,
                "to": 1,
                "request_id": "m1",
            },
            {"op": "drain_node", "node_id": 2},
            {"op": "replica_lost", "group": group_id(1, 0), "node": 2, "incident": "i"},
            {"op": "alter_queue_config", "group": "g", "set": {"lock_ms": 5000}, "reset": []},
        ]
    ):
        apply(state, command, index + 10)
    data = checkpoints.encode(state)
    copy = MetadataState()
    checkpoints.restore(copy, data)
    assert copy == state  # dataclass equality: every field, outcomes included
    assert copy.topics["a"].partitions[1].origins == {2: 11, 3: 11, 1: 13}
    assert list(copy.outcomes) == ["q1", "q2", "m1"]
    batch = checkpoints.checkpoint_batch(state, 0)
    assert checkpoints.is_checkpoint(batch) and checkpoints.checkpoint_data(batch) == data
    command = record_batch.build_batch([(None, encode_command({"op": "x"}), (), 0)])
    assert not checkpoints.is_checkpoint(command) and checkpoints.checkpoint_data(command) is None


# Applying entries on real (unstarted) nodes -------------------------------------------------


def metadata_node(tmp_path: Path, node_id: int) -> Node:
    node = Node(NodeConfig(node_id=node_id, data_dir=tmp_path, listen="127.0.0.1:1"))
    node.metadata = Replica.open(
        METADATA_GROUP,
        node_id,
        tmp_path / "metadata",
        LogConfig(retention_ms=None),
        ConfState(voters=(node_id,)),
        node._raft_config(deliver_committed=True),
        apply=node.metadata_service.apply,
        apply_gap=node.metadata_service.apply_gap,
        roll_at_control=True,
        topic="__metadata",
    )
    node.runtime.add(node.metadata)
    return node


def command_entry(index: int, command: dict[str, Any]) -> Entry:
    data = record_batch.build_batch([(None, encode_command(command), (), 0)])
    return Entry(1, index, index, EntryKind.NORMAL, data)


def checkpoint_entry(index: int, state: MetadataState) -> Entry:
    return Entry(1, index, index, EntryKind.NORMAL, checkpoints.checkpoint_batch(state, 0))


HISTORY = [
    {
        "op": "create_topic",
        "name": "a",
        "settings": settings(3),
        "replicas": [[1, 2], [2, 3], [3, 1]],
    },
    {"op": "create_topic", "name": "b", "settings": settings(2), "replicas": [[2, 3], [1, 3]]},
    {"op": "start_move", "topic_id": 2, "partition": 0, "from": 3, "to": 1, "request_id": "mv"},
    {"op": "delete_topic", "name": "a"},
    {"op": "create_topic", "name": "c", "settings": settings(1), "replicas": [[2, 3]]},
]


async def test_a_checkpoint_is_a_noop_on_a_node_in_step(tmp_path: Path) -> None:
    node = metadata_node(tmp_path, 3)
    try:
        for index, command in enumerate(HISTORY):
            node.metadata_service.apply(command_entry(index, command))
        state = node.state
        topics_before, hosted = dict(state.topics), set(node.runtime.replicas)
        assert len(hosted) == 1 + 2 + 1  # metadata, b/0 and b/1, c/0
        node.metadata_service.apply(checkpoint_entry(len(HISTORY), state))
        assert state.topics == topics_before
        assert all(state.topics[n] is t for n, t in topics_before.items())  # untouched
        assert set(node.runtime.replicas) == hosted
        assert node.metadata_service.checkpoint_index == len(HISTORY)
        assert node.metadata_service.since_checkpoint == [0, 0]
    finally:
        for replica in node.runtime.replicas.values():
            replica.close()


async def test_a_node_starting_from_a_checkpoint_rebuilds_and_hosts_its_replicas(
    tmp_path: Path,
) -> None:
    source = MetadataState()
    for index, command in enumerate(HISTORY):
        source.apply_once(command, index)
    at = len(HISTORY)
    node = metadata_node(tmp_path / "n1", 1)
    replayed = metadata_node(tmp_path / "r1", 1)
    try:
        # The runtime hands out entries from ``at - 1`` on: a command before any checkpoint.
        node.metadata_service.apply_gap(at - 1)
        node.metadata_service.apply(command_entry(at - 1, HISTORY[-1]))
        assert node.metadata_service.skipped == 1 and not node.state.topics  # not applied
        # A replica directory of a topic deleted while this node lagged, never reopened.
        orphan = tmp_path / "n1" / "partitions" / "a-0.1.0"
        (orphan / "log").mkdir(parents=True)
        # One assigned after the checkpoint (its origin, 99, is later): the log replays that
        # assignment next (a restart from this node's own checkpoint), so it stays.
        later = tmp_path / "n1" / "partitions" / "d-0.4.99"
        (later / "log").mkdir(parents=True)
        node.metadata_service.apply(checkpoint_entry(at, source))
        assert checkpoints.encode(node.state) == checkpoints.encode(source)
        for _ in range(100):
            if not orphan.exists():
                break
            await asyncio.sleep(0.02)
        assert not orphan.exists() and later.exists()
        assert not node.metadata_service.partial
        follow = {"op": "move_target_ready", "topic_id": 2, "partition": 0, "to": 1}
        node.metadata_service.apply(command_entry(at + 1, {**follow, "move_id": "mv"}))
        assert node.state.topics["b"].partitions[0].target_ready
        # Same replicas, in the same directories, as a node that applied the whole history.
        for index, command in enumerate(HISTORY):
            replayed.metadata_service.apply(command_entry(index, command))

        def hosted(n: Node) -> dict[int, str]:
            return {
                g: r.directory.name for g, r in n.runtime.replicas.items() if g != METADATA_GROUP
            }

        assert hosted(node) == hosted(replayed)
        assert set(hosted(node)) == {group_id(2, 0), group_id(2, 1)}  # b/0 as the move's target
    finally:
        for n in (node, replayed):
            for replica in n.runtime.replicas.values():
                replica.close()


def test_the_log_starts_exactly_at_a_checkpoint_once_cut(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "log", LogConfig(retention_ms=None))
    storage = LogStorage(log, roll_at_control=True)
    try:
        commands = [command_entry(i, {"op": "drain_node", "node_id": i}) for i in range(5)]
        storage.append(commands)
        storage.append([checkpoint_entry(5, MetadataState())])
        storage.append([command_entry(6, {"op": "drain_node", "node_id": 6})])
        assert log.segment_bases() == [0, 5]
        log.flush()
        assert log.discard_before(5) == 1
        assert log.start_offset == 5
        first = storage.entries(5, 6, 1 << 20)[0]
        assert checkpoints.is_checkpoint(first.data)
    finally:
        log.close()


def test_checkpoint_size_and_time_at_scale() -> None:
    """Not a benchmark: a bound that catches a checkpoint growing out of its batch limit."""
    state = MetadataState()
    for t in range(100):  # 100 topics x 100 partitions, RF 3
        replicas = [[1 + (p + k) % 5 for k in range(3)] for p in range(100)]
        state.apply_once(
            {
                "op": "create_topic",
                "name": f"topic-{t}",
                "settings": settings(100),
                "replicas": replicas,
                "request_id": f"c{t}",
            },
            t,
        )
    started = time.perf_counter()
    batch = checkpoints.checkpoint_batch(state, 0)
    copy = MetadataState()
    checkpoints.restore(copy, checkpoints.checkpoint_data(batch) or b"")
    elapsed = time.perf_counter() - started
    assert copy == state
    assert len(batch) < 4 << 20  # fits the default batch limit with room to spare
    assert elapsed < 10  # generous: a loaded 2-core machine


def test_a_malformed_checkpoint_changes_nothing() -> None:
    state = MetadataState()
    state.apply_once(
        {"op": "create_topic", "name": "a", "settings": settings(1), "replicas": [[1, 2]]}, 3
    )
    before = checkpoints.encode(state)
    good = json.loads(before)
    for bad in (
        b"not json",
        b"[]",
        json.dumps({**good, "format": 99}).encode(),
        json.dumps({**good, "topics": [["a", 1]]}).encode(),
        json.dumps({**good, "nodes": [[1, "c"]]}).encode(),
    ):
        with pytest.raises(InvalidRequestError):
            checkpoints.restore(state, bad)
        assert checkpoints.encode(state) == before


async def test_a_rebuilt_node_lifts_the_gate_of_a_replica_readmitted_meanwhile(
    tmp_path: Path,
) -> None:
    node = metadata_node(tmp_path, 1)
    try:
        source = MetadataState()
        for index, command in enumerate(HISTORY[:2]):  # a/0, a/2 and b/1 on node 1
            node.metadata_service.apply(command_entry(index, command))
            source.apply_once(command, index)
        group, other = group_id(2, 1), group_id(1, 0)
        assert {group, other} <= set(node.runtime.replicas)
        node.amnesia.lose(group)  # its log lost batches: gated until re-admitted
        incident = node.amnesia.incident(group)
        lost = {"op": "replica_lost", "group": group, "node": 1, "incident": incident}
        source.apply_once({**lost, "request_id": f"lost-{incident}"}, 2)
        assert (group, 1) in source.recovering
        # The group re-admits it while this node's metadata lags; it misses the command.
        source.apply_once({**lost, "op": "replica_recovered", "request_id": "rec"}, 3)
        # Another replica's loss was never recorded (or its request id is long forgotten).
        node.amnesia.lose(other)
        node.metadata_service.apply_gap(4)
        node.metadata_service.apply(checkpoint_entry(4, source))
        assert group not in node.amnesia.gated
        assert set(node.runtime.replicas) == {METADATA_GROUP, group, other, group_id(1, 2)}
        # That one stays gated, and its loss is reported (again) for its group to re-admit it.
        assert other in node.amnesia.gated
        reports = [t for t in node._background if "report_lost" in t.get_coro().__qualname__]
        assert reports
        for task in reports:
            task.cancel()
    finally:
        for replica in node.runtime.replicas.values():
            replica.close()


async def test_a_rebuilt_node_opens_many_replicas_a_few_at_a_time(tmp_path: Path) -> None:
    source = MetadataState()
    create = {"op": "create_topic", "name": "big", "settings": settings(100)}
    source.apply_once({**create, "replicas": [[1, 2]] * 100}, 0)
    node = metadata_node(tmp_path, 1)
    try:
        node.metadata_service.apply_gap(1)
        node.metadata_service.apply(checkpoint_entry(1, source))
        assert len(node.runtime.replicas) < 100  # not all in one loop iteration
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(node.runtime.replicas) == 1 + 100
        assert {r.directory.name for r in node.runtime.replicas.values()} >= {"big-99.1.0"}
    finally:
        for replica in node.runtime.replicas.values():
            replica.close()
