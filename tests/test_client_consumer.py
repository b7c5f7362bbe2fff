"""Consumer against an in-memory cluster on real sockets: seeks, long polls, leader moves."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator

import pytest

from laminar.client import Consumer, TopicPartition
from laminar.errors import CorruptBatchError, NotLeaderError, OffsetOutOfRangeError
from laminar.segment.batch import build_batch, control_batch, iter_batches
from tests.client_fakenode import FakeCluster

pytestmark = pytest.mark.timeout(60)

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    cluster = await FakeCluster().start(3)
    cluster.create_topic("t", 2)
    yield cluster
    await cluster.stop()


def put(cluster: FakeCluster, tp: TopicPartition, values: list[bytes], ts: int = 1000) -> None:
    """Append one batch of records (timestamps ts, ts+1, ...), keys k<offset>."""
    part = cluster.partition(*tp)
    records = [
        (f"k{part.end + i}".encode(), v, (("src", b"test"),), ts + i) for i, v in enumerate(values)
    ]
    part.append(build_batch(records))


async def drain(consumer: Consumer, want: int, timeout: float = 5.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        out += await consumer.getmany(timeout_ms=200)
    return out


async def test_reads_everything_from_the_beginning(fake: FakeCluster) -> None:
    put(fake, T0, [b"a", b"b", b"c"])
    fake.partition(*T0).append(control_batch(1, b"noop", 0))  # e.g. a Raft no-op
    put(fake, T0, [b"d"], ts=2000)
    put(fake, T1, [b"x", b"y"])
    async with Consumer(fake.bootstrap, auto_offset_reset="earliest", max_wait_ms=100) as consumer:
        await consumer.subscribe("t")
        assert consumer.assignment() == [T0, T1]
        records = await drain(consumer, 6)
        assert consumer.position(T0) == 5  # past the control batch at offset 3 and d at 4
        assert consumer.position(T1) == 2
    p0 = [(r.offset, r.key, r.value, r.timestamp) for r in records if r.partition == 0]
    assert p0 == [
        (0, b"k0", b"a", 1000),
        (1, b"k1", b"b", 1001),
        (2, b"k2", b"c", 1002),
        (4, b"k4", b"d", 2000),
    ]
    assert [r.value for r in records if r.partition == 1] == [b"x", b"y"]
    assert all(r.headers == (("src", b"test"),) and r.topic == "t" for r in records)


async def test_default_start_is_latest_and_long_poll_wakes(fake: FakeCluster) -> None:
    put(fake, T0, [b"old"])
    async with Consumer(fake.bootstrap, max_wait_ms=5000) as consumer:
        await consumer.assign([T0])
        assert consumer.position(T0) == 1
        task = asyncio.create_task(consumer.getmany(timeout_ms=5000))
        await asyncio.sleep(0.2)
        assert not task.done()  # long-polling
        started = time.perf_counter()
        put(fake, T0, [b"new"])
        records = await task
        assert time.perf_counter() - started < 1.0  # woken by the write, not by the timeout
        assert [r.value for r in records] == [b"new"]
        assert consumer.high_watermark(T0) == 2


async def test_seek_to_offset_inside_a_batch(fake: FakeCluster) -> None:
    put(fake, T0, [b"0", b"1", b"2", b"3", b"4"])
    async with Consumer(fake.bootstrap) as consumer:
        await consumer.assign([T0])
        await consumer.seek(T0, 3)
        assert consumer.position(T0) == 3
        records = await drain(consumer, 2)
        assert [(r.offset, r.value) for r in records] == [(3, b"3"), (4, b"4")]
        await consumer.seek_to_beginning(T0)
        assert [r.offset for r in await drain(consumer, 5)] == [0, 1, 2, 3, 4]
        await consumer.seek_to_end()
        assert consumer.position(T0) == 5
        assert await consumer.getmany(timeout_ms=100) == []


async def test_seek_discards_records_already_buffered(fake: FakeCluster) -> None:
    put(fake, T0, [bytes([i]) for i in range(10)])
    async with Consumer(fake.bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.assign([T0])
        first = await consumer.getmany(timeout_ms=1000, max_records=2)
        assert [r.offset for r in first] == [0, 1]
        assert consumer.position(T0) == 2
        await consumer.seek(T0, 7)
        assert [r.offset for r in await drain(consumer, 3)] == [7, 8, 9]


async def test_seek_to_timestamp(fake: FakeCluster) -> None:
    put(fake, T0, [b"a", b"b"], ts=1000)
    put(fake, T0, [b"c", b"d"], ts=5000)
    put(fake, T1, [b"e"], ts=1000)
    async with Consumer(fake.bootstrap) as consumer:
        await consumer.subscribe("t")
        await consumer.seek_to_timestamp(None, 4000)
        assert consumer.position(T0) == 2
        assert consumer.position(T1) == 1  # nothing at or after: the end
        records = await drain(consumer, 2)
        assert [r.value for r in records] == [b"c", b"d"]
        await consumer.seek_to_timestamp(T0, 0)
        assert consumer.position(T0) == 0
        # Inside a batch: the exact record, not the batch's first one.
        await consumer.seek_to_timestamp(T0, 1001)
        assert consumer.position(T0) == 1
        await consumer.seek_to_timestamp(T0, 5001)
        assert consumer.position(T0) == 3


async def test_seek_to_timestamp_skips_control_batches(fake: FakeCluster) -> None:
    put(fake, T0, [b"a"], ts=1000)
    fake.partition(*T0).append(control_batch(1, b"noop", 9000))  # a no-op stamped later
    put(fake, T0, [b"b", b"c"], ts=2000)
    async with Consumer(fake.bootstrap) as consumer:
        await consumer.assign([T0])
        await consumer.seek_to_timestamp(T0, 2001)
        assert consumer.position(T0) == 3  # c, past the no-op at 1 and b at 2
        assert [r.value for r in await drain(consumer, 1)] == [b"c"]


async def test_async_iteration_and_position(fake: FakeCluster) -> None:
    put(fake, T1, [b"1", b"2", b"3"])
    async with Consumer(fake.bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.assign([T1])
        seen = []
        async for record in consumer:
            seen.append(record.value)
            assert consumer.position(T1) == record.offset + 1
            if len(seen) == 3:
                break
    assert seen == [b"1", b"2", b"3"]


async def test_follows_a_leader_move(fake: FakeCluster) -> None:
    put(fake, T0, [b"a"])
    async with Consumer(fake.bootstrap, auto_offset_reset="earliest", max_wait_ms=100) as consumer:
        await consumer.assign([T0])
        assert [r.value for r in await drain(consumer, 1)] == [b"a"]
        old = fake.partition(*T0).leader
        fake.move_leader("t", 0, old % 3 + 1)
        put(fake, T0, [b"b"])
        assert [r.value for r in await drain(consumer, 1)] == [b"b"]
    fetchers = [node for node, asks in fake.fetch_requests if any(a[:2] == ("t", 0) for a in asks)]
    assert fetchers[0] == old and fetchers[-1] == old % 3 + 1


async def test_not_leader_without_hint_and_retriable_fetch_errors(fake: FakeCluster) -> None:
    put(fake, T0, [b"a", b"b"])
    fake.faults.fetch_errors[("t", 0)] = deque([NotLeaderError("election", 0, "")] * 2)
    async with Consumer(fake.bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.assign([T0])
        assert [r.value for r in await drain(consumer, 2)] == [b"a", b"b"]


async def test_out_of_range_resets_or_raises(fake: FakeCluster) -> None:
    for i in range(4):
        put(fake, T0, [f"v{i}".encode()])
    async with Consumer(fake.bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.assign([T0])
        fake.partition(*T0).truncate_front(2)  # retention removed offsets 0 and 1
        records = await drain(consumer, 2)
        assert [r.offset for r in records] == [2, 3]
    async with Consumer(fake.bootstrap, auto_offset_reset="none") as consumer:
        await consumer.assign([T0])
        await consumer.seek(T0, 1)
        with pytest.raises(OffsetOutOfRangeError, match=r"\[2, 4\]"):
            await drain(consumer, 1)
        await consumer.seek(T0, 9)  # beyond the end by an explicit seek: also an error
        with pytest.raises(OffsetOutOfRangeError):
            await drain(consumer, 1)


async def test_corrupt_batch_is_reported(fake: FakeCluster) -> None:
    put(fake, T0, [b"good"])
    part = fake.partition(*T0)
    damaged = bytearray(part.batches[0])
    damaged[-1] ^= 0xFF
    part.batches[0] = bytes(damaged)
    async with Consumer(fake.bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.assign([T0])
        with pytest.raises(CorruptBatchError, match="crc"):
            await drain(consumer, 1)


async def test_a_batch_damaged_on_the_wire_is_fetched_again(fake: FakeCluster) -> None:
    put(fake, T0, [b"a", b"b", b"c"])
    fake.faults.damage_fetches = 1
    async with Consumer(fake.bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.assign([T0])
        records = await drain(consumer, 3)
    assert [r.value for r in records] == [b"a", b"b", b"c"]
    assert fake.faults.damage_fetches == 0
    assert len([r for _, r in fake.fetch_requests if ("t", 0, 0) in r]) >= 2


async def test_fetch_batches_low_level(fake: FakeCluster) -> None:
    put(fake, T1, [b"a", b"b"])
    fake.partition(*T1).append(control_batch(1, b"", 0))
    put(fake, T1, [b"c"])
    async with Consumer(fake.bootstrap) as consumer:
        fetched = await consumer.fetch_batches(T1, 0, 1 << 20)
        headers = [h for _, h in iter_batches(fetched.data)]
        assert [h.base_offset for h in headers] == [0, 2, 3]
        assert fetched.high_watermark == 4 and fetched.log_start == 0
        # From the middle of the first batch the whole batch comes back.
        again = await consumer.fetch_batches(T1, 1, 1 << 20)
        assert again.data == fetched.data
        # At the end with a wait: empty after about max_wait.
        started = time.perf_counter()
        empty = await consumer.fetch_batches(T1, 4, 1 << 20, max_wait_ms=200)
        assert empty.data == b"" and 0.15 < time.perf_counter() - started < 2
        with pytest.raises(OffsetOutOfRangeError):
            await consumer.fetch_batches(T1, 99, 1 << 20)
        # Asking a replica that is not the leader: the typed error, no retry.
        leader = fake.partition(*T1).leader
        with pytest.raises(NotLeaderError):
            await consumer.fetch_batches(T1, 0, 1 << 20, node_id=leader % 3 + 1)


async def test_assign_checks_partitions_and_positions(fake: FakeCluster) -> None:
    async with Consumer(fake.bootstrap) as consumer:
        with pytest.raises(Exception, match="no partition 7"):
            await consumer.assign([TopicPartition("t", 7)])
        await consumer.assign([T0])
        with pytest.raises(ValueError, match="not assigned"):
            consumer.position(T1)
        with pytest.raises(ValueError, match="not assigned"):
            await consumer.seek(T1, 0)
        await consumer.assign([T1])
        assert consumer.assignment() == [T1]


async def test_reassigning_while_a_long_poll_is_in_flight(fake: FakeCluster) -> None:
    """A fetch task created for a partition that is unassigned before it runs must not wedge
    its node: the next partition on that node is still read."""
    for tp in (T0, T1):
        put(fake, tp, [b"a", b"b"])
    async with Consumer(fake.bootstrap, max_wait_ms=500) as consumer:
        for tp in (T0, T1, T0):
            await consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            records = await drain(consumer, 2)
            assert [r.value for r in records] == [b"a", b"b"]


async def test_two_fetches_of_a_partition_in_flight_deliver_its_records_once(
    fake: FakeCluster,
) -> None:
    """A leader change while a long poll is parked on the old leader: the consumer fetches the
    partition from the new leader too, and both answers carry the same records (the second
    one after the first was handed out). Only the first answer for a position counts (the
    other is stale), so nothing is delivered twice."""
    async with Consumer(fake.bootstrap, auto_offset_reset="earliest", max_wait_ms=2000) as c:
        await c.assign([T0])
        assert await c.getmany(timeout_ms=100) == []  # a long poll is now parked on the leader
        old = fake.partition(*T0).leader
        new = old % 3 + 1
        fake.move_leader("t", 0, new)  # the parked request passed the leader check already
        fake.faults.fetch_delay[new] = 0.3
        await c.cluster.refresh_metadata()
        assert await c.getmany(timeout_ms=50) == []  # and one more, to the new leader
        assert {node for node, _ in fake.fetch_requests[-2:]} == {old, new}
        put(fake, T0, [b"a", b"b", b"c"])  # the old leader answers now, the new one later
        got = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            got += await c.getmany(timeout_ms=50)
        assert [r.offset for r in got] == [0, 1, 2]
        assert c.position(T0) == 3
