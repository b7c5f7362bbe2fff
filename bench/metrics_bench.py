"""What metrics cost a node, measured in pieces (a shared machine's noise swamps 3 % in a
throughput A/B, see produce_bench --metrics; these figures bound the overhead instead).

* ``per_produce_request_us``: the counting a produce request does (request counter, latency
  histogram by acks, per-topic records and bytes, two clock reads).
* ``per_fetch_request_us``: the same for a fetch.
* ``scrape_ms``: one ``GET /metrics`` round trip to a real node hosting ``--partitions``
  partitions (``--metrics-per-partition`` off and on), i.e. the node's work per scrape.
* ``baseline_produce_request_us``: in the same run, the node's wall time per produce request
  of 1000 records at acks=leader on one partition (pipelined, so the node is the bottleneck).

    python bench/metrics_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laminar.client import Admin
from laminar.client.connection import Connection
from laminar.client.localcluster import LocalCluster, free_port_pairs
from laminar.node.metrics import RequestStats
from laminar.protocol import client_schema
from laminar.segment.batch import build_batch


def counting_cost(number: int) -> tuple[float, float]:
    """µs per produce request and per fetch request spent counting."""
    request = client_schema.Request.new_message()
    produce = request.body.init("produce")
    produce.acks = -1
    body = client_schema.Request.from_bytes_packed(request.to_bytes_packed()).body.produce
    stats = RequestStats()
    acks = body.acks  # read once by the server in any case

    def produce_request() -> None:
        started = time.perf_counter()
        stats.produce("bench", 1000, 110_000)
        stats.served("produce", started, acks)

    def fetch_request() -> None:
        started = time.perf_counter()
        stats.fetch("bench", 1000, 110_000)
        stats.served("fetch", started)

    produce_us = min(timeit.repeat(produce_request, number=number, repeat=5)) / number * 1e6
    fetch_us = min(timeit.repeat(fetch_request, number=number, repeat=5)) / number * 1e6
    return produce_us, fetch_us


async def http_get(address: str) -> bytes:
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
    data = await reader.read()
    writer.close()
    return data


async def node_figures(root: Path, partitions: int, per_partition: bool) -> dict[str, Any]:
    extra = ["--metrics-per-partition"] if per_partition else []
    ports = free_port_pairs(1)
    cluster = LocalCluster(
        root, ports, log_level="warning", metrics_ports=[free_port_pairs(1)[0][0]], extra_args=extra
    )
    cluster.start()
    try:
        await cluster.wait_ready(60)
        address = cluster.nodes[1].metrics_address
        async with Admin(cluster.bootstrap) as admin:
            for start in range(0, partitions, 50):
                count = min(50, partitions - start)
                await admin.create_topic(f"t{start}", partitions=count, replication_factor=1)
            await admin.create_topic("bench", partitions=1, replication_factor=1)
            await asyncio.sleep(2)
        for _ in range(3):
            await http_get(address)  # warm up
        timings = []
        size = 0
        for _ in range(20):
            started = time.perf_counter()
            size = len(await http_get(address))
            timings.append(time.perf_counter() - started)
        request_us = await produce_request_time(cluster.bootstrap)
        return {"scrape_ms": min(timings) * 1000, "bytes": size, "request_us": request_us}
    finally:
        cluster.stop()


async def produce_request_time(bootstrap: str, seconds: float = 3.0) -> float:
    """Node wall time per pipelined 1000-record produce request (acks=leader)."""
    batch = build_batch([(None, b"x" * 100, (), int(time.time() * 1000))] * 1000)
    connection = await Connection.open(bootstrap)
    done = 0
    deadline = time.perf_counter() + seconds

    def fill(body: Any) -> None:
        request = body.init("produce")
        request.acks = 1
        (ref,) = request.init("batches", 1)
        ref.topic = "bench"
        ref.partition = 0
        ref.payloadLength = len(batch)

    async def one() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await connection.request(fill, [batch])
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(8)))
    elapsed = time.perf_counter() - started
    connection.close()
    return elapsed / done * 1e6


async def main(args: argparse.Namespace) -> dict[str, Any]:
    produce_us, fetch_us = counting_cost(args.number)
    with tempfile.TemporaryDirectory(prefix="laminar-metrics-bench-") as tmp:
        topic = await node_figures(Path(tmp) / "topic", args.partitions, False)
        part = await node_figures(Path(tmp) / "part", args.partitions, True)
    return {
        "per_produce_request_us": round(produce_us, 3),
        "per_fetch_request_us": round(fetch_us, 3),
        "partitions": args.partitions,
        "scrape_ms_per_topic": round(topic["scrape_ms"], 2),
        "scrape_bytes_per_topic": topic["bytes"],
        "scrape_ms_per_partition": round(part["scrape_ms"], 2),
        "scrape_bytes_per_partition": part["bytes"],
        "baseline_produce_request_us": round(topic["request_us"], 1),
        "counting_share_of_produce_request": round(produce_us / topic["request_us"], 5),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=200)
    parser.add_argument("--number", type=int, default=100_000)
    print(json.dumps(uvloop.run(main(parser.parse_args()))))
