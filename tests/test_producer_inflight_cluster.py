"""Five batches in flight per partition through a leader crash (real node processes).

The partition leader is SIGKILLed while a producer streams with up to five batches in flight
per partition: batches behind a lost one come back refused (out of order) or lost, and are
resent after it. Every acknowledged record must be stored exactly once, at its acknowledged
offset, and each partition must hold its records in send order.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.types import RecordMetadata
from laminar.segment.batch import decode_records, is_control, iter_batches
from tests.cluster_fixture import start_cluster

pytestmark = pytest.mark.slow
TOPIC = "inflight"
PARTITIONS = 3
RECORDS = 24_000


async def read_partition(consumer: Consumer, partition: int) -> list[tuple[int, int]]:
    """(offset, record number) of every record up to the high watermark."""
    tp = TopicPartition(TOPIC, partition)
    offset, out = 0, []
    while True:
        fetched = await consumer.fetch_batches(tp, offset, 1 << 20, max_wait_ms=0)
        if offset >= fetched.high_watermark:
            return out
        for position, header in iter_batches(fetched.data):
            offset = header.next_offset
            if not is_control(header):
                batch = fetched.data[position : position + header.batch_length]
                out += [(r.offset, int(r.value or b"")) for r in decode_records(batch)]


@pytest.mark.timeout(180)
async def test_five_in_flight_through_a_leader_crash(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, nodes=3)
    try:
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
            for _ in range(200):  # leaders first, so the stream (not a start-up) meets the crash
                if all(p.leader for p in (await admin.describe_topic(TOPIC)).partitions):
                    break
                await asyncio.sleep(0.05)
        producer = Producer(
            cluster.bootstrap,
            linger_ms=1,
            batch_bytes=1500,  # ~50 records a batch: many batches per partition
            max_in_flight_per_partition=5,
            retry_backoff_ms=50,
        )
        handles = {}
        deepest = 0
        async with producer:
            accumulator = producer._accumulator
            assert accumulator is not None
            for partition in range(PARTITIONS):
                await producer.send_and_wait(TOPIC, b"%08d" % -1, partition=partition)
            for i in range(RECORDS):
                if i == RECORDS // 3:
                    async with Admin(cluster.bootstrap) as admin:
                        victim = (await admin.describe_topic(TOPIC)).partitions[0].leader
                    cluster.kill(victim)  # mid-stream, batches in flight
                tp = TopicPartition(TOPIC, i % PARTITIONS)
                handles[i] = await producer.send(TOPIC, b"%08d" % i, partition=tp.partition)
                # (a test-only look inside: how many batches of the partition are in flight)
                deepest = max(deepest, len(accumulator._in_flight.get(tp, ())))
                if i % 100 == 0:
                    await asyncio.sleep(0.001)  # a stream over a few seconds, not one burst
            acked: dict[int, RecordMetadata] = {}
            for i, handle in handles.items():
                try:
                    acked[i] = await handle
                except Exception:
                    continue  # not acknowledged: may or may not be stored
        assert deepest > 1, "the producer never had two batches of a partition in flight"
        assert len(acked) >= RECORDS * 0.9, f"only {len(acked)} acknowledged"

        async with Consumer(cluster.bootstrap) as consumer:
            stored = {p: await read_partition(consumer, p) for p in range(PARTITIONS)}
        where: dict[int, int] = {}
        for partition, records in stored.items():
            numbers = [n for _, n in records]
            numbers = numbers[1:]  # after the warm-up record
            assert numbers == sorted(numbers), f"partition {partition} is out of send order"
            assert len(set(numbers)) == len(numbers), f"a record is stored twice in {partition}"
            assert all(n % PARTITIONS == partition for n in numbers)
            where.update((n, offset) for offset, n in records)
        for i, meta in acked.items():
            assert i in where, f"acknowledged record {i} lost"
            assert meta.offset == where[i], f"record {i} acked at {meta.offset}, at {where[i]}"
    finally:
        cluster.stop()
