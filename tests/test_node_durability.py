"""The issue's durability scenario on real node processes.

3 nodes, a topic of 6 partitions with replication factor 3, 50,000 records produced with
acks=all while the leader of some partitions is SIGKILLed and later restarted. Afterwards:
every acknowledged record is present exactly once, in per-partition send order; offsets are
contiguous; and all three replicas hold identical bytes up to the committed offset.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.segment.batch import decode_records, is_control, iter_batches, read_header
from laminar.segment.log import PartitionLog
from tests.cluster_fixture import start_cluster

pytestmark = pytest.mark.slow

TOPIC = "durable"
PARTITIONS = 6
RECORDS = 50_000
CHUNKS = 10


async def produce_chunk(producer: Producer, start: int, stop: int) -> dict[int, tuple[int, int]]:
    """Send records start..stop-1 (record i to partition i % 6); return acked i -> (p, off)."""
    futures = {
        i: await producer.send(TOPIC, b"%08d" % i, partition=i % PARTITIONS)
        for i in range(start, stop)
    }
    acked: dict[int, tuple[int, int]] = {}
    for i, future in futures.items():
        try:
            meta = await future
        except Exception:
            continue  # not acknowledged: may or may not be stored, never counted as lost
        acked[i] = (meta.partition, meta.offset)
    return acked


async def read_partition(consumer: Consumer, partition: int) -> list[tuple[int, bytes]]:
    """All batches of a partition up to its high watermark, checking offset contiguity."""
    tp = TopicPartition(TOPIC, partition)
    start = (await consumer.fetch_batches(tp, 0, 1, max_wait_ms=0)).log_start
    assert start == 0
    offset = 0
    records: list[tuple[int, bytes]] = []
    while True:
        fetched = await consumer.fetch_batches(tp, offset, 1 << 20, max_wait_ms=0)
        if offset >= fetched.high_watermark:
            return records
        for position, header in iter_batches(fetched.data):
            assert header.base_offset == offset, "offsets must be contiguous"
            offset = header.next_offset
            if is_control(header):
                continue
            batch = fetched.data[position : position + header.batch_length]
            records.extend((r.offset, r.value or b"") for r in decode_records(batch))


def replica_bytes(node_dir: Path, partition: int, upto: int) -> bytes:
    (directory,) = (node_dir / "partitions").glob(f"{TOPIC}-{partition}.*")
    with PartitionLog.open(directory / "log") as log:
        out = bytearray()
        offset = log.start_offset
        while offset < upto:
            views = log.batches(offset, upto, 1 << 20)
            for view in views:
                out += view
            offset = read_header(views[-1]).next_offset
        return bytes(out)


async def wait_until_replicas_caught_up(bootstrap: str, timeout: float = 60) -> None:
    """The restarted node catches up in the background; compare files only once it has."""
    deadline = time.monotonic() + timeout
    async with Admin(bootstrap) as admin:
        while True:
            status = await admin.cluster_status()
            ours = [p for p in status.partitions if p.topic == TOPIC]
            if len(ours) == PARTITIONS and all(r.lag == 0 for p in ours for r in p.replicas):
                return
            assert time.monotonic() < deadline, f"replicas still lag: {ours}"
            await asyncio.sleep(0.2)


@pytest.mark.timeout(240)
async def test_acked_records_survive_leader_crash(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, nodes=3)
    try:
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
        acked: dict[int, tuple[int, int]] = {}
        victim = 0
        per_chunk = RECORDS // CHUNKS
        async with Producer(cluster.bootstrap, acks="all", linger_ms=2) as producer:
            for chunk in range(CHUNKS):
                if chunk == 3:
                    async with Admin(cluster.bootstrap) as admin:
                        victim = (await admin.describe_topic(TOPIC)).partitions[0].leader
                    assert victim, "partition 0 has a leader after 15,000 acked records"
                    cluster.kill(victim)  # leader of partition 0 (and of others) dies
                if chunk == 7:
                    await asyncio.to_thread(cluster.restart, victim)
                done = await produce_chunk(producer, chunk * per_chunk, (chunk + 1) * per_chunk)
                if 3 <= chunk < 7:
                    assert done, "the cluster keeps acknowledging with one node down"
                acked.update(done)
        assert len(acked) >= RECORDS * 0.9, "most records must be acknowledged"

        high_watermarks: dict[int, int] = {}
        async with Consumer(cluster.bootstrap) as consumer:
            stored: dict[int, list[tuple[int, bytes]]] = {}
            for partition in range(PARTITIONS):
                stored[partition] = await read_partition(consumer, partition)
                tp = TopicPartition(TOPIC, partition)
                high_watermarks[partition] = (
                    await consumer.fetch_batches(tp, 0, 1, max_wait_ms=0)
                ).high_watermark

        seen: dict[bytes, int] = {}
        for partition, records in stored.items():
            values = [int(value) for _, value in records]
            assert values == sorted(values), f"partition {partition} is out of send order"
            for offset, value in records:
                assert value not in seen, f"record {value!r} stored twice"
                seen[value] = offset
                assert int(value) % PARTITIONS == partition
        for i, (partition, offset) in acked.items():
            value = b"%08d" % i
            assert value in seen, f"acknowledged record {i} lost"
            assert seen[value] == offset, f"record {i} acked at {offset}, stored at {seen[value]}"
            assert partition == i % PARTITIONS
        await wait_until_replicas_caught_up(cluster.bootstrap)
    finally:
        cluster.stop()

    for partition in range(PARTITIONS):
        copies = [
            replica_bytes(node.data_dir, partition, high_watermarks[partition])
            for node in cluster.nodes.values()
        ]
        assert copies[0] == copies[1] == copies[2], f"replicas of {partition} diverge"
        assert len(copies[0]) > 0
