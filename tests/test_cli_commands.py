"""Every client command of the real `laminar` executable, against an in-memory cluster.

The cluster runs in this test's event loop on real sockets; the CLI runs as a subprocess.
The same commands against real node processes are in test_cli_cluster.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from laminar.segment.batch import decode_records
from tests.client_fakenode import FakeCluster

pytestmark = pytest.mark.timeout(120)

LAMINAR = str(Path(sys.executable).with_name("laminar"))


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    cluster = await FakeCluster().start(3)
    yield cluster
    await cluster.stop()


async def cli(fake: FakeCluster, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        LAMINAR,
        *args,
        "--bootstrap",
        fake.bootstrap,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin or b""), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def values(fake: FakeCluster, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return sorted(
        (p, r.offset, r.key, r.value)
        for p, part in enumerate(fake.topics[topic])
        for batch in part.batches
        for r in decode_records(batch)
    )


async def test_topic_commands(fake: FakeCluster) -> None:
    code, out, err = await cli(fake, "topic", "create", "events", "--partitions", "3", "-r", "3")
    assert code == 0, err
    assert out.strip() == "created topic events (3 partitions, replication factor 3)"
    code, out, err = await cli(fake, "topic", "create", "events")
    assert code == 1 and err.startswith("error: ") and "exists" in err
    code, out, _ = await cli(fake, "topic", "list")
    assert out.splitlines()[0].split() == ["TOPIC", "PARTITIONS", "REPLICATION"]
    assert out.splitlines()[1].split() == ["events", "3", "3"]
    code, out, err = await cli(fake, "topic", "describe", "events")
    assert code == 0, err
    assert "topic events" in out and "retention:          7d" in out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [row[0] for row in rows] == ["0", "1", "2"]
    assert all(row[3:] == ["0", "0"] for row in rows)  # start and end offsets
    code, out, err = await cli(fake, "topic", "describe", "nope")
    assert code == 1 and err.strip() == "error: topic 'nope' does not exist (UnknownTopicError)"
    code, out, _ = await cli(fake, "topic", "delete", "events")
    assert code == 0 and out.strip() == "deleted topic events"
    code, out, _ = await cli(fake, "topic", "list")
    assert out.strip() == "no topics"


async def test_produce_modes(fake: FakeCluster, tmp_path: Path) -> None:
    fake.create_topic("t", 2)
    code, out, err = await cli(fake, "produce", "t", "--value", "hello", "--key", "k", "-p", "1")
    assert code == 0, err
    assert out.strip() == "produced 1 record to t partition 1 offset 0"
    code, out, err = await cli(fake, "produce", "t", "--value", "n{i}", "-n", "500", "-p", "0")
    assert code == 0, err
    assert out.startswith("produced 500 records to t in ")
    code, out, err = await cli(fake, "produce", "t", "-p", "1", stdin=b"line one\nline two\n")
    assert code == 0, err
    code, _, err = await cli(
        fake, "produce", "t", "-p", "1", "--key-separator", ":", stdin=b"a:1\nb:2\n"
    )
    assert code == 0, err
    blob = bytes(range(256)) * 4
    (tmp_path / "blob.bin").write_bytes(blob)
    code, out, err = await cli(
        fake, "produce", "t", "--file", str(tmp_path / "blob.bin"), "-p", "1", "-H", "type=bin"
    )
    assert code == 0, err
    assert out.strip() == "produced 1 record to t partition 1 offset 5"
    stored = values(fake, "t")
    assert [v for p, _, _, v in stored if p == 0] == [f"n{i}".encode() for i in range(500)]
    assert [(k, v) for p, _, k, v in stored if p == 1] == [
        (b"k", b"hello"),
        (None, b"line one"),
        (None, b"line two"),
        (b"a", b"1"),
        (b"b", b"2"),
        (None, blob),
    ]
    last = decode_records(fake.topics["t"][1].batches[-1])[-1]
    assert last.headers == (("type", b"bin"),)
    code, _, err = await cli(fake, "produce", "missing", "--value", "x")
    assert code == 1 and err.strip() == "error: topic 'missing' does not exist (UnknownTopicError)"
    code, _, err = await cli(fake, "produce", "t", "--value", "x", "-p", "5")
    assert code == 1 and "has no partition 5" in err and len(err.splitlines()) == 1


async def test_consume_modes(fake: FakeCluster) -> None:
    fake.create_topic("t", 2)
    await cli(fake, "produce", "t", "--value", "a{i}", "-n", "5", "-p", "0", "--key", "ka")
    await cli(fake, "produce", "t", "--value", "b{i}", "-n", "3", "-p", "1")
    code, out, err = await cli(fake, "consume", "t", "--format", "value")
    assert code == 0, err
    assert sorted(out.split()) == sorted([f"a{i}" for i in range(5)] + [f"b{i}" for i in range(3)])
    code, out, _ = await cli(fake, "consume", "t", "-p", "0", "--from", "3", "--format", "json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["partition"], r["offset"], r["key"], r["value"]) for r in rows] == [
        (0, 3, "ka", "a3"),
        (0, 4, "ka", "a4"),
    ]
    code, out, _ = await cli(fake, "consume", "t", "-p", "1", "--count", "2")
    lines = out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("1:0\t") and lines[0].endswith("\t-\tb0")
    code, out, _ = await cli(fake, "consume", "t", "--from", "latest")
    assert code == 0 and out == ""
    code, out, _ = await cli(fake, "consume", "t", "--from", "@0", "-p", "1", "--format", "value")
    assert out.split() == ["b0", "b1", "b2"]
    code, out, _ = await cli(fake, "consume", "t", "--from", "-1h", "-p", "1", "--format", "value")
    assert out.split() == ["b0", "b1", "b2"]  # produced moments ago
    code, _, err = await cli(fake, "consume", "t", "-p", "0", "--from", "99")
    assert code == 1 and err.strip() == "error: offset 99 is out of range for t/0 [0, 5]"
    code, _, err = await cli(fake, "consume", "t", "-p", "9")
    assert code == 1 and err.strip() == "error: topic t has no partition 9 (it has 2)"


async def test_consume_follow_sees_new_records(fake: FakeCluster) -> None:
    fake.create_topic("t", 1)
    process = await asyncio.create_subprocess_exec(
        LAMINAR,
        *("consume", "t", "--from", "latest", "--follow", "--count", "2", "--format", "value"),
        *("--bootstrap", fake.bootstrap),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None and process.stdout is not None
        # The notice comes once the start offsets are fixed: what is produced next is printed.
        notice = await asyncio.wait_for(process.stderr.readline(), 30)
        assert notice.decode().strip() == "% following t from 0@0"
        assert process.returncode is None
        await cli(fake, "produce", "t", "--value", "live{i}", "-n", "2")
        out = await asyncio.wait_for(process.stdout.read(), 30)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert out.split() == [b"live0", b"live1"]


async def test_cluster_status(fake: FakeCluster) -> None:
    fake.create_topic("t", 2)
    await cli(fake, "produce", "t", "--value", "x", "-p", "0")
    code, out, err = await cli(fake, "cluster", "status")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "under-replicated partitions: 0, leaderless partitions: 0"
    lines = lines[lines.index("members (3; * = metadata leader)") :]
    assert lines[2].split()[:3] == ["1*", fake.nodes[1].address, "alive"]
    assert "partitions (2)" in out
    row = next(line.split() for line in lines if line.startswith("t "))
    assert row[:7] == ["t", "0", str(fake.topics["t"][0].leader), "1", "0", "1", "1"]
    code, out, _ = await cli(fake, "cluster", "status", "--json")
    data = json.loads(out)
    assert data["metadata_leader"] == 1
    assert [p["high_watermark"] for p in data["partitions"]] == [1, 0]
