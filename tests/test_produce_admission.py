"""Produce admission (laminar/node/admission.py): the node's bound on batches proposed and not
yet committed, and what it is for: a flood of writes costs latency, not leaderships."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from laminar.client import Admin, Producer
from laminar.client.connection import Connection
from laminar.errors import NotLeaderError
from laminar.node.admission import ProduceAdmission
from laminar.protocol import read_error
from laminar.segment.batch import build_batch
from tests.cluster_fixture import metric, start_cluster


async def test_requests_beyond_the_limit_wait_and_are_admitted_in_order() -> None:
    admission = ProduceAdmission(10)
    await admission.acquire(6)
    admitted: list[str] = []

    async def request(name: str, batches: int) -> None:
        await admission.acquire(batches)
        admitted.append(name)

    big = asyncio.create_task(request("big", 5))
    small = asyncio.create_task(request("small", 1))  # would fit, but comes after "big"
    await asyncio.sleep(0.01)
    assert admitted == [] and admission.in_flight == 6 and admission.waited == 2
    admission.release(6)
    await asyncio.gather(big, small)
    assert admitted == ["big", "small"] and admission.in_flight == 6


async def test_a_request_larger_than_the_limit_goes_alone() -> None:
    admission = ProduceAdmission(4)
    await admission.acquire(9)  # nothing in flight: admitted, or it could never be
    assert admission.in_flight == 9
    waiting = asyncio.create_task(admission.acquire(1))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    admission.release(9)
    await waiting
    assert admission.in_flight == 1


async def test_a_cancelled_waiter_takes_no_room() -> None:
    admission = ProduceAdmission(2)
    await admission.acquire(2)
    gone = asyncio.create_task(admission.acquire(2))
    after = asyncio.create_task(admission.acquire(1))
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.sleep(0)
    admission.release(2)
    await after
    assert gone.cancelled() and admission.in_flight == 1


async def test_room_comes_back_when_every_write_settles_whatever_its_outcome() -> None:
    admission = ProduceAdmission(3)
    await admission.acquire(3)
    loop = asyncio.get_running_loop()
    committed, failed, timed_out = loop.create_future(), loop.create_future(), loop.create_future()
    admission.release_when_settled(3, [committed, failed, timed_out], timeout_s=30)
    committed.set_result(None)
    failed.set_exception(NotLeaderError("leadership lost"))  # retrieved: no warning at exit
    assert admission.in_flight == 3
    timed_out.cancel()  # (await_commits cancels what did not commit in time)
    await asyncio.sleep(0)
    assert admission.in_flight == 0


async def test_room_held_for_writes_nobody_waits_for_comes_back_after_the_timeout() -> None:
    admission = ProduceAdmission(1)
    await admission.acquire(1)
    never = asyncio.get_running_loop().create_future()  # acks=1: a commit never seen
    admission.release_when_settled(1, [never], timeout_s=0.05)
    await asyncio.wait_for(admission.acquire(1), 2)
    never.set_result(None)  # settling later gives nothing back twice
    await asyncio.sleep(0)
    assert admission.in_flight == 1


async def test_a_request_context_takes_room_and_holds_it_until_its_writes_settle() -> None:
    admission = ProduceAdmission(4)
    commit = asyncio.get_running_loop().create_future()
    async with admission.admit(3, timeout_s=None) as proposed:
        assert admission.in_flight == 3
        proposed.append(commit)
    assert admission.in_flight == 3  # acks=all: the request still awaits its commit
    commit.set_result(None)
    await asyncio.sleep(0)
    assert admission.in_flight == 0


def _elections(metrics_address: str) -> float:
    return metric(metrics_address, "laminar_raft_elections_total") or 0.0


@pytest.mark.timeout(180)
async def test_a_flood_of_writes_over_many_partitions_moves_no_leadership(tmp_path: Path) -> None:
    """Every node gets produce requests far faster than it can commit them (an open loop: a
    request with a 2-record batch for each of its 100 partitions every 5 ms, 20 times what
    this machine commits). Before admission a node proposed a whole burst in one loop turn,
    its heartbeats waited seconds behind it, and its followers elected new leaders: hundreds
    of elections in seconds. Now the flood is admitted as fast as it commits: no election,
    no NotLeader answer, and every acknowledged write was taken."""
    cluster = start_cluster(tmp_path, metrics=True, log_level="warning")
    try:
        async with Admin(cluster.bootstrap) as admin:
            await admin.create_topic("flood", partitions=300, replication_factor=3)
            deadline = time.monotonic() + 60
            while True:
                partitions = (await admin.describe_topic("flood")).partitions
                if all(p.leader for p in partitions) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        led: dict[int, list[int]] = {}
        for p in partitions:
            led.setdefault(p.leader, []).append(p.partition)
        assert sorted(led) == [1, 2, 3], led
        await asyncio.sleep(1)  # the leaders' first elections are behind us
        before = {n: _elections(node.metrics_address) for n, node in cluster.nodes.items()}

        batch = build_batch([(None, b"x" * 100, (), int(time.time() * 1000))] * 2)
        connections = {n: await Connection.open(cluster.address(n)) for n in led}
        outcomes = {"acked": 0, "not_leader": 0, "other": 0}

        async def produce(node: int) -> None:
            def fill(body: object) -> None:
                request = body.init("produce")  # type: ignore[attr-defined]
                request.acks = -1
                request.timeoutMs = 60_000
                refs = request.init("batches", len(led[node]))
                for i, (ref, partition) in enumerate(zip(refs, led[node], strict=True)):
                    ref.topic, ref.partition = "flood", partition
                    ref.payloadOffset, ref.payloadLength = i * len(batch), len(batch)

            payload = [batch] * len(led[node])  # the last waits for the whole backlog: no timeout
            reply, _ = await connections[node].request(fill, payload, timeout=None)
            for result in reply.body.produce.results:
                error = read_error(result.error)
                key = "acked" if error is None else "other"
                outcomes["not_leader" if isinstance(error, NotLeaderError) else key] += 1

        requests: list[asyncio.Task[None]] = []
        sent = 0
        flood_until = time.monotonic() + 4
        while time.monotonic() < flood_until:
            for node in led:
                requests.append(asyncio.create_task(produce(node)))
                sent += len(led[node])
            await asyncio.sleep(0.005)
        await asyncio.wait_for(asyncio.gather(*requests), 120)
        for connection in connections.values():
            connection.close()

        after = {n: _elections(node.metrics_address) for n, node in cluster.nodes.items()}
        assert after == before, f"elections during the flood: {before} -> {after}"
        assert outcomes["not_leader"] == 0 and outcomes["other"] == 0, outcomes
        assert outcomes["acked"] == sent
        async with Admin(cluster.bootstrap) as admin:
            now = (await admin.describe_topic("flood")).partitions
        assert {p.partition: p.leader for p in now} == {p.partition: p.leader for p in partitions}

        for acks in ("leader", "none"):  # writes nobody awaits give their room back too
            async with Producer(cluster.bootstrap, acks=acks) as producer:
                await producer.send_many("flood", [b"x" * 100] * 3_000)
                await producer.flush()
        held = cluster.produce_batches_held()
        assert all(value == 0 for value in held.values()), held
    finally:
        cluster.stop()
