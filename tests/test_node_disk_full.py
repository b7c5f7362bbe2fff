"""A full disk on real node processes, each data directory on its own small tmpfs.

The leader refuses produce with a typed DiskFullError once free space drops below
``--min-free-bytes``, keeps every record it acknowledged intact, and takes writes again by
itself when space is freed; without a reserve, the write that hits ENOSPC takes the replica
offline and it comes back by itself, equally intact. A follower whose disk is full ignores
appends without crashing (the partition keeps committing on the other two) and catches up by
itself once space is freed.
Mounting needs root (CAP_SYS_ADMIN): elsewhere these tests skip and say so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.localcluster import LocalCluster
from laminar.errors import DiskFullError, NotLeaderError
from tests.cluster_fixture import free_port_pairs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MiB = 1 << 20
MIN_FREE = 8 * MiB


@contextlib.contextmanager
def small_disk(path: Path, size_mib: int) -> Iterator[Path]:
    path.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill_until_free(disk: Path, free: int) -> Path:
    """Write a filler file leaving about ``free`` bytes; deleting it frees the space."""
    filler = disk / "filler"
    stat = os.statvfs(disk)
    size = stat.f_bavail * stat.f_frsize - free
    with open(filler, "wb") as f:
        f.write(b"\0" * max(size, 0))
    return filler


@pytest.mark.parametrize(
    ("reserve", "refusal"),
    [
        (MIN_FREE, DiskFullError),
        # No reserve: the write that finds no space takes the replica offline (a storage
        # fault); it is repaired and serves again once space is back, with nothing lost.
        (0, NotLeaderError),
    ],
)
async def test_leader_refuses_writes_when_full_and_resumes(
    tmp_path: Path, reserve: int, refusal: type[Exception]
) -> None:
    root = tmp_path / "cluster"
    with small_disk(root / "node-1", 48):
        extra = ["--min-free-bytes", str(reserve)]
        cluster = LocalCluster(root, free_port_pairs(1), extra_args=extra)
        cluster.start()
        try:
            await cluster.wait_ready(60)
            async with Admin(cluster.bootstrap) as admin:
                await admin.create_topic("fill", 1, 1, segment_bytes=MiB)
            filler = fill_until_free(root / "node-1", reserve + 3 * MiB)
            acked: list[tuple[int, bytes]] = []
            value = os.urandom(16 * 1024)
            async with Producer(cluster.bootstrap, linger_ms=0, retries=0) as producer:
                with pytest.raises(refusal):
                    for i in range(2000):  # 32 MiB: far more than the room left
                        sent = await producer.send_and_wait("fill", value + bytes([i % 256]))
                        acked.append((sent.offset, value + bytes([i % 256])))
                assert 3 * MiB // len(value) // 2 < len(acked) < 2000
                assert cluster.nodes[1].running, "the node survived a full disk"
                filler.unlink()
                deadline = time.monotonic() + 15
                while True:  # space is back: writes resume by themselves
                    try:
                        sent = await producer.send_and_wait("fill", b"again")
                        break
                    except (DiskFullError, NotLeaderError):
                        assert time.monotonic() < deadline, "writes never resumed"
                        await asyncio.sleep(0.3)
            async with Consumer(cluster.bootstrap) as consumer:
                await consumer.assign([TopicPartition("fill", 0)])
                await consumer.seek_to_beginning()
                got: list[tuple[int, bytes | None]] = []
                while len(got) < len(acked) + 1:
                    got += [(r.offset, r.value) for r in await consumer.getmany(timeout_ms=1000)]
            assert got == [*acked, (sent.offset, b"again")], "every acknowledged record intact"
        finally:
            cluster.stop()


async def test_full_follower_ignores_appends_and_catches_up(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    with small_disk(root / "node-3", 48):
        cluster = LocalCluster(
            root, free_port_pairs(3), extra_args=["--min-free-bytes", str(MIN_FREE)]
        )
        cluster.start()
        try:
            await cluster.wait_ready(60)
            async with Admin(cluster.bootstrap) as admin:
                await admin.create_topic("steady", 3, 3)
                described = await admin.describe_topic("steady")
                deadline = time.monotonic() + 20
                while not all(p.leader for p in described.partitions):
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
                    described = await admin.describe_topic("steady")
                partition = next(p.partition for p in described.partitions if p.leader != 3)
                filler = fill_until_free(root / "node-3", MIN_FREE // 2)
                await asyncio.sleep(1.5)  # node 3 notices within a second
                async with Producer(cluster.bootstrap, linger_ms=0) as producer:
                    for i in range(200):
                        await producer.send_and_wait("steady", b"%d" % i, partition=partition)
                lag = await follower_lag(admin, partition, 3)
                assert lag > 0, "the full follower stored nothing new"
                assert cluster.nodes[3].running, "the full follower did not crash"
                filler.unlink()
                deadline = time.monotonic() + 20
                while (lag := await follower_lag(admin, partition, 3)) > 0:
                    assert time.monotonic() < deadline, f"node 3 still {lag} behind"
                    await asyncio.sleep(0.3)
        finally:
            cluster.stop()


async def follower_lag(admin: Admin, partition: int, node_id: int) -> int:
    status = await admin.cluster_status()
    part = next(p for p in status.partitions if p.topic == "steady" and p.partition == partition)
    return next(r.lag for r in part.replicas if r.node_id == node_id)
