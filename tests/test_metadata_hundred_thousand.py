"""A hundred thousand metadata changes on real node processes (issue 15's bound): with the
default checkpoint interval every node's metadata log stays bounded, and a node that joins
afterwards starts from a checkpoint, not from the history, and ends with the same state.

The changes are share-group settings (``alter_queue_config``, one metadata command each),
many in flight at once as an application's admin calls would be."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from laminar.client import Admin
from laminar.client.localcluster import LocalCluster
from laminar.node.config import NodeConfig
from tests.cluster_fixture import free_port_pairs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHANGES = 100_000
GROUPS = 100
IN_FLIGHT = 256
EVERY = next(  # the default interval, not a test setting
    f.default for f in dataclasses.fields(NodeConfig) if f.name == "metadata_checkpoint_commands"
)
REBUILT = "metadata state rebuilt from a checkpoint"


async def settings(address: str) -> dict[str, tuple[int | None, int | None, str | None]]:
    async with Admin(address) as admin:
        out = {}
        for g in range(GROUPS):
            config = await admin.describe_queue_config(f"g{g}")
            out[f"g{g}"] = (config.lock_ms, config.max_deliveries, config.dead_letter_topic)
        return out


async def test_100k_changes_keep_the_log_bounded_and_a_new_node_starts_from_a_checkpoint(
    tmp_path: Path,
) -> None:
    assert EVERY * 3 < CHANGES
    cluster = LocalCluster(tmp_path, free_port_pairs(4))  # node 4 joins afterwards
    for node_id in (1, 2, 3):
        cluster.start_node(node_id)
    try:
        await cluster.wait_ready(60, nodes=3)
        first = ",".join(cluster.nodes[n].client_address for n in (1, 2, 3))
        async with Admin(first) as admin:
            gate = asyncio.Semaphore(IN_FLIGHT)

            async def change(i: int) -> None:
                async with gate:
                    await admin.alter_queue_config(f"g{i % GROUPS}", lock_ms=1_000 + i)

            started = time.monotonic()
            await asyncio.gather(*(change(i) for i in range(CHANGES)))
            print(f"{CHANGES / (time.monotonic() - started):.0f} metadata changes/s")
            rows = (await admin.cluster_status()).metadata_log
        assert {row.node_id for row in rows} == {1, 2, 3}
        for row in rows:
            # Cut at a checkpoint, and at most a couple of intervals beyond it.
            assert row.checkpoint >= row.start_offset > 0, row
            assert row.end_offset - row.start_offset < 3 * EVERY, row
        want = await settings(cluster.nodes[1].client_address)
        assert {lock for lock, _, _ in want.values()} <= set(range(1_000, 1_000 + CHANGES))

        cluster.start_node(4)
        node4 = cluster.nodes[4]
        deadline = time.monotonic() + 60
        while REBUILT not in node4.log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline, "node 4 never rebuilt from a checkpoint"
            await asyncio.sleep(0.3)
        async with Admin(node4.client_address) as admin:
            while True:
                rows = {r.node_id: r for r in (await admin.cluster_status()).metadata_log}
                row = rows.get(4)
                if row is not None and row.applied >= min(
                    r.applied for r in rows.values() if r.node_id != 4
                ):
                    break
                assert time.monotonic() < deadline, f"node 4 did not catch up: {rows}"
                await asyncio.sleep(0.3)
        assert row.start_offset > 0, "node 4 replayed the history instead of a checkpoint"
        assert await settings(node4.client_address) == want
    finally:
        cluster.stop()
