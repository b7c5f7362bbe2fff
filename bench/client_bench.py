"""Throughput of the asyncio client API against its own encoding/decoding ceiling.

Starts a 1-node cluster (topic of 3 partitions, RF 1) and measures, in one uvloop process:
the full `Producer` API (``await producer.send(...)`` in a tight loop, the returned awaitables
awaited at the end) with acks=leader and acks=all, the `Consumer` API reading everything back,
and as baselines the same number of records encoded with `build_batch` alone and decoded with
`decode_records` alone. The last line is one JSON object.

    python bench/client_bench.py --quick
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.localcluster import LocalCluster, free_port_pairs
from laminar.segment.batch import build_batch, decode_records

VALUE = b"x" * 100
PARTITIONS = 3
RECORDS_PER_BATCH = 2400  # about what a 256 KiB producer batch holds of 100-byte records


async def produce(bootstrap: str, topic: str, count: int, acks: str) -> float:
    """Records/s of ``await producer.send`` for ``count`` records, all acknowledged."""
    async with Producer(bootstrap, acks=acks, linger_ms=5) as producer:
        await producer.send_and_wait(topic, VALUE)  # metadata and connection warm
        started = time.perf_counter()
        send = producer.send
        pending = [await send(topic, VALUE) for _ in range(count)]
        for waiter in pending:
            await waiter
        elapsed = time.perf_counter() - started
    return count / elapsed


async def consume(bootstrap: str, topic: str, expected: int) -> float:
    """Records/s of ``Consumer.getmany`` reading every partition from the beginning."""
    async with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        got = 0
        started = time.perf_counter()
        while got < expected:
            records = await consumer.getmany(timeout_ms=5000)
            if not records:
                raise RuntimeError(f"consumer stalled after {got} of {expected} records")
            got += len(records)
        elapsed = time.perf_counter() - started
    return got / elapsed


def ceilings(count: int) -> tuple[float, float]:
    """Records/s of build_batch alone and decode_records alone over ``count`` records."""
    ts = int(time.time() * 1000)
    batches = max(1, count // RECORDS_PER_BATCH)
    records = [(None, VALUE, (), ts)] * RECORDS_PER_BATCH
    started = time.perf_counter()
    built = [build_batch(records, producer_id=1, producer_epoch=0, base_sequence=0)]
    for _ in range(batches - 1):
        built.append(build_batch(records, producer_id=1, producer_epoch=0, base_sequence=0))
    encode = batches * RECORDS_PER_BATCH / (time.perf_counter() - started)
    started = time.perf_counter()
    decoded = 0
    for data in built:
        decoded += len(decode_records(data))
    decode = decoded / (time.perf_counter() - started)
    return encode, decode


async def main(args: argparse.Namespace) -> dict[str, Any]:
    count = 300_000 if args.quick else 2_000_000
    rounds = 3
    producer: list[float] = []
    producer_all: list[float] = []
    consumer: list[float] = []
    with tempfile.TemporaryDirectory(prefix="laminar-client-bench-") as root:
        cluster = LocalCluster(Path(root), free_port_pairs(1), log_level="warning")
        cluster.start()
        try:
            await cluster.wait_ready(60)
            bootstrap = cluster.bootstrap
            for round_ in range(rounds):
                leader, every = f"leader-{round_}", f"all-{round_}"
                async with Admin(bootstrap) as admin:
                    await admin.create_topic(leader, partitions=PARTITIONS, replication_factor=1)
                    await admin.create_topic(every, partitions=PARTITIONS, replication_factor=1)
                producer.append(await produce(bootstrap, leader, count, "leader"))
                producer_all.append(await produce(bootstrap, every, count, "all"))
                consumer.append(await consume(bootstrap, leader, count + 1))
        finally:
            cluster.stop()
    encode, decode = zip(*(ceilings(count) for _ in range(rounds)), strict=True)
    best = {
        "producer": max(producer),
        "producer_all": max(producer_all),
        "consumer": max(consumer),
        "encode": max(encode),
        "decode": max(decode),
    }
    return {
        "records": count,
        "value_bytes": len(VALUE),
        "partitions": PARTITIONS,
        "rounds": rounds,
        "producer_records_per_s": round(best["producer"]),
        "producer_acks_all_records_per_s": round(best["producer_all"]),
        "consumer_records_per_s": round(best["consumer"]),
        "encode_ceiling_records_per_s": round(best["encode"]),
        "decode_ceiling_records_per_s": round(best["decode"]),
        "producer_ratio": round(best["producer"] / best["encode"], 3),
        "consumer_ratio": round(best["consumer"] / best["decode"], 3),
        "producer_rounds": [round(x) for x in producer],
        "producer_acks_all_rounds": [round(x) for x in producer_all],
        "consumer_rounds": [round(x) for x in consumer],
        "client": "laminar.client Producer/Consumer, one uvloop process, 1-node cluster, RF 1; "
        "best of the rounds (the machine is shared)",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="300k records per round")
    figures = uvloop.run(main(parser.parse_args()))
    print(json.dumps(figures))
