"""Producer against an in-memory cluster on real sockets: batching, ordering, retries, acks."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator

import pytest

from laminar.client import Producer, RecordMetadata
from laminar.client.partitioner import key_partition
from laminar.errors import (
    BatchTooLargeError,
    CorruptBatchError,
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


def stored(cluster: FakeCluster, topic: str, partition: int) -> list[tuple[int, bytes | None]]:
    part = cluster.partition(topic, partition)
    return [(r.offset, r.value) for batch in part.batches for r in decode_records(batch)]


async def test_keyed_records_round_trip_with_offsets(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, linger_ms=2) as producer:
        futures = [
            await producer.send(
                "t", f"v{i}".encode(), key=f"k{i % 7}".encode(), headers=(("n", str(i).encode()),)
            )
            for i in range(300)
        ]
        results: list[RecordMetadata] = list(await asyncio.gather(*futures))
    for i, meta in enumerate(results):
        assert meta.topic == "t"
        assert meta.partition == key_partition(f"k{i % 7}".encode(), 3)
    for partition in range(3):
        mine = [
            (m.offset, f"v{i}".encode()) for i, m in enumerate(results) if m.partition == partition
        ]
        # Offsets per partition are 0..n-1 in send order, and the node holds exactly that.
        assert [o for o, _ in mine] == list(range(len(mine)))
        assert stored(fake, "t", partition) == mine
    records = [
        r for b in fake.partition("t", results[5].partition).batches for r in decode_records(b)
    ]
    by_offset = {r.offset: r for r in records}
    assert by_offset[results[5].offset].headers == (("n", b"5"),)
    assert by_offset[results[5].offset].key == b"k5"


async def test_linger_groups_records_and_flush_sends_now(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, linger_ms=10_000) as producer:
        futures = [await producer.send("t", b"x", partition=1) for _ in range(50)]
        await asyncio.sleep(0.1)
        assert not any(f.done() for f in futures)  # lingering: nothing sent yet
        started = time.perf_counter()
        await producer.flush()
        assert time.perf_counter() - started < 2
        assert all(f.done() for f in futures)
    assert len(fake.partition("t", 1).batches) == 1  # one batch for fifty records
    assert [f.result().offset for f in futures] == list(range(50))


async def test_linger_zero_sends_a_lone_record_without_flush(fake: FakeCluster) -> None:
    # linger_ms=0 means "send now": a lone record is acknowledged with no flush() and no
    # later record to push it out (a lingering producer would hold it, as above).
    async with Producer(fake.bootstrap, linger_ms=0) as producer:
        future = await producer.send("t", b"now", partition=2)
        meta = await asyncio.wait_for(future, 5)
    assert meta.offset == 0
    assert fake.produce_requests == [(fake.topics["t"][2].leader, [("t", 2)])]


async def test_a_request_takes_along_the_lingering_batches_of_its_node(fake: FakeCluster) -> None:
    # As Kafka's sender: once a batch is due, the request to its leader also carries the
    # batches of that leader's other partitions still lingering (each would otherwise need a
    # request of its own as its linger ran out); another node's batch keeps lingering.
    fake.create_topic("w", 3, leaders=[1, 1, 2])
    async with Producer(fake.bootstrap, linger_ms=300) as producer:
        futures = [await producer.send("w", b"a", partition=0)]
        await asyncio.sleep(0.15)
        futures.append(await producer.send("w", b"b", partition=1))
        futures.append(await producer.send("w", b"c", partition=2))
        await asyncio.wait_for(asyncio.gather(*futures), 5)
    assert fake.produce_requests == [(1, [("w", 0), ("w", 1)]), (2, [("w", 2)])]


async def test_batch_bytes_splits_batches(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, linger_ms=50, batch_bytes=4096) as producer:
        futures = [await producer.send("t", bytes(1000), partition=0) for _ in range(20)]
        await asyncio.gather(*futures)
    batches = fake.partition("t", 0).batches
    assert len(batches) >= 5
    assert all(len(b) <= 4096 + 1100 for b in batches)
    assert [off for off, _ in stored(fake, "t", 0)] == list(range(20))


async def test_not_leader_with_hint_is_followed_in_order(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, linger_ms=1) as producer:
        first = await producer.send_and_wait("t", b"before", partition=0)
        assert first.offset == 0
        old = fake.partition("t", 0).leader
        new = old % 3 + 1
        fake.move_leader("t", 0, new)  # the client's metadata is now stale
        futures = [await producer.send("t", f"m{i}".encode(), partition=0) for i in range(100)]
        results = await asyncio.gather(*futures)
    assert [m.offset for m in results] == list(range(1, 101))
    assert [v for _, v in stored(fake, "t", 0)] == [b"before"] + [
        f"m{i}".encode() for i in range(100)
    ]
    assert any(node == new for node, _ in fake.produce_requests)


async def test_not_leader_without_hint_refreshes_metadata(fake: FakeCluster) -> None:
    fake.faults.produce_errors[("t", 2)] = deque(
        [NotLeaderError("election", 0, ""), NotLeaderError("election", 0, "")]
    )
    async with Producer(fake.bootstrap, retry_backoff_ms=10) as producer:
        meta = await producer.send_and_wait("t", b"v", partition=2)
    assert meta.offset == 0
    assert stored(fake, "t", 2) == [(0, b"v")]
    assert len([r for _, r in fake.produce_requests if ("t", 2) in r]) == 3


async def test_a_leadership_in_transfer_does_not_spend_retries_back_to_back(
    fake: FakeCluster,
) -> None:
    # The metadata names A while A answers "transfer under way, go to B" (and so does B, not
    # yet leader): the leader watch sends at once to each leader the metadata names at most
    # once per batch, so the batch falls back to its backoff instead of ping-ponging between
    # the hint and the metadata (which spent 100 retries in well under a second).
    leader = fake.partition("t", 0).leader
    hint = leader % 3 + 1
    transfer = NotLeaderError("leadership is being transferred", hint, fake.address_of(hint))
    fake.faults.produce_errors[("t", 0)] = deque([transfer] * 30)
    async with Producer(fake.bootstrap, retries=100, retry_backoff_ms=20) as producer:
        future = await producer.send("t", b"v", partition=0)
        await asyncio.sleep(0.3)
        tries = len([r for _, r in fake.produce_requests if ("t", 0) in r])
        assert 2 <= tries <= 8, tries  # backoff 20, 40, 80, 160 ms after the first few
        fake.faults.produce_errors[("t", 0)].clear()  # the transfer ends
        meta = await future
    assert stored(fake, "t", 0) == [(meta.offset, b"v")]


async def test_a_batch_damaged_on_the_wire_is_sent_again(fake: FakeCluster) -> None:
    # Client frames leave batches to their own crc, so the node answers a batch damaged in
    # transit with CorruptBatchError; the producer's copy is whole, and a resend succeeds.
    fake.faults.produce_errors[("t", 1)] = deque([CorruptBatchError("crc32c mismatch")])
    async with Producer(fake.bootstrap, retry_backoff_ms=10) as producer:
        meta = await producer.send_and_wait("t", b"v", partition=1)
    assert meta.offset == 0
    assert stored(fake, "t", 1) == [(0, b"v")]


async def test_retries_keep_partition_order(fake: FakeCluster) -> None:
    fake.faults.produce_errors[("t", 0)] = deque(
        [RequestTimeoutError("slow"), NotLeaderError("moved", 0, ""), RequestTimeoutError("slow")]
    )
    async with Producer(
        fake.bootstrap, linger_ms=0, batch_bytes=200, retry_backoff_ms=5
    ) as producer:
        futures = [await producer.send("t", f"r{i:03}".encode(), partition=0) for i in range(60)]
        results = await asyncio.gather(*futures)
    assert [m.offset for m in results] == list(range(60))
    assert [v for _, v in stored(fake, "t", 0)] == [f"r{i:03}".encode() for i in range(60)]


async def test_lost_reply_is_retried_without_duplicates(fake: FakeCluster) -> None:
    # The node writes, then the connection drops before the reply. The producer retries the
    # same bytes (same producer id and sequence), so the node answers with the first write.
    fake.faults.drop_after_produce = 2
    async with Producer(fake.bootstrap, retry_backoff_ms=10, linger_ms=0) as producer:
        first = await producer.send_and_wait("t", b"once", partition=1)
        second = await producer.send_and_wait("t", b"twice", partition=1)
    assert [v for _, v in stored(fake, "t", 1)] == [b"once", b"twice"]
    assert (first.offset, second.offset) == (0, 1)
    headers = [read_header(b) for b in fake.partition("t", 1).batches]
    assert headers[0].producer_id == headers[1].producer_id == producer.producer_id >= 0
    assert [h.base_sequence for h in headers] == [0, 1]
    assert len(fake.produce_requests) == 4  # two tries each


async def test_without_idempotence_a_lost_reply_duplicates(fake: FakeCluster) -> None:
    fake.faults.drop_after_produce = 1
    async with Producer(fake.bootstrap, retry_backoff_ms=10, idempotent=False) as producer:
        meta = await producer.send_and_wait("t", b"again", partition=1)
    assert [v for _, v in stored(fake, "t", 1)] == [b"again", b"again"]  # at-least-once
    assert meta.offset == 1
    assert read_header(fake.partition("t", 1).batches[0]).producer_id == -1


async def test_errors_that_cannot_be_retried_fail_only_their_records(fake: FakeCluster) -> None:
    fake.faults.produce_errors[("t", 0)] = deque([BatchTooLargeError("batch of 9 MiB")])
    async with Producer(fake.bootstrap) as producer:
        bad = await producer.send("t", b"a", partition=0)
        good = await producer.send("t", b"b", partition=1)
        await producer.flush()
        with pytest.raises(BatchTooLargeError, match="9 MiB"):
            await bad
        assert (await good).offset == 0
        # The partition works again for later records.
        assert (await producer.send_and_wait("t", b"c", partition=0)).offset == 0


async def test_retries_run_out(fake: FakeCluster) -> None:
    fake.faults.produce_errors[("t", 0)] = deque(NotLeaderError("nope", 0, "") for _ in range(10))
    async with Producer(fake.bootstrap, retries=2, retry_backoff_ms=1) as producer:
        with pytest.raises(NotLeaderError):
            await producer.send_and_wait("t", b"a", partition=0)
    assert len(fake.faults.produce_errors[("t", 0)]) == 7  # 1 try + 2 retries


async def test_delivery_timeout_bounds_retrying(fake: FakeCluster) -> None:
    fake.faults.produce_errors[("t", 0)] = deque(RequestTimeoutError("slow") for _ in range(1000))
    async with Producer(
        fake.bootstrap, retries=1000, retry_backoff_ms=20, delivery_timeout_ms=400
    ) as producer:
        started = time.perf_counter()
        with pytest.raises(RequestTimeoutError):
            await producer.send_and_wait("t", b"a", partition=0)
        elapsed = time.perf_counter() - started
    assert 0.4 <= elapsed < 3.0  # gave up at the delivery timeout, not after 1000 tries
    assert len(fake.faults.produce_errors[("t", 0)]) > 900


async def test_acks_none_and_leader(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, acks="none") as producer:
        meta = await producer.send_and_wait("t", b"fire", partition=0)
    assert meta.offset == -1
    assert stored(fake, "t", 0) == [(0, b"fire")]  # written anyway (close waited for the send)
    async with Producer(fake.bootstrap, acks="leader") as producer:
        assert (await producer.send_and_wait("t", b"x", partition=0)).offset == 1
    with pytest.raises(ValueError, match="acks"):
        Producer(fake.bootstrap, acks="most")


async def test_bad_topic_partition_and_types(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap, metadata_timeout_ms=300) as producer:
        started = time.perf_counter()
        with pytest.raises(UnknownTopicError, match="nope"):
            await producer.send("nope", b"x")
        assert time.perf_counter() - started < 2
        with pytest.raises(UnknownPartitionError, match="has no partition 3"):
            await producer.send("t", b"x", partition=3)
        with pytest.raises(TypeError, match="value must be bytes"):
            await producer.send("t", "text")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="header"):
            await producer.send("t", b"x", headers=(("h", "str"),))  # type: ignore[arg-type]


async def test_topic_created_after_start_is_found(fake: FakeCluster) -> None:
    async with Producer(fake.bootstrap) as producer:
        fake.create_topic("late", 2)
        meta = await producer.send_and_wait("late", b"x", key=b"k")
    assert meta.partition == key_partition(b"k", 2)


async def test_back_pressure_when_buffer_is_full(fake: FakeCluster) -> None:
    fake.faults.produce_delay = 0.05
    async with Producer(
        fake.bootstrap, batch_bytes=2048, buffer_bytes=4096, linger_ms=0
    ) as producer:
        futures = [await producer.send("t", bytes(500), partition=0) for _ in range(40)]
        results = await asyncio.gather(*futures)
    assert [m.offset for m in results] == list(range(40))


async def test_close_delivers_buffered_records(fake: FakeCluster) -> None:
    producer = Producer(fake.bootstrap, linger_ms=60_000)
    await producer.start()
    futures = [await producer.send("t", b"x", partition=2) for _ in range(5)]
    await producer.close()
    assert [f.result().offset for f in futures] == [0, 1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="closed"):
        await producer.send("t", b"late")


async def test_start_fails_clearly_without_cluster() -> None:
    with pytest.raises(ConnectionError, match="cannot reach any node"):
        async with Producer("127.0.0.1:1"):
            pass
