"""Bounded metadata on real node processes (checkpoint every 40 metadata commands).

One cluster run, in stages (one start-up keeps the runtime down):

* (b) node 3 is stopped; the others create and delete 60 topics (some 240 metadata commands
  with the leaders' ``set_leader`` records): they checkpoint and cut their metadata logs. Node
  3 restarts far behind: the leader resets its log to a checkpoint, it rebuilds its state from
  it, deletes the replicas of topics deleted meanwhile, and hosts exactly the replicas assigned
  to it; a topic created before and one created after work (produce, consume through it).
* (a) every node's metadata log stays below a bound and starts at a checkpoint; a full
  cluster restart keeps every topic and record.
* (c) a brand-new node joins the compacted cluster: it gets the state from a checkpoint and
  takes replicas (a new topic's, and those the rebalancer moves to it).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.localcluster import LocalCluster
from tests.cluster_fixture import free_port_pairs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EVERY = 40
ARGS = ["--metadata-checkpoint-commands", str(EVERY), "--node-dead-after", "600"]
CHURN = 60


async def eventually(
    what: str, check: Callable[[], Awaitable[Any] | Any], timeout: float = 45
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if inspect.isawaitable(last):
                last = await last
        except Exception as exc:  # a node restarting, no leader yet
            last = exc
        if last and not isinstance(last, Exception):
            return last
        await asyncio.sleep(0.3)
    raise AssertionError(f"{what}: not reached in {timeout} s (last: {last!r})")


async def produce(bootstrap: str, topic: str, partitions: int, tag: str) -> None:
    async with Producer(bootstrap, linger_ms=1, retries=50) as producer:
        futures = [
            await producer.send(topic, f"{tag}-{p}".encode(), partition=p)
            for p in range(partitions)
        ]
        await asyncio.gather(*futures)


async def consume(bootstrap: str, topic: str, partitions: int) -> set[bytes]:
    found: set[bytes] = set()
    async with Consumer(bootstrap) as consumer:
        for partition in range(partitions):
            tp = TopicPartition(topic, partition)
            await consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.fetch_batches(tp, 0, 1)).high_watermark
            deadline = time.monotonic() + 30
            while consumer.position(tp) < end:
                assert time.monotonic() < deadline, f"{topic}/{partition} stuck"
                for record in await consumer.getmany(timeout_ms=1000):
                    found.add(record.value or b"")
    return found


def hosted(data_dir: Path) -> set[tuple[str, int]]:
    """(topic, partition) of every replica directory a node holds."""
    out = set()
    root = data_dir / "partitions"
    for entry in root.iterdir() if root.exists() else ():
        name = entry.name.rsplit(".", 2)[0]
        topic, partition = name.rsplit("-", 1)
        out.add((topic, int(partition)))
    return out


async def assigned(admin: Admin, node_id: int) -> set[tuple[str, int]]:
    out = set()
    for name in await admin.list_topics():
        if name.startswith("__"):
            continue
        for p in (await admin.describe_topic(name)).partitions:
            if node_id in p.replicas:
                out.add((name, p.partition))
    return out


def log_events(path: Path, event: str) -> int:
    count = 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            count += json.loads(line).get("event") == event
        except ValueError:
            continue
    return count


async def test_metadata_log_is_bounded_and_lagging_and_new_nodes_start_from_a_checkpoint(
    tmp_path: Path,
) -> None:
    ports = free_port_pairs(4)
    cluster = LocalCluster(tmp_path / "cluster", ports[:3], extra_args=ARGS)
    joiner: subprocess.Popen[bytes] | None = None
    cluster.start()
    try:
        await cluster.wait_ready(60)
        bootstrap = cluster.bootstrap
        async with Admin(bootstrap) as admin:
            await admin.create_topic("before", partitions=3, replication_factor=3)
            for i in range(4):  # node 3 hosts these; they are deleted while it is away
                await admin.create_topic(f"gone-{i}", partitions=1, replication_factor=3)
        await produce(bootstrap, "before", 3, "one")
        await eventually("node 3 hosts gone-*", lambda: ("gone-3", 0) in hosted(dirs(cluster, 3)))

        # (b) node 3 away while the others churn the metadata and cut their logs.
        await asyncio.to_thread(cluster.stop_node, 3)
        live = ",".join(cluster.nodes[n].client_address for n in (1, 2))
        async with Admin(live) as admin:
            for i in range(4):
                await admin.delete_topic(f"gone-{i}")
            for i in range(CHURN):
                await admin.create_topic(f"churn-{i}", partitions=1, replication_factor=1)
                if i >= 2:
                    await admin.delete_topic(f"churn-{i - 2}")

            async def cut() -> bool:
                rows = (await admin.cluster_status()).metadata_log
                return len(rows) == 2 and all(m.start_offset > 0 for m in rows)

            await eventually("nodes 1 and 2 cut their metadata logs", cut)
            first_kept = min(m.start_offset for m in (await admin.cluster_status()).metadata_log)
        await asyncio.to_thread(cluster.start_node, 3)
        async with Admin(bootstrap) as admin:

            async def node3_rebuilt() -> bool:
                rows = {m.node_id: m for m in (await admin.cluster_status()).metadata_log}
                row = rows.get(3)
                return row is not None and row.start_offset >= first_kept and row.applied > 0

            await eventually("node 3 was reset to a checkpoint", node3_rebuilt, 60)
            log3 = cluster.nodes[3].log_path
            rebuilt = "metadata state rebuilt from a checkpoint"
            await eventually("node 3 logs its rebuild", lambda: log_events(log3, rebuilt))
            assert log_events(log3, "metadata command skipped") == 0
            want = await assigned(admin, 3)
            assert ("before", 0) in want and not any(t.startswith("gone") for t, _ in want)

            async def exactly_assigned() -> bool:
                return hosted(dirs(cluster, 3)) == want

            await eventually("node 3 hosts exactly its replicas", exactly_assigned)
            await admin.create_topic("after", partitions=3, replication_factor=3)
        node3 = cluster.nodes[3].client_address
        await produce(node3, "after", 3, "two")
        await produce(node3, "before", 3, "two")
        assert await consume(node3, "after", 3) == {b"two-0", b"two-1", b"two-2"}
        assert len(await consume(node3, "before", 3)) == 6

        # (a) bounded on every node, and a full restart keeps everything.
        async with Admin(bootstrap) as admin:
            rows = (await admin.cluster_status()).metadata_log
            assert len(rows) == 3
            for row in rows:
                assert row.checkpoint >= row.start_offset > 0, row
                # At most a few checkpoint intervals beyond the newest checkpoint (set_leader
                # records and Raft's own entries count as offsets too).
                assert row.end_offset - row.start_offset < 6 * EVERY, row
            topics_before = set(await admin.list_topics())
        assert len(topics_before & {f"churn-{i}" for i in range(CHURN)}) == 2
        await asyncio.to_thread(cluster.stop)
        cluster.start()
        await cluster.wait_ready(60)
        async with Admin(bootstrap) as admin:
            assert set(await admin.list_topics()) == topics_before

        async def all_records() -> bool:  # once the new leaders commit (high watermarks)
            before, after = (
                await consume(bootstrap, "before", 3),
                await consume(bootstrap, "after", 3),
            )
            return len(before) == 6 and len(after) == 3

        await eventually("every record readable after the restart", all_records)

        # (c) a brand-new node joins the compacted cluster and takes replicas.
        client4, peer4 = f"127.0.0.1:{ports[3][0]}", f"127.0.0.1:{ports[3][1]}"
        log4 = tmp_path / "node-4.log"
        with open(log4, "wb") as out:
            joiner = subprocess.Popen(
                [sys.executable, "-m", "laminar", "node", "start", "--node-id", "4",
                 "--data-dir", str(tmp_path / "node-4"), "--listen", client4,
                 "--peer-listen", peer4, "--join", cluster.nodes[1].peer_address,
                 "--log-format", "json", *ARGS],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

        async def knows_everything() -> bool:
            async with Admin(client4) as admin:
                return set(await admin.list_topics()) == topics_before

        await eventually("node 4 has the metadata", knows_everything, 60)
        async with Admin(client4) as admin:
            await eventually("node 4 logs its rebuild", lambda: log_events(log4, rebuilt))
            await admin.create_topic("on-four", partitions=4, replication_factor=1)
            placed = await admin.describe_topic("on-four")
            mine = [p.partition for p in placed.partitions if p.replicas == (4,)]
            assert mine, placed
        await produce(client4, "on-four", 4, "three")
        assert await consume(client4, "on-four", 4) == {f"three-{p}".encode() for p in range(4)}

        async def moved_to_four() -> bool:  # the rebalancer evens replica counts out
            async with Admin(client4) as admin:
                counts = {m.node_id: m.replicas for m in (await admin.cluster_status()).members}
            return counts.get(4, 0) >= 3

        await eventually("replicas moved to node 4", moved_to_four, 60)
    finally:
        if joiner is not None:
            joiner.send_signal(signal.SIGTERM)
            try:
                joiner.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(joiner.pid, signal.SIGKILL)
        cluster.stop()


def dirs(cluster: LocalCluster, node_id: int) -> Path:
    return cluster.nodes[node_id].data_dir
