"""Consumer groups on a real local cluster: offset commit rate and reassignment time.

A 3-node cluster (session timeout 3 s, heartbeat interval 0.5 s) and, each in its own process,
through the public API (`laminar.client.Consumer` with a ``group_id``):

* **commits/s, one consumer**: one member of a group owning a 12-partition topic commits as
  fast as it can (``--inflight`` concurrent ``commit()`` calls, each acknowledged only once
  replicated like an ``acks=all`` write);
* **commits/s, ten consumers**: ten such processes, each in its own group (groups spread over
  the coordinator shards, as independent applications would);
* **baseline**: the same number of acks=all writes of one 100-byte record each, pipelined the
  same way from one process over the raw client protocol: the replicated write path without
  the coordinator;
* **reassignment**: ten members share a 120-partition topic under a steady producer; an
  eleventh joins (how long did the others' partitions go unread meanwhile, against the gaps
  before it), then one member is SIGKILLed: the time until every partition it owned has been
  read again by another member (goal: session timeout + 1 s).

The last line is one JSON object.

    python bench/group_bench.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laminar.client import Admin, Consumer, Producer
from laminar.client.connection import Connection
from laminar.client.localcluster import LocalCluster, free_port_pairs
from laminar.segment.batch import build_batch

SESSION_S = 3.0
HEARTBEAT_S = 0.5
COMMIT_TOPIC = "commits"
FLOW_TOPIC = "flow"
FLOW_PARTITIONS = 120


# --------------------------------------------------------------------------- worker processes


async def commit_worker(bootstrap: str, group: str, seconds: float, inflight: int) -> None:
    """Join ``group``, then commit as fast as ``inflight`` concurrent commits allow."""
    async with Consumer(bootstrap, group_id=group, enable_auto_commit=False) as consumer:
        await consumer.subscribe([COMMIT_TOPIC])
        while not consumer.assignment():
            await consumer.getmany(timeout_ms=100)
        owned = sorted(consumer.assignment())
        done = 0
        deadline = time.perf_counter() + seconds

        async def loop(worker: int) -> None:
            nonlocal done
            offset = worker
            while time.perf_counter() < deadline:
                tp = owned[offset % len(owned)]
                await consumer.commit({tp: offset})
                offset += inflight
                done += 1

        start = time.perf_counter()
        await asyncio.gather(*(loop(i) for i in range(inflight)))
        print(json.dumps({"commits": done, "seconds": time.perf_counter() - start}), flush=True)


async def member_worker(bootstrap: str, group: str, out: Path) -> None:
    """Read ``FLOW_TOPIC`` as a group member until SIGTERM; log every read and assignment."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    with out.open("a") as log:

        def event(kind: str, tps: Any) -> None:
            parts = sorted(tp.partition for tp in tps)
            log.write(json.dumps({"t": time.time(), "event": kind, "parts": parts}) + "\n")
            log.flush()

        consumer = Consumer(
            bootstrap,
            group_id=group,
            auto_offset_reset="latest",
            max_wait_ms=100,
            on_partitions_assigned=lambda tps: event("assigned", tps),
            on_partitions_revoked=lambda tps: event("revoked", tps),
        )
        async with consumer:
            await consumer.subscribe([FLOW_TOPIC])
            while not stop.is_set():
                records = await consumer.getmany(timeout_ms=100)
                if records:
                    parts = sorted({r.partition for r in records})
                    log.write(json.dumps({"t": time.time(), "read": parts}) + "\n")
                    log.flush()


async def produce_worker(bootstrap: str, rate: int) -> None:
    """Write ``rate`` records/s spread over every partition of ``FLOW_TOPIC`` until killed."""
    async with Producer(bootstrap, acks="all", linger_ms=5) as producer:
        n = 0
        start = time.perf_counter()
        while True:
            await producer.send(FLOW_TOPIC, b"x" * 100, partition=n % FLOW_PARTITIONS)
            n += 1
            ahead = n / rate - (time.perf_counter() - start)
            if ahead > 0:
                await asyncio.sleep(ahead)


def spawn(*args: str, stdout: Any = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", *args],
        stdout=stdout,
        stderr=subprocess.DEVNULL,
        text=True,
    )


# --------------------------------------------------------------------------- measurements


async def baseline_writes(bootstrap: str, seconds: float, inflight: int) -> float:
    """acks=all writes of one 100-byte record, ``inflight`` at a time, round robin over the
    commit topic's partition leaders (raw protocol: no client-side batching)."""
    async with Admin(bootstrap) as admin:
        description = await admin.describe_topic(COMMIT_TOPIC)
        brokers = (await admin.cluster.refresh_metadata()).brokers
    connections = {n: await Connection.open(a) for n, a in brokers.items()}
    batch = build_batch([(None, b"x" * 100, (), int(time.time() * 1000))])
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop(worker: int) -> None:
        nonlocal done
        i = worker
        while time.perf_counter() < deadline:
            part = description.partitions[i % len(description.partitions)]

            def fill(body: Any, partition: int = part.partition) -> None:
                request = body.init("produce")
                request.acks = -1
                request.timeoutMs = 10_000
                ref = request.init("batches", 1)[0]
                ref.topic, ref.partition = COMMIT_TOPIC, partition
                ref.payloadOffset, ref.payloadLength = 0, len(batch)

            await connections[part.leader].request(fill, [batch], timeout=10)
            i += inflight
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(inflight)))
    elapsed = time.perf_counter() - start
    for connection in connections.values():
        connection.close()
    return done / elapsed


def commit_rate(bootstrap: str, consumers: int, seconds: float, inflight: int) -> float:
    procs = [
        spawn("commit", bootstrap, f"rate-{consumers}-{i}", str(seconds), str(inflight))
        for i in range(consumers)
    ]
    results = [
        json.loads(p.communicate(timeout=seconds + 60)[0].strip().splitlines()[-1]) for p in procs
    ]
    return sum(r["commits"] / r["seconds"] for r in results)


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def owned_by(path: Path) -> set[int]:
    owned: set[int] = set()
    for entry in read_log(path):
        if entry.get("event") == "assigned":
            owned |= set(entry["parts"])
        elif entry.get("event") == "revoked":
            owned -= set(entry["parts"])
    return owned


def last_reads(path: Path, since: float, until: float) -> dict[int, list[float]]:
    reads: dict[int, list[float]] = {}
    for entry in read_log(path):
        if "read" in entry and since <= entry["t"] <= until:
            for part in entry["read"]:
                reads.setdefault(part, []).append(entry["t"])
    return reads


def max_gap(times: list[float], start: float, end: float) -> float:
    points = [start, *sorted(times), end]
    return max(b - a for a, b in itertools.pairwise(points))


async def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


async def reassignment(bootstrap: str, work: Path, settle: float) -> dict[str, float]:
    logs = [work / f"member-{i}.jsonl" for i in range(11)]
    producer = spawn("produce", bootstrap, "3000", stdout=subprocess.DEVNULL)
    members = [spawn("member", bootstrap, "flow-group", str(logs[i])) for i in range(10)]
    try:
        everything = set(range(FLOW_PARTITIONS))
        await wait_until(
            lambda: (
                set().union(*(owned_by(p) for p in logs[:10])) == everything
                and all(owned_by(p) for p in logs[:10])
            ),
            60,
            "ten members never owned every partition",
        )
        await asyncio.sleep(settle)
        before = {i: owned_by(logs[i]) for i in range(10)}
        # An eleventh member joins: partitions the others keep must keep being read.
        joined_at = time.time()
        members.append(spawn("member", bootstrap, "flow-group", str(logs[10])))
        await wait_until(lambda: len(owned_by(logs[10])) >= 10, 30, "the new member got nothing")
        await asyncio.sleep(settle)
        stable_at = time.time()
        gap_during = gap_before = 0.0
        for i in range(10):
            kept = before[i] & owned_by(logs[i])
            during = last_reads(logs[i], joined_at, stable_at)
            earlier = last_reads(logs[i], joined_at - settle, joined_at)
            for part in kept:
                gap_during = max(gap_during, max_gap(during.get(part, []), joined_at, stable_at))
                gap_before = max(
                    gap_before, max_gap(earlier.get(part, []), joined_at - settle, joined_at)
                )
        # SIGKILL one member: how long until another member reads each of its partitions?
        victim = 0
        orphaned = owned_by(logs[victim])
        members[victim].kill()
        killed_at = time.time()

        def reassigned() -> bool:
            seen: set[int] = set()
            for i in range(1, 11):
                seen |= set(last_reads(logs[i], killed_at, time.time()))
            return orphaned <= seen

        await wait_until(reassigned, 30, "the killed member's partitions were never read again")
        read_again: dict[int, float] = {}
        for i in range(1, 11):
            for part, times in last_reads(logs[i], killed_at, time.time()).items():
                if part in orphaned:
                    read_again[part] = min(read_again.get(part, 1e18), min(times))
        return {
            "reassign_after_kill_s": round(max(read_again.values()) - killed_at, 2),
            "moved_partitions": len(orphaned),
            "join_max_gap_kept_partitions_s": round(gap_during, 3),
            "steady_max_gap_s": round(gap_before, 3),
        }
    finally:
        for proc in [producer, *members]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [producer, *members]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


async def main(args: argparse.Namespace) -> dict[str, Any]:
    seconds = 3.0 if args.quick else 10.0
    with tempfile.TemporaryDirectory(prefix="group-bench-") as tmp:
        work = Path(tmp)
        cluster = LocalCluster(
            work / "cluster",
            free_port_pairs(3),
            log_level="warning",
            extra_args=[
                "--group-session-timeout",
                str(SESSION_S),
                "--group-heartbeat-interval",
                str(HEARTBEAT_S),
            ],
        )
        cluster.start()
        try:
            await cluster.wait_ready(60)
            bootstrap = cluster.bootstrap
            async with Admin(bootstrap) as admin:
                await admin.create_topic(COMMIT_TOPIC, partitions=12, replication_factor=3)
                await admin.create_topic(
                    FLOW_TOPIC, partitions=FLOW_PARTITIONS, replication_factor=3
                )
                for topic in (COMMIT_TOPIC, FLOW_TOPIC):
                    while not all(p.leader for p in (await admin.describe_topic(topic)).partitions):
                        await asyncio.sleep(0.1)
            figures: dict[str, Any] = {
                "cluster": "3 nodes, RF 3, one machine",
                "client": "laminar.client.Consumer.commit, one process per consumer",
                "inflight_per_consumer": args.inflight,
                "session_timeout_s": SESSION_S,
            }
            figures["baseline_acks_all_1_record_writes_per_s"] = round(
                await baseline_writes(bootstrap, seconds, args.inflight)
            )
            figures["commits_per_s_1_consumer"] = round(
                commit_rate(bootstrap, 1, seconds, args.inflight)
            )
            figures["commits_per_s_10_consumers"] = round(
                commit_rate(bootstrap, 10, seconds, args.inflight)
            )
            figures.update(await reassignment(bootstrap, work, 2.0 if args.quick else 5.0))
        finally:
            cluster.stop()
    return figures


def worker(argv: list[str]) -> None:
    kind, bootstrap, *rest = argv
    if kind == "commit":
        group, seconds, inflight = rest
        coro = commit_worker(bootstrap, group, float(seconds), int(inflight))
    elif kind == "member":
        group, path = rest
        coro = member_worker(bootstrap, group, Path(path))
    elif kind == "produce":
        coro = produce_worker(bootstrap, int(rest[0]))
    else:
        raise SystemExit(f"unknown worker {kind}")
    uvloop.run(coro)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2:])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s per rate instead of 10 s")
    parser.add_argument("--inflight", type=int, default=64, help="concurrent commits per consumer")
    result = uvloop.run(main(parser.parse_args()))
    print(json.dumps(result))
    os._exit(0)
