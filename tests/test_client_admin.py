"""Admin against an in-memory cluster on real sockets."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from laminar.client import Admin, Producer, TopicPartition
from laminar.errors import InvalidRequestError, TopicExistsError, UnknownTopicError
from tests.client_fakenode import FakeCluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    cluster = await FakeCluster().start(3)
    yield cluster
    await cluster.stop()


async def test_topic_lifecycle(fake: FakeCluster) -> None:
    async with Admin(fake.bootstrap) as admin:
        created = await admin.create_topic("orders", partitions=4, replication_factor=3)
        assert created.name == "orders"
        assert [p.partition for p in created.partitions] == [0, 1, 2, 3]
        assert all(len(p.replicas) == 3 and p.leader in p.replicas for p in created.partitions)
        assert await admin.list_topics() == ["orders"]
        described = await admin.describe_topic("orders")
        assert described.partitions == created.partitions
        assert described.retention_ms == 7 * 86_400_000
        with pytest.raises(TopicExistsError):
            await admin.create_topic("orders", partitions=1)
        with pytest.raises(InvalidRequestError):
            await admin.create_topic("bad", partitions=0)
        await admin.delete_topic("orders")
        assert await admin.list_topics() == []
        with pytest.raises(UnknownTopicError):
            await admin.describe_topic("orders")
        with pytest.raises(UnknownTopicError):
            await admin.delete_topic("orders")


async def test_list_offsets_and_status(fake: FakeCluster) -> None:
    fake.create_topic("t", 2)
    async with Producer(fake.bootstrap) as producer:
        for i in range(3):
            await producer.send_and_wait("t", b"x", partition=0, timestamp_ms=1000 * (i + 1))
    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    async with Admin(fake.bootstrap) as admin:
        assert await admin.list_offsets(tps, -2) == {tps[0]: 0, tps[1]: 0}
        assert await admin.list_offsets(tps, -1) == {tps[0]: 3, tps[1]: 0}
        assert await admin.list_offsets(tps[:1], 2500) == {tps[0]: 2}
        assert await admin.list_offsets(tps[:1], 9999) == {tps[0]: -1}
        status = await admin.cluster_status()
    assert [m.node_id for m in status.members] == [1, 2, 3]
    assert status.metadata_leader == 1
    assert [(p.topic, p.partition, p.high_watermark) for p in status.partitions] == [
        ("t", 0, 3),
        ("t", 1, 0),
    ]
    assert all(len(p.replicas) == 3 for p in status.partitions)
