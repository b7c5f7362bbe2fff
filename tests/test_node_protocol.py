"""Client protocol against real nodes: round trips and every typed error reply.

One 3-node process cluster serves the whole module; the test that takes two nodes down runs
last.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from laminar.client import Admin, Producer, TopicPartition
from laminar.client.connection import Connection
from laminar.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    InvalidRequestError,
    NotEnoughReplicasError,
    NotLeaderError,
    OffsetOutOfRangeError,
    RequestTimeoutError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)
from laminar.protocol import read_error
from laminar.segment.batch import build_batch, control_batch
from tests.cluster_fixture import ClusterHandle, start_cluster

pytestmark = pytest.mark.slow
TOPIC = "proto"
T = 1_800_000_000_000  # later than every other record of the module


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    handle = start_cluster(Path(tmp_path_factory.mktemp("proto")), nodes=3)
    try:
        yield handle
    finally:
        handle.stop()


async def leader_and_follower(cluster: ClusterHandle, partition: int = 0) -> tuple[str, str]:
    async with Admin(cluster.bootstrap) as admin:
        if TOPIC not in await admin.list_topics():
            await admin.create_topic(TOPIC, partitions=2, replication_factor=3)
        for _ in range(100):
            leader = (await admin.describe_topic(TOPIC)).partitions[partition].leader
            if leader:
                break
            await asyncio.sleep(0.1)
    follower = next(n for n in cluster.nodes if n != leader)
    return cluster.address(leader), cluster.address(follower)


def produce_body(batches: list[tuple[str, int, bytes]], acks: int = -1, timeout_ms: int = 5000):
    def fill(body: Any) -> None:
        request = body.init("produce")
        request.acks = acks
        request.timeoutMs = timeout_ms
        refs = request.init("batches", len(batches))
        position = 0
        for ref, (topic, partition, data) in zip(refs, batches, strict=True):
            ref.topic = topic
            ref.partition = partition
            ref.payloadOffset = position
            ref.payloadLength = len(data)
            position += len(data)

    return fill, [data for _, _, data in batches]


async def produce_errors(address: str, batches: list[tuple[str, int, bytes]], **kw: Any) -> list:
    connection = await Connection.open(address)
    try:
        fill, payload = produce_body(batches, **kw)
        reply, _ = await connection.request(fill, payload)
        return [(read_error(r.error), r.baseOffset) for r in reply.body.produce.results]
    finally:
        connection.close()


def one_batch(value: bytes = b"v") -> bytes:
    return build_batch([(b"k", value, [("h", b"1")], 1_700_000_000_000)])


async def test_produce_round_trip_and_partition_errors(cluster: ClusterHandle) -> None:
    leader, follower = await leader_and_follower(cluster)
    corrupt = bytearray(one_batch())
    corrupt[-1] ^= 0xFF
    results = await produce_errors(
        leader,
        [
            (TOPIC, 0, one_batch()),
            ("no-such-topic", 0, one_batch()),
            (TOPIC, 99, one_batch()),
            (TOPIC, 0, bytes(corrupt)),
            (TOPIC, 0, b"\x00" * 10),
            (TOPIC, 0, control_batch(1, b"", 0)),
            (TOPIC, 0, one_batch()),
        ],
    )
    errors = [type(e) if e else None for e, _ in results]
    assert errors == [
        None,
        UnknownTopicError,
        UnknownPartitionError,
        CorruptBatchError,
        CorruptBatchError,
        InvalidRequestError,
        None,
    ]
    assert results[6][1] == results[0][1] + 1, "bad batches in between took no offsets"
    ((not_leader, _),) = await produce_errors(follower, [(TOPIC, 0, one_batch())])
    assert isinstance(not_leader, NotLeaderError)
    assert not_leader.leader_address == leader


async def test_batch_too_large_and_bad_acks(cluster: ClusterHandle) -> None:
    leader, _ = await leader_and_follower(cluster)
    huge = build_batch([(None, b"x" * (5 << 20), (), 0)])
    ((error, offset),) = await produce_errors(leader, [(TOPIC, 0, huge)])
    assert isinstance(error, BatchTooLargeError) and offset == -1
    with pytest.raises(InvalidRequestError):
        await produce_errors(leader, [(TOPIC, 0, one_batch())], acks=7)


async def test_fetch_and_list_offsets_errors(cluster: ClusterHandle) -> None:
    leader, _ = await leader_and_follower(cluster)
    connection = await Connection.open(leader)
    try:

        def fetch(offset: int):
            def fill(body: Any) -> None:
                request = body.init("fetch")
                request.maxWaitMs = 0
                request.maxBytes = 1 << 20
                (ask,) = request.init("partitions", 1)
                ask.topic = TOPIC
                ask.partition = 0
                ask.offset = offset
                ask.maxBytes = 1 << 20

            return fill

        reply, payload = await connection.request(fetch(0))
        (result,) = reply.body.fetch.results
        assert read_error(result.error) is None
        assert result.payloadLength > 0 and len(payload) == result.payloadLength
        reply, _ = await connection.request(fetch(10**9))
        error = read_error(reply.body.fetch.results[0].error)
        assert isinstance(error, OffsetOutOfRangeError)
        assert error.start == 0 and error.end == result.highWatermark

        def offsets(fill_body: Any) -> None:
            queries = fill_body.init("listOffsets").init("queries", 3)
            for query, (topic, timestamp) in zip(
                queries, [(TOPIC, -2), (TOPIC, -1), ("nope", -1)], strict=True
            ):
                query.topic = topic
                query.timestamp = timestamp

        reply, _ = await connection.request(offsets)
        earliest, latest, missing = reply.body.listOffsets.answers
        assert earliest.offset == 0 and latest.offset == result.highWatermark
        assert isinstance(read_error(missing.error), UnknownTopicError)
    finally:
        connection.close()


async def test_admin_errors(cluster: ClusterHandle) -> None:
    await leader_and_follower(cluster)
    async with Admin(cluster.bootstrap) as admin:
        with pytest.raises(TopicExistsError):
            await admin.create_topic(TOPIC, partitions=1, replication_factor=1)
        with pytest.raises(NotEnoughReplicasError):
            await admin.create_topic("wide", partitions=1, replication_factor=5)
        with pytest.raises(InvalidRequestError):
            await admin.create_topic("bad/name", partitions=1, replication_factor=1)
        with pytest.raises(UnknownTopicError):
            await admin.delete_topic("never-created")
        await admin.create_topic("doomed", partitions=2, replication_factor=3)
        await admin.delete_topic("doomed")
        assert "doomed" not in await admin.list_topics()


async def test_metadata_and_status_from_any_node(cluster: ClusterHandle) -> None:
    await leader_and_follower(cluster)
    for node_id in cluster.nodes:
        async with Admin(cluster.address(node_id)) as admin:
            status = await admin.cluster_status()
            assert {m.node_id for m in status.members} == set(cluster.nodes)
            assert all(m.state == "alive" for m in status.members)
            assert {(p.topic, p.partition) for p in status.partitions} >= {(TOPIC, 0), (TOPIC, 1)}


async def test_list_offsets_by_timestamp_finds_the_record(cluster: ClusterHandle) -> None:
    leader, _ = await leader_and_follower(cluster)
    batch = build_batch(
        [(None, b"a", (), T + 5_000), (None, b"b", (), T + 6_000), (None, b"c", (), T + 7_000)]
    )
    ((error, base),) = await produce_errors(leader, [(TOPIC, 0, batch)])
    assert error is None
    async with Admin(cluster.bootstrap) as admin:
        tp = TopicPartition(TOPIC, 0)
        assert (await admin.list_offsets([tp], T + 6_000))[tp] == base + 1
        assert (await admin.list_offsets([tp], T + 6_500))[tp] == base + 2
        assert (await admin.list_offsets([tp], 10**15))[tp] == -1


async def test_timeout_when_majority_is_down(cluster: ClusterHandle) -> None:
    leader, _ = await leader_and_follower(cluster, partition=1)
    async with Producer(cluster.bootstrap) as producer:  # warm: partition 1 has data
        await producer.send_and_wait(TOPIC, b"before", partition=1)
    leader_id = next(n for n in cluster.nodes if cluster.address(n) == leader)
    for node_id in cluster.nodes:
        if node_id != leader_id:
            cluster.kill(node_id)
    results = await produce_errors(leader, [(TOPIC, 1, one_batch())], timeout_ms=500)
    error = results[0][0]
    assert isinstance(error, RequestTimeoutError | NotLeaderError), error
