"""The group client (Consumer group mode, Admin, `laminar group`) against real node
processes: joins and splits, commits, leaving, the revoke listener, admin and CLI."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from laminar.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition
from laminar.errors import GroupNotEmptyError
from tests.cluster_fixture import ClusterHandle, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

LAMINAR = str(Path(sys.executable).with_name("laminar"))
PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    handle = start_cluster(
        Path(tmp_path_factory.mktemp("client-groups")),
        nodes=3,
        extra_args=["--group-session-timeout", "4", "--group-heartbeat-interval", "0.3"],
    )
    try:
        yield handle
    finally:
        handle.stop()


async def ends(bootstrap: str, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    async with Admin(bootstrap) as admin:
        return await admin.list_offsets(tps, -1)


async def make_topic(bootstrap: str, topic: str, per_partition: int) -> list[TopicPartition]:
    """A topic whose partitions hold ``per_partition`` records with values "p-i" (a new
    leader's no-op may sit before them, so offsets are read from the log's end)."""
    async with Admin(bootstrap) as admin:
        await admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    async with Producer(bootstrap, acks="all") as producer:
        for p in range(PARTITIONS):
            for i in range(per_partition):
                await producer.send(topic, f"{p}-{i}".encode(), partition=p)
        await producer.flush()
    return [TopicPartition(topic, p) for p in range(PARTITIONS)]


def member(bootstrap: str, group: str, **options: object) -> Consumer:
    defaults: dict[str, object] = {
        "group_id": group,
        "auto_offset_reset": "earliest",
        "max_wait_ms": 100,
        "auto_commit_interval_ms": 200,
    }
    return Consumer(bootstrap, **{**defaults, **options})  # type: ignore[arg-type]


async def until(
    check: Callable[[], bool],
    timeout: float,
    *consumers: Consumer,
    sink: list[ConsumerRecord] | None = None,
    sink_from: Consumer | None = None,
) -> None:
    """Poll ``consumers`` until ``check()``; records go to ``sink`` (only those of
    ``sink_from`` if given)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        polled = await asyncio.gather(*(c.getmany(timeout_ms=50) for c in consumers))
        for consumer, got in zip(consumers, polled, strict=True):
            if sink is not None and sink_from in (None, consumer):
                sink.extend(got)


async def test_members_split_commit_and_hand_over_on_close(cluster: ClusterHandle) -> None:
    bootstrap = cluster.bootstrap
    tps = await make_topic(bootstrap, "split", 10)
    a = member(bootstrap, "split-g")
    b = member(bootstrap, "split-g")
    await a.start()
    await b.start()
    try:
        records: list[ConsumerRecord] = []
        await a.subscribe("split")
        await until(lambda: len(a.assignment()) == PARTITIONS, 30, a, sink=records)
        await b.subscribe("split")
        await until(lambda: len(a.assignment()) == len(b.assignment()) == 2, 20, a, b, sink=records)
        assert not set(a.assignment()) & set(b.assignment())
        end = await ends(bootstrap, tps)
        await until(lambda: all(b.position(tp) == end[tp] for tp in b.assignment()), 10, b)
        await b.commit()
        for tp in b.assignment():
            assert await b.committed(tp) == end[tp]
        b_parts = set(b.assignment())
        await b.close()  # leaves at once: a takes everything, where b committed
        await until(lambda: len(a.assignment()) == PARTITIONS, 10, a, sink=records)
        assert all(a.position(tp) == end[tp] for tp in b_parts)  # nothing read again
        async with Producer(bootstrap, acks="all") as producer:
            for tp in tps:
                await producer.send("split", b"late", partition=tp.partition)
        new_end = await ends(bootstrap, tps)
        await until(lambda: all(a.position(tp) == new_end[tp] for tp in tps), 10, a, sink=records)
        late = sorted(r.partition for r in records if r.value == b"late")
        assert late == list(range(PARTITIONS))  # each exactly once, b's ones read by a
    finally:
        await a.close()
        await b.close()
    async with Admin(bootstrap) as admin:
        description = await admin.describe_group("split-g")
        assert description.state == "empty" and not description.members
        assert {(r.partition, r.committed, r.lag) for r in description.partitions} == {
            (tp.partition, new_end[tp], 0) for tp in tps
        }


async def test_revoke_listener_commit_is_where_the_next_owner_starts(
    cluster: ClusterHandle,
) -> None:
    bootstrap = cluster.bootstrap
    tps = await make_topic(bootstrap, "handover", 6)
    end = await ends(bootstrap, tps)
    revoked: list[set[TopicPartition]] = []

    async def on_revoked(tps: set[TopicPartition]) -> None:
        revoked.append(tps)
        await a.commit({tp: (end[tp] - 2, "listener") for tp in tps})

    a = member(bootstrap, "handover-g", enable_auto_commit=False, on_partitions_revoked=on_revoked)
    b = member(bootstrap, "handover-g", enable_auto_commit=False)
    async with a, b:
        await a.subscribe("handover")
        await until(lambda: len(a.assignment()) == PARTITIONS, 30, a)
        got: list[ConsumerRecord] = []
        await b.subscribe("handover")
        await until(lambda: len(b.assignment()) == 2, 20, a, b, sink=got, sink_from=b)
        assert revoked == [set(b.assignment())]
        await until(
            lambda: all(b.position(tp) == end[tp] for tp in b.assignment()), 10, b, sink=got
        )
        mine = set(b.assignment())
        values = sorted(r.value for r in got if TopicPartition(r.topic, r.partition) in mine)
        assert values == sorted(f"{tp.partition}-{i}".encode() for tp in mine for i in (4, 5))


async def test_admin_and_cli_on_a_real_cluster(cluster: ClusterHandle) -> None:
    bootstrap = cluster.bootstrap
    tps = await make_topic(bootstrap, "tools", 3)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [LAMINAR, *args, "--bootstrap", bootstrap],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    printed = await asyncio.to_thread(
        cli, "consume", "tools", "--group", "tools-g", "--format", "value"
    )
    assert printed.returncode == 0, printed.stderr
    assert sorted(printed.stdout.split()) == sorted(
        f"{p}-{i}" for p in range(PARTITIONS) for i in range(3)
    )
    again = await asyncio.to_thread(cli, "consume", "tools", "-g", "tools-g")
    assert again.returncode == 0 and again.stdout == "", again.stderr
    listed = await asyncio.to_thread(cli, "group", "list")
    assert next(
        line.split()[:3] for line in listed.stdout.splitlines() if line.startswith("tools-g")
    ) == ["tools-g", "empty", "0"]
    described = await asyncio.to_thread(cli, "group", "describe", "tools-g")
    assert described.returncode == 0, described.stderr
    rows = [line.split() for line in described.stdout.splitlines() if line.startswith("tools ")]
    end = await ends(bootstrap, tps)
    assert rows == [
        ["tools", str(tp.partition), "-", str(end[tp]), str(end[tp]), "0"] for tp in tps
    ]
    reset = await asyncio.to_thread(
        cli, "group", "reset-offsets", "tools-g", "-t", "tools", "--to", "1"
    )
    assert reset.returncode == 0, reset.stderr
    async with Admin(bootstrap) as admin:
        offsets = await admin.fetch_offsets("tools-g")
        assert {tp: o.offset for tp, o in offsets.items()} == dict.fromkeys(tps, 1)
        async with member(bootstrap, "tools-g") as c:
            await c.subscribe("tools")
            await until(lambda: len(c.assignment()) == PARTITIONS, 30, c)
            groups = {g.group: g for g in await admin.list_groups()}
            assert groups["tools-g"].members == 1
            with pytest.raises(GroupNotEmptyError):
                await admin.delete_group("tools-g")
            with pytest.raises(GroupNotEmptyError):
                await admin.reset_offsets("tools-g", "tools", to="earliest")
            description = await admin.describe_group("tools-g")
            assert len(description.members) == 1
            assert set(description.members[0].assigned) == set(tps)
        await admin.delete_group("tools-g")
        assert "tools-g" not in {g.group for g in await admin.list_groups()}
