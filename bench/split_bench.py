"""Produce throughput on one hot key-range partition before and after an automatic split, and
the pause the split causes to producers.

A 3-node `LocalCluster`; a topic with one range partition (replication factor 3) and an
automatic policy that splits it once a full window has been measured (``--window`` seconds; the
threshold is 1 byte/s, so the split comes right after the window, at most 2 active
partitions). ``--producers`` closed-loop producer processes (default 2; the public `Producer`,
acks=all, many keys, at most ``--in-flight`` records outstanding each) write 100-byte records
throughout; acknowledgement times are wall-clock, comparable across processes. The
baseline is measured in the same run: throughput over the window before the split, on the one
partition; then throughput over as long after the split, on the two children (their leaders
are reported: placement puts them on different nodes). The pause is the latency (send to
acknowledgement) of records sent from one second before the split began until one second after
it finished: p50, p99 and max, against p99 of the baseline window. On a 2-core machine the
three node processes and the clients share two cores, and with replication factor 3 every node
handles every record whoever leads: a split spreads the leaders' share of the work, not the
followers', so throughput can grow only where a leader, not the machine, was the limit.

    python bench/split_bench.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laminar.client import Admin, Producer
from laminar.client.localcluster import LocalCluster, free_port_pairs

TOPIC = "hot"
VALUE = b"x" * 100


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run(window: float, in_flight: int, producers: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="split-bench-"))
    cluster = LocalCluster(work / "laminar", free_port_pairs(3), log_level="warning")
    cluster.start()
    try:
        await cluster.wait_ready(60)
        bootstrap = cluster.bootstrap
        async with Admin(bootstrap) as admin:
            await admin.create_topic(
                TOPIC,
                1,
                3,
                partitioning="range",
                auto_split_above=1,
                auto_window_ms=int(window * 1000),
                max_partitions=2,
            )
            while not (await admin.describe_topic(TOPIC)).partitions[0].leader:
                await asyncio.sleep(0.1)
            return await measure(admin, bootstrap, window, in_flight, producers, work)
    finally:
        cluster.stop()


def worker(bootstrap: str, in_flight: int, stop_file: str, out_file: str, seed: int) -> None:
    """One producer process: writes until ``stop_file`` exists, then saves (sent, acked)
    wall-clock pairs (time.time: comparable across processes) to ``out_file``."""
    uvloop.run(_produce(bootstrap, in_flight, Path(stop_file), Path(out_file), seed))


async def _produce(bootstrap: str, in_flight: int, stop: Path, out: Path, seed: int) -> None:
    acks: list[tuple[float, float]] = []
    slots = asyncio.Semaphore(in_flight)
    clock = time.time
    async with Producer(bootstrap, acks="all", linger_ms=2) as producer:

        def done(sent: float, future: Any) -> None:
            slots.release()
            if future.exception() is None:
                acks.append((sent, clock()))

        n = 0
        while not stop.exists():
            for _ in range(200):
                await slots.acquire()
                sent = clock()
                key = b"k%d-%d" % (seed, n % 10_000)
                future = await producer.send(TOPIC, VALUE, key=key)
                future.add_done_callback(lambda f, sent=sent: done(sent, f))
                n += 1
        await producer.flush()
    out.write_text(json.dumps(acks))


async def measure(
    admin: Admin, bootstrap: str, window: float, in_flight: int, producers: int, work: Path
) -> dict[str, Any]:
    stop = work / "stop"
    outs = [work / f"acks-{i}.json" for i in range(producers)]
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=worker, args=(bootstrap, in_flight, str(stop), str(out), i))
        for i, out in enumerate(outs)
    ]
    for process in processes:
        process.start()
    clock = time.time
    start = clock()
    began = finished = None
    while finished is None:
        description = await admin.describe_topic(TOPIC)
        if began is None and (description.operation is not None or len(description.active) > 1):
            began = clock()
        if len(description.active) > 1:
            finished = clock()
            began = began or finished
        elif clock() - start > 10 * window + 60:
            stop.touch()
            raise RuntimeError("no automatic split happened")
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0 + window)
    stop.touch()
    for process in processes:
        await asyncio.to_thread(process.join, 120)
    acks = [tuple(pair) for out in outs for pair in json.loads(out.read_text())]
    leaders = [p.leader for p in (await admin.describe_topic(TOPIC)).active]

    def rate(lo: float, hi: float) -> float:
        return sum(1 for _s, a in acks if lo <= a < hi) / (hi - lo)

    first_ack = min(a for _s, a in acks)
    warm = first_ack + 1.0
    before = rate(warm, began)
    after = rate(finished + 1.0, finished + 1.0 + window)
    across = [a - s for s, a in acks if began - 1.0 <= s <= finished + 1.0]
    baseline = [a - s for s, a in acks if warm <= s < began - 1.0]
    return {
        "bench": "split",
        "window_s": window,
        "client": f"{producers} Python Producer process(es), acks=all, {in_flight} in flight each",
        "before_records_per_s": round(before),
        "after_records_per_s": round(after),
        "speedup": round(after / before, 2) if before else None,
        "children_leaders": leaders,
        "split_took_ms": round((finished - began) * 1000),
        "pause_p50_ms": round(percentile(across, 0.5) * 1000, 1),
        "pause_p99_ms": round(percentile(across, 0.99) * 1000, 1),
        "pause_max_ms": round(max(across, default=0) * 1000, 1),
        "baseline_p99_ms": round(percentile(baseline, 0.99) * 1000, 1),
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s windows instead of 10 s")
    parser.add_argument("--window", type=float, default=None)
    parser.add_argument("--in-flight", type=int, default=2000)
    parser.add_argument("--producers", type=int, default=2, help="producer processes")
    args = parser.parse_args()
    window = args.window or (3.0 if args.quick else 10.0)
    result = uvloop.run(run(window, args.in_flight, args.producers))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
