"""A storage fault in one partition stays in that partition (real node processes, real faults).

* Disk full: node 1's data directory is a tiny tmpfs (mounted for the test; skipped where mount
  is not permitted). A big record to one topic cannot be written there (ENOSPC from writev).
  Node 1's replica of that partition goes offline, visibly (cluster status, a structured log
  line), while node 1 keeps acknowledging and voting for every other group: with node 3 killed,
  those groups need node 1 to commit. Once space is freed the replica is reopened, catches up
  and the partition commits again with node 1's help.
* Corruption: a byte of a sealed segment in the leader's files is flipped, so the crc check
  fails when a follower that was down needs those batches. The leader's replica goes offline,
  a new leader catches the follower up, the damaged replica is cut before the bad batch, and as
  a replica that lost state it is re-admitted by its group (learner, then voter again);
  afterwards every replica verifies clean and holds identical bytes.
* The vote rule, driven in-process on a real (unstarted) node with crafted Raft messages: a
  replica cut before damaged entries it had acknowledged is a replica that lost state. It
  neither grants votes nor takes leadership, across a restart too, and `cluster status` lists
  it, until its group re-admits it; then it votes only in later terms.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from laminar.cli import render_status
from laminar.client import Admin, Consumer, Producer, TopicPartition
from laminar.client.descriptions import ClusterStatus
from laminar.client.localcluster import LocalCluster, free_port_pairs
from laminar.errors import CorruptLogError
from laminar.node.config import NodeConfig
from laminar.node.metadata import group_id
from laminar.node.node import Node
from laminar.node.status import replica_faults
from laminar.raft import Entry, EntryKind, Message, MessageType
from laminar.segment.batch import build_batch, decode_records, is_control, iter_batches
from laminar.segment.log import LogConfig, PartitionLog

WAIT_S = 30.0


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting until {what}")


async def status(cluster: LocalCluster, node_id: int) -> ClusterStatus:
    async with Admin(cluster.nodes[node_id].client_address) as admin:
        return await admin.cluster_status()


async def produce(cluster: LocalCluster, topic: str, values: list[bytes], partition: int) -> None:
    """Every value acknowledged with acks=all (committed on a majority)."""
    async with Producer(
        cluster.bootstrap,
        linger_ms=0,
        retries=100,  # leadership moves while a replica fails
        request_timeout_ms=5_000,
        delivery_timeout_ms=25_000,
    ) as producer:
        for value in values:  # one batch each
            await producer.send_and_wait(topic, value, partition=partition)


async def read_all(cluster: LocalCluster, topic: str, partition: int) -> list[bytes]:
    """Every record value of a partition up to its high watermark, through any replica."""
    tp = TopicPartition(topic, partition)
    values: list[bytes] = []
    async with Consumer(cluster.bootstrap) as consumer:
        offset = 0
        while True:
            fetched = await consumer.fetch_batches(tp, offset, 1 << 20)
            if offset >= fetched.high_watermark:
                return values
            for position, header in iter_batches(fetched.data):
                offset = header.next_offset
                if not is_control(header):
                    one = fetched.data[position : position + header.batch_length]
                    values += [r.value or b"" for r in decode_records(one)]


def logged(cluster: LocalCluster, node_id: int, text: str) -> bool:
    return text in cluster.nodes[node_id].log_path.read_text(errors="replace")


def replica_dirs(cluster: LocalCluster, node_id: int, topic: str) -> list[Path]:
    return sorted((cluster.nodes[node_id].data_dir / "partitions").glob(f"{topic}-*"))


@contextlib.contextmanager
def tiny_filesystem(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            timeout=10,
        )
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs for the disk-full fault: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the disk-full fault: {done.stderr.decode()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_full_disk_takes_one_replica_offline_and_the_node_keeps_serving(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cluster"
    with tiny_filesystem(root / "node-1", "24m") as disk:
        # No free-space reserve: this is the write that really runs out of space (the
        # reserve's refusal is tests/test_node_disk_full.py).
        extra = ["--min-free-bytes", "0"]
        cluster = LocalCluster(root, free_port_pairs(3), extra_args=extra)
        cluster.start()
        try:
            await cluster.wait_ready(60)
            async with Admin(cluster.bootstrap) as admin:
                await admin.create_topic("big", partitions=1, replication_factor=3)
                await admin.create_topic("small", partitions=3, replication_factor=3)
            await produce(cluster, "big", [b"warm-up"], 0)
            for p in range(3):
                await produce(cluster, "small", [b"before-%d" % p], p)

            # Leave ~1 MiB free on node 1's disk: a 2 MiB record cannot be written there.
            ballast = disk / "ballast"
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            with ballast.open("wb") as f:
                f.write(b"\0" * (free - (1 << 20)))
            await produce(cluster, "big", [b"B" * (2 << 20)], 0)  # nodes 2 and 3 commit it

            async def offline_on_node_1() -> bool:
                current = await status(cluster, 2)
                shown = render_status(current)  # what `laminar cluster status` prints
                return (
                    any(f.topic == "big" and f.node_id == 1 for f in current.faults)
                    and "replicas not serving" in shown
                    and "OSError" in shown
                )

            await eventually(offline_on_node_1, "cluster status shows big/0 offline on node 1")
            assert logged(cluster, 1, "replica failed; taking it offline")
            assert logged(cluster, 1, '"error_type": "OSError"')  # a short write or ENOSPC
            assert cluster.nodes[1].running, "the node itself keeps running"

            # Node 3 dies: every group now needs node 1 to commit.
            cluster.kill_node(3)
            for p in range(3):
                await produce(cluster, "small", [b"after-%d-%d" % (p, i) for i in range(20)], p)
            async with Admin(cluster.bootstrap) as admin:  # the metadata group too
                await admin.create_topic("later", partitions=1, replication_factor=2)
            await produce(cluster, "later", [b"new topic"], 0)
            for p in range(3):
                values = await read_all(cluster, "small", p)
                assert values == [b"before-%d" % p] + [b"after-%d-%d" % (p, i) for i in range(20)]

            # Space comes back: the replica is reopened, catches up and helps commit again.
            ballast.unlink()

            async def repaired() -> bool:
                return not (await status(cluster, 1)).faults

            await eventually(repaired, "node 1's replica of big/0 is back")
            await produce(cluster, "big", [b"after repair"], 0)  # needs node 1 (3 is dead)
            assert await read_all(cluster, "big", 0) == [
                b"warm-up",
                b"B" * (2 << 20),
                b"after repair",
            ]
        finally:
            cluster.stop()


def flip_a_byte_of_a_sealed_segment(partition_dir: Path) -> int:
    """Corrupt the last byte of a record value in the second batch of the second sealed
    segment (headers stay readable, the crc check fails); returns that batch's offset."""
    segments = sorted((partition_dir / "log").glob("*.log"))
    assert len(segments) > 3, segments
    sealed = segments[1]
    batches = list(iter_batches(sealed.read_bytes()))
    position, header = batches[1]
    fd = os.open(sealed, os.O_RDWR)
    try:
        at = position + header.batch_length - 1
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0xFF]), at)
    finally:
        os.close(fd)
    return header.base_offset


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_corrupt_sealed_segment_on_the_leader_is_cut_and_the_replica_readmitted(
    tmp_path: Path,
) -> None:
    cluster = LocalCluster(tmp_path / "cluster", free_port_pairs(3))
    cluster.start()
    try:
        await cluster.wait_ready(60)
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic("rot", partitions=1, replication_factor=3, segment_bytes=4096)
            await admin.create_topic("calm", partitions=2, replication_factor=3)
        cluster.kill_node(3)  # node 3 falls behind: it will need the old segments
        values = [b"%05d" % i + b"v" * 400 for i in range(60)]
        await produce(cluster, "rot", values, 0)
        leader = next(p.leader for p in (await status(cluster, 1)).partitions if p.topic == "rot")
        (rot_dir,) = replica_dirs(cluster, leader, "rot")
        damaged = flip_a_byte_of_a_sealed_segment(rot_dir)

        cluster.start_node(3)  # the leader must now read the damaged batch for node 3

        async def failed_on_leader() -> bool:
            return logged(cluster, leader, "replica failed; taking it offline")

        await eventually(failed_on_leader, "the leader noticed the damage")
        assert logged(cluster, leader, "CorruptLogError")
        await eventually(
            lambda: asyncio.sleep(0, logged(cluster, leader, "cutting the log before a damaged")),
            "the damaged replica was cut",
        )
        assert logged(cluster, leader, f'"offset": {damaged}, "lost_until"')
        assert cluster.nodes[leader].running, "the node itself keeps running"

        async def healed() -> bool:
            current = await status(cluster, 1)
            rot = [p for p in current.partitions if p.topic == "rot"]
            return (
                not current.faults
                and len(rot) == 1
                and all(r.lag == 0 for r in rot[0].replicas)
                and len(rot[0].replicas) == 3
            )

        await eventually(healed, "every replica of rot/0 caught up and nothing is offline", 60)
        assert await read_all(cluster, "rot", 0) == values
        # It lost acknowledged batches: it voted again only once its group re-admitted it.
        assert logged(cluster, leader, "replica re-admitted to its group")

        # The other survivor dies: rot/0 and calm need the repaired node (it votes again).
        other = ({1, 2} - {leader}).pop()
        cluster.kill_node(other)
        await produce(cluster, "rot", [b"after"], 0)
        for p in range(2):
            await produce(cluster, "calm", [b"calm-%d" % p], p)
        assert await read_all(cluster, "rot", 0) == [*values, b"after"]
    finally:
        cluster.stop()
    # Every replica's log verifies (nobody kept or copied the damaged batch) and all hold the
    # same batches (the node killed last missed only the final record).
    contents = {}
    for node_id in (1, 2, 3):
        (directory,) = replica_dirs(cluster, node_id, "rot")
        with PartitionLog.open(directory / "log", LogConfig(retention_ms=None)) as plog:
            plog.verify()
            contents[node_id] = b"".join(map(bytes, plog.batches(0, plog.end_offset, 1 << 30)))
    assert contents[leader] == contents[3]
    assert contents[3].startswith(contents[other]) and len(contents[other]) < len(contents[3])


def follower_entries(term: int, first: int, count: int) -> list[Entry]:
    return [
        Entry(term, i, i, EntryKind.NORMAL, build_batch([(None, b"%05d" % i * 40, (), 1_000)]))
        for i in range(first, first + count)
    ]


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.01)


def grants(sent: list[Message]) -> list[Message]:
    return [
        m
        for m in sent
        if m.type in (MessageType.VOTE_RESP, MessageType.PRE_VOTE_RESP) and not m.reject
    ]


ONE_PARTITION = {
    "partitions": 1,
    "replication_factor": 3,
    "segment_bytes": 1024,
    "segment_ms": 60_000,
    "retention_ms": None,
    "retention_bytes": None,
}


def unstarted_node(data_dir: Path, me: int) -> tuple[Node, int, list[Message]]:
    """A node whose metadata holds topic t (one partition on nodes 1-3); its Raft runtime runs
    for real, its peers are never connected: what it hands them is recorded."""
    node = Node(NodeConfig(node_id=me, data_dir=data_dir, listen="127.0.0.1:1", tick_ms=10))
    node.state.apply(
        {"op": "create_topic", "name": "t", "settings": ONE_PARTITION, "replicas": [[1, 2, 3]]}
    )
    sent: list[Message] = []
    node.peers.send_raft = lambda _peer, messages: sent.extend(m for _, m in messages)  # type: ignore[method-assign]
    node.runtime.start()
    node._open_partition(node.state.topics["t"], 0, 7)
    return node, group_id(node.state.topics["t"].topic_id, 0), sent


async def ticked(node: Node, ticks: int) -> None:
    start = node.runtime.ticks
    await until(lambda: node.runtime.ticks >= start + ticks, f"{ticks} ticks")


def lost_state_rows(node: Node) -> list[str]:
    return [row["state"] for row in replica_faults(node) if "lost state" in row["state"]]


async def test_a_replica_cut_before_damage_does_not_vote_until_its_group_readmits_it(
    tmp_path: Path,
) -> None:
    me = 2
    node, group, sent = unstarted_node(tmp_path, me)
    try:
        replica = node.runtime.replicas[group]
        # Leader 1, term 1: 20 entries, acknowledged by this replica once durable.
        append = Message(MessageType.APPEND, me, 1, 1, 0, -1, follower_entries(1, 0, 20), 19)
        node._raft_received(1, [(group, append)])
        await until(lambda: any(m.type is MessageType.APPEND_RESP for m in sent), "acked")
        assert max(m.index for m in sent if m.type is MessageType.APPEND_RESP) == 19

        # A sealed batch rots; reading it (a lagging follower needs it) fails the replica.
        damaged = flip_a_byte_of_a_sealed_segment(replica.directory)
        assert 0 < damaged < 19
        with pytest.raises(CorruptLogError) as caught:
            replica.storage.entries(0, 20, 1 << 20)
        node.runtime.fail(replica, caught.value)
        await until(lambda: node.runtime.replicas.get(group) not in (None, replica), "repaired")
        repaired = node.runtime.replicas[group]
        assert repaired.log.end_offset == damaged
        repaired.log.verify()
        assert group in node.amnesia.gated, "the cut replica was not taken for one that lost state"
        incident = node.amnesia.incident(group)
        assert lost_state_rows(node) == ["lost state: re-admitting (not voting)"]

        # Node 3 has only what survived here: the core alone would vote for it.
        sent.clear()
        vote = Message(MessageType.VOTE, me, 3, 2, log_term=1, index=damaged - 1)
        node._raft_received(3, [(group, vote)])
        node._raft_received(1, [(group, Message(MessageType.TIMEOUT_NOW, me, 1, 2))])
        await ticked(node, 3 * node.config.election_ticks)  # three election timeouts
        assert not grants(sent), "a replica that lost acknowledged entries voted"
        assert repaired.raft.vote != 3 and not repaired.is_leader
        assert not [m for m in sent if m.type in (MessageType.VOTE, MessageType.PRE_VOTE)]
    finally:
        await node.runtime.stop()

    # A restart keeps the rule: the mark was made durable before the cut.
    node, group, sent = unstarted_node(tmp_path, me)
    try:
        restarted = node.runtime.replicas[group]
        assert restarted.log.end_offset == damaged
        assert node.amnesia.incident(group) == incident and lost_state_rows(node)
        node._raft_received(3, [(group, Message(MessageType.VOTE, me, 3, 3, log_term=1, index=19))])
        await ticked(node, 10)
        assert not grants(sent)

        # Its group re-admitted it (the metadata records it): it votes again, in later terms.
        restarted.raft.step(Message(MessageType.HEARTBEAT, me, 1, 4, commit=-1))  # leader 1
        node.readmission.applied(
            {"op": "replica_recovered", "group": group, "node": me, "incident": incident}
        )
        assert group not in node.amnesia.gated and not lost_state_rows(node)
        restarted.raft.report_node_down(1)  # leader 1 is gone: no lease keeps the vote back
        node._raft_received(3, [(group, Message(MessageType.VOTE, me, 3, 4, log_term=1, index=19))])
        await ticked(node, 10)
        assert not grants(sent), "voted in a term it may have voted in before the loss"
        node._raft_received(3, [(group, Message(MessageType.VOTE, me, 3, 5, log_term=1, index=19))])
        await until(lambda: bool(grants(sent)), "it votes again")
    finally:
        await node.runtime.stop()
