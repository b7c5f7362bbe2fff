"""The Kafka listener against the native protocol: the same produce and consume work, one run.

A 3-node cluster with Kafka listeners; two topics of 3 partitions, replication factor 3. The
same N records of 100 bytes are produced with acks=all through laminar's native `Producer`
into one topic and through confluent-kafka (librdkafka, idempotent) against the Kafka port
into the other, then each is consumed back whole by its own client (native `Consumer`,
confluent `Consumer`). Figures are records/s as each application sees them; the ratios are
Kafka / native (goal >= 0.8). Since the native Python client is itself often the bottleneck,
the nodes' CPU time per record (user + system, all three node processes, from /proc) is
reported for each phase too: that is what the Kafka listener's own cost shows in. The last
line is one JSON object.

    python bench/kafka_bench.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import confluent_kafka

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.localcluster import LocalCluster, free_port_pairs, free_ports

RECORD = b"x" * 100
PARTITIONS = 3


async def native_produce(bootstrap: str, topic: str, count: int) -> float:
    async with Producer(bootstrap, acks="all", linger_ms=5, batch_bytes=256 * 1024) as producer:
        started = time.perf_counter()
        futures = []
        for i in range(count):
            futures.append(await producer.send(topic, RECORD, partition=i % PARTITIONS))
            if len(futures) >= 50_000:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)
        return count / (time.perf_counter() - started)


async def native_consume(bootstrap: str, topic: str, count: int) -> float:
    async with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        started = time.perf_counter()
        got = 0
        while got < count:
            got += len(await consumer.getmany(timeout_ms=1000))
        return count / (time.perf_counter() - started)


def kafka_produce(bootstrap: str, topic: str, count: int) -> float:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 256 * 1024,
        }
    )
    failed = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    started = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, RECORD, partition=i % PARTITIONS, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("records left unsent")
    elapsed = time.perf_counter() - started
    if failed:
        raise RuntimeError(f"{len(failed)} records failed: {failed[0]}")
    return count / elapsed


def kafka_consume(bootstrap: str, topic: str, count: int) -> float:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 4 * 1024 * 1024,
            "max.partition.fetch.bytes": 1024 * 1024,
        }
    )
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    started = time.perf_counter()
    got = 0
    try:
        while got < count:
            for msg in consumer.consume(10_000, 1.0):
                if msg.error() is None:
                    got += 1
        return count / (time.perf_counter() - started)
    finally:
        consumer.close()


def node_cpu_seconds(cluster: LocalCluster) -> float:
    """user + system CPU seconds of every node process so far (Linux /proc)."""
    total = 0
    for node in cluster.nodes.values():
        if node.pid is None:
            continue
        fields = Path(f"/proc/{node.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


async def run(count: int, root: Path) -> dict[str, float]:
    cluster = LocalCluster(root, free_port_pairs(3), kafka_ports=free_ports(3))
    cluster.start()
    try:
        await cluster.wait_ready(60)
        async with Admin(cluster.bootstrap) as admin:
            for topic in ("native", "kafka"):
                await admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
        await asyncio.sleep(2)  # leaders elected
        out: dict[str, float] = {"records": count, "record_bytes": len(RECORD)}
        phases = [
            ("native_produce", native_produce(cluster.bootstrap, "native", count)),
            (
                "kafka_produce",
                asyncio.to_thread(kafka_produce, cluster.kafka_bootstrap, "kafka", count),
            ),
            ("native_consume", native_consume(cluster.bootstrap, "native", count)),
            (
                "kafka_consume",
                asyncio.to_thread(kafka_consume, cluster.kafka_bootstrap, "kafka", count),
            ),
        ]
        for name, phase in phases:
            cpu = node_cpu_seconds(cluster)
            out[f"{name}_rps"] = await phase
            out[f"{name}_node_cpu_us_per_record"] = (node_cpu_seconds(cluster) - cpu) / count * 1e6
        out["produce_ratio"] = out["kafka_produce_rps"] / out["native_produce_rps"]
        out["consume_ratio"] = out["kafka_consume_rps"] / out["native_consume_rps"]
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}
    finally:
        await asyncio.to_thread(cluster.stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k records (else 1M)")
    parser.add_argument("--records", type=int, default=0)
    args = parser.parse_args()
    count = args.records or (100_000 if args.quick else 1_000_000)
    with tempfile.TemporaryDirectory(prefix="kafka-bench-") as tmp:
        result = uvloop.run(run(count, Path(tmp)))
    for key, value in result.items():
        print(f"{key:>20}: {value:,}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
