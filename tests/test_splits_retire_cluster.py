"""A sealed partition retires once retention has emptied it, on real node processes: its
replica directories go on every node, describe leaves it out, its children lose their parent,
and a consumer reading from the start reads every record acknowledged to the children."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer
from laminar.client.descriptions import TopicDescription
from laminar.client.types import TopicPartition
from laminar.errors import LaminarError, PartitionRetiredError
from laminar.protocol import EARLIEST
from tests.cluster_fixture import ClusterHandle, start_cluster
from tests.test_splits_cluster import KeyedWriters, cli

pytestmark = pytest.mark.timeout(120)

RETENTION_MS = 2000


@pytest.fixture
def cluster(tmp_path: Path):
    handle = start_cluster(
        tmp_path, 3, extra_args=["--retention-check-interval", "0.3"], kafka=True
    )
    try:
        yield handle
    finally:
        handle.stop()


async def wait_retired(
    admin: Admin, topic: str, partition: int, timeout: float
) -> TopicDescription:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(LaminarError, ConnectionError):
            await admin.cluster.refresh_metadata()
            description = admin.cluster.topic(topic)
            if description.partitions[partition].state == "retired":
                return description
        assert time.monotonic() < deadline, f"{topic}/{partition} was not retired"
        await asyncio.sleep(0.2)


async def test_a_sealed_partition_retires_once_retention_emptied_it(
    cluster: ClusterHandle,
) -> None:
    started = time.monotonic()
    async with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap, linger_ms=2) as p:
        # Short retention; segments never age, so the children keep their records in their
        # active segments (retention never deletes those) while the parent's sealed one goes.
        await admin.create_topic(
            "r", 1, 3, partitioning="range", retention_ms=RETENTION_MS, segment_ms=3_600_000
        )
        writers = KeyedWriters(p, "r")
        writers.start()
        await asyncio.sleep(0.8)
        split = await admin.split_partition("r", 0)
        assert [x.state for x in split.partitions] == ["sealed", "active", "active"]
        await asyncio.sleep(0.8)
        await writers.stop()
        assert not writers.failed, writers.failed[:3]
        acked_parent = sum(md.partition == 0 for v in writers.acked.values() for _s, md in v)
        assert acked_parent > 0
        described = await wait_retired(admin, "r", 0, 25)
    zero, one, two = described.partitions
    assert (zero.state, zero.replicas, zero.leader) == ("retired", (), 0)
    assert one.parents == () and two.parents == () and len(described.partitions) == 3
    assert {one.state, two.state} == {"active"}
    # every node deleted its replica of r/0 (and keeps the children's)
    for node_id, node in cluster.nodes.items():
        for _ in range(50):
            names = [d.name for d in (node.data_dir / "partitions").iterdir()]
            if not any(n.startswith("r-0.") for n in names):
                break
            await asyncio.sleep(0.1)
        assert not any(n.startswith("r-0.") for n in names), (node_id, names)
        assert any(n.startswith("r-1.") for n in names) and any(n.startswith("r-2.") for n in names)
    # a node restarted afterwards replays the retirement: no replica of r/0 comes back
    await asyncio.to_thread(cluster.restart, 3)
    names = [d.name for d in (cluster.nodes[3].data_dir / "partitions").iterdir()]
    assert not any(n.startswith("r-0.") for n in names), names
    # a consumer reading from the start reads every record acknowledged to the children, once,
    # per key in acknowledged order, and nothing of the retired parent
    children = {
        (key, seq): md for key, acked in writers.acked.items() for seq, md in acked if md.partition
    }
    records = []
    async with Consumer(cluster.bootstrap, auto_offset_reset="earliest", max_wait_ms=200) as c:
        await c.subscribe("r")
        assert {tp.partition for tp in c.assignment()} == {1, 2}
        deadline = time.monotonic() + 15
        while len(records) < len(children) and time.monotonic() < deadline:
            records.extend(await c.getmany(timeout_ms=300))
    read = defaultdict(list)
    for record in records:
        key, seq = record.value.split(b":")
        read[key].append(int(seq))
        md = children[(key, int(seq))]
        assert (md.partition, md.offset) == (record.partition, record.offset)
    assert len(records) == len(children) and records, "an acknowledged record was lost"
    for key, acked in writers.acked.items():
        assert read[key] == [seq for seq, md in acked if md.partition], f"{key!r} out of order"
    # asking for its offsets is a clear error at once, not a wait for a leader
    async with Admin(cluster.bootstrap) as admin:
        await admin.cluster.refresh_metadata()
        asked = time.monotonic()
        with pytest.raises(PartitionRetiredError, match="retired"):
            await admin.list_offsets([TopicPartition("r", 0)], EARLIEST)
        assert time.monotonic() - asked < 2
    # the CLI: describe leaves it out of the partitions, ranges and lineage tree
    code, out, err = await cli(cluster, "topic", "describe", "r")
    assert code == 0, err
    assert "lineage\n  1 (active)\n  2 (active)" in out
    assert "retired (emptied by retention, numbers not reused): 0" in out
    assert "(sealed)" not in out and "(retired)" not in out
    await asyncio.to_thread(kafka_clients_see_the_retired_partition_offline, cluster)
    assert time.monotonic() - started < 40


def kafka_clients_see_the_retired_partition_offline(cluster: ClusterHandle) -> None:
    """Metadata keeps listing a retired partition (Kafka clients take the partition count from
    the list) as one without a leader or replicas; the children read as usual."""
    import kafka

    consumer = kafka.KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        deadline = time.monotonic() + 15
        while not (partitions := consumer.partitions_for_topic("r")):  # metadata not yet in
            assert time.monotonic() < deadline, "kafka-python never saw topic r's partitions"
            consumer.topics()  # a blocking metadata request
            time.sleep(0.2)
        assert partitions == {0, 1, 2}
        assert consumer._client.cluster.leader_for_partition(kafka.TopicPartition("r", 0)) == -1
        ends = consumer.end_offsets([kafka.TopicPartition("r", p) for p in (1, 2)])
        assert all(offset > 0 for offset in ends.values())
    finally:
        consumer.close()
