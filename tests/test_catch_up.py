"""A node back after writes went on without it catches up every partition: real processes.

At 10,000 partitions, 4 GiB written while a node was down: one drain's appends to it left as
one frame over the receiver's 64 MiB limit, which closed the connection, and every retry did
the same; bounded frames then still queued gigabytes toward it, its heartbeats and votes
waited behind them, and groups lost their leaders. Frames now carry at most 8 MiB of entries
(``raft_codec.encode_frames``) and a node queues at most about 32 MiB of entries toward a peer
(``send_gate.PeerBacklog``). Here 200 partitions owe the returning node about 210 MiB, over
1 MiB (one message) each.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from laminar.client import Admin, Producer
from tests.cluster_fixture import start_cluster

PARTITIONS = 200
RECORDS_PER_PARTITION = 1100
VALUE = b"v" * 1000
CAUGHT_UP_WITHIN = 90.0


async def _lag_of(admin: Admin, node_id: int) -> int | None:
    """Records the node's replicas lack, by their leaders' account (None: not all seen)."""
    try:
        status = await admin.cluster_status()
    except Exception:  # (a node still starting)
        return None
    hosted = [r for p in status.partitions for r in p.replicas if r.node_id == node_id]
    return sum(r.lag for r in hosted) if len(hosted) == PARTITIONS else None


async def test_a_node_back_after_writes_without_it_catches_up_every_partition(
    tmp_path: Path,
) -> None:
    cluster = start_cluster(tmp_path, 3, log_level="warning")
    try:
        async with Admin(cluster.bootstrap, request_timeout_ms=30_000) as admin:
            await admin.create_topic("owed", partitions=PARTITIONS, replication_factor=3)
            cluster.kill(3)
            async with Producer(
                cluster.bootstrap, acks="all", retries=1_000, retry_backoff_ms=50
            ) as producer:
                values = [VALUE] * RECORDS_PER_PARTITION
                deliveries = [
                    await producer.send_many("owed", values, partition=p) for p in range(PARTITIONS)
                ]
                for delivery in deliveries:
                    await delivery
            owed = PARTITIONS * RECORDS_PER_PARTITION * len(VALUE)
            assert owed > 64 * 1024 * 1024  # (more than one frame could ever hold)
            cluster.start_node(3)
            deadline = time.monotonic() + CAUGHT_UP_WITHIN
            lag = await _lag_of(admin, 3)
            while lag != 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                lag = await _lag_of(admin, 3)
            assert lag == 0, f"node 3 still lacks {lag} records\n{cluster.logs()}"
            logs = cluster.logs()
            assert "bad frame" not in logs and "peer silent" not in logs, logs
    finally:
        cluster.stop()
