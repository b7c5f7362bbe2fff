"""Compressed batches through a real in-process node, for every codec: the native producer
compresses, the node stores and serves the same bytes, and every reader decompresses: the
native consumer, ``laminar consume`` (a process), the Spark source's reader, a share-group
consumer with delayed records, and ListOffsets by timestamp. A batch whose records do not
decompress is a typed error for its reader and nobody else's problem."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import crc32c
import pyarrow as pa
import pytest

from laminar.client import Consumer, Producer, ShareConsumer, TopicPartition
from laminar.client.connection import Connection
from laminar.client.offsets import list_offsets
from laminar.errors import CorruptBatchError
from laminar.protocol import read_error
from laminar.segment import compression as codecs
from laminar.segment.batch import HEADER_SIZE, build_batch, is_control, iter_batches
from spark_source.source import LaminarDataSource
from tests.single_node import SingleNode, create_topic

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parent.parent
T0 = int(time.time() * 1000) - 60_000


@pytest.fixture
async def bootstrap(tmp_path: Path) -> AsyncIterator[str]:
    single = SingleNode(tmp_path)
    node = await single.start()
    try:
        await create_topic(single.bootstrap, "stream", 1)
        await create_topic(single.bootstrap, "jobs", 1)
        yield single.bootstrap
    finally:
        await node.stop()


def sent_records(count: int) -> list[tuple[bytes | None, bytes | None, tuple, int]]:
    out = []
    for i in range(count):
        key = None if i % 9 == 0 else b"user-%d" % (i % 17)
        value = None if i % 13 == 4 else b'{"n": %d, "text": "%s"}' % (i, b"abc" * (i % 20))
        headers = (("h", b"%d" % i), ("none", None)) if i % 4 == 0 else ()
        out.append((key, value, headers, T0 + i - (i % 3)))
    return out


async def stored_codecs(bootstrap: str, topic: str) -> list[int]:
    """The codec of every data batch in the partition, as the node serves it."""
    async with Consumer(bootstrap) as consumer:
        fetched = await consumer.fetch_batches(TopicPartition(topic, 0), 0, 8 << 20)
    return [h.compression for _, h in iter_batches(fetched.data) if not is_control(h)]


async def cli(*args: str) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "laminar", *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def spark_rows(bootstrap: str, topic: str) -> pa.Table:
    """The Spark source's planning and executor reads, in this process (no JVM needed)."""
    source = LaminarDataSource(
        {"bootstrap": bootstrap, "subscribe": topic, "includeHeaders": "true"}
    )
    reader = source.reader(source.schema())
    return pa.Table.from_batches(
        [batch for part in reader.partitions() for batch in reader.read(part)]
    )


@pytest.mark.parametrize("codec", list(codecs.CODECS))
async def test_every_reader_gets_back_what_a_compressing_producer_sent(
    bootstrap: str, codec: str
) -> None:
    sent = sent_records(2000)
    async with Producer(bootstrap, compression=codec, linger_ms=20, batch_bytes=64 << 10) as p:
        futures = [
            await p.send("stream", v, key=k, headers=h, partition=0, timestamp_ms=ts)
            for k, v, h, ts in sent
        ]
        await p.flush()
        offsets = [meta.offset for meta in await asyncio.gather(*futures)]
    kinds = await stored_codecs(bootstrap, "stream")
    assert len(kinds) > 1 and set(kinds) == {codecs.CODECS[codec]}
    expected = [(o, ts, k, v, h) for o, (k, v, h, ts) in zip(offsets, sent, strict=True)]

    async with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.assign([TopicPartition("stream", 0)])
        got: list = []
        while len(got) < len(sent):
            got += await consumer.getmany(timeout_ms=500)
        assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in got] == expected
        # A seek into the middle of a compressed batch starts at that record.
        await consumer.seek(TopicPartition("stream", 0), offsets[1234])
        after: list = []
        while not after:
            after = await consumer.getmany(timeout_ms=500)
        assert after[0].offset == offsets[1234]

    # ListOffsets by timestamp looks inside the compressed batch on the node.
    async with Consumer(bootstrap) as consumer:
        tp = TopicPartition("stream", 0)
        for i in (0, 1, 700, 1999):
            wanted = min(ts for _, _, _, ts in sent[i:])
            found = (await list_offsets(consumer.cluster, [tp], sent[i][3]))[tp]
            first_at = next(
                o for o, (_, _, _, ts) in zip(offsets, sent, strict=True) if ts >= wanted
            )
            assert found == first_at

    code, out, err = await cli("consume", "stream", "--format", "json", "--bootstrap", bootstrap)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["offset"], r["value"]) for r in rows] == [
        (o, None if v is None else v.decode()) for o, _, _, v, _ in expected
    ]

    table = await asyncio.to_thread(spark_rows, bootstrap, "stream")
    assert table.column("offset").to_pylist() == offsets
    assert table.column("value").to_pylist() == [v for _, _, _, v, _ in expected]
    assert table.column("key").to_pylist() == [k for _, _, k, _, _ in expected]
    assert [int(t.timestamp() * 1000) for t in table.column("timestamp").to_pylist()] == [
        ts for _, ts, _, _, _ in expected
    ]
    assert [
        [(x["key"], x["value"]) for x in row] for row in table.column("headers").to_pylist()
    ] == [list(h) for _, _, _, _, h in expected]


@pytest.mark.parametrize("codec", list(codecs.CODECS))
async def test_a_share_group_reads_compressed_batches_and_holds_their_delayed_records(
    bootstrap: str, codec: str
) -> None:
    async with ShareConsumer(bootstrap, "g", "jobs", max_records=100) as consumer:
        sent = time.time()
        async with Producer(bootstrap, compression=codec, linger_ms=50) as producer:
            futures = []
            for i in range(60):  # one batch: delayed records among ready ones
                delay = 1200 if i % 10 == 3 else None
                value = b"job %d %s" % (i, b"payload " * 10)
                futures.append(await producer.send("jobs", value, partition=0, delay_ms=delay))
            await producer.flush()
            await asyncio.gather(*futures)
        assert set(await stored_codecs(bootstrap, "jobs")) == {codecs.CODECS[codec]}
        ready: list = []
        while len(ready) < 54:
            ready += await consumer.fetch(timeout_ms=300)
        assert time.time() - sent < 1.2
        assert sorted(int(m.value.split()[1]) for m in ready) == [
            i for i in range(60) if i % 10 != 3
        ]
        for message in ready:
            message.ack()
        later: list = []
        while len(later) < 6:
            later += await consumer.fetch(timeout_ms=300)
        assert time.time() >= sent + 1.2
        assert sorted(int(m.value.split()[1]) for m in later) == list(range(3, 60, 10))
        for message in later:
            await message.ack()


async def test_produce_compression_in_the_cli(bootstrap: str) -> None:
    code, out, err = await cli(
        "produce", "stream", "--value", "record {i} " + "x" * 50, "-n", "300",
        "--compression", "zstd", "--bootstrap", bootstrap,
    )  # fmt: skip
    assert code == 0, err
    assert set(await stored_codecs(bootstrap, "stream")) == {codecs.ZSTD}
    code, out, _ = await cli("consume", "stream", "--format", "value", "--bootstrap", bootstrap)
    assert out.splitlines() == [f"record {i} " + "x" * 50 for i in range(300)]
    code, _, err = await cli(
        "produce", "stream", "-v", "x", "--compression", "brotli", "--bootstrap", bootstrap
    )
    assert code != 0 and "compression must be one of" in err


async def test_a_batch_that_does_not_decompress_fails_its_readers_only(bootstrap: str) -> None:
    """The node stores it (its crc is right, the node never inflates on produce); the
    consumer and the Spark source raise CorruptBatchError; the node keeps serving."""
    good = build_batch([(None, b"fine " * 50, (), T0)] * 20, compression=codecs.LZ4)
    bad = bytearray(good)
    bad[HEADER_SIZE + 20 :] = b"\xff" * (len(bad) - HEADER_SIZE - 20)
    struct.pack_into("<I", bad, 20, crc32c.crc32c(memoryview(bad)[24:]))
    connection = await Connection.open(bootstrap)
    try:
        for batch in (good, bytes(bad)):

            def fill(body, data=batch):  # type: ignore[no-untyped-def]
                request = body.init("produce")
                request.acks = -1
                request.timeoutMs = 5000
                (ref,) = request.init("batches", 1)
                ref.topic, ref.partition, ref.payloadOffset = "jobs", 0, 0
                ref.payloadLength = len(data)

            reply, _ = await connection.request(fill, [batch])
            assert read_error(reply.body.produce.results[0].error) is None
    finally:
        connection.close()
    async with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.assign([TopicPartition("jobs", 0)])
        with pytest.raises(CorruptBatchError, match="jobs/0 near offset"):
            for _ in range(20):  # (the fetch holding it, fetched twice, fails whole)
                await consumer.getmany(timeout_ms=300)
    with pytest.raises(CorruptBatchError):
        await asyncio.to_thread(spark_rows, bootstrap, "jobs")
    async with Producer(bootstrap, compression="gzip") as producer:
        assert (await producer.send_and_wait("stream", b"still serving", partition=0)).offset >= 0
