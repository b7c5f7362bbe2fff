"""`laminar group ...` and `laminar consume --group` as subprocesses, against the in-memory
cluster whose nodes host the real group Coordinator (tests/client_fakegroups.py)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator

import pytest

from laminar.client import Admin, Consumer, TopicPartition
from tests.client_fakenode import FakeCluster
from tests.test_cli_commands import LAMINAR, cli

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    cluster = await FakeCluster().start(3)
    yield cluster
    await cluster.stop()


def table(out: str, header: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [header])
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


async def test_consume_with_a_group_commits_what_it_printed(fake: FakeCluster) -> None:
    fake.create_topic("t", 2)
    await cli(fake, "produce", "t", "--value", "a{i}", "-n", "4", "-p", "0")
    await cli(fake, "produce", "t", "--value", "b{i}", "-n", "2", "-p", "1")
    code, out, err = await cli(fake, "consume", "t", "--group", "g", "--format", "value")
    assert code == 0, err
    assert sorted(out.split()) == ["a0", "a1", "a2", "a3", "b0", "b1"]
    code, out, err = await cli(fake, "consume", "t", "--group", "g", "--format", "value")
    assert code == 0 and out == "", err  # everything was committed
    await cli(fake, "produce", "t", "--value", "c{i}", "-n", "3", "-p", "0")
    code, out, err = await cli(fake, "consume", "t", "-g", "g", "-n", "2", "--format", "value")
    assert code == 0 and out.split() == ["c0", "c1"], err
    code, out, err = await cli(fake, "consume", "t", "-g", "g", "--format", "value")
    assert out.split() == ["c2"]  # the count stopped after c1 and committed exactly that
    code, _, err = await cli(fake, "consume", "t", "-g", "g", "--from", "5")
    assert code == 1 and "earliest or latest" in err

    code, out, err = await cli(fake, "group", "list")
    assert code == 0, err
    assert out.splitlines()[0].split() == [
        "GROUP",
        "STATE",
        "MEMBERS",
        "COORDINATOR",
        "PROTOCOL",
    ]
    assert out.splitlines()[1].split()[:3] == ["g", "empty", "0"]
    await cli(fake, "produce", "t", "--value", "d", "-p", "1")
    code, out, err = await cli(fake, "group", "describe", "g")
    assert code == 0, err
    assert "STATE        empty" in out
    rows = table(out, "TOPIC")
    assert rows == [["t", "0", "-", "7", "7", "0"], ["t", "1", "-", "2", "3", "1"]]
    assert "TOTAL-LAG    1" in out

    code, out, err = await cli(
        fake, "group", "reset-offsets", "g", "--topic", "t", "--to", "earliest", "--dry-run"
    )
    assert code == 0, err
    assert table(out, "TOPIC") == [["t", "0", "7", "0"], ["t", "1", "2", "0"]]
    assert "dry run" in out
    code, out, err = await cli(fake, "group", "reset-offsets", "g", "-t", "t", "--to", "3")
    assert code == 0, err
    assert table(out, "TOPIC") == [["t", "0", "7", "3"], ["t", "1", "2", "3"]]
    code, out, err = await cli(fake, "group", "reset-offsets", "g", "-t", "t", "--to", "-1h")
    assert code == 0 and table(out, "TOPIC") == [["t", "0", "3", "0"], ["t", "1", "3", "0"]], err
    code, _, err = await cli(fake, "group", "reset-offsets", "g", "-t", "t", "--to", "soon")
    assert code == 1 and err.startswith("error: --to 'soon'")
    code, out, err = await cli(fake, "group", "delete", "g")
    assert code == 0 and out.strip() == "deleted group g", err
    code, out, _ = await cli(fake, "group", "list")
    assert out.strip() == "no groups"


async def test_group_commands_refuse_a_group_with_members(fake: FakeCluster) -> None:
    fake.create_topic("t", 1)

    async with Consumer(fake.bootstrap, group_id="busy", max_wait_ms=50) as consumer:
        await consumer.subscribe("t")
        while not consumer.assignment():
            await consumer.getmany(timeout_ms=50)
        code, out, err = await cli(fake, "group", "describe", "busy")
        assert code == 0, err
        assert "STATE        stable" in out
        [member] = table(out, "MEMBER")
        assert member[3:] == ["t", "t:0", "-"]
        assert table(out, "TOPIC") == [["t", "0", member[0], "-", "0", "-"]]
        code, _, err = await cli(fake, "group", "delete", "busy")
        assert code == 1 and "GroupNotEmptyError" in err
        code, _, err = await cli(fake, "group", "reset-offsets", "busy", "-t", "t", "--to", "0")
        assert code == 1 and "GroupNotEmptyError" in err
    async with Admin(fake.bootstrap) as admin:
        assert (await admin.describe_group("busy")).members == ()
        # close() auto-committed the position (the end: auto_offset_reset="latest")
        assert (await admin.fetch_offsets("busy"))[TopicPartition("t", 0)].offset == 0


def _takes_ctrl_c() -> None:
    """In the child, before exec: SIGINT stops it even when this test run was started in the
    background by a shell (which makes it ignore SIGINT, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_consume_group_follow_commits_as_it_prints(fake: FakeCluster) -> None:
    fake.create_topic("f", 2)
    process = await asyncio.create_subprocess_exec(
        LAMINAR,
        "consume",
        "f",
        "--group",
        "follower",
        "--follow",
        "--format",
        "value",
        "--bootstrap",
        fake.bootstrap,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=_takes_ctrl_c,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        note = await asyncio.wait_for(process.stderr.readline(), 30)
        assert note.startswith(b"% joined group follower")
        async with Admin(fake.bootstrap) as admin:
            for _ in range(200):  # joined: wait until it owns both partitions
                described = await admin.describe_group("follower")
                if described.members and len(described.members[0].assigned) == 2:
                    break
                await asyncio.sleep(0.05)
            await cli(fake, "produce", "f", "--value", "v{i}", "-n", "3", "-p", "1")
            lines = [await asyncio.wait_for(process.stdout.readline(), 10) for _ in range(3)]
            assert [line.strip() for line in lines] == [b"v0", b"v1", b"v2"]
            for _ in range(200):
                offsets = await admin.fetch_offsets("follower")
                if (
                    offsets.get(TopicPartition("f", 1))
                    and offsets[TopicPartition("f", 1)].offset == 3
                ):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"printed records were not committed: {offsets}")
    finally:
        process.send_signal(signal.SIGINT)
        await asyncio.wait_for(process.wait(), 30)
    async with Admin(fake.bootstrap) as admin:
        assert (await admin.describe_group("follower")).members == ()  # left on Ctrl-C
