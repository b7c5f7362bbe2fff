"""Consumer groups on the client side, against the in-memory cluster whose nodes host the real
group Coordinator (tests/client_fakegroups.py): routing, joins and splits, revocation with
commits, leaving, fencing, client-side session expiry, and the admin calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from laminar.client import Admin, Consumer, ConsumerRecord, TopicPartition
from laminar.errors import GroupNotEmptyError, PartitionNotOwnedError
from laminar.segment.batch import build_batch
from tests.client_fakenode import FakeCluster

pytestmark = pytest.mark.timeout(60)

TPS = [TopicPartition("t", p) for p in range(4)]


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    cluster = await FakeCluster().start(3)
    cluster.create_topic("t", 4)
    for tp in TPS:
        put(cluster, tp, 5)
    yield cluster
    await cluster.stop()


def put(cluster: FakeCluster, tp: TopicPartition, count: int) -> None:
    part = cluster.partition(*tp)
    base = part.end
    part.append(
        build_batch([(None, f"{tp.partition}-{base + i}".encode(), (), 1) for i in range(count)])
    )


async def until(
    check: Callable[[], bool],
    timeout: float = 10.0,
    *consumers: Consumer,
    sink: list[ConsumerRecord] | None = None,
    sink_of: Consumer | None = None,
) -> None:
    """Poll the consumers (so they reconcile and read) until ``check()`` holds; records
    polled meanwhile (by ``sink_of`` only, if given) go to ``sink``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        if consumers:
            polled = await asyncio.gather(*(c.getmany(timeout_ms=20) for c in consumers))
            for consumer, got in zip(consumers, polled, strict=True):
                if sink is not None and sink_of in (None, consumer):
                    sink.extend(got)
        else:
            await asyncio.sleep(0.02)


def group_consumer(fake: FakeCluster, **options: object) -> Consumer:
    defaults: dict[str, object] = {
        "group_id": "g",
        "auto_offset_reset": "earliest",
        "max_wait_ms": 50,
        "auto_commit_interval_ms": 100,
    }
    return Consumer(fake.bootstrap, **{**defaults, **options})  # type: ignore[arg-type]


async def test_two_members_split_the_partitions_and_commits_survive(fake: FakeCluster) -> None:
    records: list[ConsumerRecord] = []
    async with group_consumer(fake, enable_auto_commit=False) as a, group_consumer(fake) as b:
        await a.subscribe("t")
        await until(lambda: len(a.assignment()) == 4, 10, a)
        await b.subscribe(["t"])
        both = (a, b)
        # Only b's records count: a may read b's partitions before the rebalance takes them
        # (it commits nothing, so b reads them again from the start).
        await until(
            lambda: len(a.assignment()) == len(b.assignment()) == 2,
            10,
            *both,
            sink=records,
            sink_of=b,
        )
        assert not set(a.assignment()) & set(b.assignment())
        await until(lambda: all(a.position(tp) == 5 for tp in a.assignment()), 5, a)
        await until(lambda: all(b.position(tp) == 5 for tp in b.assignment()), 5, b, sink=records)
        assert sorted((r.partition, r.offset) for r in records) == sorted(
            (tp.partition, o) for tp in b.assignment() for o in range(5)
        )
        await a.commit()
        for tp in a.assignment():
            assert await a.committed(tp) == 5
        mine = a.assignment()[0]
        await a.commit({mine: (3, "note")})
        assert await b.committed(mine) == 3
        theirs = b.assignment()[0]
        with pytest.raises(PartitionNotOwnedError):
            await a.commit({theirs: 1})
    async with Admin(fake.bootstrap) as admin:
        description = await admin.describe_group("g")
        assert description.state == "empty" and not description.members
        committed = {(o.topic, o.partition): (o.offset, o.metadata) for o in description.offsets}
        assert committed[tuple(mine)] == (3, "note")  # b's close committed only its own


async def test_close_hands_everything_to_the_other_member_where_it_committed(
    fake: FakeCluster,
) -> None:
    async with group_consumer(fake, enable_auto_commit=True) as a:
        b = group_consumer(fake)
        await b.start()
        await a.subscribe("t")
        await b.subscribe("t")
        await until(lambda: len(a.assignment()) == len(b.assignment()) == 2, 10, a, b)
        # b reads all 5 records of both its partitions
        await until(lambda: all(b.position(tp) == 5 for tp in b.assignment()), 5, b)
        b_parts = set(b.assignment())
        await b.close()  # auto-commit, revoke, leave at once
        await until(lambda: len(a.assignment()) == 4, 5, a)
        for tp in b_parts:
            assert a.position(tp) == 5  # continues where b committed, nothing re-read
        for tp in b_parts:
            put(fake, tp, 1)
        fresh: list[ConsumerRecord] = []
        await until(lambda: all(a.position(tp) == 6 for tp in b_parts), 5, a, sink=fresh)
        fresh = [r for r in fresh if r.offset >= 5]
        assert sorted((r.partition, r.offset) for r in fresh) == sorted(
            (tp.partition, 5) for tp in b_parts
        )


async def test_revoke_listener_commits_before_the_partition_moves(fake: FakeCluster) -> None:
    revoked: list[set[TopicPartition]] = []
    assigned: list[set[TopicPartition]] = []

    async def on_revoked(tps: set[TopicPartition]) -> None:
        revoked.append(tps)
        await a.commit({tp: (2, "from-listener") for tp in tps})

    a = group_consumer(
        fake,
        enable_auto_commit=False,
        on_partitions_revoked=on_revoked,
        on_partitions_assigned=assigned.append,
    )
    async with a, group_consumer(fake, enable_auto_commit=False) as b:
        await a.subscribe("t")
        await until(lambda: len(a.assignment()) == 4, 10, a)
        assert assigned == [set(TPS)]
        await b.subscribe("t")
        got: list[ConsumerRecord] = []
        # Only b's records count: a reads all four partitions until the rebalance takes two.
        await until(lambda: len(b.assignment()) == 2, 10, a, b, sink=got, sink_of=b)
        assert len(revoked) == 1 and revoked[0] == set(b.assignment())
        await until(lambda: all(b.position(tp) == 5 for tp in b.assignment()), 5, b, sink=got)
        # b started at what a's revoke listener committed
        assert sorted((r.partition, r.offset) for r in got) == sorted(
            (tp.partition, o) for tp in b.assignment() for o in (2, 3, 4)
        )


async def test_fenced_member_loses_its_partitions_without_committing(fake: FakeCluster) -> None:
    lost: list[set[TopicPartition]] = []
    async with group_consumer(fake, on_partitions_lost=lost.append) as a:
        await a.subscribe("t")
        await until(lambda: len(a.assignment()) == 4, 10, a)
        member = a._member
        assert member is not None
        old_id = member.membership.member_id
        # The coordinator forgets the member (e.g. its session ran out while it was paused).
        shard = fake.groups.shards[next(iter(fake.groups.shards))]
        for coordinator in fake.groups.shards.values():
            if "g" in coordinator.state.groups:
                shard = coordinator
        shard.leave("g", old_id, member.membership.epoch, int(time.monotonic() * 1000))
        shard.take_batch()
        shard.records_committed(shard.written)
        await until(lambda: bool(lost), 5, a)
        assert lost == [set(TPS)]
        await until(lambda: len(a.assignment()) == 4, 5, a)
        assert member.membership.member_id != old_id  # joined again as a new member


async def test_session_expiry_stops_reading_before_the_next_heartbeat(fake: FakeCluster) -> None:
    lost: list[set[TopicPartition]] = []
    async with group_consumer(fake, on_partitions_lost=lost.append) as a:
        await a.subscribe("t")
        await until(lambda: len(a.assignment()) == 4, 10, a)
        member = a._member
        assert member is not None
        for tp in TPS:
            put(fake, tp, 1)
        await asyncio.sleep(0.2)  # fetches may have buffered the new records
        # As if the process was stopped for longer than the session: no answer since then.
        member.membership.last_reply_ms = -(10**9)
        assert await a.getmany(timeout_ms=0) == []
        assert a.assignment() == []
        await until(lambda: bool(lost), 5)
        assert lost == [set(TPS)]


async def test_admin_list_describe_reset_delete(fake: FakeCluster) -> None:
    async with Admin(fake.bootstrap) as admin:
        async with group_consumer(fake) as a:
            await a.subscribe("t")
            await until(lambda: len(a.assignment()) == 4, 10, a)
            await until(lambda: all(a.position(tp) == 5 for tp in TPS), 5, a)
            await a.commit()
            [summary] = await admin.list_groups()
            assert (summary.group, summary.members) == ("g", 1)
            description = await admin.describe_group("g")
            assert description.state == "stable" and len(description.members) == 1
            put(fake, TPS[0], 3)
            description = await admin.describe_group("g")
            lag = {(r.topic, r.partition): r.lag for r in description.partitions}
            assert lag == {("t", 0): 3, ("t", 1): 0, ("t", 2): 0, ("t", 3): 0}
            assert {r.member_id for r in description.partitions} == {
                description.members[0].member_id
            }
            with pytest.raises(GroupNotEmptyError):
                await admin.reset_offsets("g", "t", to="earliest")
            with pytest.raises(GroupNotEmptyError):
                await admin.delete_group("g")
            plan = await admin.reset_offsets("g", "t", to="earliest", dry_run=True)
            assert set(plan.values()) == {0}
        plan = await admin.reset_offsets("g", "t", to=2)
        assert plan == dict.fromkeys(TPS, 2)
        plan = await admin.reset_offsets("g", "t", to=100, partitions=[0])
        assert plan == {TPS[0]: 8}  # clamped to the end
        offsets = await admin.fetch_offsets("g")
        assert {tp: o.offset for tp, o in offsets.items()} == {**dict.fromkeys(TPS, 2), TPS[0]: 8}
        await admin.commit_offsets("g", {TPS[1]: (1, "m")})
        assert (await admin.fetch_offsets("g"))[TPS[1]].metadata == "m"
        await admin.delete_group("g")
        assert await admin.list_groups() == []
        assert (await admin.describe_group("g")).state == "empty"


async def test_a_revocation_waits_until_the_member_polls_again(fake: FakeCluster) -> None:
    """As in Kafka, where the revocation runs inside poll: while the application works on a
    batch, nobody else gets its partitions; once it polls again, the revocation commits what
    it processed and the next owner starts right after it (nothing read twice)."""
    async with group_consumer(fake) as a, group_consumer(fake) as b:
        await a.subscribe("t")
        await until(lambda: len(a.assignment()) == 4, 10, a)
        await until(lambda: all(a.position(tp) == 5 for tp in TPS), 5, a)
        assert await a.getmany(timeout_ms=0) == []
        for tp in TPS:
            put(fake, tp, 3)
        batch: list[ConsumerRecord] = []
        await until(lambda: len(batch) == 12, 5, a, sink=batch)
        # a is "processing" records 5..7 of every partition and does not poll; b joins.
        await b.subscribe("t")
        got: list[ConsumerRecord] = []
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            got += await b.getmany(timeout_ms=20)
        assert b.assignment() == [] and got == [], "b read partitions a is still working on"
        assert len(a.assignment()) == 4
        # a polls again: done with its batch; the revocation commits 8 and releases two.
        await until(lambda: len(b.assignment()) == 2, 10, a, b, sink=got)
        await until(lambda: all(b.position(tp) == 8 for tp in b.assignment()), 5, a, b, sink=got)
        assert got == [], "records a processed were delivered again"
        assert [await b.committed(tp) for tp in b.assignment()] == [8, 8]


async def test_static_member_comes_back_to_its_partitions(fake: FakeCluster) -> None:
    b = group_consumer(fake)
    async with b:
        a = group_consumer(fake, group_instance_id="static-a")
        await a.start()
        await a.subscribe("t")
        await b.subscribe("t")
        await until(lambda: len(a.assignment()) == len(b.assignment()) == 2, 10, a, b)
        a_parts, b_parts = set(a.assignment()), set(b.assignment())
        await a.close()  # keeps its assignment for the next incarnation
        again = group_consumer(fake, group_instance_id="static-a")
        async with again:
            await again.subscribe("t")
            await until(lambda: len(again.assignment()) == 2, 10, again, b)
            assert set(again.assignment()) == a_parts
            assert set(b.assignment()) == b_parts


async def test_leaving_on_an_error_commits_only_what_was_processed(fake: FakeCluster) -> None:
    a = group_consumer(fake)
    with pytest.raises(RuntimeError):
        async with a:
            await a.subscribe("t")
            await until(lambda: len(a.assignment()) == 4, 10, a)
            await until(lambda: all(a.position(tp) == 5 for tp in TPS), 5, a)
            assert await a.getmany(timeout_ms=0) == []
            for tp in TPS:
                put(fake, tp, 2)
            batch: list[ConsumerRecord] = []
            await until(lambda: len(batch) == 8, 5, a, sink=batch)
            raise RuntimeError("processing failed")
    async with Admin(fake.bootstrap) as admin:
        offsets = await admin.fetch_offsets("g")
    assert {tp: o.offset for tp, o in offsets.items()} == dict.fromkeys(TPS, 5)


async def test_assigned_consumer_with_a_group_commits_from_outside_it(fake: FakeCluster) -> None:
    async with group_consumer(fake) as c:
        await c.assign(TPS[:2])
        await until(lambda: all(c.position(tp) == 5 for tp in TPS[:2]), 5, c)
        await c.commit()  # member "" at epoch -1: allowed while the group has no members
        assert [await c.committed(tp) for tp in TPS] == [5, 5, None, None]
        async with group_consumer(fake) as member:
            await member.subscribe("t")
            await until(lambda: len(member.assignment()) == 4, 10, member)
            with pytest.raises(GroupNotEmptyError):
                await c.commit({TPS[0]: 1})
            with pytest.raises(RuntimeError):
                await c.subscribe("t")  # assign() and a subscription do not mix


async def test_a_revocation_waiting_for_the_application_ends_when_the_member_is_fenced(
    fake: FakeCluster,
) -> None:
    """A member busy with a batch (not polling) has a revocation waiting when it is fenced:
    its partitions are reported lost, never revoked as well, and its next incarnation takes
    its new share at once (reconciliation does not stay stuck behind the old revocation)."""
    revoked: list[set[TopicPartition]] = []
    lost: list[set[TopicPartition]] = []
    a = group_consumer(fake, on_partitions_revoked=revoked.append, on_partitions_lost=lost.append)
    async with a, group_consumer(fake) as b:
        await a.subscribe("t")
        await until(lambda: len(a.assignment()) == 4, 10, a)
        member = a._member
        assert member is not None
        await b.subscribe("t")
        await until(lambda: member._revoke_done is not None, 5, b)  # waits for a to poll
        shard = next(c for c in fake.groups.shards.values() if "g" in c.state.groups)
        shard.leave("g", member.membership.member_id, member.membership.epoch, 0)
        shard.take_batch()
        shard.records_committed(shard.written)
        await until(lambda: len(a.assignment()) == 2 and len(b.assignment()) == 2, 10, b)
        assert lost == [set(TPS)] and revoked == []
        await until(lambda: len(a.assignment()) == 2, 5, a)
        assert revoked == [], "partitions reported lost were revoked as well"
