"""Topic and node administration on real node processes: adding partitions, altering a topic's
log settings at run time (they survive a restart), undoing a drain, and typed errors that leave
the metadata untouched. The CLI commands run as the real `laminar` executable."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.localcluster import LocalCluster
from laminar.errors import InvalidRequestError, UnknownTopicError
from laminar.protocol import EARLIEST
from tests.cluster_fixture import free_port_pairs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

LAMINAR = str(Path(sys.executable).with_name("laminar"))


async def cli(bootstrap: str, *args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        LAMINAR,
        *args,
        "--bootstrap",
        bootstrap,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def wait_for_leaders(admin: Admin, topic: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        description = await admin.describe_topic(topic)
        if len(description.partitions) == count and all(p.leader for p in description.partitions):
            return
        assert time.monotonic() < deadline, f"{topic}: not every partition got a leader"
        await asyncio.sleep(0.2)


async def test_add_partitions_alter_and_undrain(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path / "cluster", free_port_pairs(3), extra_args=["--retention-check-interval", "0.3"]
    )
    cluster.start()
    try:
        await cluster.wait_ready(60)
        bootstrap = cluster.bootstrap
        async with Admin(bootstrap) as admin:
            await admin.create_topic("grow", partitions=2, replication_factor=3)
            await admin.create_topic("trim", partitions=1, replication_factor=3, retention_ms=-1)

            # Adding partitions: the new ones get replicas on every node and a leader, and
            # take writes; the old ones keep their data.
            async with Producer(bootstrap, linger_ms=0) as producer:
                before = [await producer.send_and_wait("grow", b"old", partition=1)]
            out = await cli(bootstrap, "topic", "add-partitions", "grow", "--total", "5")
            assert out.strip() == "topic grow has 5 partitions"
            await wait_for_leaders(admin, "grow", 5)
            grown = await admin.describe_topic("grow")
            assert all(len(p.replicas) == 3 for p in grown.partitions)
            async with Producer(bootstrap, linger_ms=0) as producer:
                sent = await producer.send_and_wait("grow", b"new", partition=4)
            async with Consumer(bootstrap) as consumer:
                await consumer.assign([TopicPartition("grow", 4), TopicPartition("grow", 1)])
                await consumer.seek_to_beginning()
                got: list[tuple[int, int, bytes | None]] = []
                while len(got) < 2:
                    got += [
                        (r.partition, r.offset, r.value)
                        for r in await consumer.getmany(timeout_ms=1000)
                    ]
            assert sorted(got) == [(1, before[0].offset, b"old"), (4, sent.offset, b"new")]

            # Bad requests get typed errors and change nothing.
            with pytest.raises(InvalidRequestError):
                await admin.add_partitions("grow", 5)
            with pytest.raises(UnknownTopicError):
                await admin.add_partitions("nope", 3)
            with pytest.raises(InvalidRequestError):
                await admin.alter_topic("trim", segment_bytes=10)
            with pytest.raises(InvalidRequestError):
                await admin.add_partitions("__consumer_offsets", 100)
            assert len((await admin.describe_topic("grow")).partitions) == 5
            assert (await admin.describe_topic("trim")).segment_bytes != 10

            # Altering log settings at run time: small segments and a byte limit make the
            # existing replicas roll and expire segments without a restart.
            async with Producer(bootstrap, linger_ms=0) as producer:
                for _ in range(10):
                    await producer.send_and_wait("trim", b"x" * 500, partition=0)
            await cli(
                bootstrap, "topic", "alter", "trim", "--segment-bytes", "4KiB",
                "--retention-bytes", "8KiB",
            )  # fmt: skip
            described = await admin.describe_topic("trim")
            assert (described.segment_bytes, described.retention_bytes) == (4096, 8192)
            tp = TopicPartition("trim", 0)
            async with Producer(bootstrap, linger_ms=0) as producer:
                for _ in range(60):
                    await producer.send_and_wait("trim", b"y" * 500, partition=0)
            deadline = time.monotonic() + 20
            while (await admin.list_offsets([tp], EARLIEST))[tp] == 0:
                assert time.monotonic() < deadline, "the altered byte limit never expired data"
                await asyncio.sleep(0.3)

            # The settings are metadata: a restarted node still has them.
            await asyncio.to_thread(cluster.restart_node, 3)
            await cluster.wait_ready(60)
        async with Admin(cluster.nodes[3].client_address) as admin:
            deadline = time.monotonic() + 30
            while "trim" not in await admin.list_topics():  # node 3 replays the metadata log
                assert time.monotonic() < deadline, "the restarted node never saw the topic"
                await asyncio.sleep(0.2)
            described = await admin.describe_topic("trim")
            assert (described.segment_bytes, described.retention_bytes) == (4096, 8192)
            assert len((await admin.describe_topic("grow")).partitions) == 5

            # Undrain takes back a drain.
            await admin.drain_node(2)
            assert "(draining)" in await cli(bootstrap, "cluster", "status")
            out = await cli(bootstrap, "node", "undrain", "2")
            assert out.strip() == "node 2 takes replicas again"
            assert "(draining)" not in await cli(bootstrap, "cluster", "status")
    finally:
        cluster.stop()
