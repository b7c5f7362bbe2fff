"""A replica opened after a peer was reported down (a move's target, a repaired replica
reopened, a resync, while a node is dead) counts that peer as down, as the replicas open at
the report do: as a leader it neither heartbeats the dead node nor waits for it to go quiet."""

from __future__ import annotations

from pathlib import Path

from laminar.node.replica import Replica
from laminar.node.runtime import MultiRaft
from laminar.raft import ConfState, Message, MessageType, RaftConfig
from laminar.segment.log import LogConfig


async def test_a_replica_opened_after_a_peer_died_counts_it_down(tmp_path: Path) -> None:
    """A heartbeat still in flight from a leader reported dead must not put the group to
    sleep: it would then wait for a leader that never calls again instead of electing."""
    runtime = MultiRaft(2, 1.0, lambda _peer, _messages: None, lambda _replica: None)
    runtime.node_down(1)
    replica = Replica.open(
        7, 2, tmp_path / "p7", LogConfig(), ConfState(voters=(1, 2, 3)), RaftConfig(seed=7)
    )
    try:
        runtime.add(replica)
        quiet = Message(MessageType.HEARTBEAT, 2, 1, 1, index=1, quiesce=True)
        runtime.step(7, quiet)
        assert replica.raft.leader_id == 1
        assert not replica.raft.quiesced  # its leader is down: it must stay awake to elect
    finally:
        replica.log.close()
