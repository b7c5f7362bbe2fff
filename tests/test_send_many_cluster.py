"""Producer.send_many against real node processes: a leader SIGKILLed while bulk batches are in
flight; every acknowledged record is stored once, in input order per partition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from laminar.client import Admin, Consumer, ConsumerRecord, Producer
from laminar.client.partitioner import key_partition
from tests.cluster_fixture import ClusterHandle, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    handle = start_cluster(tmp_path_factory.mktemp("send-many"), nodes=3)
    try:
        yield handle
    finally:
        handle.stop()


async def read_all(bootstrap: str, topic: str, want: int) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    async with Consumer(bootstrap, auto_offset_reset="earliest", max_wait_ms=200) as consumer:
        await consumer.subscribe(topic)
        deadline = time.monotonic() + 60
        while len(out) < want and time.monotonic() < deadline:
            out += await consumer.getmany(timeout_ms=500)
    return out


async def test_send_many_survives_a_killed_leader_in_order_without_duplicates(
    cluster: ClusterHandle,
) -> None:
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topic("bulk", partitions=3, replication_factor=3)
    count = 4000
    keys = [f"k{i % 40}".encode() for i in range(2 * count)]
    values = [f"v{i:05}".encode() * 8 for i in range(2 * count)]
    async with Producer(
        cluster.bootstrap, acks="all", batch_bytes=16 * 1024, retries=50, retry_backoff_ms=50
    ) as producer:
        first = await producer.send_many("bulk", values[:count], keys=keys[:count])
        await first
        async with Admin(cluster.bootstrap) as admin:
            leader = (await admin.describe_topic("bulk")).partitions[0].leader
        second = await producer.send_many("bulk", values[count:], keys=keys[count:])
        cluster.kill(leader)  # while the second call's batches are buffered or in flight
        await asyncio.wait_for(second, 90)
    results = first.metadata() + second.metadata()
    assert len(results) == 2 * count
    for i, meta in enumerate(results):
        assert meta.partition == key_partition(keys[i], 3)
    records = await read_all(cluster.bootstrap, "bulk", 2 * count)
    stored = {(r.partition, r.offset): (r.key, r.value) for r in records}
    assert len(records) == len(stored) == 2 * count, "a record lost or stored twice"
    for i, meta in enumerate(results):  # every record where its metadata says
        assert stored[(meta.partition, meta.offset)] == (keys[i], values[i])
    for partition in range(3):  # input order per partition
        mine = [m.offset for m in results if m.partition == partition]
        assert mine == sorted(mine)


async def test_send_many_on_a_key_range_topic_places_keys_as_send_does(
    cluster: ClusterHandle,
) -> None:
    async with Admin(cluster.bootstrap) as admin:
        await admin.create_topic("ranged", 4, 3, partitioning="range")
    keys = [f"user-{i}".encode() for i in range(200)]
    async with Producer(cluster.bootstrap) as producer:
        one_by_one = [await producer.send("ranged", b"a", key=k) for k in keys]
        bulk = await producer.send_many("ranged", [b"b"] * len(keys), keys=keys)
        await bulk
        singles = [await f for f in one_by_one]
    assert [m.partition for m in bulk.metadata()] == [m.partition for m in singles]
    assert len({m.partition for m in singles}) > 1
