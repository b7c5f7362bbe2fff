"""The idempotent sequence rule on the native produce path, against a real node process:
in-order batches are appended, a gap is refused with nothing stored, a retry is answered with
the first write's offsets, and the rule holds after a restart (the table rebuilt from the log).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, TopicPartition
from laminar.client.connection import Connection, is_retriable
from laminar.errors import DuplicateSequenceError, OutOfOrderSequenceError
from laminar.node.tail_checkpoint import CHECKPOINT_FILE, INTERVAL_S
from laminar.segment.batch import build_batch
from tests.cluster_fixture import ClusterHandle, start_cluster
from tests.test_node_protocol import produce_body

pytestmark = pytest.mark.slow
TOPIC = "seq"
PID = 77


def batch(sequence: int, count: int, tag: str, producer_id: int = PID) -> bytes:
    records = [(None, f"{tag}{i}".encode(), [], 1_700_000_000_000) for i in range(count)]
    return build_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=sequence)


async def produce(address: str, data: bytes) -> tuple[BaseException | None, int]:
    from laminar.protocol import read_error

    connection = await Connection.open(address)
    try:
        fill, payload = produce_body([(TOPIC, 0, data)])
        reply, _ = await connection.request(fill, payload)
        (result,) = reply.body.produce.results
        return read_error(result.error), result.baseOffset
    finally:
        connection.close()


async def stored(cluster: ClusterHandle) -> list[bytes]:
    consumer = Consumer(cluster.bootstrap, max_wait_ms=50, auto_offset_reset="earliest")
    async with consumer:
        await consumer.assign([TopicPartition(TOPIC, 0)])
        values: list[bytes] = []
        for _ in range(20):
            records = await consumer.getmany(timeout_ms=200)
            values += [r.value for r in records]
            if not records and values:
                break
        return values


async def wait_leader(cluster: ClusterHandle) -> str:
    async with Admin(cluster.bootstrap) as admin:
        if TOPIC not in await admin.list_topics():
            await admin.create_topic(TOPIC, partitions=1, replication_factor=1)
        for _ in range(200):
            leader = (await admin.describe_topic(TOPIC)).partitions[0].leader
            if leader:
                return cluster.address(leader)
            await asyncio.sleep(0.05)
    raise AssertionError("no leader")


async def test_sequence_rule_on_the_native_path(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path, nodes=1)
    try:
        leader = await wait_leader(cluster)
        error, o = await produce(leader, batch(0, 3, "a"))  # o: the first offset (after
        assert error is None  # the log's own control entries)
        assert await produce(leader, batch(3, 2, "b")) == (None, o + 3)  # in order: appended
        error, base = await produce(leader, batch(7, 1, "gap"))  # 5 and 6 missing
        assert isinstance(error, OutOfOrderSequenceError) and base == -1
        assert is_retriable(error)
        assert await produce(leader, batch(0, 3, "a")) == (None, o)  # a retry: same offsets
        assert await produce(leader, batch(3, 2, "b")) == (None, o + 3)
        assert await produce(leader, batch(5, 1, "c")) == (None, o + 5)  # the gap's batch follows
        # Another producer is independent (unknown to the table: any sequence is accepted).
        assert await produce(leader, batch(40, 1, "p", producer_id=78)) == (None, o + 6)
        assert await stored(cluster) == [b"a0", b"a1", b"a2", b"b0", b"b1", b"c0", b"p0"]

        cluster.restart(1)  # the table is rebuilt from the log's tail
        leader = await wait_leader(cluster)
        for _ in range(100):  # the restarted node may refuse writes until it leads again
            error, base = await produce(leader, batch(7, 1, "gap"))
            if not isinstance(error, OutOfOrderSequenceError) and error is not None:
                await asyncio.sleep(0.1)
                continue
            break
        assert isinstance(error, OutOfOrderSequenceError), error
        assert await produce(leader, batch(3, 2, "b")) == (None, o + 3)  # remembered across it
        error, d = await produce(leader, batch(6, 1, "d"))  # the last one + 1
        assert error is None and d > o + 6  # (after the new term's own entry)
        assert await produce(leader, batch(41, 1, "q", producer_id=78)) == (None, d + 1)
        error, _ = await produce(leader, batch(30, 1, "old", producer_id=78))
        assert isinstance(error, DuplicateSequenceError)
        assert await stored(cluster) == [
            b"a0",
            b"a1",
            b"a2",
            b"b0",
            b"b1",
            b"c0",
            b"p0",
            b"d0",
            b"q0",
        ]
    finally:
        cluster.stop()


async def test_a_crashed_node_remembers_sequences_from_its_tail_checkpoint(tmp_path: Path) -> None:
    """SIGKILL after the node saved its tails (``tail_checkpoint``): the restart in the same
    boot opens every replica from the saved state instead of walking its log, and the sequence
    rule still knows the producer's batches, a retry gets the first write's offsets."""
    cluster = start_cluster(tmp_path, nodes=1)
    try:
        leader = await wait_leader(cluster)
        error, o = await produce(leader, batch(0, 3, "a"))
        assert error is None
        assert await produce(leader, batch(3, 2, "b")) == (None, o + 3)
        node = cluster.nodes[1]
        saved = node.data_dir / CHECKPOINT_FILE
        for _ in range(int(4 * INTERVAL_S / 0.2)):  # the next capture after both writes
            if saved.exists() and f'"end":{o + 5},'.encode() in saved.read_bytes():
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError(f"no tail saved up to offset {o + 5}: {saved.read_bytes()!r}")

        cluster.kill(1)
        cluster.start_node(1)
        cluster.wait_ready()
        lines = node.log_path.read_text().splitlines()
        opened = [json.loads(line) for line in lines if '"replicas opened"' in line]
        assert opened and opened[-1]["from_tail_checkpoint"] == 2, opened  # metadata and seq-0
        leader = await wait_leader(cluster)
        for _ in range(100):  # the restarted node refuses writes until it leads again
            error, base = await produce(leader, batch(0, 3, "a"))
            if error is None:
                break
            await asyncio.sleep(0.1)
        assert (error, base) == (None, o)  # a retry: the first write's offsets
        error, _ = await produce(leader, batch(9, 1, "gap"))
        assert isinstance(error, OutOfOrderSequenceError)
        error, c = await produce(leader, batch(5, 1, "c"))
        assert error is None and c > o + 4
        assert await stored(cluster) == [b"a0", b"a1", b"a2", b"b0", b"b1", b"c0"]
    finally:
        cluster.stop()
