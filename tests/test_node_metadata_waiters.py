"""Metadata proposals are answered for the command they proposed, not for its offset.

After a metadata leader change another command may be committed at the offset a proposal was
made at. These tests drive a real (unstarted) node's metadata replica: nothing commits on its
own, so the test decides which entry gets applied at the proposal's offset.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from laminar.errors import NotLeaderError, TopicExistsError
from laminar.node.config import NodeConfig
from laminar.node.metadata import METADATA_GROUP, MetadataState, encode_command
from laminar.node.node import Node
from laminar.node.replica import Replica
from laminar.raft import ConfState, Entry, EntryKind
from laminar.segment import batch as record_batch
from laminar.segment.log import LogConfig

SETTINGS = {
    "partitions": 1,
    "replication_factor": 1,
    "segment_bytes": 1 << 20,
    "segment_ms": 60_000,
    "retention_ms": None,
    "retention_bytes": None,
}


def leading_node(tmp_path: Path) -> Node:
    """A node whose single-voter metadata replica leads; no flush task, so nothing commits."""
    node = Node(NodeConfig(node_id=1, data_dir=tmp_path, listen="127.0.0.1:1"))
    node.metadata = Replica.open(
        METADATA_GROUP,
        1,
        tmp_path / "metadata",
        LogConfig(retention_ms=None),
        ConfState(voters=(1,)),
        node._raft_config(deliver_committed=True),
        apply=node.metadata_service.apply,
        topic="__metadata",
    )
    node.runtime.add(node.metadata)
    node.metadata.raft.campaign()
    assert node.metadata.is_leader
    return node


def entry_at(index: int, term: int, command: dict) -> Entry:
    data = record_batch.build_batch([(None, encode_command(command), (), 0)])
    return Entry(term, index, index, EntryKind.NORMAL, data)


async def proposed(node: Node, command: dict) -> tuple[asyncio.Task, int]:
    """Start a local proposal and return it with the offset it was proposed at."""
    service = node.metadata_service
    task = asyncio.create_task(service._propose_local(command))
    while not service._waiters:
        await asyncio.sleep(0)
    (index,) = service._waiters
    return task, index


MINE = {"op": "register_node", "node_id": 5, "client_address": "a:1", "peer_address": "a:2"}


async def proposed_and_applied(node: Node, command: dict) -> tuple[asyncio.Task, int]:
    """A local proposal whose own entry was just applied (the task has not run since)."""
    task, index = await proposed(node, command)
    (request_id,) = [r for r, _ in node.metadata_service._waiters.values()]
    node.metadata_service.apply(
        entry_at(index, node.metadata.raft.term, {**command, "request_id": request_id})
    )
    return task, index


async def test_another_command_at_the_same_offset_does_not_answer_the_proposal(
    tmp_path: Path,
) -> None:
    node = leading_node(tmp_path)
    try:
        mine = {"op": "register_node", "node_id": 5, "client_address": "a:1", "peer_address": "a:2"}
        task, index = await proposed(node, mine)
        # A new leader committed its own command at that offset; ours was never applied.
        theirs = {
            "op": "register_node",
            "node_id": 6,
            "client_address": "b:1",
            "peer_address": "b:2",
            "request_id": "someone-else",
        }
        node.metadata_service.apply(entry_at(index, node.metadata.raft.term + 1, theirs))
        with pytest.raises(NotLeaderError):
            await task
        assert 5 not in node.state.nodes and 6 in node.state.nodes
    finally:
        node.metadata.close()


async def test_a_noop_at_the_offset_fails_the_proposal_once_a_later_entry_applies(
    tmp_path: Path,
) -> None:
    node = leading_node(tmp_path)
    try:
        mine = {"op": "drain_node", "node_id": 1}
        task, index = await proposed(node, mine)
        # The offset went to a new leader's no-op (never applied); the next command follows.
        other = {"op": "register_node", "node_id": 1, "client_address": "x", "peer_address": "y"}
        node.metadata_service.apply(entry_at(index + 1, node.metadata.raft.term + 1, other))
        with pytest.raises(NotLeaderError):
            await asyncio.wait_for(task, 5)
    finally:
        node.metadata.close()


async def test_the_proposal_is_answered_by_its_own_entry(tmp_path: Path) -> None:
    node = leading_node(tmp_path)
    try:
        task, index = await proposed_and_applied(node, MINE)
        answer = await task
        assert answer["index"] == index and answer["result"]["node_id"] == 5
    finally:
        node.metadata.close()


async def test_a_proposal_cancelled_as_its_entry_applies_ends_cancelled(tmp_path: Path) -> None:
    """A node stops by cancelling its tasks; one whose proposal was answered in the same loop
    step must still end. With ``asyncio.wait_for`` (Python 3.11) the answer won and the task
    went on, waiting forever: a node's stop hung in CI."""
    node = leading_node(tmp_path)
    try:
        task, _ = await proposed_and_applied(node, MINE)
        task.cancel()  # before the task saw the answer
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        node.metadata.close()


async def test_losing_leadership_fails_waiters(tmp_path: Path) -> None:
    node = leading_node(tmp_path)
    try:
        task, _ = await proposed(node, {"op": "drain_node", "node_id": 1})
        node.metadata_service.leadership_lost()
        with pytest.raises(NotLeaderError):
            await task
    finally:
        node.metadata.close()


def test_a_retried_command_is_applied_once() -> None:
    state = MetadataState()
    command = {
        "op": "create_topic",
        "name": "t",
        "settings": SETTINGS,
        "replicas": [[1]],
        "request_id": "r1",
    }
    _first, applied = state.apply_once(command)
    # The retry reached the log too (the first copy committed after the caller gave up).
    again, applied_again = state.apply_once({**command, "replicas": [[2]]})
    assert applied and not applied_again
    assert again == {"name": "t", "topic_id": 1} and state.topics["t"].partitions[0].replicas == [1]
    assert state.next_topic_id == 2
    with pytest.raises(TopicExistsError):  # somebody else's create of the same name
        state.apply_once({**command, "request_id": "r2"})
    with pytest.raises(TopicExistsError):  # and its retry hears the same answer
        state.apply_once({**command, "request_id": "r2"})
