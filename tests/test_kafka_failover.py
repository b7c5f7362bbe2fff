"""An idempotent Kafka producer (librdkafka, aiokafka) keeps writing while a partition leader is
SIGKILLed: every acknowledged record is there exactly once, in order per partition."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from laminar.client.admin import Admin
from tests.cluster_fixture import ClusterHandle, run_sync, start_cluster

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.timeout(300)

COUNT = 6000
PARTITIONS = 3


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "x"})
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = consumer.list_topics(topic, timeout=5).topics[topic]
            if md.error is None and partition in md.partitions:
                leader = md.partitions[partition].leader
                if leader > 0:
                    return leader
            time.sleep(0.2)
    finally:
        consumer.close()
    raise AssertionError("no leader")


def isr_of(bootstrap: str, topic: str, partition: int) -> list[int]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "x"})
    try:
        return list(
            consumer.list_topics(topic, timeout=10).topics[topic].partitions[partition].isrs
        )
    finally:
        consumer.close()


def produce_confluent(
    cluster: ClusterHandle, topic: str, victim: int
) -> list[tuple[int, int, int]]:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "enable.idempotence": True,
            "linger.ms": 2,
            "batch.num.messages": 200,
            "message.timeout.ms": 120_000,
        }
    )
    acked: list[tuple[int, int, int]] = []
    failed: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(err)
        else:
            acked.append((msg.partition(), msg.offset(), int(msg.value())))

    for i in range(COUNT):
        producer.produce(topic, value=b"%d" % i, partition=i % PARTITIONS, on_delivery=delivered)
        producer.poll(0)
        if i == COUNT // 3:
            producer.flush(60)  # some acknowledged before the kill, the rest around it
        if i == COUNT // 3 + 200:
            cluster.kill(victim)
        if i % 500 == 0:
            time.sleep(0.05)
    assert producer.flush(120) == 0
    assert not failed, failed[:5]
    return acked


def produce_aiokafka(cluster: ClusterHandle, topic: str, victim: int) -> list[tuple[int, int, int]]:
    aiokafka = pytest.importorskip("aiokafka")

    async def go() -> list[tuple[int, int, int]]:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap,
            enable_idempotence=True,
            linger_ms=2,
            request_timeout_ms=30_000,
        )
        await producer.start()
        try:
            futures = []
            for i in range(COUNT):
                futures.append(
                    await producer.send(topic, value=b"%d" % i, partition=i % PARTITIONS)
                )
                if i == COUNT // 3:
                    await producer.flush()
                if i == COUNT // 3 + 200:
                    cluster.kill(victim)
                if i % 500 == 0:
                    await asyncio.sleep(0.05)
            metas = await asyncio.gather(*futures)
        finally:
            await producer.stop()
        return [(m.partition, m.offset, i) for i, m in enumerate(metas)]

    return asyncio.run(go())


def produce_kafka_python(
    cluster: ClusterHandle, topic: str, victim: int
) -> list[tuple[int, int, int]]:
    kafka = pytest.importorskip("kafka")
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap,
        enable_idempotence=True,
        acks="all",
        linger_ms=2,
        retries=1_000,
        delivery_timeout_ms=120_000,
    )
    try:
        futures = []
        for i in range(COUNT):
            futures.append(producer.send(topic, value=b"%d" % i, partition=i % PARTITIONS))
            if i == COUNT // 3:
                producer.flush(60)
            if i == COUNT // 3 + 200:
                cluster.kill(victim)
            if i % 500 == 0:
                time.sleep(0.05)
        producer.flush(120)
        metas = [f.get(timeout=60) for f in futures]
    finally:
        producer.close(5)
    return [(m.partition, m.offset, i) for i, m in enumerate(metas)]


PRODUCERS = {
    "confluent": produce_confluent,
    "aiokafka": produce_aiokafka,
    "kafka-python": produce_kafka_python,
}


@pytest.mark.parametrize("client", sorted(PRODUCERS))
def test_leader_sigkill_during_idempotent_produce(tmp_path: Path, client: str) -> None:
    cluster = start_cluster(tmp_path, 3, kafka=True)
    try:
        topic = "failover"

        async def create() -> None:
            async with Admin(cluster.bootstrap) as admin:
                await admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)

        run_sync(create())
        victim = leader_of(cluster.kafka_bootstrap, topic, 0)
        acked = PRODUCERS[client](cluster, topic, victim)
        # the new leader no longer counts the dead node in sync
        deadline = time.monotonic() + 30
        while victim in isr_of(cluster.kafka_bootstrap, topic, 0):
            assert time.monotonic() < deadline, "the killed node stays in the ISR"
            time.sleep(0.5)
        assert len(acked) == COUNT
        assert not cluster.nodes[victim].running

        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": cluster.kafka_bootstrap,
                "group.id": "unused",
                "enable.auto.commit": False,
            }
        )
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
        total = 0
        deadline = time.monotonic() + 90
        try:
            while total < COUNT and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                assert msg.error() is None, msg.error()
                seen[msg.partition()].append((msg.offset(), int(msg.value())))
                total += 1
            time.sleep(1)  # anything extra (a duplicate) would arrive now
            while (msg := consumer.poll(0.5)) is not None:
                if msg.error() is None:
                    seen[msg.partition()].append((msg.offset(), int(msg.value())))
        finally:
            consumer.close()
        for partition, records in seen.items():
            values = [v for _, v in records]
            assert values == list(range(partition, COUNT, PARTITIONS)), (
                f"partition {partition}: {len(values)} records, "
                f"{len(values) - len(set(values))} duplicates"
            )
        by_value = {v: (p, o) for p, o, v in acked}
        for partition, records in seen.items():
            for offset, value in records:
                assert by_value[value] == (partition, offset), "acknowledged at another offset"
    finally:
        cluster.stop()
