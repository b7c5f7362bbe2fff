"""Many partitions on real node processes: a 1,000-partition RF 3 topic is created and fully
led, then the node leading most partitions is SIGKILLed and every partition accepts an
acks=all write again.

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

PARTITIONS = 1000
ALL_LED_WITHIN = 60.0
WRITABLE_AGAIN_WITHIN = 45.0


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


async def test_many_partitions_are_led_and_survive_the_loss_of_a_leader_node(
    tmp_path: Path,
) -> None:
    cluster = start_cluster(tmp_path, 3, log_level="warning")
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
    finally:
        cluster.stop()
