"""Consumer groups on real nodes, spoken in the raw client protocol (no group client):
coordinator routing, durable offsets, the revocation handshake across two members, the
internal topic's protections, and checkpoints that keep the internal partition small.

The first test runs one in-process node (so the checkpoint thresholds can be tiny); the others
share a 3-node process cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from laminar.client import Admin, Producer
from laminar.client.cluster import Cluster
from laminar.errors import (
    FencedMemberEpochError,
    GroupNotEmptyError,
    InvalidOffsetError,
    InvalidRequestError,
    LaminarError,
    NotLeaderError,
    PartitionNotOwnedError,
    RequestTimeoutError,
    UnknownMemberIdError,
    UnknownTopicError,
)
from laminar.groups.service import INTERNAL_TOPIC
from laminar.groups.settings import GroupSettings
from laminar.node.metadata import group_id
from tests.cluster_fixture import ClusterHandle, start_cluster
from tests.single_node import SingleNode, create_topic

TOPIC = "events"


async def ask(bootstrap: str, fill: Any, timeout: float = 20.0) -> Any:
    """Send a group request to every node in turn until one is the coordinator (a real client
    follows the NotLeader hint; trying them all keeps this test independent of that code)."""
    cluster = await Cluster.connect(bootstrap, request_timeout=10.0)
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            metadata = await cluster.refresh_metadata()
            for node_id in sorted(metadata.brokers):
                try:
                    connection = await cluster.connection(node_id)
                    reply, _ = await connection.request(fill, timeout=10.0)
                except (ConnectionError, OSError, NotLeaderError, RequestTimeoutError):
                    continue
                return reply
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("no node answered as the coordinator")
            await asyncio.sleep(0.2)
    finally:
        cluster.close()


async def heartbeat(
    bootstrap: str,
    group: str,
    member: str,
    epoch: int,
    topics: list[str],
    owned: list[tuple[str, int]],
    instance: str = "",
) -> tuple[int, set[tuple[str, int]]]:
    def fill(body: Any) -> None:
        request = body.init("groupHeartbeat")
        request.group = group
        request.memberId = member
        request.memberEpoch = epoch
        request.instanceId = instance
        request.rebalanceTimeoutMs = 10_000
        request.topics = topics
        slots = request.init("owned", len(owned))
        for slot, (topic, partition) in zip(slots, owned, strict=True):
            slot.topic, slot.partition = topic, partition

    reply = await ask(bootstrap, fill)
    out = reply.body.groupHeartbeat
    return out.memberEpoch, {(p.topic, p.partition) for p in out.assignment}


async def commit(
    bootstrap: str, group: str, member: str, epoch: int, offsets: dict[tuple[str, int], int]
) -> None:
    def fill(body: Any) -> None:
        request = body.init("commitOffsets")
        request.group, request.memberId, request.memberEpoch = group, member, epoch
        slots = request.init("offsets", len(offsets))
        for slot, ((topic, partition), offset) in zip(slots, offsets.items(), strict=True):
            slot.topic, slot.partition, slot.offset = topic, partition, offset
            slot.metadata = f"m{offset}"

    await ask(bootstrap, fill)


async def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    def fill(body: Any) -> None:
        body.init("fetchOffsets").group = group

    reply = await ask(bootstrap, fill)
    return {(o.topic, o.partition): o.offset for o in reply.body.offsets.offsets}


async def describe_raw(bootstrap: str, group: str) -> Any:
    def fill(body: Any) -> None:
        body.describeGroup = group

    return (await ask(bootstrap, fill)).body.group


async def describe(bootstrap: str, group: str) -> Any:
    group_reply = await describe_raw(bootstrap, group)
    return {
        "state": group_reply.state,
        "members": {
            m.memberId: {(p.topic, p.partition) for p in m.assigned} for m in group_reply.members
        },
    }


async def leave(bootstrap: str, group: str, member: str, epoch: int) -> None:
    def fill(body: Any) -> None:
        request = body.init("leaveGroup")
        request.group, request.memberId, request.memberEpoch = group, member, epoch

    await ask(bootstrap, fill)


# --------------------------------------------------------------------------- one node


async def test_checkpoints_keep_the_group_partition_small_and_offsets_survive_restart(
    tmp_path: Path,
) -> None:
    settings = GroupSettings(
        partitions=1, segment_bytes=4096, checkpoint_min_records=200, session_timeout_ms=30_000
    )
    single = SingleNode(tmp_path, rack="r1", groups=settings)
    bootstrap = single.bootstrap
    node = await single.start()
    try:
        await create_topic(bootstrap, TOPIC, 4)
        epoch, assigned = await heartbeat(bootstrap, "g", "m1", 0, [TOPIC], [])
        assert assigned == {(TOPIC, p) for p in range(4)}
        # the node's rack reaches the assignor (it prefers members in a replica's rack)
        assert node.groups.replica_racks() == {(TOPIC, p): frozenset({"r1"}) for p in range(4)}
        for i in range(1, 600):  # ~3 checkpoints' worth of records
            await commit(bootstrap, "g", "m1", epoch, {(TOPIC, i % 4): i})
        internal = node.state.topics[INTERNAL_TOPIC]
        replica = node.runtime.replicas[group_id(internal.topic_id, 0)]
        assert replica.log.start_offset > 0, "no checkpoint let old segments go"
        assert replica.log.end_offset - replica.log.start_offset < 600
        await leave(bootstrap, "g", "m1", epoch)
        want = {(TOPIC, p): max(i for i in range(1, 600) if i % 4 == p) for p in range(4)}
        assert await committed(bootstrap, "g") == want
    finally:
        await node.stop()
    node = await single.start()  # a restart replays from the checkpoint
    try:
        assert await committed(bootstrap, "g") == want
        assert (await describe(bootstrap, "g"))["state"] == "empty"
    finally:
        await node.stop()


# --------------------------------------------------------------------------- three nodes


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    handle = start_cluster(
        Path(tmp_path_factory.mktemp("groups")),
        nodes=3,
        extra_args=["--group-session-timeout", "3", "--group-heartbeat-interval", "0.5"],
    )
    try:
        yield handle
    finally:
        handle.stop()


@pytest.mark.slow
async def test_two_members_split_partitions_with_no_overlap_and_offsets_are_durable(
    cluster: ClusterHandle,
) -> None:
    bootstrap = cluster.bootstrap
    async with Admin(bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=6, replication_factor=3)
    everything = {(TOPIC, p) for p in range(6)}
    e1, a1 = await heartbeat(bootstrap, "two", "m1", 0, [TOPIC], [])
    assert a1 == everything
    e2, a2 = await heartbeat(bootstrap, "two", "m2", 0, [TOPIC], [])
    assert a2 == set(), "m2 got partitions m1 still owns"
    # m1 learns what to revoke; m2 gets nothing until m1 says it let go
    e1, a1 = await heartbeat(bootstrap, "two", "m1", e1, [TOPIC], sorted(a1))
    assert len(a1) == 3
    e2, a2 = await heartbeat(bootstrap, "two", "m2", e2, [TOPIC], [])
    assert a2 == set()
    # a commit for a partition being revoked still works; one for a partition never held not
    revoked = sorted(everything - a1)
    await commit(bootstrap, "two", "m1", e1, {revoked[0]: 11})
    with pytest.raises(PartitionNotOwnedError):
        await commit(bootstrap, "two", "m2", e2, {revoked[0]: 12})
    e1, a1 = await heartbeat(bootstrap, "two", "m1", e1, [TOPIC], sorted(a1))
    e2, a2 = await heartbeat(bootstrap, "two", "m2", e2, [TOPIC], [])
    assert a1 | a2 == everything and not a1 & a2 and len(a2) == 3
    assert (await describe(bootstrap, "two"))["state"] == "stable"
    await commit(bootstrap, "two", "m2", e2, {tp: 5 for tp in a2})
    # typed errors
    with pytest.raises(FencedMemberEpochError):
        await commit(bootstrap, "two", "m2", e2 + 100, {sorted(a2)[0]: 6})
    with pytest.raises(UnknownMemberIdError):
        await heartbeat(bootstrap, "two", "nobody", 3, [TOPIC], [])
    with pytest.raises(InvalidOffsetError):
        await commit(bootstrap, "two", "m2", e2, {sorted(a2)[0]: -1})
    with pytest.raises(UnknownTopicError):
        await commit(bootstrap, "two", "m2", e2, {("nope", 0): 1})
    with pytest.raises(GroupNotEmptyError):
        await commit(bootstrap, "two", "", -1, {sorted(a2)[0]: 1})
    want = {revoked[0]: 11, **{tp: 5 for tp in a2}}
    assert await committed(bootstrap, "two") == want

    # The coordinator's node dies: the next one has the same offsets and members.
    coordinator = (await describe_raw(bootstrap, "two")).coordinator
    cluster.kill(coordinator)
    try:
        assert await committed(bootstrap, "two") == want
        assert set((await describe(bootstrap, "two"))["members"]) == {"m1", "m2"}
        assert (await describe_raw(bootstrap, "two")).coordinator != coordinator
    finally:
        cluster.restart(coordinator)


@pytest.mark.slow
async def test_a_member_that_stops_heartbeating_loses_its_partitions(
    cluster: ClusterHandle,
) -> None:
    bootstrap = cluster.bootstrap
    async with Admin(bootstrap) as admin:
        if TOPIC not in await admin.list_topics():
            await admin.create_topic(TOPIC, partitions=6, replication_factor=3)
    e1, a1 = await heartbeat(bootstrap, "expiry", "m1", 0, [TOPIC], [])
    e2, _ = await heartbeat(bootstrap, "expiry", "m2", 0, [TOPIC], [])
    e1, a1 = await heartbeat(bootstrap, "expiry", "m1", e1, [TOPIC], sorted(a1))
    e1, a1 = await heartbeat(bootstrap, "expiry", "m1", e1, [TOPIC], sorted(a1))
    # m2 goes silent; m1 keeps heartbeating and gets everything after the 3 s session
    loop = asyncio.get_running_loop()
    start = loop.time()
    while len(a1) < 6:
        await asyncio.sleep(0.5)
        e1, a1 = await heartbeat(bootstrap, "expiry", "m1", e1, [TOPIC], sorted(a1))
        assert loop.time() - start < 10, "m2's partitions were never reassigned"
    assert loop.time() - start > 2.5
    with pytest.raises(UnknownMemberIdError):
        await commit(bootstrap, "expiry", "m2", e2, {(TOPIC, 0): 1})


@pytest.mark.slow
async def test_the_internal_topic_is_the_clusters_own(cluster: ClusterHandle) -> None:
    bootstrap = cluster.bootstrap
    await committed(bootstrap, "any")  # makes sure the topic exists
    async with Admin(bootstrap) as admin:
        assert INTERNAL_TOPIC in await admin.list_topics()
        with pytest.raises(InvalidRequestError):
            await admin.create_topic("__mine", partitions=1, replication_factor=1)
        with pytest.raises(InvalidRequestError):
            await admin.delete_topic(INTERNAL_TOPIC)
    async with Producer(bootstrap, acks="all") as producer:
        with pytest.raises(LaminarError):
            await (await producer.send(INTERNAL_TOPIC, b"x", partition=0))


@pytest.mark.slow
async def test_deleting_a_topic_removes_its_offsets_from_every_group(
    cluster: ClusterHandle,
) -> None:
    bootstrap = cluster.bootstrap
    async with Admin(bootstrap) as admin:
        for topic in ("doomed", "kept"):
            await admin.create_topic(topic, partitions=2, replication_factor=3)
    offsets = {("doomed", 0): 3, ("doomed", 1): 4, ("kept", 0): 5}
    await commit(bootstrap, "outside", "", -1, offsets)  # from outside the (empty) group
    assert await committed(bootstrap, "outside") == offsets
    async with Admin(bootstrap) as admin:
        await admin.delete_topic("doomed")
    deadline = asyncio.get_running_loop().time() + 10
    while (found := await committed(bootstrap, "outside")) != {("kept", 0): 5}:
        assert asyncio.get_running_loop().time() < deadline, found
        await asyncio.sleep(0.2)
