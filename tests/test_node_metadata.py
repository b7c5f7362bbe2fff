"""The metadata state machine and replica placement."""

from __future__ import annotations

import pytest

from laminar.errors import (
    InvalidRequestError,
    NotEnoughReplicasError,
    TopicExistsError,
    UnknownTopicError,
)
from laminar.node.metadata import (
    MetadataState,
    decode_command,
    encode_command,
    group_id,
    place_replicas,
    validate_topic_name,
)
from laminar.node.metadata_checkpoint import encode, restore

SETTINGS = {
    "partitions": 3,
    "replication_factor": 2,
    "segment_bytes": 1 << 20,
    "segment_ms": 1000,
    "retention_ms": None,
    "retention_bytes": None,
}


def create(state: MetadataState, name: str) -> object:
    return state.apply(
        {"op": "create_topic", "name": name, "settings": SETTINGS, "replicas": [[1, 2]] * 3}
    )


def test_create_delete_and_ids_never_repeat() -> None:
    state = MetadataState()
    first = create(state, "a")
    assert state.topics["a"].topic_id == 1
    with pytest.raises(TopicExistsError):
        create(state, "a")
    state.apply({"op": "delete_topic", "name": "a"})
    with pytest.raises(UnknownTopicError):
        state.apply({"op": "delete_topic", "name": "a"})
    create(state, "a")
    assert state.topics["a"].topic_id == 2, "a re-created topic gets a new id (new groups)"
    assert first is not state.topics["a"]


def test_set_leader_ignores_older_terms() -> None:
    state = MetadataState()
    create(state, "t")
    state.apply({"op": "set_leader", "topic_id": 1, "partition": 0, "leader": 2, "term": 5})
    state.apply({"op": "set_leader", "topic_id": 1, "partition": 0, "leader": 1, "term": 4})
    assert state.topics["t"].partitions[0].leader == 2


def test_set_leaders_records_many_partitions_and_ignores_older_terms_and_gone_topics() -> None:
    state = MetadataState()
    create(state, "t")
    state.apply({"op": "set_leader", "topic_id": 1, "partition": 2, "leader": 2, "term": 5})
    state.apply(
        {
            "op": "set_leaders",
            "leader": 1,
            "partitions": [[1, 0, 3], [1, 1, 1], [1, 2, 4], [9, 0, 1]],
        }
    )
    leaders = [(p.leader, p.leader_term) for p in state.topics["t"].partitions]
    assert leaders == [(1, 3), (1, 1), (2, 5)], "partition 2's newer record stands"


def test_placement_looks_again_after_any_command_but_a_leadership_report() -> None:
    # Thousands of leadership reports arrive while a big topic is created or a node fails;
    # replica placement (a pass over every partition) need not look again after each.
    state = MetadataState()
    create(state, "t")
    seen = state.placement_changes
    state.apply({"op": "set_leader", "topic_id": 1, "partition": 0, "leader": 2, "term": 5})
    state.apply({"op": "set_leaders", "leader": 1, "partitions": [[1, 1, 3]]})
    assert state.placement_changes == seen
    create(state, "u")
    assert state.placement_changes == seen + 1
    restored = MetadataState()
    restore(restored, encode(state))
    assert restored.placement_changes == 1 and restored == state


def test_commands_round_trip_and_reject_garbage() -> None:
    command = {"op": "delete_topic", "name": "x"}
    assert decode_command(encode_command(command)) == command
    with pytest.raises(InvalidRequestError):
        decode_command(b"[1, 2]")
    with pytest.raises(InvalidRequestError):
        MetadataState().apply({"op": "launch_rockets"})


def test_placement_is_even_and_spreads_leaders() -> None:
    placement = place_replicas(6, 3, [1, 2, 3], {})
    counts = {n: sum(n in r for r in placement) for n in (1, 2, 3)}
    assert counts == {1: 6, 2: 6, 3: 6}
    leaders = [r[0] for r in placement]
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]
    assert all(len(set(r)) == 3 for r in placement)


def test_placement_prefers_least_loaded_nodes() -> None:
    placement = place_replicas(2, 1, [1, 2, 3, 4], {1: 5, 2: 5, 3: 0, 4: 0})
    assert sorted(r[0] for r in placement) == [3, 4]


def test_placement_errors() -> None:
    with pytest.raises(NotEnoughReplicasError):
        place_replicas(1, 3, [1, 2], {})
    with pytest.raises(InvalidRequestError):
        place_replicas(0, 1, [1], {})


@pytest.mark.parametrize("name", ["", "a/b", "..\x00", "x" * 201, "spaces here"])
def test_bad_topic_names(name: str) -> None:
    with pytest.raises(InvalidRequestError):
        validate_topic_name(name)


def test_group_ids_are_unique_per_topic_and_partition() -> None:
    ids = {group_id(t, p) for t in range(1, 5) for p in range(100)}
    assert len(ids) == 400
    assert 0 not in ids


def test_add_partitions_appends_and_refuses_a_stale_placement() -> None:
    state = MetadataState()
    create(state, "t")
    command = {"op": "add_partitions", "name": "t", "from": 3, "replicas": [[2, 1], [1, 2]]}
    topic = state.apply(command)
    assert [p.replicas for p in state.topics["t"].partitions] == [[1, 2]] * 3 + [[2, 1], [1, 2]]
    assert topic is state.topics["t"] and state.topics["t"].settings.partitions == 5
    with pytest.raises(InvalidRequestError):  # placed for 3 partitions, the topic has 5 now
        state.apply(command)
    assert len(state.topics["t"].partitions) == 5
    with pytest.raises(UnknownTopicError):
        state.apply({**command, "name": "nope"})


def test_alter_topic_changes_only_log_settings() -> None:
    state = MetadataState()
    create(state, "t")
    state.apply({"op": "alter_topic", "name": "t", "settings": {"retention_bytes": 4096}})
    assert state.topics["t"].settings.retention_bytes == 4096
    with pytest.raises(InvalidRequestError):
        state.apply({"op": "alter_topic", "name": "t", "settings": {"partitions": 9}})
    assert state.topics["t"].settings.partitions == 3


def test_undrain_takes_back_a_drain() -> None:
    state = MetadataState()
    state.apply(
        {"op": "register_node", "node_id": 2, "client_address": "a:1", "peer_address": "a:2"}
    )
    state.apply({"op": "drain_node", "node_id": 2})
    assert state.draining == {2}
    state.apply({"op": "undrain_node", "node_id": 2})
    assert state.draining == set()
    with pytest.raises(InvalidRequestError):
        state.apply({"op": "undrain_node", "node_id": 7})


def test_placement_of_added_partitions_continues_the_leader_rotation() -> None:
    placed = place_replicas(3, 1, [1, 2, 3], {}, first=1)
    assert [r[0] for r in placed] == [2, 3, 1]


def test_forget_node_only_once_it_holds_no_replica() -> None:
    state = MetadataState()
    for node_id in (1, 2, 3):
        state.apply(
            {
                "op": "register_node",
                "node_id": node_id,
                "client_address": f"h:{node_id}",
                "peer_address": f"h:{node_id + 100}",
            }
        )
    create(state, "t")  # replicas on nodes 1 and 2
    with pytest.raises(InvalidRequestError, match="still holds"):
        state.apply({"op": "forget_node", "node_id": 2})
    state.apply({"op": "drain_node", "node_id": 3})
    assert state.apply({"op": "forget_node", "node_id": 3}) == 3
    assert sorted(state.nodes) == [1, 2] and not state.draining
    with pytest.raises(InvalidRequestError):
        state.apply({"op": "forget_node", "node_id": 3})
