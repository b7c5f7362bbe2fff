"""Per-record delivery handles and the consumer's direct decoder (no node needed)."""

from __future__ import annotations

import asyncio
import random

import pytest

from laminar.client.accumulator import ProducerBatch, RecordAccumulator
from laminar.client.decoding import decode_consumer_records
from laminar.client.delivery import RecordFuture
from laminar.client.types import ConsumerRecord, RecordMetadata, TopicPartition
from laminar.errors import CorruptBatchError
from laminar.segment.batch import build_batch, decode_records, read_header, stamp

TP = TopicPartition("t", 2)


def _filled(count: int) -> tuple[RecordAccumulator, ProducerBatch, list[RecordFuture]]:
    acc = RecordAccumulator(batch_bytes=1 << 20, linger=0.0)
    handles = [acc.append(TP, None, b"v", (), 100 + i, now=0.0)[0] for i in range(count)]
    (batch,) = acc.ready(now=1.0)[0]
    acc.start_sending([batch])
    return acc, batch, handles


async def test_handles_resolve_from_the_batch_base_offset() -> None:
    _, batch, handles = _filled(3)
    assert not any(h.done() for h in handles)
    with pytest.raises(asyncio.InvalidStateError):
        handles[0].result()
    waiting = asyncio.ensure_future(handles[1])  # awaited before the batch is done
    await asyncio.sleep(0)
    batch.complete(40)
    assert await waiting == RecordMetadata("t", 2, 41, 101)
    assert [await h for h in handles] == [RecordMetadata("t", 2, 40 + i, 100 + i) for i in range(3)]
    assert all(h.done() and not h.cancelled() and h.exception() is None for h in handles)
    assert list(await asyncio.gather(*handles)) == [h.result() for h in handles]


async def test_a_failed_batch_raises_its_error_from_every_record() -> None:
    _, batch, handles = _filled(2)
    gathered = asyncio.gather(*handles, return_exceptions=True)
    batch.fail(CorruptBatchError("bad"))
    assert [type(r) for r in await gathered] == [CorruptBatchError, CorruptBatchError]
    with pytest.raises(CorruptBatchError):
        await handles[0]
    assert isinstance(handles[1].exception(), CorruptBatchError)


async def test_cancelling_one_wait_leaves_the_batch_and_other_records_alone() -> None:
    _, batch, handles = _filled(3)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(handles[0], 0.01)  # cancels only that record's own future
    assert handles[0].cancelled()

    async def waiter() -> RecordMetadata:
        return await handles[1]

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    batch.complete(7)
    assert not batch.done.cancelled()
    assert handles[1].cancelled()  # as an asyncio.Future awaited by a cancelled task
    assert (await handles[2]).offset == 9
    done, pending = await asyncio.wait(handles)
    assert len(done) == 3 and not pending


async def test_gather_and_wait_over_records_make_no_future_per_record() -> None:
    _, batch, handles = _filled(500)
    gathered = asyncio.gather(*handles)
    waited = asyncio.ensure_future(asyncio.wait(handles[:10]))
    await asyncio.sleep(0)
    assert not batch.waiters  # callbacks wait on the batch, not on a future per record
    assert all(h._future is None for h in handles)
    batch.complete(1000)
    results = await gathered
    assert [m.offset for m in results] == list(range(1000, 1500))
    done, pending = await waited
    assert len(done) == 10 and not pending
    assert not batch.callbacks  # asyncio.wait removed its callbacks, gather's ran


async def test_cancelling_a_gathered_record_cancels_the_gather_at_once() -> None:
    _, batch, handles = _filled(3)
    gathered = asyncio.gather(*handles)
    await asyncio.sleep(0)
    assert handles[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(gathered, 5)  # not left waiting for the batch
    calls: list[object] = []
    handles[2].add_done_callback(calls.append)
    assert handles[2].remove_done_callback(calls.append) == 1
    batch.complete(0)
    await asyncio.sleep(0)
    assert not calls
    assert (await handles[0]).offset == 0 and handles[1].cancelled()
    assert not handles[0].cancel()  # settled: nothing to cancel


async def test_acks_none_resolves_with_offset_minus_one() -> None:
    _, batch, handles = _filled(2)
    batch.complete(-1)
    assert [(await h).offset for h in handles] == [-1, -1]


def _random_batch(rng: random.Random) -> bytes:
    records = []
    for _ in range(rng.randint(1, 40)):
        key = None if rng.random() < 0.4 else rng.randbytes(rng.choice([0, 3, 70, 200]))
        value = None if rng.random() < 0.1 else rng.randbytes(rng.choice([0, 10, 63, 64, 300]))
        headers = [("h", rng.randbytes(3)), ("é", None)] if rng.random() < 0.2 else []
        records.append((key, value, headers, 1_000 + rng.randint(-100, 100)))
    data = bytearray(build_batch(records))
    stamp(data, rng.randint(0, 10_000), 1)
    return bytes(data)


def _expected(data: bytes, from_offset: int) -> list[ConsumerRecord]:
    return [
        ConsumerRecord("t", 2, r.offset, r.timestamp, r.key, r.value, r.headers)
        for r in decode_records(data)
        if r.offset >= from_offset
    ]


def test_direct_decoder_matches_decode_records() -> None:
    rng = random.Random(7)
    for _ in range(200):
        data = _random_batch(rng)
        header = read_header(data)
        start = header.base_offset + rng.randint(0, header.record_count)
        out: list[ConsumerRecord] = []
        decode_consumer_records(data, header, "t", 2, start, out)
        assert out == _expected(data, start)


def test_direct_decoder_rejects_what_decode_records_rejects() -> None:
    rng = random.Random(11)
    rejected = 0
    for _ in range(2_000):
        data = bytearray(_random_batch(rng))
        for _flip in range(rng.randint(1, 3)):
            position = rng.randrange(68, len(data))  # the records, not the header
            data[position] = rng.randrange(256)
        mutated = bytes(data)
        header = read_header(mutated)
        try:
            expected = _expected(mutated, 0)
        except CorruptBatchError:
            rejected += 1
            with pytest.raises(CorruptBatchError):
                decode_consumer_records(mutated, header, "t", 2, 0, [])
            continue
        out: list[ConsumerRecord] = []
        decode_consumer_records(mutated, header, "t", 2, 0, out)
        assert out == expected
    assert rejected > 100  # the mutations really exercised the error paths
