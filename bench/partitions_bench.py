"""Many active partitions: the same acks=all workload over 3 and over 300 partitions.

One 3-node cluster (RF 3) on this machine, two topics (3 and 300 partitions), measured
back-to-back in one run:

* **saturated**: a fixed number of records in flight (default 20,000), spread evenly over the
  topic's partitions; one produce request per leader node carries one pre-built batch per
  partition it leads (as the ``Producer`` sends them), a few requests in flight per node.
  Records/s, request p50/p99, node CPU-µs per record.
* **paced**: the same topic at a fixed offered rate (default 100,000 records/s): a request per
  leader node every ``--tick-ms``; p50/p99 of the acknowledgements. A rate the nodes cannot
  keep stops once 2 s of requests wait for answers and is reported ``saturated``.

The client is lean (pre-built batches) so the figures measure the nodes' data path, not
Python record encoding. In the same run it measures the raw disk: ``N`` files with a small
append each, fdatasynced one after another vs by a pool of threads (what a group-commit pass
over ``N`` dirty partition logs costs). The last line is one JSON object.

    python bench/partitions_bench.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laminar.client import Admin
from laminar.client.connection import Connection
from laminar.client.localcluster import LocalCluster, free_port_pairs
from laminar.errors import NotLeaderError
from laminar.protocol import read_error
from laminar.segment.batch import build_batch

RECORD = b"x" * 100
BACKLOG_S = 2.0
"""Paced phase: requests waiting for answers, in seconds of the offered rate, before it stops."""


def fsync_passes(directory: Path, files: int, workers: int, rounds: int) -> dict[str, Any]:
    """``rounds`` times, alternating on the same files: append 4 KiB to each of ``files``
    files and fdatasync them one after another, then append again and fdatasync them on a
    pool of ``workers`` threads (what a group-commit pass over that many dirty logs costs,
    serial vs pooled, interleaved so disk noise hits both alike): pass p50/p99 in ms."""
    root = Path(tempfile.mkdtemp(dir=directory))
    fds = [os.open(root / f"f{i}", os.O_WRONLY | os.O_CREAT, 0o644) for i in range(files)]
    block = b"z" * 4096
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    serial: list[float] = []
    pooled: list[float] = []
    try:
        for fd in fds:  # the files exist on disk before anything is timed
            os.fsync(fd)
        for _ in range(rounds):
            for fd in fds:
                os.write(fd, block)
            started = time.perf_counter()
            for fd in fds:
                os.fdatasync(fd)
            serial.append(time.perf_counter() - started)
            for fd in fds:
                os.write(fd, block)
            started = time.perf_counter()
            list(pool.map(os.fdatasync, fds))
            pooled.append(time.perf_counter() - started)
    finally:
        pool.shutdown()
        for fd in fds:
            os.close(fd)
        shutil.rmtree(root)

    def summary(passes: list[float]) -> dict[str, float]:
        passes.sort()
        return {
            "pass_p50_ms": round(passes[len(passes) // 2] * 1000, 2),
            "pass_p99_ms": round(passes[int(len(passes) * 0.99)] * 1000, 2),
        }

    return {
        f"{files}_files_serial": summary(serial),
        f"{files}_files_{workers}_threads": summary(pooled),
    }


def disk_baseline(directory: Path, workers: int, quick: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for files in (3, 300):
        rounds = (100 if quick else 300) if files == 3 else (15 if quick else 40)
        out.update(fsync_passes(directory, files, workers, rounds))
    return out


def nodes_cpu_seconds(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / ticks


class Workload:
    """One topic's leaders and one connection per node. A NotLeader answer counts as a
    failed batch (``not_leader``) and makes a background task look the leaders up again."""

    def __init__(self, topic: str, bootstrap: str, addresses: dict[int, str]):
        self.topic = topic
        self.bootstrap = bootstrap
        self.leaders: dict[int, list[int]] = {}  # node id -> partitions it leads
        self.addresses = addresses
        self.connections: dict[int, Connection] = {}
        self.not_leader = 0
        self.leaderless = 0
        self.led_after_s = 0.0
        self._parts: list[Any] = []
        self._stale = asyncio.Event()
        self._refresher: asyncio.Task[None] | None = None

    async def open(self, timeout: float = 120) -> None:
        """Wait until every partition has a leader, connect to every node."""
        for node, address in self.addresses.items():
            self.connections[node] = await Connection.open(address)
        started = time.monotonic()
        await self._lookup(timeout)
        self.led_after_s = round(time.monotonic() - started, 2)
        self.leaderless = len(self._parts) - sum(len(led) for led in self.leaders.values())
        self._refresher = asyncio.create_task(self._refresh())

    async def _lookup(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with Admin(self.bootstrap) as admin:
            while True:
                parts = (await admin.describe_topic(self.topic)).partitions
                if all(p.leader for p in parts) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        self._parts = parts
        leaders: dict[int, list[int]] = {node: [] for node in self.addresses}
        for p in parts:
            if p.leader:
                leaders[p.leader].append(p.partition)
        self.leaders = leaders

    async def _refresh(self) -> None:
        while True:
            await self._stale.wait()
            await asyncio.sleep(0.2)
            self._stale.clear()
            await self._lookup(5)

    def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        for connection in self.connections.values():
            connection.close()
        self.connections.clear()

    async def request(self, node: int, batch: bytes, records: int) -> tuple[float, int]:
        """One produce request with ``batch`` for every partition ``node`` leads: (latency,
        records acknowledged)."""
        partitions = list(self.leaders.get(node, ()))
        if not partitions:
            await asyncio.sleep(0.05)
            return 0.0, 0
        topic = self.topic

        def fill(body: Any) -> None:
            request = body.init("produce")
            request.acks = -1
            request.timeoutMs = 30_000
            refs = request.init("batches", len(partitions))
            for i, (ref, partition) in enumerate(zip(refs, partitions, strict=True)):
                ref.topic = topic
                ref.partition = partition
                ref.payloadOffset = i * len(batch)
                ref.payloadLength = len(batch)

        started = time.perf_counter()
        reply, _ = await self.connections[node].request(fill, [batch] * len(partitions))
        acked = 0
        for result in reply.body.produce.results:
            error = read_error(result.error)
            if error is None:
                acked += records
            elif isinstance(error, NotLeaderError):
                self.not_leader += 1
                self._stale.set()
            else:
                raise error
        return time.perf_counter() - started, acked


def _batch(records: int) -> bytes:
    now = int(time.time() * 1000)
    return build_batch([(None, RECORD, (), now)] * max(1, records))


def _summary(latencies: list[float], records: int, elapsed: float) -> dict[str, float]:
    latencies.sort()
    if not latencies:  # nothing acknowledged (every answer was NotLeader)
        return {"records_per_s": 0, "p50_ms": None, "p99_ms": None}
    return {
        "records_per_s": round(records / elapsed),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
    }


async def saturated(work: Workload, partitions: int, seconds: float, in_flight: int, per_node: int):
    """``in_flight`` records in flight over all partitions, ``per_node`` requests per node."""
    records_per_batch = max(1, in_flight // (partitions * per_node))
    batch = _batch(records_per_batch)
    latencies: list[float] = []
    acked = 0
    deadline = time.perf_counter() + seconds

    async def lane(node: int) -> None:
        nonlocal acked
        while time.perf_counter() < deadline:
            latency, count = await work.request(node, batch, records_per_batch)
            if count:
                latencies.append(latency)
                acked += count

    started = time.perf_counter()
    await asyncio.gather(*(lane(n) for n in work.addresses for _ in range(per_node)))
    result = _summary(latencies, acked, time.perf_counter() - started)
    result["records_per_batch"] = records_per_batch
    return result, acked


async def paced(work: Workload, partitions: int, seconds: float, rate: int, tick: float):
    """A request per leader node every ``tick`` s carrying ``rate`` records/s in all. Once
    more than ``BACKLOG_S`` of requests wait for answers the nodes cannot keep this rate:
    the phase stops there and says ``saturated`` (a growing backlog only measures itself)."""
    records_per_batch = max(1, round(rate * tick / partitions))
    batch = _batch(records_per_batch)
    latencies: list[float] = []
    acked = 0
    failed = 0
    pending: set[asyncio.Task[tuple[float, int]]] = set()

    def done(task: asyncio.Task[tuple[float, int]]) -> None:
        nonlocal acked, failed
        pending.discard(task)
        if task.cancelled() or task.exception() is not None:
            failed += 1
            return
        latency, count = task.result()
        if count:
            latencies.append(latency)
            acked += count

    started = time.perf_counter()
    next_at = started
    saturated = False
    most_pending = BACKLOG_S / tick * len(work.addresses)
    while next_at - started < seconds:
        if len(pending) > most_pending:
            saturated = True
            break
        for node, led in work.leaders.items():
            if led:
                task = asyncio.ensure_future(work.request(node, batch, records_per_batch))
                pending.add(task)
                task.add_done_callback(done)
        next_at += tick
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    offered_for = time.perf_counter() - started
    if pending:
        await asyncio.wait(pending, timeout=30)
    result = _summary(latencies, acked, time.perf_counter() - started)
    result["offered_records_per_s"] = round(records_per_batch * partitions / tick)
    if saturated:
        result["saturated"] = True
        result["offered_for_s"] = round(offered_for, 2)
    if failed:
        result["failed_requests"] = failed
    return result, acked


async def run(args: argparse.Namespace, root: Path, tree: Path) -> dict[str, Any]:
    """Both topics on a fresh 3-node cluster running the laminar source tree ``tree``."""
    pairs = free_port_pairs(3)
    cluster = LocalCluster(
        root, pairs, log_level="warning", node_env=lambda _: {"PYTHONPATH": str(tree)}
    )
    cluster.start()
    try:
        await cluster.wait_ready(60)
        addresses = {i + 1: a for i, a in enumerate(cluster.bootstrap.split(","))}
        pids = [node.pid for node in cluster.nodes.values() if node.pid is not None]
        works: dict[int, Workload] = {}
        async with Admin(cluster.bootstrap) as admin:
            for partitions in args.partitions:
                topic = f"p{partitions}"
                await admin.create_topic(topic, partitions=partitions, replication_factor=3)
                works[partitions] = Workload(topic, cluster.bootstrap, addresses)
        for work in works.values():  # every topic led before anything is measured
            await work.open()
            work.close()
        await asyncio.sleep(2)
        out: dict[str, Any] = {}
        for _ in range(args.repeat):
            for partitions, work in works.items():
                await work.open()
                try:
                    for node in work.addresses:  # warm up
                        await work.request(node, _batch(1), 1)
                    figures: dict[str, Any] = {}
                    cpu = nodes_cpu_seconds(pids)
                    figures["saturated"], acked = await saturated(
                        work, partitions, args.seconds, args.in_flight, args.per_node
                    )
                    figures["saturated"]["node_cpu_us_per_record"] = round(
                        (nodes_cpu_seconds(pids) - cpu) / max(1, acked) * 1e6, 2
                    )
                    cpu = nodes_cpu_seconds(pids)
                    figures["paced"], acked = await paced(
                        work, partitions, args.seconds, args.rate, args.tick_ms / 1000
                    )
                    figures["paced"]["node_cpu_us_per_record"] = round(
                        (nodes_cpu_seconds(pids) - cpu) / max(1, acked) * 1e6, 2
                    )
                    figures["not_leader_replies"] = work.not_leader
                    figures["leaderless_at_start"] = work.leaderless
                    figures["all_led_after_s"] = work.led_after_s
                finally:
                    work.close()
                out.setdefault(str(partitions), []).append(figures)
                print(tree, partitions, json.dumps(figures), file=sys.stderr, flush=True)
        return out
    finally:
        cluster.stop()


def summarize(runs: dict[str, list[dict[str, Any]]], few: str, many: str) -> dict[str, Any]:
    def median(key: str, phase: str) -> dict[str, Any]:  # the median round of each phase
        ordered = sorted(runs[key], key=lambda f: f[phase]["records_per_s"])
        return ordered[len(ordered) // 2][phase]

    figures: dict[str, Any] = {}
    for key in (few, many):
        for phase in ("saturated", "paced"):
            for name, value in median(key, phase).items():
                figures[f"p{key}_{phase}_{name}"] = value
    few_rate = figures[f"p{few}_saturated_records_per_s"]
    ratio = figures[f"p{many}_saturated_records_per_s"] / few_rate if few_rate else 0.0
    figures[f"saturated_ratio_{many}_vs_{few}"] = round(ratio, 3)
    return figures


async def main(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    here = Path(__file__).resolve().parent.parent
    few, many = (str(p) for p in args.partitions)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="laminar-pbench-") as tmp:
        root = Path(tmp)
        out["disk"] = disk_baseline(root, args.disk_threads, args.quick)
        if args.baseline_tree is not None:  # first, then this tree: back to back, same run
            runs = await run(args, root / "baseline", args.baseline_tree.resolve())
            out["baseline"] = {"tree": str(args.baseline_tree), "runs": runs}
            out["baseline"].update(summarize(runs, few, many))
        runs = await run(args, root / "current", here)
    out["runs"] = runs
    out.update(summarize(runs, few, many))
    return {
        **out,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "client": (
            f"lean: pre-built batches, one request per leader node with a batch per partition "
            f"it leads; {args.in_flight} records in flight, {args.per_node} requests per node"
        ),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (about a minute)")
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--partitions", type=int, nargs=2, default=[3, 300])
    parser.add_argument("--in-flight", type=int, default=20_000)
    parser.add_argument("--per-node", type=int, default=4, help="requests in flight per node")
    parser.add_argument("--rate", type=int, default=100_000, help="paced records/s")
    parser.add_argument("--tick-ms", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=None, help="A/B rounds (median kept)")
    parser.add_argument("--disk-threads", type=int, default=16)
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="also run the nodes from this laminar source tree first (e.g. a main checkout)",
    )
    arguments = parser.parse_args()
    if arguments.seconds is None:
        arguments.seconds = 5.0 if arguments.quick else 10.0
    if arguments.repeat is None:
        arguments.repeat = 1 if arguments.quick else 3
    print(json.dumps(uvloop.run(main(arguments))))
