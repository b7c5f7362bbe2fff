"""librdkafka (confluent-kafka) and laminar's compressed records sections, both ways, through
librdkafka's own mock Kafka broker (no Kafka needed). Run as a process by
tests/test_compression.py (aiokafka's pure-Python record code must be chosen at import).

1. aiokafka's record builder, with laminar's compressors in place of its own, produces to the
   mock broker; a librdkafka consumer reads the records back.
2. A librdkafka producer compresses with each codec; aiokafka's record reader, with laminar's
   decompressors in place of its own, reads the records back.

Prints one line per codec and direction, "ok" or what went wrong; exits 1 on any failure.
"""

from __future__ import annotations

import os

os.environ["AIOKAFKA_NO_EXTENSIONS"] = "1"  # before aiokafka is imported

import asyncio
import logging
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiokafka.record.default_records as records
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioPartition
from confluent_kafka import Consumer, Producer, TopicPartition

from laminar.segment import compression

COUNT = 500
VALUES = [b"value %d %s" % (i, b"abc" * (i % 30)) for i in range(COUNT)]


def mock_broker() -> tuple[Consumer, str]:
    """A librdkafka consumer owning a mock cluster, and that cluster's address (from the
    mock's debug log: librdkafka exposes no other way to Python)."""
    seen: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.extend(re.findall(r"127\.0\.0\.1:\d+", record.getMessage()))

    logger = logging.getLogger("librdkafka-mock")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(Catch())
    consumer = Consumer(
        {
            "test.mock.num.brokers": 1,
            "group.id": "interop",
            "auto.offset.reset": "earliest",
            "debug": "mock",
            "logger": logger,
        }
    )
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        consumer.poll(0.1)
    if not seen:
        raise SystemExit("no mock broker address in librdkafka's log")
    return consumer, seen[0]


def laminar_encoder(codec: int, used: list[int]):  # type: ignore[no-untyped-def]
    def encode(data: bytes, *_args: object, **_kwargs: object) -> bytes:
        used.append(codec)
        return compression.compress(codec, bytes(data))

    return encode


def laminar_decoder(codec: int, used: list[int]):  # type: ignore[no-untyped-def]
    def decode(data: bytes) -> bytes:
        used.append(codec)
        return compression.decompress(codec, data)

    return decode


async def aiokafka_produce(bootstrap: str, topic: str, name: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=name, linger_ms=50)
    await producer.start()
    try:
        sent = [await producer.send(topic, value=v, partition=0) for v in VALUES]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def aiokafka_consume(bootstrap: str, topic: str) -> list[bytes | None]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partition = AioPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        got: list[bytes | None] = []
        deadline = time.monotonic() + 20
        while len(got) < COUNT and time.monotonic() < deadline:
            batches = await consumer.getmany(partition, timeout_ms=500)
            got += [message.value for message in batches.get(partition, [])]
        return got
    finally:
        await consumer.stop()


def main() -> int:
    assert records.DefaultRecordBatchBuilder is records._DefaultRecordBatchBuilderPy
    encoded: list[int] = []
    decoded: list[int] = []
    records.gzip_encode = laminar_encoder(compression.GZIP, encoded)
    records.snappy_encode = laminar_encoder(compression.SNAPPY, encoded)
    records.lz4_encode = laminar_encoder(compression.LZ4, encoded)
    records.zstd_encode = laminar_encoder(compression.ZSTD, encoded)
    records.gzip_decode = laminar_decoder(compression.GZIP, decoded)
    records.snappy_decode = laminar_decoder(compression.SNAPPY, decoded)
    records.lz4_decode = laminar_decoder(compression.LZ4, decoded)
    records.zstd_decode = laminar_decoder(compression.ZSTD, decoded)
    reader, bootstrap = mock_broker()
    failures = 0
    for name, codec in compression.CODECS.items():
        topic = f"laminar-wrote-{name}"
        asyncio.run(aiokafka_produce(bootstrap, topic, name))
        reader.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes | None] = []
        deadline = time.monotonic() + 20
        while len(got) < COUNT and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is not None and message.error() is None:
                got.append(message.value())
        ok = got == VALUES and codec in encoded
        failures += not ok
        print(f"laminar -> librdkafka {name}: {'ok' if ok else f'FAILED ({len(got)} read)'}")

        topic = f"librdkafka-wrote-{name}"
        writer = Producer(
            {"bootstrap.servers": bootstrap, "compression.type": name, "linger.ms": 50}
        )
        for value in VALUES:
            writer.produce(topic, value, partition=0)
        writer.flush(20)
        got = asyncio.run(aiokafka_consume(bootstrap, topic))
        ok = got == VALUES and codec in decoded
        failures += not ok
        print(f"librdkafka -> laminar {name}: {'ok' if ok else f'FAILED ({len(got)} read)'}")
    reader.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
