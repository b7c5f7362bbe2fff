"""`laminar cluster health` and `Admin.cluster_health` on real node processes: a SIGKILLed node
shows as down with its replicas out of sync, the CLI exits 2 while the cluster is not healthy,
and once `--exit-when-healthy` returns after the restart, the returning node is caught up on
every partition (health claims nothing the full status contradicts)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laminar.client import Admin, ClusterHealth, Producer
from laminar.node.health import SAMPLE, Health
from tests.cluster_fixture import start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

LAMINAR = str(Path(sys.executable).with_name("laminar"))
TOPIC = "health"
PARTITIONS = 30


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LAMINAR, "cluster", "health", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def wait_for(admin: Admin, done: object, timeout: float = 30.0) -> ClusterHealth:
    deadline = time.monotonic() + timeout
    health = await admin.cluster_health()
    while not done(health):  # type: ignore[operator]
        assert time.monotonic() < deadline, f"health never reached the state: {health}"
        await asyncio.sleep(0.2)
        health = await admin.cluster_health()
    return health


async def views_from(address: str, seconds: float) -> list[ClusterHealth]:
    """Health as answered through ``address`` only, polled for ``seconds``."""
    views: list[ClusterHealth] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            async with asyncio.timeout(5), Admin(address, request_timeout_ms=2_000) as admin:
                views.append(await admin.cluster_health())
        except (ConnectionError, OSError):
            pass  # not listening yet
        await asyncio.sleep(0.05)
    return views


async def produce(bootstrap: str, count: int) -> None:
    async with Producer(bootstrap, acks="all") as producer:
        for i in range(count):
            await producer.send(TOPIC, f"r{i}".encode(), partition=i % PARTITIONS)
        await producer.flush()


async def test_health_through_a_kill_and_a_restart(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path)
    try:
        async with Admin(cluster.bootstrap, request_timeout_ms=10_000) as admin:
            await admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
            await produce(cluster.bootstrap, 300)
            healthy = await wait_for(admin, lambda h: h.healthy)
            assert healthy.reasons == ()
            assert healthy.nodes == (1, 2, 3) and healthy.nodes_down == ()
            assert healthy.partitions == PARTITIONS and healthy.metadata_leader in (1, 2, 3)
            assert healthy.leaderless_count == healthy.under_replicated_count == 0
            assert healthy.out_of_sync == {} and healthy.replica_faults_count == 0
            watched = cli(
                "--watch", "--json", "--interval", "0.2", "--timeout", "1",
                "--bootstrap", cluster.bootstrap,
            )  # fmt: skip
            assert watched.returncode == 0, watched.stdout + watched.stderr
            reports = [json.loads(line) for line in watched.stdout.splitlines()]
            assert len(reports) >= 3 and all(r["healthy"] for r in reports)
            assert reports[-1]["partitions"] == PARTITIONS

            victim = 3
            cluster.kill(victim)
            down = await wait_for(
                admin, lambda h: h.nodes_down == (victim,) and h.leaderless_count == 0
            )
            assert not down.healthy
            assert "nodes down" in down.reasons
            assert "under-replicated partitions" in down.reasons
            # Every partition has a replica on the dead node, so each is under-replicated.
            assert down.under_replicated_count == PARTITIONS
            assert len(down.under_replicated) == SAMPLE
            assert down.out_of_sync == {victim: PARTITIONS}

            shown = cli("--bootstrap", cluster.address(1))
            assert shown.returncode == 2, shown.stderr
            assert "nodes down:" in shown.stdout
            assert f"under-replicated ({PARTITIONS}):" in shown.stdout
            assert shown.stdout.splitlines()[0].split() == [
                "healthy:",
                "no",
                "(nodes",
                "down,",
                "under-replicated",
                "partitions)",
            ]

            await produce(cluster.bootstrap, 300)  # written while the victim is away
            cluster.start_node(victim)
            # Asked first, the returning node answers clients before it joins the cluster:
            # its answer (or the node the client asks instead) never calls a peer down.
            views = await views_from(cluster.address(victim), seconds=3.0)
            assert views and all(set(h.nodes_down) <= {victim} for h in views), views
            waited = cli(
                "--exit-when-healthy", "--interval", "0.2", "--timeout", "60",
                "--bootstrap", cluster.address(1),
            )  # fmt: skip
            assert waited.returncode == 0, waited.stdout + waited.stderr
            assert waited.stdout.startswith("healthy:") and "yes" in waited.stdout.splitlines()[0]

            # Healthy means caught up: on an idle cluster every replica of the returning node
            # holds every record.
            status = await admin.cluster_status()
            assert len(status.partitions) == PARTITIONS
            for part in status.partitions:
                lags = {r.node_id: r.lag for r in part.replicas}
                assert lags.get(victim) == 0, part
    finally:
        cluster.stop()


def test_a_malformed_peer_part_counts_as_not_answering() -> None:
    health = Health(metadata_leader=1, nodes=[1, 2, 3], nodes_down=[])
    led: set[tuple[str, int]] = set()
    good = {
        "led": {"t": [0, 1]},
        "under_count": 1,
        "under": [["t", 1]],
        "out_of_sync": {"3": 1},
        "fault_count": 0,
        "faults": [],
    }
    health.add(1, good, led)
    for peer, bad in (
        (2, None),
        (2, {"led": {"t": ["x"]}}),
        (3, {**good, "under": [["t"]]}),
        (3, {**good, "out_of_sync": {"three": 1}}),
        (3, {**good, "under_count": -1}),
        (3, {**good, "led": {"t": [1 << 32]}}),
    ):
        health.add(peer, bad, led)
    assert led == {("t", 0), ("t", 1)}
    assert health.not_answering == [2, 2, 3, 3, 3, 3]
    assert health.under_count == 1 and health.out_of_sync == {3: 1}
    assert "nodes not answering" in health.reasons
