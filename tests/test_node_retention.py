"""Age-based retention on a live node: whole sealed segments past retention disappear,
the log start moves, consumers get a typed out-of-range error below it, and newer data stays."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.localcluster import LocalCluster
from laminar.errors import OffsetOutOfRangeError
from tests.cluster_fixture import free_port_pairs

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
async def test_retention_expires_old_segments(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "cluster", free_port_pairs(1), extra_args=["--retention-check-interval", "0.3"]
    )
    cluster.start()
    try:
        await cluster.wait_ready(60)
        tp = TopicPartition("short", 0)
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic(
                "short", partitions=1, replication_factor=1, retention_ms=1500, segment_bytes=4096
            )
        async with Producer(cluster.bootstrap, linger_ms=0) as producer:
            old = [
                await producer.send_and_wait("short", b"o" * 500, partition=0) for _ in range(40)
            ]
            await asyncio.sleep(2.0)  # the old records age past retention
            new = [
                await producer.send_and_wait("short", b"n" * 500, partition=0) for _ in range(40)
            ]
        async with Consumer(cluster.bootstrap) as consumer:
            deadline = time.monotonic() + 20
            start = 0
            while time.monotonic() < deadline:
                start = (await consumer.fetch_batches(tp, new[0].offset, 1)).log_start
                if start > old[-1].offset - 20:
                    break
                await asyncio.sleep(0.3)
            assert old[0].offset < start <= new[0].offset, "old segments expired, new ones kept"
            with pytest.raises(OffsetOutOfRangeError):
                await consumer.fetch_batches(tp, old[0].offset, 1 << 20)
            await consumer.assign([tp])
            await consumer.seek(tp, new[0].offset)
            records = []
            while len(records) < 40:
                records += await consumer.getmany(timeout_ms=1000)
            assert [r.offset for r in records] == [m.offset for m in new]
    finally:
        cluster.stop()
