"""Client pieces that need no node: partitioner, accumulator rules, bootstrap parsing."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import crc32c
import pytest

from laminar.client.accumulator import RecordAccumulator
from laminar.client.partitioner import DefaultPartitioner, key_partition
from laminar.client.types import TopicPartition, parse_bootstrap
from laminar.segment.batch import decode_records, verify_batch

TP = TopicPartition("t", 0)


def test_key_partition_is_stable_and_spreads() -> None:
    # Stable across processes: a fixed function of the bytes (crc32c), not Python's hash().
    assert key_partition(b"user-42", 12) == crc32c.crc32c(b"user-42") % 12
    counts = Counter(key_partition(f"key-{i}".encode(), 8) for i in range(8000))
    assert set(counts) == set(range(8))
    assert min(counts.values()) > 800  # ~1000 each


def test_default_partitioner_keys_and_sticky() -> None:
    partitioner = DefaultPartitioner(random.Random(7))
    assert partitioner("t", b"k", 5) == key_partition(b"k", 5)
    first = partitioner("t", None, 5)
    assert all(partitioner("t", None, 5) == first for _ in range(100))
    partitioner.batch_closed("t", first, 5)
    second = partitioner("t", None, 5)
    assert second != first
    # A batch closing on another partition does not move the sticky one.
    partitioner.batch_closed("t", (second + 1) % 5, 5)
    assert partitioner("t", None, 5) == second
    # Topics are independent; a single partition stays put.
    assert partitioner("solo", None, 1) == 0
    partitioner.batch_closed("solo", 0, 1)
    assert partitioner("solo", None, 1) == 0


def test_sticky_partitioner_visits_every_partition() -> None:
    partitioner = DefaultPartitioner(random.Random(1))
    seen = set()
    for _ in range(200):
        partition = partitioner("t", None, 4)
        seen.add(partition)
        partitioner.batch_closed("t", partition, 4)
    assert seen == {0, 1, 2, 3}


def test_sticky_partitioner_moves_to_a_partition_with_nothing_in_flight() -> None:
    # A partition has one batch in flight at most: a record sent to a busy one waits a whole
    # acknowledgement round trip, so the sticky partition moves to an idle one when it can.
    partitioner = DefaultPartitioner(random.Random(3))
    for _ in range(50):
        current = partitioner("t", None, 6)
        busy = {current, (current + 1) % 6, (current + 3) % 6}
        partitioner.batch_closed("t", current, 6, busy.__contains__)
        assert partitioner("t", None, 6) not in busy
    # Every other partition busy: it still moves on (as before), to any other one.
    current = partitioner("t", None, 6)
    partitioner.batch_closed("t", current, 6, lambda _partition: True)
    assert partitioner("t", None, 6) != current


def test_a_sticky_partition_waiting_for_an_ack_gives_way_to_an_idle_one() -> None:
    partitioner = DefaultPartitioner(random.Random(5))
    current = partitioner("t", None, 4)
    busy = {current, (current + 2) % 4}
    moved = partitioner.avoid_busy("t", current, 4, busy.__contains__)
    assert moved not in busy
    assert partitioner("t", None, 4) == moved  # sticky there from now on
    # Nowhere better to go: it stays.
    assert partitioner.avoid_busy("t", moved, 4, lambda _partition: True) == moved
    assert partitioner("t", None, 4) == moved


async def test_accumulator_tells_which_partitions_are_busy() -> None:
    accumulator = RecordAccumulator(batch_bytes=1 << 20, linger=0.0)
    other = TopicPartition("t", 1)
    assert not accumulator.busy(TP) and not accumulator.busy(other)
    accumulator.append(TP, None, b"x", (), 0)
    assert accumulator.busy(TP)  # a batch queued
    batches, _ = accumulator.ready(asyncio.get_running_loop().time())
    assert not accumulator.sending(TP)
    accumulator.start_sending(batches)
    assert accumulator.busy(TP) and not accumulator.busy(other)  # in flight
    assert accumulator.sending(TP)
    accumulator.finished(batches[0])
    assert not accumulator.busy(TP) and not accumulator.sending(TP)


def test_parse_bootstrap() -> None:
    assert parse_bootstrap("a:1, b:2,") == ["a:1", "b:2"]
    assert parse_bootstrap(["h:9092"]) == ["h:9092"]
    with pytest.raises(ValueError, match="not host:port"):
        parse_bootstrap("localhost")
    with pytest.raises(ValueError, match="no address"):
        parse_bootstrap(" , ")


async def test_accumulator_linger_and_size() -> None:
    acc = RecordAccumulator(batch_bytes=1000, linger=0.05)
    _, look = acc.append(TP, None, b"x" * 10, (), 1, now=0.0)
    assert look  # a new batch: the sender must learn its linger deadline
    _, look = acc.append(TP, None, b"x" * 10, (), 2, now=0.01)
    assert not look
    ready, wake_at = acc.ready(now=0.02)
    assert ready == [] and wake_at == pytest.approx(0.05)
    ready, _ = acc.ready(now=0.05)
    assert len(ready) == 1 and len(ready[0].records) == 2
    # Filling a batch makes it ready at once, before linger.
    # Each record is estimated at 24 + 50 bytes and a batch header is 68: three fit in 300.
    acc2 = RecordAccumulator(batch_bytes=300, linger=10.0)
    looks = [acc2.append(TP, None, b"y" * 50, (), i, now=0.0)[1] for i in range(4)]
    assert looks == [True, False, False, True]  # new batch, -, -, new batch (first is full)
    ready, wake_at = acc2.ready(now=0.0)
    assert [len(batch.records) for batch in ready] == [3]
    assert wake_at is None  # the second batch waits behind the first (one in flight)


async def test_accumulator_one_in_flight_per_partition_and_requeue_order() -> None:
    acc = RecordAccumulator(batch_bytes=100, linger=0.0)
    for i in range(6):
        acc.append(TP, None, b"z" * 40, (), i, now=0.0)
    first, _ = acc.ready(now=1.0)
    assert len(first) == 1
    acc.start_sending(first)
    # While the head is in flight, nothing else of this partition may go.
    assert acc.ready(now=1.0)[0] == []
    acc.requeue(first[0], retry_at=2.0)
    ready, wake_at = acc.ready(now=1.5)
    assert ready == [] and wake_at == 2.0  # the retry waits for its backoff, blocking the rest
    ready, _ = acc.ready(now=2.0)
    assert ready == first  # the retried batch goes again first: order is kept
    built = first[0].build()
    assert verify_batch(built).record_count == len(first[0].records)
    assert [r.timestamp for r in decode_records(built)] == [0, 1][: len(first[0].records)]


async def test_accumulator_flush_and_completion() -> None:
    acc = RecordAccumulator(batch_bytes=10_000, linger=60.0)
    futures = [
        acc.append(TopicPartition("t", p), b"k", b"v", (("h", b"1"),), 5, now=0.0)[0]
        for p in range(3)
    ]
    assert acc.ready(now=0.0)[0] == []
    waiting = acc.begin_flush()
    assert len(waiting) == 3
    ready, _ = acc.ready(now=0.0)
    assert len(ready) == 3  # flush overrides linger
    acc.start_sending(ready)
    ready[0].complete(10)
    ready[1].fail(RuntimeError("boom"))
    ready[2].complete(-1)
    for batch in ready:
        acc.finished(batch)
    assert acc.empty() and acc.buffered_bytes == 0
    assert futures[0].result().offset == 10
    with pytest.raises(RuntimeError):
        futures[1].result()
    assert futures[2].result().offset == -1
    await asyncio.gather(*waiting)


async def test_accumulator_stamps_producer_id_and_sequences() -> None:
    acc = RecordAccumulator(batch_bytes=150, linger=0.0, producer_id=77)
    other = TopicPartition("t", 1)
    for i in range(3):
        acc.append(TP, None, b"a" * 40, (), i, now=0.0)  # one record per batch at this size
    acc.append(other, None, b"b", (), 0, now=0.0)
    sequences: dict[TopicPartition, list[int]] = {TP: [], other: []}
    for _ in range(3):
        ready, _ = acc.ready(now=1.0)
        acc.start_sending(ready)
        for batch in ready:
            header = verify_batch(batch.data or b"")
            assert header.producer_id == 77 and header.producer_epoch == 0
            sequences[batch.tp].append(header.base_sequence)
            acc.finished(batch)
    assert sequences == {TP: [0, 1, 2], other: [0]}  # per partition, counting records
    # A retried batch keeps its bytes, so its sequence too.
    acc.append(TP, None, b"c", (), 9, now=0.0)
    ready, _ = acc.ready(now=1.0)
    acc.start_sending(ready)
    data = ready[0].data
    acc.requeue(ready[0], retry_at=0.0)
    again, _ = acc.ready(now=1.0)
    acc.start_sending(again)
    assert again[0].data is data and verify_batch(data or b"").base_sequence == 3


async def test_accumulator_pipelines_up_to_max_in_flight_in_order() -> None:
    acc = RecordAccumulator(batch_bytes=100, linger=0.0, producer_id=7, max_in_flight=3)
    for i in range(8):
        acc.append(TP, None, b"z" * 60, (), i, now=0.0)  # one record per batch
    sent = []
    for _ in range(2):  # one batch of a partition per ready() (one per request)
        ready, _ = acc.ready(now=0.0)
        assert len(ready) == 1
        acc.start_sending(ready)
        sent += ready
        if len(sent) == 1:
            # Until the node acknowledged one batch, only one goes (it may not know us yet).
            assert acc.ready(now=0.0)[0] == []
            sent[0].complete(0)
            acc.finished(sent[0])
    for _ in range(2):
        ready, _ = acc.ready(now=0.0)
        acc.start_sending(ready)
        sent += ready
    assert acc.ready(now=0.0)[0] == []  # three in flight: the limit
    sequences = [verify_batch(b.data or b"").base_sequence for b in sent]
    assert sequences == [0, 1, 2, 3]  # contiguous, in send order
    # The second fails retriably; the two behind it come back refused (out of order).
    acc.requeue(sent[1], retry_at=0.5)
    acc.requeue(sent[3], retry_at=0.0, rebuild=True, counted=False)
    ready, _ = acc.ready(now=1.0)
    assert ready == []  # the retry waits for every batch sent before it to come back
    acc.requeue(sent[2], retry_at=0.0, rebuild=True, counted=False)
    order = []
    for round_ in range(3):
        ready, _ = acc.ready(now=1.0)
        assert len(ready) == 1
        acc.start_sending(ready)
        order += ready
        if round_ < 2:
            assert acc.ready(now=1.0)[0] == []  # the next resent batch waits for this one
        ready[0].complete(0)
        acc.finished(ready[0])
    assert order == sent[1:4]  # resent in the original order, with the same bytes
    assert [verify_batch(b.data or b"").base_sequence for b in order] == [1, 2, 3]
    ready, _ = acc.ready(now=1.0)  # then new batches pipeline again, continuing the sequence
    acc.start_sending(ready)
    assert verify_batch(ready[0].data or b"").base_sequence == 4


async def test_accumulator_new_epoch_after_a_batch_failed_for_good() -> None:
    acc = RecordAccumulator(batch_bytes=100, linger=0.0, producer_id=7, max_in_flight=5)
    for i in range(4):
        acc.append(TP, None, b"z" * 60, (), i, now=0.0)
    first, _ = acc.ready(now=0.0)
    acc.start_sending(first)
    first[0].complete(0)
    acc.finished(first[0])
    sent = []
    for _ in range(2):
        ready, _ = acc.ready(now=0.0)
        acc.start_sending(ready)
        sent += ready
    sent[0].fail(ValueError("refused for good"))  # sequence 1 will never be written
    acc.finished(sent[0])
    assert acc.stale(sent[1])
    assert acc.ready(now=0.0)[0] == []  # drains: nothing of the new epoch while one is out
    acc.requeue(sent[1], retry_at=0.0, rebuild=True, counted=False)  # refused: rebuilt
    ready, _ = acc.ready(now=0.0)
    acc.start_sending(ready)
    header = verify_batch(ready[0].data or b"")
    assert ready == [sent[1]] and (header.producer_epoch, header.base_sequence) == (1, 0)


async def test_accumulator_linger_zero_sends_at_once_when_idle() -> None:
    acc = RecordAccumulator(batch_bytes=1 << 20, linger=0.0, producer_id=7, max_in_flight=5)
    _, look = acc.append(TP, None, b"x", (), 0, now=10.0)
    assert look  # the sender is woken for the new batch
    ready, _ = acc.ready(now=10.0)
    assert len(ready) == 1  # no linger: it leaves in the same loop turn
    acc.start_sending(ready)
    ready[0].complete(0)
    acc.finished(ready[0])
    acc.append(TP, None, b"x", (), 0, now=10.0)
    first, _ = acc.ready(now=10.0)
    acc.start_sending(first)
    acc.append(TP, None, b"y", (), 0, now=10.0)
    # A batch still taking records waits for the one in flight rather than going alone...
    assert acc.ready(now=20.0)[0] == []
    small = RecordAccumulator(batch_bytes=100, linger=0.0, producer_id=7, max_in_flight=5)
    small.append(TP, None, b"x", (), 0, now=0.0)
    sent, _ = small.ready(now=0.0)
    small.start_sending(sent)
    sent[0].complete(0)
    small.finished(sent[0])
    small.append(TP, None, b"x", (), 0, now=0.0)
    small.start_sending(small.ready(now=0.0)[0])
    small.append(TP, None, b"z" * 80, (), 0, now=0.0)  # fills its batch
    ready, _ = small.ready(now=0.0)
    assert len(ready) == 1  # ...but a full one is pipelined behind it
