"""A rolling restart under a steady acks=all producer: every node in turn gets SIGTERM, hands
its leaderships over before it exits, and comes back. No send fails, every acknowledged record
is read back, and when a stopped node's process has exited the metadata already names other
leaders for everything it led (without the hand-off they would stay on record until an
election timeout and a report later)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.localcluster import LocalCluster
from tests.cluster_fixture import free_port_pairs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TOPIC = "roll"
PARTITIONS = 6


async def test_rolling_restart_fails_no_send(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", free_port_pairs(3))
    cluster.start()
    try:
        await cluster.wait_ready(60)
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
        acked: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        failures: list[BaseException] = []
        stop = asyncio.Event()

        async def produce(producer: Producer) -> None:
            i = 0
            while not stop.is_set():
                futures = [
                    await producer.send(TOPIC, str(i + n).encode(), partition=(i + n) % PARTITIONS)
                    for n in range(20)
                ]
                for n, future in enumerate(futures):
                    try:
                        sent = await future
                    except Exception as exc:  # what the application would see
                        failures.append(exc)
                        continue
                    acked[sent.partition].append(i + n)
                i += 20
                await asyncio.sleep(0.005)

        async with Producer(cluster.bootstrap, acks="all", linger_ms=1) as producer:
            task = asyncio.create_task(produce(producer))
            for node_id in (1, 2, 3):
                await asyncio.sleep(1.0)
                led_before = await leaders_of(cluster, node_id, node_id)
                started = time.monotonic()
                code = await asyncio.to_thread(cluster.stop_node, node_id, 15.0)
                took = time.monotonic() - started
                assert code == 0, cluster.log_tail(node_id)
                assert took < 8, f"node {node_id} took {took:.1f} s to stop"
                other = 1 if node_id != 1 else 2
                still = await leaders_of(cluster, other, node_id)
                assert not still, (
                    f"node {node_id} exited still on record as the leader of partitions "
                    f"{still} (it led {led_before})"
                )
                await asyncio.to_thread(cluster.start_node, node_id)
                await cluster.wait_ready(60)
            await asyncio.sleep(1.0)
            stop.set()
            await task
        assert not failures, f"{len(failures)} sends failed, first: {failures[0]!r}"
        async with Consumer(cluster.bootstrap) as consumer:
            tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
            await consumer.assign(tps)
            await consumer.seek_to_beginning()
            got: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
            want = sum(len(v) for v in acked.values())
            deadline = time.monotonic() + 30
            while sum(len(v) for v in got.values()) < want and time.monotonic() < deadline:
                for record in await consumer.getmany(timeout_ms=500):
                    assert record.value is not None
                    got[record.partition].append(int(record.value))
        for partition in range(PARTITIONS):
            assert got[partition] == acked[partition], f"partition {partition} differs"
        assert want > 500, "the producer kept writing through the restarts"
    finally:
        cluster.stop()


async def leaders_of(cluster: LocalCluster, ask: int, node_id: int) -> list[int]:
    """Partitions the metadata on node ``ask`` names ``node_id`` the leader of."""
    async with Admin(cluster.nodes[ask].client_address) as admin:
        description = await admin.describe_topic(TOPIC)
    return [p.partition for p in description.partitions if p.leader == node_id]
