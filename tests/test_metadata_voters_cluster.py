"""The metadata voters follow the cluster, on five real node processes: the first three nodes
start as voters, the metadata leader promotes the other two, and after two of the original
three die the control plane still works (a majority of five is alive) and the dead pair is
replaced by removing them, leaving three good voters."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from laminar.client import Admin
from laminar.client.localcluster import LocalCluster
from tests.cluster_fixture import free_port_pairs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def voters(admin: Admin) -> set[int]:
    status = await admin.cluster_status()
    return {m.node_id for m in status.members if m.metadata_voter}


async def wait_voters(admin: Admin, wanted: set[int], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    seen: set[int] = set()
    while time.monotonic() < deadline:
        try:
            seen = await voters(admin)
        except Exception:  # a node of the bootstrap list is down, or no leader yet
            seen = set()
        if seen == wanted:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"metadata voters {seen}, wanted {wanted}")


async def test_losing_two_of_the_original_three_keeps_the_control_plane(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "cluster", free_port_pairs(5), extra_args=["--node-dead-after", "2"]
    )
    cluster.start()
    try:
        await cluster.wait_ready(90)
        async with Admin(cluster.nodes[5].client_address) as admin:
            await wait_voters(admin, {1, 2, 3, 4, 5})
            for node_id in (1, 2):
                await asyncio.to_thread(cluster.kill_node, node_id)
            await admin.create_topic("after-loss", partitions=2, replication_factor=3)
            await wait_voters(admin, {3, 4, 5})
            await admin.create_topic("after-removal", partitions=2, replication_factor=3)
            assert {"after-loss", "after-removal"} <= set(await admin.list_topics())
            # A returning original stays a learner: four eligible nodes keep three voters.
            await asyncio.to_thread(cluster.start_node, 1)
            deadline = time.monotonic() + 30
            while 1 not in {m.node_id for m in (await admin.cluster_status()).members}:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.5)
            assert await voters(admin) == {3, 4, 5}
    finally:
        cluster.stop()
