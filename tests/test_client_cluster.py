"""The client library against real node processes (3 nodes, started once for this module)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from laminar.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition
from laminar.errors import OffsetOutOfRangeError, TopicExistsError, UnknownTopicError
from laminar.segment.batch import decode_records, is_control, iter_batches
from tests.cluster_fixture import ClusterHandle, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    handle = start_cluster(tmp_path_factory.mktemp("client-cluster"), nodes=3)
    try:
        yield handle
    finally:
        handle.stop()


async def make_topic(bootstrap: str, name: str, partitions: int = 3) -> None:
    async with Admin(bootstrap) as admin:
        await admin.create_topic(name, partitions=partitions, replication_factor=3)


async def read_all(
    bootstrap: str, topic: str, want: int, timeout: float = 20.0
) -> list[ConsumerRecord]:
    out: list[ConsumerRecord] = []
    async with Consumer(bootstrap, auto_offset_reset="earliest", max_wait_ms=200) as consumer:
        await consumer.subscribe(topic)
        deadline = time.monotonic() + timeout
        while len(out) < want and time.monotonic() < deadline:
            out += await consumer.getmany(timeout_ms=500)
    return out


async def test_admin_calls(cluster: ClusterHandle) -> None:
    async with Admin(cluster.bootstrap) as admin:
        created = await admin.create_topic(
            "admin-t", partitions=2, replication_factor=3, retention_ms=3_600_000
        )
        assert created.name == "admin-t" and len(created.partitions) == 2
        assert all(sorted(p.replicas) == [1, 2, 3] for p in created.partitions)
        assert created.retention_ms == 3_600_000
        assert "admin-t" in await admin.list_topics()
        with pytest.raises(TopicExistsError):
            await admin.create_topic("admin-t", partitions=1)
        described = await admin.describe_topic("admin-t")
        assert described.topic_id == created.topic_id
        status = await admin.cluster_status()
        assert [m.node_id for m in status.members] == [1, 2, 3]
        assert all(m.state == "alive" for m in status.members)
        assert status.metadata_leader in (1, 2, 3)
        tps = [TopicPartition("admin-t", 0), TopicPartition("admin-t", 1)]
        async with Producer(cluster.bootstrap) as producer:
            meta = await producer.send_and_wait("admin-t", b"x", partition=0, timestamp_ms=5000)
        assert (await admin.list_offsets(tps, -2))[tps[0]] == 0
        # The end is just past the record (a leader's Raft no-op may sit before it).
        assert (await admin.list_offsets(tps, -1))[tps[0]] == meta.offset + 1
        assert await admin.list_offsets(tps[:1], 4000) == {tps[0]: meta.offset}
        assert await admin.list_offsets(tps[:1], 6000) == {tps[0]: -1}
        await admin.delete_topic("admin-t")
        assert "admin-t" not in await admin.list_topics()
        with pytest.raises(UnknownTopicError):
            await admin.describe_topic("admin-t")


async def test_round_trip_keys_headers_timestamps(cluster: ClusterHandle) -> None:
    await make_topic(cluster.bootstrap, "rt")
    sent = {}
    async with Producer(cluster.bootstrap) as producer:
        futures = []
        for i in range(600):
            key = f"key-{i % 13}".encode()
            futures.append(
                await producer.send(
                    "rt",
                    f"value-{i}".encode(),
                    key=key,
                    headers=(("i", str(i).encode()), ("empty", None)),
                    timestamp_ms=1_700_000_000_000 + i,
                )
            )
        for i, meta in enumerate(await asyncio.gather(*futures)):
            sent[(meta.partition, meta.offset)] = i
    records = await read_all(cluster.bootstrap, "rt", 600)
    assert len(records) == 600
    for record in records:
        i = sent[(record.partition, record.offset)]
        assert record.key == f"key-{i % 13}".encode()
        assert record.value == f"value-{i}".encode()
        assert record.headers == (("i", str(i).encode()), ("empty", None))
        assert record.timestamp == 1_700_000_000_000 + i
    for partition in range(3):
        mine = [r for r in records if r.partition == partition]
        # One key, one partition; per partition the send order is the offset order.
        assert [sent[(r.partition, r.offset)] for r in mine] == sorted(
            sent[(r.partition, r.offset)] for r in mine
        )
    keys_per_partition: dict[bytes | None, set[int]] = {}
    for r in records:
        keys_per_partition.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in keys_per_partition.values())


@pytest.mark.parametrize("acks", ["all", "leader", "none"])
async def test_acks_modes(cluster: ClusterHandle, acks: str) -> None:
    topic = f"acks-{acks}"
    await make_topic(cluster.bootstrap, topic, partitions=1)
    async with Producer(cluster.bootstrap, acks=acks) as producer:
        metas = [await producer.send_and_wait(topic, f"{acks}-{i}".encode()) for i in range(5)]
    if acks == "none":
        assert all(m.offset == -1 for m in metas)
    else:
        offsets = [m.offset for m in metas]
        assert offsets == sorted(offsets) and len(set(offsets)) == 5
    records = await read_all(cluster.bootstrap, topic, 5)
    assert [r.value for r in records] == [f"{acks}-{i}".encode() for i in range(5)]


async def test_a_waiting_fetch_wakes_when_the_high_watermark_moves(
    cluster: ClusterHandle,
) -> None:
    # A fetch parked at the end of the log, on the leader and on each follower, answers as soon
    # as a write commits there: followers learn the commit from the leader's next message,
    # which it sends the moment the commit moves. Parked for up to 30 s; a fetch that was not
    # woken would answer empty only then.
    await make_topic(cluster.bootstrap, "wake", partitions=1)
    tp = TopicPartition("wake", 0)
    async with Admin(cluster.bootstrap) as admin:
        partition = (await admin.describe_topic("wake")).partitions[0]
    async with (
        Producer(cluster.bootstrap, linger_ms=0) as producer,
        Consumer(cluster.bootstrap) as consumer,
    ):
        for round_ in range(2):
            end = (await producer.send_and_wait("wake", b"before-%d" % round_)).offset + 1
            for node in partition.replicas:  # every replica has applied the commit of it
                deadline = time.monotonic() + 20
                while (await consumer.fetch_batches(tp, 0, 1, node_id=node)).high_watermark < end:
                    assert time.monotonic() < deadline, f"node {node} never reached {end}"
            parked = {
                node: asyncio.create_task(
                    consumer.fetch_batches(tp, end, 1 << 20, max_wait_ms=30_000, node_id=node)
                )
                for node in partition.replicas
            }
            started = time.monotonic()
            meta = await producer.send_and_wait("wake", b"wake-%d" % round_)
            assert meta.offset == end
            for node, task in parked.items():
                fetched = await asyncio.wait_for(task, 35)
                data = memoryview(fetched.data)
                values = [
                    r.value
                    for position, header in iter_batches(data)
                    if not is_control(header)
                    for r in decode_records(data[position : position + header.batch_length])
                ]
                assert b"wake-%d" % round_ in values, (node, partition.leader)
            assert time.monotonic() - started < 15


async def test_seek_modes(cluster: ClusterHandle) -> None:
    await make_topic(cluster.bootstrap, "seeks", partitions=1)
    tp = TopicPartition("seeks", 0)
    async with Producer(cluster.bootstrap) as producer:
        metas = [
            await producer.send_and_wait("seeks", f"s{i}".encode(), timestamp_ms=1000 * (i + 1))
            for i in range(10)
        ]
    async with Consumer(cluster.bootstrap, max_wait_ms=200) as consumer:
        await consumer.assign([tp])
        end = consumer.position(tp)  # default: latest
        assert end == metas[-1].offset + 1
        await consumer.seek_to_beginning()
        first = await consumer.getmany(timeout_ms=2000, max_records=1)
        assert first[0].value == b"s0"
        await consumer.seek(tp, metas[6].offset)
        got = await consumer.getmany(timeout_ms=2000)
        assert [r.value for r in got][:4] == [b"s6", b"s7", b"s8", b"s9"]
        await consumer.seek_to_timestamp(tp, 4500)  # first record at or after: s4 (5000)
        assert consumer.position(tp) == metas[4].offset
        got = await consumer.getmany(timeout_ms=2000, max_records=1)
        assert got[0].value == b"s4" and got[0].timestamp == 5000
        async with Producer(cluster.bootstrap, linger_ms=60_000) as producer:
            batch = [
                await producer.send("seeks", f"b{i}".encode(), timestamp_ms=20_000 + i)
                for i in range(5)
            ]
            await producer.flush()  # the five go as one batch
        batch_offsets = [(await f).offset for f in batch]
        await consumer.seek_to_timestamp(tp, 20_003)
        assert consumer.position(tp) == batch_offsets[3]  # the record, not its batch start
        end = batch_offsets[-1] + 1
        await consumer.seek_to_timestamp(tp, 99_999)
        assert consumer.position(tp) == end
        await consumer.seek_to_end(tp)
        waiter = asyncio.create_task(consumer.getmany(timeout_ms=5000))
        await asyncio.sleep(0.3)
        async with Producer(cluster.bootstrap) as producer:
            await producer.send_and_wait("seeks", b"live")
        assert [r.value for r in await waiter] == [b"live"]
        fetched = await consumer.fetch_batches(tp, 0, 1 << 20)
        assert fetched.high_watermark == end + 1
        assert sum(h.record_count for _, h in iter_batches(fetched.data)) >= 1
        with pytest.raises(OffsetOutOfRangeError):
            await consumer.fetch_batches(tp, end + 100, 1 << 20)


async def test_leader_crash_loses_no_acknowledged_record(cluster: ClusterHandle) -> None:
    await make_topic(cluster.bootstrap, "failover", partitions=1)
    tp = TopicPartition("failover", 0)
    acknowledged: dict[int, bytes] = {}
    polled: list[ConsumerRecord] = []
    done = asyncio.Event()

    async def consume_live() -> None:
        # A consumer that keeps reading through the crash, from the first offset on.
        async with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
            await consumer.assign([tp])
            while not (done.is_set() and {r.offset for r in polled} >= set(acknowledged)):
                polled.extend(await consumer.getmany(timeout_ms=200))

    reader = asyncio.create_task(consume_live())
    async with Producer(cluster.bootstrap, linger_ms=1, retries=30) as producer:
        for i in range(50):
            meta = await producer.send_and_wait("failover", f"before-{i}".encode())
            acknowledged[meta.offset] = f"before-{i}".encode()
        async with Admin(cluster.bootstrap) as admin:
            leader = (await admin.describe_topic("failover")).partitions[0].leader
        assert leader in cluster.nodes
        cluster.kill(leader)
        for i in range(50):
            meta = await producer.send_and_wait("failover", f"after-{i}".encode())
            acknowledged[meta.offset] = f"after-{i}".encode()
    done.set()
    await asyncio.wait_for(reader, 30)
    # The live consumer: no acknowledged record lost, none twice, offsets only go up.
    offsets = [r.offset for r in polled]
    assert offsets == sorted(set(offsets)), "duplicate or out-of-order poll"
    stored = {r.offset: r.value for r in polled}
    for offset, value in acknowledged.items():
        assert stored.get(offset) == value, f"acknowledged offset {offset} lost or changed"
    # The crashed node comes back and its replica catches up to the same bytes.
    cluster.restart(leader)
    end = max(acknowledged) + 1
    async with Consumer(cluster.bootstrap) as consumer:
        deadline = time.monotonic() + 30
        fetched = await consumer.fetch_batches(tp, 0, 8 << 20, node_id=leader)
        while fetched.high_watermark < end and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            fetched = await consumer.fetch_batches(tp, 0, 8 << 20, node_id=leader)
        from_leader = await consumer.fetch_batches(tp, 0, 8 << 20)
    assert fetched.high_watermark >= end
    replica = {
        r.offset: r.value
        for pos, h in iter_batches(fetched.data)
        if not is_control(h)
        for r in decode_records(fetched.data[pos : pos + h.batch_length])
    }
    assert {o: v for o, v in replica.items() if o < end} == {
        o: v for o, v in stored.items() if o < end
    }
    assert fetched.data[: len(from_leader.data)] == from_leader.data[: len(fetched.data)]


async def test_missing_topic_and_unreachable(cluster: ClusterHandle) -> None:
    async with Producer(cluster.bootstrap, metadata_timeout_ms=500) as producer:
        with pytest.raises(UnknownTopicError):
            await producer.send("no-such-topic", b"x")
    with pytest.raises(ConnectionError, match="cannot reach any node"):
        async with Admin("127.0.0.1:1"):
            pass
