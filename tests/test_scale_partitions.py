"""Many partitions on real node processes: a 1,000-partition RF 3 topic is created and fully
led, then the node leading most partitions is SIGKILLed and every partition accepts an
acks=all write again; restarted, that node catches up on every partition without a single
pre-vote (its replicas wait for their leaders to call, ``MultiRaft.rest``).

Before the node-wide hard-state journal, bulk leadership reports and the stall-tolerant peer
liveness (docs/ARCHITECTURE.md, "Many partitions"), 1,000 partitions on a loaded 2-core
machine never got all their leaders (elections churned); with them it takes seconds. The
bounds are generous for a shared, loaded machine; ``bench/scale_bench.py`` measures.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

from laminar.client import Admin, Producer
from tests.cluster_fixture import start_cluster
from tests.test_node_metrics import scrape, value

PARTITIONS = 1000
ALL_LED_WITHIN = 60.0
WRITABLE_AGAIN_WITHIN = 45.0
CAUGHT_UP_WITHIN = 60.0


async def _all_led(admin: Admin, topic: str, timeout: float) -> tuple[int, int]:
    """Until describe_topic and cluster status name a leader for every partition; returns
    how many each named last."""
    deadline = time.monotonic() + timeout
    described = statused = 0
    while time.monotonic() < deadline:
        description = await admin.describe_topic(topic)
        described = sum(1 for p in description.partitions if p.leader)
        if described == PARTITIONS:
            status = await admin.cluster_status()
            statused = len({p.partition for p in status.partitions if p.topic == topic})
            if statused == PARTITIONS:
                break
        await asyncio.sleep(0.5)
    return described, statused


async def _caught_up(admin: Admin, node_id: int, timeout: float) -> int:
    """Until the gossip calls ``node_id`` alive and every leader reports it caught up on
    every partition it hosts; returns how many are still behind."""
    deadline = time.monotonic() + timeout
    behind = PARTITIONS
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        try:
            status = await admin.cluster_status()
        except Exception:  # (a node still starting)
            continue
        alive = any(m.node_id == node_id and m.state == "alive" for m in status.members)
        hosted = [r for p in status.partitions for r in p.replicas if r.node_id == node_id]
        behind = sum(1 for r in hosted if r.lag > 0) if alive and hosted else PARTITIONS
        if behind == 0:
            break
    return behind


async def test_many_partitions_are_led_and_survive_the_loss_of_a_leader_node(
    tmp_path: Path,
) -> None:
    cluster = start_cluster(tmp_path, 3, log_level="warning", metrics=True)
    try:
        async with Admin(cluster.bootstrap, request_timeout_ms=30_000) as admin:
            started = time.monotonic()
            await admin.create_topic("many", partitions=PARTITIONS, replication_factor=3)
            described, statused = await _all_led(admin, "many", ALL_LED_WITHIN)
            assert (described, statused) == (PARTITIONS, PARTITIONS), (
                f"after {time.monotonic() - started:.0f} s describe_topic names {described} "
                f"leaders and cluster status {statused}, of {PARTITIONS}\n{cluster.logs()}"
            )
            async with Producer(
                cluster.bootstrap, acks="all", retries=1_000, retry_backoff_ms=50
            ) as producer:
                first = [
                    await producer.send("many", b"before", partition=p) for p in range(PARTITIONS)
                ]
                await asyncio.wait_for(asyncio.gather(*first), WRITABLE_AGAIN_WITHIN)
                description = await admin.describe_topic("many")
                victim, led = Counter(p.leader for p in description.partitions).most_common(1)[0]
                assert led >= PARTITIONS // 4, f"node {victim} leads only {led}"
                cluster.kill(victim)
                killed = time.monotonic()
                again = [
                    await producer.send("many", b"after", partition=p) for p in range(PARTITIONS)
                ]
                done, pending = await asyncio.wait(again, timeout=WRITABLE_AGAIN_WITHIN)
                assert not pending, (
                    f"{len(pending)} of {PARTITIONS} partitions took no acks=all write within "
                    f"{WRITABLE_AGAIN_WITHIN:.0f} s of killing node {victim} (which led {led})"
                )
                assert all(f.exception() is None for f in done)
                assert time.monotonic() - killed < WRITABLE_AGAIN_WITHIN
            cluster.start_node(victim)
            behind = await _caught_up(admin, victim, CAUGHT_UP_WITHIN)
            assert behind == 0, f"node {victim} restarted, still behind on {behind}"
            pre_votes = {}
            for node_id, node in cluster.nodes.items():
                samples = await scrape(node.metrics_address)
                pre_votes[node_id] = value(samples, "laminar_raft_pre_votes_total", topic="many")
            assert pre_votes.pop(victim) == 0, f"node {victim}'s replicas campaigned"
            assert sum(pre_votes.values()) >= led  # the survivors did, for the dead leader's
    finally:
        cluster.stop()
