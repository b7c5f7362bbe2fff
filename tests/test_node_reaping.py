"""A node that stays down past ``--reap-after`` is forgotten: the gossip reaps it, the metadata
leader forgets it (it holds no replica) and removes its metadata learner, and it drops out of
`cluster status`. Started again, it registers afresh and is a member like any other."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from laminar.client import Admin
from laminar.client.descriptions import ClusterStatus
from laminar.client.localcluster import LocalCluster
from tests.cluster_fixture import free_port_pairs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


async def wait_status(
    admin: Admin, check: object, what: str, timeout: float = 60.0
) -> ClusterStatus:
    deadline = time.monotonic() + timeout
    while True:
        status = await admin.cluster_status()
        if check(status):  # type: ignore[operator]
            return status
        assert time.monotonic() < deadline, f"{what}; last status: {status.members}"
        await asyncio.sleep(0.3)


async def test_a_long_dead_node_is_forgotten_and_can_come_back(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "cluster",
        free_port_pairs(4),
        extra_args=["--reap-after", "3", "--node-dead-after", "1"],
    )
    cluster.start()
    try:
        await cluster.wait_ready(60)
        async with Admin(cluster.nodes[1].client_address) as admin:

            def states(status: ClusterStatus) -> dict[int, str]:
                return {m.node_id: m.state for m in status.members}

            await wait_status(admin, lambda s: states(s).get(4) == "alive", "node 4 never alive")
            await asyncio.to_thread(cluster.kill_node, 4)
            status = await wait_status(
                admin, lambda s: 4 not in states(s), "node 4 was never forgotten"
            )
            assert sorted(states(status)) == [1, 2, 3]
            assert all(state == "alive" for state in states(status).values())

            await asyncio.to_thread(cluster.start_node, 4)
            await wait_status(
                admin, lambda s: states(s).get(4) == "alive", "node 4 did not come back"
            )
            # Back as a full member: it can hold replicas of a new topic.
            await admin.create_topic("after", partitions=4, replication_factor=3)
            described = await admin.describe_topic("after")
            assert any(4 in p.replicas for p in described.partitions)
    finally:
        cluster.stop()
