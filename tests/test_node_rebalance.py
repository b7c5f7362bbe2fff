"""Replica rebalancing on real node processes under a steady producer.

A 3-node cluster with a 12-partition RF 3 topic; a 4th node joins through gossip and receives
replicas until every node is within one of the mean; one node is SIGKILLed for longer than
``node_dead_after`` and every partition returns to 3 in-sync replicas on the others; it comes
back, is drained and ends with no replicas. No acknowledged record is lost throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.descriptions import ClusterStatus
from laminar.client.localcluster import LocalCluster
from tests.cluster_fixture import free_port_pairs

pytestmark = pytest.mark.slow

TOPIC = "moving"
PARTITIONS = 12
DEAD_AFTER = ["--node-dead-after", "3"]


class SteadyProducer:
    """Sends record i to partition i % 12, one small batch at a time, until stopped."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.acked: dict[int, tuple[int, int]] = {}
        self.sent = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> SteadyProducer:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        async with Producer(self.bootstrap, linger_ms=1, retries=50) as producer:
            while not self._stop.is_set():
                futures = {}
                for _ in range(60):
                    i = self.sent
                    futures[i] = await producer.send(TOPIC, b"%08d" % i, partition=i % 12)
                    self.sent += 1
                for i, future in futures.items():
                    with contextlib.suppress(Exception):
                        meta = await future
                        self.acked[i] = (meta.partition, meta.offset)
                await asyncio.sleep(0.02)


async def status(bootstrap: str) -> ClusterStatus:
    async with Admin(bootstrap, request_timeout_ms=3000) as admin:
        return await admin.cluster_status()


async def wait_for(
    bootstrap: str, condition: Callable[[ClusterStatus], bool], what: str, timeout: float = 90
) -> ClusterStatus:
    deadline = time.monotonic() + timeout
    last: ClusterStatus | None = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            last = await status(bootstrap)
            if condition(last):
                return last
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out waiting until {what}; last status: {last}")


def replica_counts(s: ClusterStatus, nodes: set[int]) -> dict[int, int]:
    return {m.node_id: m.replicas for m in s.members if m.node_id in nodes}


def settled(s: ClusterStatus, nodes: set[int]) -> bool:
    """No moves, every partition led, RF 3 on ``nodes`` only, all replicas in sync."""
    if s.moves or len([p for p in s.partitions if p.topic == TOPIC]) != PARTITIONS:
        return False
    for p in s.partitions:
        if p.topic != TOPIC:
            continue
        members = {r.node_id for r in p.replicas}
        if len(members) != 3 or not members <= nodes or any(r.lag != 0 for r in p.replicas):
            return False
    return True


def balanced(s: ClusterStatus, nodes: set[int]) -> bool:
    counts = replica_counts(s, nodes)
    mean = PARTITIONS * 3 / len(nodes)
    return settled(s, nodes) and all(abs(c - mean) <= 1 for c in counts.values())


def drain(bootstrap: str, node_id: int) -> str:
    """Through the real command, which waits until the node holds no replica."""
    done = subprocess.run(
        [sys.executable, "-m", "laminar", "node", "drain", str(node_id), "--timeout", "120",
         "--bootstrap", bootstrap],
        capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.timeout(400)
async def test_join_failure_and_drain_keep_every_record(tmp_path: Path) -> None:
    ports = free_port_pairs(4)
    cluster = LocalCluster(tmp_path / "cluster", ports[:3], extra_args=DEAD_AFTER)
    joiner: subprocess.Popen[bytes] | None = None
    cluster.start()
    try:
        await cluster.wait_ready(60)
        bootstrap = cluster.bootstrap
        async with Admin(bootstrap) as admin:
            await admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
        await wait_for(bootstrap, lambda s: settled(s, {1, 2, 3}), "the topic is up")

        async with SteadyProducer(bootstrap) as producer:
            # 1. A 4th node joins through gossip: replicas spread to it.
            client4, peer4 = f"127.0.0.1:{ports[3][0]}", f"127.0.0.1:{ports[3][1]}"
            log4 = open(tmp_path / "node-4.log", "wb")  # noqa: SIM115
            joiner = subprocess.Popen(
                [sys.executable, "-m", "laminar", "node", "start", "--node-id", "4",
                 "--data-dir", str(tmp_path / "node-4"), "--listen", client4,
                 "--peer-listen", peer4, "--join", cluster.nodes[1].peer_address,
                 "--log-format", "json", *DEAD_AFTER],
                stdout=log4, stderr=subprocess.STDOUT,
            )  # fmt: skip
            bootstrap = f"{bootstrap},{client4}"
            producer.bootstrap = bootstrap
            s = await wait_for(
                bootstrap, lambda s: balanced(s, {1, 2, 3, 4}), "node 4 has its share"
            )
            assert replica_counts(s, {1, 2, 3, 4})[4] >= 8

            # 2. Node 2 dies for longer than node_dead_after: its replicas are re-created.
            cluster.kill_node(2)
            await wait_for(
                bootstrap, lambda s: settled(s, {1, 3, 4}), "RF 3 is restored without node 2"
            )

            # 3. Node 2 comes back (empty of assignments) and is then drained.
            cluster.start_node(2)
            await wait_for(
                bootstrap, lambda s: balanced(s, {1, 2, 3, 4}), "node 2 got replicas back"
            )
            output = await asyncio.to_thread(drain, cluster.nodes[1].client_address, 2)
            assert "node 2 is drained" in output
            s = await wait_for(bootstrap, lambda s: settled(s, {1, 3, 4}), "node 2 is drained")
            assert replica_counts(s, {2}).get(2, 0) == 0
        assert len(producer.acked) > 1000

        async with Consumer(bootstrap) as consumer:
            stored: dict[bytes, tuple[int, int]] = {}
            for partition in range(PARTITIONS):
                tp = TopicPartition(TOPIC, partition)
                await consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                end = (await consumer.fetch_batches(tp, 0, 1)).high_watermark
                deadline = time.monotonic() + 30
                while consumer.position(tp) < end:
                    assert time.monotonic() < deadline, (
                        f"partition {partition} stuck at {consumer.position(tp)} of {end}"
                    )
                    for record in await consumer.getmany(timeout_ms=1000):
                        assert record.value not in stored, f"{record.value!r} stored twice"
                        stored[record.value or b""] = (record.partition, record.offset)
        for i, where in producer.acked.items():
            assert stored.get(b"%08d" % i) == where, f"acknowledged record {i} lost or moved"
    finally:
        if joiner is not None:
            joiner.send_signal(signal.SIGTERM)
            try:
                joiner.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(joiner.pid, signal.SIGKILL)
        cluster.stop()
