"""Real node processes under a small open-files limit host more partition replicas than the
limit has descriptors: 1,000 RF 3 partitions put 1,000 replicas on each of 3 nodes limited to
1,024 open files (soft and hard, so the node cannot raise it). Every partition gets a leader
and takes an acks=all write, a SIGKILLed node reopens its 1,000 logs under the same limit, and
every partition takes a second write; both read back in order.

Before the node-wide descriptor budget (laminar/segment/descriptors.py) every replica kept
about four files open for its whole life (its directory lock, the active segment's data file
and both index files), ~4,000 per node here: the nodes stopped with "Too many open files".
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.errors import InvalidRequestError, RequestTimeoutError
from tests.cluster_fixture import start_cluster
from tests.single_node import SingleNode

LIMIT = 1024
PARTITIONS = 1000
ALL_LED_WITHIN = 90.0
WRITTEN_WITHIN = 60.0


def _open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _nofile_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files limit in /proc/<pid>/limits")


async def _all_led(admin: Admin, topic: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    led = 0
    while time.monotonic() < deadline:
        description = await admin.describe_topic(topic)
        led = sum(1 for p in description.partitions if p.leader)
        if led == PARTITIONS:
            break
        await asyncio.sleep(0.5)
    return led


async def _write_each(bootstrap: str, round_: int) -> None:
    """One acks=all record to every partition."""
    async with Producer(bootstrap, acks="all", retries=1_000, retry_backoff_ms=50) as producer:
        sent = [
            await producer.send("wide", f"p{p}-{round_}".encode(), partition=p)
            for p in range(PARTITIONS)
        ]
        await asyncio.wait_for(asyncio.gather(*sent), WRITTEN_WITHIN)


async def _status_while_starting(address: str, timeout: float) -> bool:
    """Ask a (re)starting node for the cluster status until it answers: refused connections
    are expected while it is not listening yet; any other failure is an error."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with Admin(address, request_timeout_ms=5_000) as admin:
                await admin.cluster_status()
            return True
        except (ConnectionError, RequestTimeoutError):
            await asyncio.sleep(0.05)
    return False


async def test_nodes_host_more_replicas_than_their_open_files_limit(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, 3, log_level="warning", open_files_limit=LIMIT)
    nodes = cluster.local.nodes
    try:
        for node in nodes.values():
            assert node.pid is not None and _nofile_limit(node.pid) == LIMIT
        async with Admin(cluster.bootstrap, request_timeout_ms=30_000) as admin:
            started = time.monotonic()
            await admin.create_topic("wide", partitions=PARTITIONS, replication_factor=3)
            led = await _all_led(admin, "wide", ALL_LED_WITHIN)
            assert led == PARTITIONS, (
                f"{led} of {PARTITIONS} partitions led after "
                f"{time.monotonic() - started:.0f} s\n{cluster.logs()}"
            )
        await _write_each(cluster.bootstrap, 1)
        # a crashed node reopens all its 1,000 logs (recovery) under the same limit
        cluster.kill(2)
        cluster.start_node(2)
        answered = await _status_while_starting(nodes[2].client_address, ALL_LED_WITHIN)
        await cluster.local.wait_ready(ALL_LED_WITHIN)
        await _write_each(cluster.bootstrap, 2)
        seen: dict[int, list[bytes | None]] = {p: [] for p in range(PARTITIONS)}
        async with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
            await consumer.assign([TopicPartition("wide", p) for p in range(PARTITIONS)])
            deadline = time.monotonic() + WRITTEN_WITHIN
            while sum(map(len, seen.values())) < 2 * PARTITIONS:
                assert time.monotonic() < deadline, "records missing"
                for record in await consumer.getmany(timeout_ms=1000):
                    seen[record.partition].append(record.value)
        assert seen == {p: [f"p{p}-1".encode(), f"p{p}-2".encode()] for p in range(PARTITIONS)}
        assert all(node.running for node in nodes.values()), cluster.logs()
        open_now = [_open_files(node.pid) for node in nodes.values() if node.pid is not None]
        assert max(open_now) < LIMIT // 2 + 100, open_now  # the budget (half), sockets
        for node in nodes.values():
            text = node.log_path.read_text(errors="replace")
            assert "Too many open files" not in text
            # Peers' hellos and clients reached the restarted node while it opened its
            # replicas, before its gossip had started: neither may fail for that.
            assert "SWIM driver not started" not in text
            assert "Fatal error on transport" not in text
        assert answered, "the restarted node never answered cluster status"
    finally:
        cluster.stop()


async def test_a_second_node_on_the_same_data_directory_is_refused(tmp_path: Path) -> None:
    first = await SingleNode(tmp_path).start()
    try:
        with pytest.raises(InvalidRequestError, match="in use by another process"):
            await SingleNode(tmp_path).start()
        assert first.metadata is not None and not first.metadata.closed
    finally:
        await first.stop()
    again = await SingleNode(tmp_path).start()  # the lock went with the first node
    await again.stop()
