"""Cluster scale: a many-partition topic on a real 3-node cluster, measured as a user meets it.

One run measures a small baseline topic (``--baseline``, 30 partitions) and then the big one
(``--partitions``), each on a fresh 3-node ``LocalCluster`` with replication factor 3, through
the public ``Admin`` and ``Producer`` only:

- ``create_s``: ``create_topic`` until it answers;
- ``all_led_s``: from the create until ``describe_topic`` names a leader for every partition
  *and* ``cluster status`` lists every partition as led (the leaders' own view);
- ``describe_s`` / ``status_s`` / ``health_s``: latency of those calls once all are led
  (median of 3);
- ``idle_cpu_pct`` / ``rss_mib`` per node: CPU over an idle window (% of one core) and memory;
- ``first_write_s``: one acks=all record to every partition;
- ``failover_s``: SIGKILL of the node leading most partitions, until every partition has
  accepted an acks=all record again (the producer was running before the kill, so election
  and the client's discovery of the new leaders both count);
- ``restart_ready_s``: the killed node restarted, until ``cluster health`` says the cluster is
  whole again (the node up, every partition led, every replica in sync and serving);
- with ``--data-gib G`` (default 10 without ``--quick``): the big topic filled to G GiB with
  1,000-byte records (``Producer.send_many``), every replica caught up, node 1 SIGKILLed and
  restarted: ``restart_with_data_s`` until ``cluster health`` is whole again, beside the
  node's bytes on disk and ``restart_ready_s`` (the same restart without the data) as the
  baseline of the same run;
- ``cpu_s`` per phase and node: CPU-seconds, steadier than wall time on a loaded machine.

Every phase notes the load average. The last line printed is one JSON object.

    python bench/scale_bench.py --partitions 3000 --quick
    python bench/scale_bench.py --partitions 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laminar.client import Admin, Producer
from laminar.client.localcluster import LocalCluster, free_port_pairs

TOPIC = "scale"
DATA_VALUE_BYTES = 1000
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU of a process so far."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mib(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return 0.0


def load() -> float:
    return round(os.getloadavg()[0], 2)


class CpuMeter:
    """CPU-seconds each node process spent between two readings (a restarted node counts
    from its new process's start; a dead one is left out)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.start = self._read()

    def _read(self) -> dict[int, tuple[int | None, float]]:
        return {
            n: (node.pid if node.running else None, cpu_seconds(node.pid) if node.running else 0.0)
            for n, node in self.cluster.nodes.items()
        }

    def lap(self) -> dict[str, float]:
        now = self._read()
        spent = {}
        for n, (pid, seconds) in now.items():
            if pid is None:
                continue
            before_pid, before = self.start.get(n, (None, 0.0))
            spent[str(n)] = round(seconds - (before if before_pid == pid else 0.0), 2)
        self.start = now
        return spent


async def timed(call: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await call
    return time.perf_counter() - started, result


async def wait_all_led(admin: Admin, partitions: int, timeout: float) -> tuple[bool, int, int]:
    """Until describe_topic and cluster status both show a leader for every partition;
    returns (all led, led per describe, led per status) as last seen."""
    deadline = time.monotonic() + timeout
    described = statused = 0
    while time.monotonic() < deadline:
        try:
            topic = await admin.describe_topic(TOPIC)
            described = sum(1 for p in topic.partitions if p.leader)
            if described == partitions:
                status = await admin.cluster_status()
                statused = len({p.partition for p in status.partitions if p.topic == TOPIC})
                if statused == partitions:
                    return True, described, statused
        except Exception:  # a node busy creating may time out: ask again
            pass
        await asyncio.sleep(0.2)
    return False, described, statused


async def write_everywhere(producer: Producer, partitions: int, timeout: float) -> float:
    """One acks=all record to every partition; seconds until all are acknowledged."""
    started = time.perf_counter()
    futures = [await producer.send(TOPIC, b"x" * 100, partition=p) for p in range(partitions)]
    try:
        await asyncio.wait_for(asyncio.gather(*futures), timeout)
    except TimeoutError:
        return float("nan")  # (reported as NaN: not all within the bound)
    return time.perf_counter() - started


async def restart_ready(cluster: LocalCluster, admin: Admin, node_id: int, timeout: float) -> float:
    """Restart ``node_id``; seconds until ``cluster health`` says the cluster is whole again:
    the node up and answering, every partition led, every replica in sync and serving.

    Polled every 0.25 s, as a rolling-restart script would poll it. ``cluster health`` answers
    in counts, so polling it costs the nodes little (``health_s`` against ``status_s``); a
    leader too busy to answer makes the cluster unhealthy (nodes not answering), never a
    partition pass for caught up."""
    started = time.perf_counter()
    cluster.start_node(node_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        try:
            health = await admin.cluster_health()
        except Exception:  # the answering node busy past the request timeout
            continue
        if health.healthy:
            return time.perf_counter() - started
    return float("nan")


async def wait_caught_up(admin: Admin, timeout: float) -> bool:
    """Until every replica holds every record its leader has (lag 0 everywhere)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = await admin.cluster_status()
            if all(r.lag == 0 for p in status.partitions for r in p.replicas):
                return True
        except Exception:  # a busy node may time out: ask again
            pass
        await asyncio.sleep(0.5)
    return False


def bytes_under(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def restart_with_data(
    cluster: LocalCluster, admin: Admin, partitions: int, gib: float, meter: CpuMeter
) -> dict[str, Any]:
    """Fill the topic to ``gib`` GiB, let every replica catch up, SIGKILL node 1 and restart
    it: seconds until the cluster is whole again (``restart_ready``)."""
    value = os.urandom(DATA_VALUE_BYTES)
    per_partition = max(1, round(gib * (1 << 30) / partitions / DATA_VALUE_BYTES))
    started = time.perf_counter()
    async with Producer(
        cluster.bootstrap, acks="all", linger_ms=5, delivery_timeout_ms=600_000
    ) as producer:
        pending: deque[Any] = deque()
        for p in range(partitions):
            pending.append(await producer.send_many(TOPIC, [value] * per_partition, partition=p))
            if len(pending) >= 64:
                await pending.popleft()
        for delivery in pending:
            await delivery
    filled = time.perf_counter() - started
    out: dict[str, Any] = {
        "data_fill_mib_s": round(gib * 1024 / filled, 1),
        "data_caught_up": await wait_caught_up(admin, 600),
        "data_bytes_node_1": bytes_under(cluster.nodes[1].data_dir),
    }
    cluster.kill_node(1)
    await asyncio.sleep(1.0)
    meter.lap()
    out["load_restart_with_data"] = load()
    out["restart_with_data_s"] = await restart_ready(cluster, admin, 1, 300)
    out["cpu_s_restart_with_data"] = meter.lap()
    return out


async def measure(
    partitions: int, idle_seconds: float, led_timeout: float, data_gib: float = 0.0
) -> dict[str, Any]:
    out: dict[str, Any] = {"partitions": partitions}
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as root:
        cluster = LocalCluster(Path(root), free_port_pairs(3), log_level="warning")
        cluster.start()
        try:
            await cluster.wait_ready(60)
            meter = CpuMeter(cluster)
            async with Admin(cluster.bootstrap, request_timeout_ms=60_000) as admin:
                out["load_create"] = load()
                out["create_s"], _ = await timed(
                    admin.create_topic(TOPIC, partitions=partitions, replication_factor=3)
                )
                out["all_led_s"], (ok, described, statused) = await timed(
                    wait_all_led(admin, partitions, led_timeout)
                )
                out["all_led_s"] += out["create_s"]
                out["all_led"] = ok
                if not ok:
                    out["led_describe"], out["led_status"] = described, statused
                out["cpu_s_create"] = meter.lap()
                out["load_led"] = load()
                describe = [(await timed(admin.describe_topic(TOPIC)))[0] for _ in range(3)]
                status = [(await timed(admin.cluster_status()))[0] for _ in range(3)]
                health = [(await timed(admin.cluster_health()))[0] for _ in range(3)]
                out["describe_s"] = statistics.median(describe)
                out["status_s"] = statistics.median(status)
                out["health_s"] = statistics.median(health)
                if not ok:
                    return out
                # idle: nothing but the cluster's own upkeep
                await asyncio.sleep(1.0)
                meter.lap()
                out["load_idle"] = load()
                await asyncio.sleep(idle_seconds)
                out["idle_cpu_pct"] = {
                    n: round(100 * s / idle_seconds, 2) for n, s in meter.lap().items()
                }
                out["rss_mib"] = {str(n): rss_mib(node.pid) for n, node in cluster.nodes.items()}
                async with Producer(
                    cluster.bootstrap,
                    acks="all",
                    linger_ms=1,
                    retries=1_000,
                    retry_backoff_ms=50,
                    delivery_timeout_ms=300_000,
                ) as producer:
                    out["first_write_s"] = await write_everywhere(producer, partitions, 300)
                    topic = await admin.describe_topic(TOPIC)
                    leaders = Counter(p.leader for p in topic.partitions)
                    victim, led = leaders.most_common(1)[0]
                    out["victim"], out["victim_led"] = victim, led
                    meter.lap()
                    out["load_failover"] = load()
                    killed = time.perf_counter()
                    cluster.kill_node(victim)
                    written = await write_everywhere(producer, partitions, 300)
                    # (NaN when not every partition took its write within the bound)
                    out["failover_s"] = (
                        written if math.isnan(written) else time.perf_counter() - killed
                    )
                    out["cpu_s_failover"] = meter.lap()
                out["load_restart"] = load()
                out["restart_ready_s"] = await restart_ready(cluster, admin, victim, 300)
                out["cpu_s_restart"] = meter.lap()
                if data_gib:
                    out["data_gib"] = data_gib
                    out.update(await restart_with_data(cluster, admin, partitions, data_gib, meter))
        finally:
            cluster.stop()
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--baseline", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="short idle window, tighter bounds")
    parser.add_argument(
        "--data-gib",
        type=float,
        default=None,
        help="GiB to fill the big topic with before a restart (default 10; 0 with --quick)",
    )
    args = parser.parse_args()
    idle = 5.0 if args.quick else 15.0
    led_timeout = 120.0 if args.quick else 300.0
    data_gib = args.data_gib if args.data_gib is not None else (0.0 if args.quick else 10.0)
    baseline = await measure(args.baseline, idle, led_timeout)
    print("baseline", json.dumps(baseline), flush=True)
    big = await measure(args.partitions, idle, led_timeout, data_gib)
    print("big", json.dumps(big), flush=True)
    print(json.dumps({"bench": "scale", "quick": args.quick, "baseline": baseline, "big": big}))


if __name__ == "__main__":
    uvloop.run(main())
