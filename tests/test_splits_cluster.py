"""Splits and merges of key-range partitions under a steady keyed producer, on real node
processes: every acknowledged record is read exactly once by the native Consumer, per key in
the order it was acknowledged, and nothing lands in a partition after its seal; a split whose
parent leader is SIGKILLed completes (or never began), losing nothing acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer
from laminar.client.descriptions import TopicDescription
from laminar.client.types import RecordMetadata
from laminar.errors import InvalidRequestError, LaminarError
from tests.cluster_fixture import ClusterHandle, start_cluster

pytestmark = pytest.mark.timeout(150)

KEYS = 24


class KeyedWriters:
    """One sequential writer per key (a record is sent once the key's previous one is
    acknowledged), so per key the acknowledged order is the send order."""

    def __init__(self, producer: Producer, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.acked: dict[bytes, list[tuple[int, RecordMetadata]]] = defaultdict(list)
        self.failed: list[tuple[bytes, int, str]] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._write(b"key-%d" % k)) for k in range(KEYS)]

    async def _write(self, key: bytes) -> None:
        seq = 0
        while not self._stop.is_set():
            try:
                handle = await self.producer.send(self.topic, b"%s:%d" % (key, seq), key=key)
                self.acked[key].append((seq, await handle))
            except LaminarError as exc:  # a failed delivery: may or may not be stored
                self.failed.append((key, seq, str(exc)))
            seq += 1
            await asyncio.sleep(0.005)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def total(self) -> int:
        return sum(len(v) for v in self.acked.values())


class GroupReaders:
    """Members of one consumer group reading the topic while it splits, logging what each
    ``getmany`` returned in the order returned (one event loop: a total order)."""

    def __init__(self, bootstrap: str, topic: str, members: int = 2) -> None:
        self.consumers = [
            Consumer(
                bootstrap,
                group_id="readers",
                auto_offset_reset="earliest",
                auto_commit_interval_ms=200,
                max_wait_ms=200,
            )
            for _ in range(members)
        ]
        self.topic = topic
        self.read: list[tuple[bytes, int]] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for consumer in self.consumers:
            await consumer.start()
            await consumer.subscribe(self.topic)
            self._tasks.append(asyncio.create_task(self._read(consumer)))

    async def _read(self, consumer: Consumer) -> None:
        while not self._stop.is_set():
            for record in await consumer.getmany(timeout_ms=200):
                key, seq = record.value.split(b":")
                self.read.append((key, int(seq)))

    async def stop_when_read(self, writers: KeyedWriters, timeout: float) -> None:
        wanted = {(key, seq) for key, acked in writers.acked.items() for seq, _md in acked}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not wanted <= set(self.read) and loop.time() < deadline:
            await asyncio.sleep(0.2)
        self._stop.set()
        await asyncio.gather(*self._tasks)
        for consumer in self.consumers:
            await consumer.close()


async def read_all(bootstrap: str, topic: str, expected: int, timeout: float) -> list:
    """Everything the native consumer returns from the topic (earliest), following lineage,
    until ``expected`` records arrived and nothing more comes for a moment."""
    records = []
    async with Consumer(bootstrap, auto_offset_reset="earliest", max_wait_ms=200) as consumer:
        await consumer.subscribe(topic)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        quiet = 0
        while loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            records.extend(batch)
            quiet = 0 if batch else quiet + 1
            if len(records) >= expected and quiet >= 3:
                break
    return records


def check(writers: KeyedWriters, records: list, topic: TopicDescription) -> None:
    """Exactly once, per-key acknowledged order, acknowledged where read, nothing past a seal."""
    seen: dict[tuple[bytes, int], int] = defaultdict(int)
    order: dict[bytes, list[int]] = defaultdict(list)
    where = {}
    for record in records:
        key, seq = record.value.split(b":")
        seen[(key, int(seq))] += 1
        order[key].append(int(seq))
        where[(key, int(seq))] = (record.partition, record.offset)
    duplicates = [k for k, n in seen.items() if n > 1]
    assert not duplicates, f"read more than once: {duplicates[:5]}"
    for key, acked in writers.acked.items():
        missing = [seq for seq, _md in acked if (key, seq) not in seen]
        assert not missing, f"acknowledged but never read: {key!r} {missing[:5]}"
        for seq, md in acked:
            assert where[(key, seq)] == (md.partition, md.offset), (key, seq, md)
        acked_order = [seq for seq, _md in acked]
        read_order = [seq for seq in order[key] if seq in set(acked_order)]
        assert read_order == acked_order, f"{key!r} read out of order"
    for partition in topic.partitions:
        if partition.state == "sealed":
            past = [r for r in records if r.partition == partition.partition]
            assert all(r.offset < partition.seal_end for r in past)


async def wait_finished(admin: Admin, topic: str, timeout: float) -> TopicDescription:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        with contextlib.suppress(LaminarError, ConnectionError):
            await admin.cluster.refresh_metadata()
            description = admin.cluster.topic(topic)
            if description.operation is None:
                return description
        assert loop.time() < deadline, "the split did not finish"
        await asyncio.sleep(0.1)


@pytest.fixture
def cluster(tmp_path: Path):
    handle = start_cluster(
        tmp_path,
        3,
        extra_args=["--group-session-timeout", "4", "--group-heartbeat-interval", "0.3"],
        kafka=True,
    )
    try:
        yield handle
    finally:
        handle.stop()


async def test_split_twice_and_merge_under_load(cluster: ClusterHandle) -> None:
    async with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap, linger_ms=2) as p:
        await admin.create_topic("events", 1, 3, partitioning="range")
        writers = KeyedWriters(p, "events")
        writers.start()
        await asyncio.sleep(1.0)
        first = await admin.split_partition("events", 0)
        assert [x.state for x in first.partitions] == ["sealed", "active", "active"]
        assert first.partitions[1].parents == (0,) and first.partitions[2].parents == (0,)
        await asyncio.sleep(1.0)
        second = await admin.split_partition("events", 1, at=1 << 30)
        assert (second.partitions[3].range_start, second.partitions[3].range_end) == (0, 1 << 30)
        await asyncio.sleep(1.0)
        merged = await admin.merge_partitions("events", 3, 4)
        assert merged.partitions[5].parents == (3, 4)
        assert (merged.partitions[5].range_start, merged.partitions[5].range_end) == (0, 1 << 31)
        active = sorted((x.range_start, x.range_end) for x in merged.active)
        assert active == [(0, 1 << 31), (1 << 31, 1 << 32)]
        await asyncio.sleep(1.0)
        await writers.stop()
        described = await admin.describe_topic("events")
    # a consumer group reads it all afterwards: members read parents and children at once
    # unless the coordinator holds children back until their parents are committed
    group = GroupReaders(cluster.bootstrap, "events")
    await group.start()
    await group.stop_when_read(writers, 40)
    assert not writers.failed, writers.failed[:3]
    assert writers.total() > 200
    records = await read_all(cluster.bootstrap, "events", writers.total(), 30)
    check(writers, records, described)
    # every partition took records: the writes followed the splits
    assert {r.partition for r in records} == {0, 1, 2, 3, 4, 5}
    # the consumer group: every acknowledged record once, per key in acknowledged order
    assert len(group.read) == len(set(group.read)), "a group member read a record twice"
    for key, acked in writers.acked.items():
        read_order = [seq for k, seq in group.read if k == key]
        assert read_order == [seq for seq, _md in acked], f"group read {key!r} out of order"
    await asyncio.to_thread(kafka_clients_see_partitions_and_cannot_write_sealed, cluster)
    await pipelined_writes_keep_send_order(cluster)
    # the CLI: create, split and describe (ranges and the lineage tree)
    code, out, err = await cli(cluster, "topic", "create", "cli", "--partitioning", "range")
    assert code == 0, err
    code, out, err = await cli(cluster, "topic", "split", "cli", "0")
    assert (code, out.strip()) == (0, "split cli/0 into partitions 1, 2"), err
    code, out, err = await cli(cluster, "topic", "describe", "events")
    assert code == 0, err
    assert "partitioning:       range" in out
    assert "  ├─ 1 (sealed)\n  │  ├─ 3 (sealed)\n  │  │  └─ 5 (active)" in out
    code, out, err = await cli(cluster, "topic", "split", "events", "0")
    assert code != 0 and "sealed" in err
    code, out, err = await cli(
        cluster, "consume", "events", "--from", "earliest", "--format", "value"
    )
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == writers.total() + 1  # and the record written through Kafka
    for key, acked in writers.acked.items():
        seqs = [int(line.split(":")[1]) for line in lines if line.split(":")[0] == key.decode()]
        assert seqs == [seq for seq, _md in acked], f"laminar consume: {key!r} out of order"


def kafka_clients_see_partitions_and_cannot_write_sealed(cluster: ClusterHandle) -> None:
    """Kafka clients cannot follow lineage: Metadata lists every partition, and a produce to a
    sealed one fails (NOT_LEADER_OR_FOLLOWER, retried until the client gives up)."""
    import kafka
    import kafka.errors

    consumer = kafka.KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        assert consumer.partitions_for_topic("events") == {0, 1, 2, 3, 4, 5}
    finally:
        consumer.close()
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap, retries=2, retry_backoff_ms=50
    )
    try:
        with pytest.raises(kafka.errors.KafkaError):
            producer.send("events", b"late", key=b"k", partition=0).get(timeout=30)
        producer.send("events", b"kafka:0", key=b"kafka", partition=5).get(timeout=30)
    finally:
        producer.close()


async def pipelined_writes_keep_send_order(cluster: ClusterHandle) -> None:
    """Records sent without waiting (many in flight per key) while their partition splits are
    read per key in the order they were sent."""
    async with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap, linger_ms=5) as p:
        await admin.create_topic("piped", 1, 3, partitioning="range")
        handles = []

        async def send_all() -> None:
            for seq in range(4000):
                key = b"k%d" % (seq % 7)
                handles.append(await p.send("piped", b"%s:%d" % (key, seq), key=key))
                if seq % 20 == 0:
                    await asyncio.sleep(0.005)

        await p.send_and_wait("piped", b"warm-up:-1", key=b"warm-up")
        sending = asyncio.create_task(send_all())
        await asyncio.sleep(0.5)
        await admin.split_partition("piped", 0)
        await sending
        acked = await asyncio.gather(*handles)
    assert {md.partition for md in acked} >= {0, 1, 2}
    records = await read_all(cluster.bootstrap, "piped", len(acked) + 1, 30)
    assert len(records) == len(acked) + 1
    order: dict[bytes, list[int]] = defaultdict(list)
    for record in records:
        key, seq = record.value.split(b":")
        order[key].append(int(seq))
    for key, seqs in order.items():
        assert seqs == sorted(seqs), f"{key!r} read out of send order"


async def cli(cluster: ClusterHandle, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("laminar")),
        *args,
        "--bootstrap",
        cluster.bootstrap,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_parent_leader_killed_during_split(cluster: ClusterHandle) -> None:
    async with Admin(cluster.bootstrap) as admin:
        created = await admin.create_topic("orders", 1, 3, partitioning="range")
        await asyncio.sleep(0.5)
        leader = (await admin.describe_topic("orders")).partitions[0].leader
    survivor = next(n for n in cluster.nodes if n != leader)
    bootstrap = cluster.address(survivor)
    async with Admin(bootstrap) as admin, Producer(bootstrap, linger_ms=2) as producer:
        writers = KeyedWriters(producer, "orders")
        writers.start()
        await asyncio.sleep(1.0)
        split = asyncio.create_task(admin.split_partition("orders", 0))
        await asyncio.sleep(0.01)
        cluster.kill(leader)
        with contextlib.suppress(LaminarError, ConnectionError):
            await split
        described = await wait_finished(admin, "orders", 30)
        await asyncio.sleep(1.0)
        await writers.stop()
    states = [x.state for x in described.partitions]
    # completed (the parent sealed, both children active) or never begun: never half-done
    assert states in (["sealed", "active", "active"], ["active"]), states
    assert created.partitions[0].state == "active"
    records = await read_all(bootstrap, "orders", writers.total(), 30)
    check(writers, records, described)


async def test_automatic_split_under_load_and_merge_when_idle(cluster: ClusterHandle) -> None:
    async with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap, linger_ms=5) as p:
        await admin.create_topic(
            "hot",
            1,
            3,
            partitioning="range",
            auto_split_above=60_000,
            auto_merge_below=20_000,
            auto_window_ms=2000,
            max_partitions=2,
        )
        stop = asyncio.Event()

        async def load() -> None:  # ~200 KB/s over many keys
            n = 0
            while not stop.is_set():
                await asyncio.gather(
                    *[await p.send("hot", b"x" * 2000, key=b"%d" % (n + i)) for i in range(20)]
                )
                n += 20
                await asyncio.sleep(0.1)

        loader = asyncio.create_task(load())
        loop = asyncio.get_running_loop()
        started = loop.time()
        while len((await admin.describe_topic("hot")).active) < 2:
            assert loop.time() - started < 20, "no automatic split under load"
            await asyncio.sleep(0.3)
        split_after = loop.time() - started
        stop.set()
        await loader
        described = await admin.describe_topic("hot")
        assert [x.state for x in described.partitions] == ["sealed", "active", "active"]
        idle = loop.time()
        while True:
            newest = (await admin.describe_topic("hot")).partitions[-1]
            if newest.parents == (1, 2) and newest.state == "active":
                break
            assert loop.time() - idle < 20, "idle siblings were not merged"
            await asyncio.sleep(0.3)
        merged = await admin.describe_topic("hot")
        # the policy changes at run time; a bad one is refused and changes nothing
        altered = await admin.alter_topic("hot", auto_split_above=0, max_partitions=4)
        assert (altered.auto_split_above, altered.max_partitions) == (0, 4)
        assert altered.auto_merge_below == 20_000
        with pytest.raises(InvalidRequestError):
            await admin.alter_topic("hot", auto_split_above=30_000)  # merge_below > half
        assert (await admin.describe_topic("hot")).auto_split_above == 0
    assert [x.state for x in merged.partitions] == ["sealed", "sealed", "sealed", "active"]
    assert split_after < 12, split_after
