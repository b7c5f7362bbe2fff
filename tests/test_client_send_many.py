"""Producer.send_many (the bulk path) against an in-memory cluster on real sockets: placement,
per-partition order, batching, acks, retries, errors and back-pressure."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar.client import Producer
from laminar.client.accumulator import record_size
from laminar.client.bulk import plan
from laminar.client.partitioner import key_partition
from laminar.errors import (
    BatchTooLargeError,
    NotLeaderError,
    RequestTimeoutError,
    UnknownPartitionError,
    UnknownTopicError,
)
from laminar.segment.batch import decode_records, read_header
from tests.client_fakenode import FakeCluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    cluster = await FakeCluster().start(3)
    cluster.create_topic("t", 3)
    yield cluster
    await cluster.stop()


def stored(cluster: FakeCluster, partition: int) -> list[tuple[int, bytes | None, bytes | None]]:
    part = cluster.partition("t", partition)
    return [(r.offset, r.key, r.value) for b in part.batches for r in decode_records(b)]


async def test_keyed_records_land_by_key_in_input_order(fake: FakeCluster) -> None:
    values = [f"v{i:04}".encode() for i in range(2000)]
    keys = [f"k{i % 13}".encode() for i in range(2000)]
    async with Producer(fake.bootstrap, linger_ms=1, batch_bytes=4096) as producer:
        delivery = await producer.send_many("t", values, keys=keys)
        await delivery
        results = delivery.metadata()
    assert len(results) == len(delivery) == 2000
    for partition in range(3):
        mine = [i for i in range(2000) if key_partition(keys[i], 3) == partition]
        assert [results[i].partition for i in mine] == [partition] * len(mine)
        # offsets follow input order within the partition, and the node holds exactly that
        assert [results[i].offset for i in mine] == list(range(len(mine)))
        assert stored(fake, partition) == [(n, keys[i], values[i]) for n, i in enumerate(mine)]
    assert len(fake.partition("t", 0).batches) > 3  # cut into batch_bytes batches


async def test_unkeyed_records_fill_whole_batches_over_the_partitions(fake: FakeCluster) -> None:
    values = [bytes([i % 256]) * 100 for i in range(3000)]
    async with Producer(fake.bootstrap, batch_bytes=16 * 1024) as producer:
        delivery = await producer.send_many("t", values, headers=(("h", b"1"),))
        await delivery
    results = delivery.metadata()
    assert {m.partition for m in results} == {0, 1, 2}
    for partition in range(3):
        mine = [i for i, m in enumerate(results) if m.partition == partition]
        assert mine == sorted(mine)
        got = stored(fake, partition)
        assert [v for _, _, v in got] == [values[i] for i in mine]
        assert [results[i].offset for i in mine] == [o for o, _, _ in got]
        for batch in fake.partition("t", partition).batches:
            assert len(batch) <= 16 * 1024 + 200
    record = decode_records(fake.partition("t", 0).batches[0])[0]
    assert record.headers == (("h", b"1"),)


async def test_explicit_partition_and_mixing_with_send_keeps_order(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, linger_ms=5) as producer:
        first = await producer.send("t", b"a", partition=2)
        bulk = await producer.send_many("t", [b"b", b"c", None], partition=2, timestamp_ms=7)
        last = await producer.send("t", b"d", partition=2)
        await asyncio.gather(first, bulk, last)
    assert [v for _, _, v in stored(fake, 2)] == [b"a", b"b", b"c", None, b"d"]
    assert [m.offset for m in bulk.metadata()] == [1, 2, 3]
    assert [m.timestamp for m in bulk.metadata()] == [7, 7, 7]
    assert (await last).offset == 4


async def test_retries_keep_order_and_do_not_duplicate(fake: FakeCluster) -> None:
    fake.faults.produce_errors[("t", 0)] = deque(
        [RequestTimeoutError("slow"), NotLeaderError("moved", 0, ""), RequestTimeoutError("slow")]
    )
    fake.faults.drop_after_produce = 2  # a written batch whose reply is lost: sent again
    values = [f"r{i:04}".encode() for i in range(500)]
    async with Producer(
        fake.bootstrap, batch_bytes=1024, retry_backoff_ms=5, linger_ms=0
    ) as producer:
        delivery = await producer.send_many("t", values, partition=0)
        await delivery
    assert [m.offset for m in delivery.metadata()] == list(range(500))
    assert [v for _, _, v in stored(fake, 0)] == values
    sequences = [read_header(b).base_sequence for b in fake.partition("t", 0).batches]
    assert sequences == sorted(sequences) and sequences[0] == 0


async def test_a_leader_move_is_followed(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, linger_ms=1) as producer:
        await (await producer.send_many("t", [b"x"] * 10, partition=1))
        old = fake.partition("t", 1).leader
        fake.move_leader("t", 1, old % 3 + 1)
        delivery = await producer.send_many("t", [b"y"] * 10, partition=1)
        await delivery
    assert [m.offset for m in delivery.metadata()] == list(range(10, 20))


async def test_a_failed_batch_fails_only_its_records(fake: FakeCluster) -> None:
    fake.faults.produce_errors[("t", 1)] = deque([BatchTooLargeError("batch of 9 MiB")])
    async with Producer(fake.bootstrap, batch_bytes=2048) as producer:
        delivery = await producer.send_many("t", [b"z" * 50] * 300)
        with pytest.raises(BatchTooLargeError):
            await delivery
        assert isinstance(delivery.exception(), BatchTooLargeError)
        results = delivery.results()
        with pytest.raises(BatchTooLargeError):
            delivery.metadata()
    failed = [r for r in results if isinstance(r, BaseException)]
    ok = [r for r in results if not isinstance(r, BaseException)]
    assert failed and ok
    # one whole batch failed; everything acknowledged is stored
    assert len(failed) < 300 // 3
    stored_count = sum(len(stored(fake, p)) for p in range(3))
    assert stored_count == len(ok)


async def test_acks_none_and_leader(fake: FakeCluster) -> None:
    for acks in ("none", "leader"):
        async with Producer(fake.bootstrap, acks=acks) as producer:
            delivery = await producer.send_many("t", [b"q"] * 5, partition=0)
            await delivery
        offsets = [m.offset for m in delivery.metadata()]
        assert offsets == ([-1] * 5 if acks == "none" else list(range(5, 10)))
    assert len(stored(fake, 0)) == 10


async def test_back_pressure_bounds_the_buffer(fake: FakeCluster) -> None:
    fake.faults.produce_delay = 0.02  # the buffer fills faster than it drains
    async with Producer(fake.bootstrap, batch_bytes=4096, buffer_bytes=16 * 1024) as producer:
        delivery = await producer.send_many("t", [b"b" * 100] * 2000, partition=0)
        assert producer._accumulator is not None
        assert producer._accumulator.buffered_bytes <= 16 * 1024 + 4096  # waited for room
        await delivery
    assert [m.offset for m in delivery.metadata()] == list(range(2000))


async def test_bad_input_is_refused_clearly(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, metadata_timeout_ms=300) as producer:
        with pytest.raises(TypeError, match="sequence"):
            await producer.send_many("t", b"not a list")
        with pytest.raises(TypeError, match="value #1"):
            await producer.send_many("t", [b"a", "str"])
        with pytest.raises(TypeError, match="key #0"):
            await producer.send_many("t", [b"a"], keys=[1])
        with pytest.raises(ValueError, match="2 keys for 1 values"):
            await producer.send_many("t", [b"a"], keys=[b"k", b"j"])
        with pytest.raises(UnknownPartitionError):
            await producer.send_many("t", [b"a"], partition=3)
        with pytest.raises(UnknownTopicError):
            await producer.send_many("missing", [b"a"])
        empty = await producer.send_many("t", [])
        await empty
        assert empty.metadata() == []
        views = await producer.send_many("t", [bytearray(b"ba"), memoryview(b"mv")], partition=0)
        await views
    assert [v for _, _, v in stored(fake, 0)] == [b"ba", b"mv"]


def test_plan_is_pure_and_keeps_input_order() -> None:
    values = [b"v" * 10] * 10
    groups = plan(values, None, (), 1, 3, None, 2, 100)
    # 34-byte records, 100-byte chunks: runs of 2 records go to 2, 0, 1, 2, 0
    assert {p: g[0] for p, g in groups.items()} == {2: [0, 1, 6, 7], 0: [2, 3, 8, 9], 1: [4, 5]}
    assert groups[2][2] == [34, 68, 102, 136]
    exact = plan(values, None, (), 1, 3, None, 2, 68)  # a run that fills its chunk exactly
    assert {p: g[0] for p, g in exact.items()} == {2: [0, 1, 6, 7], 0: [2, 3, 8, 9], 1: [4, 5]}
    keyed = plan([b"a", b"b", b"c"], [b"x", b"y", b"x"], (), 1, 2, lambda k: k == b"y", 0, 100)
    assert {p: g[0] for p, g in keyed.items()} == {0: [0, 2], 1: [1]}


def _plan_one_by_one(values, keys, headers, ts, partitions, choose, sticky, chunk_bytes):  # type: ignore[no-untyped-def]
    """``plan``'s rule written record by record, to check its C-level shortcuts against."""
    out: dict = {}  # type: ignore[type-arg]
    keys = [None] * len(values) if keys is None else keys
    partition, run = sticky % partitions, 0
    for index, (key, value) in enumerate(zip(keys, values, strict=True)):
        size = record_size(key, value, headers)
        if choose is not None:
            target = choose(key)
        else:
            if run and run + size > chunk_bytes:
                partition, run = (partition + 1) % partitions, 0
            run += size
            target = partition
        positions, records, totals = out.setdefault(target, ([], [], []))
        positions.append(index)
        records.append((key, value, headers, ts))
        totals.append((totals[-1] if totals else 0) + size)
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.binary(max_size=60)), max_size=40),
    st.booleans(),
    st.booleans(),
    st.integers(1, 4),
    st.integers(0, 7),
    st.integers(1, 200),
)
def test_plan_groups_as_one_record_at_a_time_would(
    values: list[bytes | None],
    keyed: bool,
    with_headers: bool,
    partitions: int,
    sticky: int,
    chunk_bytes: int,
) -> None:
    keys = [None if v is None else v[:2] for v in values] if keyed else None
    headers = (("h", b"1"),) if with_headers else ()
    for choose in (None, (lambda k: len(k or b"") % partitions) if keyed else None):
        args = (values, keys, headers, 9, partitions, choose, sticky, chunk_bytes)
        assert plan(*args) == _plan_one_by_one(*args)
