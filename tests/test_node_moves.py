"""Replica moves: planning (which moves start) and the Raft steps that carry one out or, when
its target dies on the way, undo it. The Raft groups are in-memory (tests/raft_harness.py)."""

from __future__ import annotations

from collections.abc import Callable

from laminar.node.metadata import MetadataState
from laminar.node.rebalance import advance_move, move_done, plan_moves, undo_move
from laminar.raft import ConfState, MemoryStorage, Role
from tests.raft_harness import Net

SETTINGS = {
    "partitions": 6,
    "replication_factor": 3,
    "segment_bytes": 1 << 20,
    "segment_ms": 1000,
    "retention_ms": None,
    "retention_bytes": None,
}


def state_with(nodes: list[int], replicas: list[list[int]]) -> MetadataState:
    state = MetadataState()
    for node in nodes:
        node_info = {"node_id": node, "client_address": "", "peer_address": ""}
        state.apply({"op": "register_node", **node_info})
    state.apply({"op": "create_topic", "name": "t", "settings": SETTINGS, "replicas": replicas})
    return state


def test_a_gone_node_is_never_a_move_target_even_if_gossip_calls_it_live() -> None:
    # Node 4 holds nothing, so evening out would fill it; but it has been dead for longer than
    # node_dead_after, and a stale suspect state in gossip must not make it a target again.
    state = state_with([1, 2, 3, 4], [[1, 2, 3]] * 6)
    assert plan_moves(state, live={1, 2, 3, 4}, gone={4}, max_concurrent=4) == []
    moves = plan_moves(state, live={1, 2, 3, 4}, gone=set(), max_concurrent=4)
    assert moves and all(move.target == 4 for move in moves)


def test_abort_move_keeps_the_replicas_and_clears_the_move() -> None:
    state = state_with([1, 2, 3, 4], [[1, 2, 3]] * 6)
    move = {"topic_id": 1, "partition": 0, "from": 2, "to": 4}
    assert state.apply({"op": "start_move", **move}) is not None
    assert state.apply({"op": "abort_move", **move, "to": 3}) is None  # not this move
    assert state.apply({"op": "abort_move", **move}) is not None
    assignment = state.topics["t"].partitions[0]
    assert assignment.replicas == [1, 2, 3] and not assignment.moving


def group() -> Net:
    net = Net([1, 2, 3], election_tick=10)
    net.elect(1)
    assert net[1].role == Role.LEADER
    return net


def settle(net: Net) -> None:
    net.deliver()
    for _ in range(20):  # let heartbeats carry the commit index
        net.tick_all()


def test_a_move_to_a_learner_that_died_is_undone() -> None:
    net = group()
    assert not advance_move(
        net[1], 2, 4, target_ready=True
    )  # adds node 4 as a learner; node 4 never answers
    settle(net)
    assert 4 in net[1].committed_conf.learners
    assert not advance_move(net[1], 2, 4, target_ready=True)  # never caught up: no promotion
    assert not undo_move(net[1], 4)  # proposes removing the learner
    settle(net)
    assert undo_move(net[1], 4)
    committed = net[1].committed_conf
    assert committed.voters == (1, 2, 3) and committed.learners == ()


def test_a_move_to_a_voter_that_died_is_undone_with_the_source_still_there() -> None:
    net = group()
    advance_move(net[1], 2, 4, target_ready=True)
    net.start(4, ConfState(()))
    settle(net)
    while 4 not in net[1].committed_conf.voters:  # caught up: promoted
        assert not advance_move(net[1], 2, 4, target_ready=True)
        settle(net)
    assert not move_done(net[1], 2, 4)  # the source has not been removed yet
    net.isolate(4)  # the target dies
    assert not undo_move(net[1], 4)
    settle(net)  # 3 of the 4 voters commit its removal
    assert undo_move(net[1], 4)
    assert net[1].committed_conf.voters == (1, 2, 3)


def test_a_move_back_is_not_answered_by_the_replica_the_target_held_before() -> None:
    """Raft knows a replica only by its node id. Node 2 is moved off a group while it is down,
    and moved back before it has applied that: it still hosts its old replica, which must not
    answer for the new one. The leader adds the target once the target recorded that it applied
    the move (``move_target_ready``). Without that wait the old replica caught up as the learner
    and got node 2 promoted; the empty replica that replaced it moments later was then a voter
    whose match the leader took for granted and which it never caught up (here: the leader's
    probe at that match and the replica's refusal go back and forth for ever, "network did not
    quiesce"; on real nodes, tests/test_node_rebalance.py timed out with it far behind)."""
    net = group()
    leader_view = state_with([1, 2, 3, 4], [[1, 2, 3]])  # the metadata as node 1 applied it
    commands: list[dict[str, object]] = []  # the metadata log, which node 2 applies late

    def commit(command: dict[str, object]) -> None:
        commands.append(command)
        leader_view.apply(command)

    def carry_out(source: int, target: int, lag: int, open_target: Callable[[], None]) -> None:
        """The leader's placement steps; the target applies the start_move ``lag`` steps late,
        opens its replica (having, in log order, dropped any older one) and says so."""
        move = {"topic_id": 1, "partition": 0, "from": source, "to": target}
        commit({"op": "start_move", **move, "request_id": f"move-{source}-{target}"})
        assignment = leader_view.topics["t"].partitions[0]
        for step in range(40):
            if step == lag:
                open_target()
                ready = {"move_id": assignment.move_id, "request_id": f"ready-{target}"}
                commit({"op": "move_target_ready", **move, **ready})
            if advance_move(net[1], source, target, assignment.target_ready) and step >= lag:
                commit({"op": "finish_move", **move})
                return
            settle(net)
        raise AssertionError(f"move {source} -> {target} did not finish")

    def node_2_applies_the_metadata() -> None:
        node_2_view = state_with([1, 2, 3, 4], [[1, 2, 3]])
        for command in commands:
            node_2_view.apply(command)
        # The finish_move of 2 -> 4 dropped the old replica; the start_move of 3 -> 2 opens a
        # fresh one (in a directory of its own).
        net.storages[2] = MemoryStorage()
        net.hard_states.pop(2, None)
        net.confs.pop(2, None)
        net.start(2, ConfState(tuple(node_2_view.topics["t"].partitions[0].replicas), (2,)))

    for i in range(5):
        net[1].propose(b"before %d" % i)
    settle(net)
    net.isolate(2)  # node 2 is down; its replica moves to node 4
    carry_out(2, 4, 0, lambda: net.start(4, ConfState((1, 2, 3), (4,))))
    for i in range(5):
        net[1].propose(b"without node 2 %d" % i)
    settle(net)
    # Node 2 is back with its old replica and takes a few placement steps to apply the
    # metadata: long enough for that replica to catch up and be promoted, were it let in.
    net.heal()
    carry_out(3, 2, 6, node_2_applies_the_metadata)
    for i in range(5):
        net[1].propose(b"after %d" % i)
    settle(net)
    assert net[1].committed_conf.voters == (1, 2, 4)
    assert net.entries(2) == net.entries(1)
